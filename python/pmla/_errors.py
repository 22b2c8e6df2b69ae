# SPDX-License-Identifier: MIT
"""pmla.Error and one subclass per pmla_status."""
from . import _abi


class Error(Exception):
    """A pmla call failed. status: the pmla_status number; status_name: its C
    name; message: the plugin's last_error text (or pmla's own message)."""

    status = None
    status_name = "PMLA_ERROR"

    def __init__(self, message, status=None, call=None):
        if status is not None:
            self.status = status
        self.message = message
        self.call = call
        super().__init__(message)

    def __str__(self):
        return "%s: %s" % (self.status_name, self.message)


class InvalidArgument(Error, ValueError):
    status, status_name = _abi.ERR_INVALID_ARGUMENT, "PMLA_ERR_INVALID_ARGUMENT"


class Unsupported(Error, NotImplementedError):
    status, status_name = _abi.ERR_UNSUPPORTED, "PMLA_ERR_UNSUPPORTED"


class VersionError(Error):
    status, status_name = _abi.ERR_VERSION, "PMLA_ERR_VERSION"


class StructSize(Error):
    status, status_name = _abi.ERR_STRUCT_SIZE, "PMLA_ERR_STRUCT_SIZE"


class Capacity(Error):
    status, status_name = _abi.ERR_CAPACITY, "PMLA_ERR_CAPACITY"


class NoDevice(Error):
    status, status_name = _abi.ERR_NO_DEVICE, "PMLA_ERR_NO_DEVICE"


class OutOfMemory(Error, MemoryError):
    status, status_name = _abi.ERR_OUT_OF_MEMORY, "PMLA_ERR_OUT_OF_MEMORY"


class DeviceError(Error):
    status, status_name = _abi.ERR_DEVICE, "PMLA_ERR_DEVICE"


class BadState(Error):
    status, status_name = _abi.ERR_BAD_STATE, "PMLA_ERR_BAD_STATE"


class DeviceInputError(Error):
    """Kernels skipped bad device-side input; flags holds the error bits and
    flag_names their names (kv_len, page_index, slot_index, qo_indptr,
    last_page_len, kv_scale, schedule)."""

    status, status_name = _abi.ERR_DEVICE_INPUT, "PMLA_ERR_DEVICE_INPUT"
    flags = 0

    @property
    def flag_names(self):
        return [n for bit, n in sorted(_abi.DEVERR_BITS.items()) if self.flags & bit]


class InternalError(Error):
    status, status_name = _abi.ERR_INTERNAL, "PMLA_ERR_INTERNAL"


class LoadError(Error, OSError):
    """The registry library or a backend could not be found or opened."""

    status_name = "PMLA_LOAD_ERROR"


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgument, Unsupported, VersionError, StructSize, Capacity, NoDevice, OutOfMemory,
    DeviceError, BadState, DeviceInputError, InternalError)}


for _cls in (Error, InvalidArgument, Unsupported, VersionError, StructSize, Capacity, NoDevice,
             OutOfMemory, DeviceError, BadState, DeviceInputError, InternalError, LoadError):
    _cls.__module__ = "pmla"


def error_class(status):
    """The Error subclass raised for a pmla_status."""
    return _BY_STATUS.get(status, Error)


def make_error(status, message, call=None):
    cls = _BY_STATUS.get(status)
    if cls is None:
        err = Error(message, status=status, call=call)
        err.status_name = "pmla_status %d" % status
        return err
    return cls(message, call=call)
