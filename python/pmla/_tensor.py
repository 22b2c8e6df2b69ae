# SPDX-License-Identifier: MIT
"""Tensors in: DLPack (``__dlpack__`` or a capsule), the numpy array
interface, or a (nested) list of ints. Each becomes a ``Tensor``: a DLTensor
owned by Python plus the objects that keep its memory alive."""
import ctypes
import operator
import sys

from . import _abi
from ._errors import InvalidArgument

_api = ctypes.pythonapi
_capsule_get_name = _api.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_pointer = _api.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = _api.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_void_p]
# The names a consumed capsule takes (DLPack's protocol). PyCapsule_SetName
# keeps the pointer, so the buffers live as long as the module.
_USED_NAME = {b"dltensor": ctypes.create_string_buffer(b"used_dltensor"),
              b"dltensor_versioned": ctypes.create_string_buffer(b"used_dltensor_versioned")}
# the producer's deleter, called with the GIL held (numpy's takes it itself)
_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
_DL_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY in DLManagedTensorVersioned.flags

_DTYPE_NAMES = {(_abi.kDLInt, 32): "int32", (_abi.kDLInt, 64): "int64",
                (_abi.kDLUInt, 16): "uint16", (_abi.kDLFloat, 32): "float32",
                (_abi.kDLFloat, 16): "float16", (_abi.kDLFloat, 64): "float64",
                (_abi.kDLBfloat, 16): "bfloat16", (_abi.kDLUInt, 8): "uint8",
                (_abi.kDLInt, 8): "int8", (10, 8): "float8_e4m3fn"}

# numpy array-interface type strings (little-endian or native) -> DLDataType
_TYPESTR = {"i4": (_abi.kDLInt, 32), "i8": (_abi.kDLInt, 64), "u2": (_abi.kDLUInt, 16),
            "f4": (_abi.kDLFloat, 32), "f2": (_abi.kDLFloat, 16), "f8": (_abi.kDLFloat, 64),
            "u1": (_abi.kDLUInt, 8), "i1": (_abi.kDLInt, 8)}


_LIBRARY_TYPES = (("torch", "Tensor"), ("numpy", "ndarray"), ("cupy", "ndarray"))


def library_of(obj):
    """'torch', 'numpy', 'cupy' or None: which library's tensor obj is
    (subclasses included: a subclass has its base's in-place changes)."""
    for lib, cls in _LIBRARY_TYPES:
        mod = sys.modules.get(lib)
        base = getattr(mod, cls, None) if mod is not None else None
        if isinstance(base, type) and isinstance(obj, base):
            return lib
    return None


def is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _exporter_error(name, obj, what, e):
    """An exporter's own exception, as InvalidArgument naming the argument;
    what: how it failed, with {} for the exporter's type name."""
    return InvalidArgument("%s: %s: %s: %s" % (name, what.format(type(obj).__name__),
                                               type(e).__name__, e))


def _has(obj, attr):
    """hasattr that lets no exporter's exception through: an attribute whose
    reading raises counts as present, and reading it again reports it."""
    try:
        return hasattr(obj, attr)
    except Exception:
        return True


class Tensor:
    """A DLTensor (``dl``, at address ``addr``) describing ``obj``; ``owner``
    keeps the exporter's memory and shape arrays alive. ``check()`` reads
    obj's data pointer, shape, strides and dtype again: while it returns
    ``sig`` the DLTensor still describes obj (None for a capsule, which
    cannot change, and a list, which is never reused)."""

    __slots__ = ("obj", "owner", "dl", "addr", "shape", "lib", "check", "sig")

    @property
    def device_type(self):
        return self.dl.device.device_type

    @property
    def device_id(self):
        return self.dl.device.device_id

    @property
    def is_gpu(self):
        return self.dl.device.device_type in _abi.GPU_DEVICE_TYPES

    @property
    def dtype_name(self):
        d = self.dl.dtype
        return _DTYPE_NAMES.get((d.code, d.bits), "code %d bits %d" % (d.code, d.bits))


def _finish(t, obj, owner, dl, lib, bf16):
    if bf16 and dl.dtype.code == _abi.kDLUInt and dl.dtype.bits == 16:
        dl.dtype.code = _abi.kDLBfloat  # numpy / CuPy have no bfloat16: uint16 bit patterns
    t.obj = obj
    t.owner = owner
    t.dl = dl
    t.addr = ctypes.addressof(dl)
    t.shape = tuple(dl.shape[i] for i in range(dl.ndim)) if dl.ndim > 0 else ()
    t.lib = lib
    t.check = _layout_reader(obj, lib)
    t.sig = t.check() if t.check is not None else None
    return t


def _layout_reader(obj, lib):
    """A function reading what an in-place change of obj could move (a torch
    tensor's set_, resize_ or transpose_; a numpy array's resize, shape,
    strides or dtype), or None where nothing can (a consumed capsule, whose
    memory stays the producer's until its deleter runs; a list, which is
    never reused). Any other exporter may hand out other memory at each
    export, and nothing tells pmla when: it is exported again every call."""
    if lib == "torch" and hasattr(obj, "data_ptr"):
        return lambda: (obj.data_ptr(), obj.shape, obj.stride(), obj.dtype, obj.device)
    if lib == "numpy" and _has(obj, "__array_interface__"):
        return lambda: (obj.__array_interface__["data"][0], obj.shape, obj.strides, obj.dtype,
                        obj.flags.writeable)
    if lib == "cupy" and hasattr(obj, "data"):
        return lambda: (obj.data.ptr, obj.shape, obj.strides, obj.dtype)
    if is_capsule(obj) or isinstance(obj, (list, tuple)):
        return None
    return _Never


class _Never:
    """A layout that equals no other, itself included: the Tensor holding it
    is never reused."""

    __slots__ = ()

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = None


class _Managed:
    """A consumed DLPack capsule's managed tensor: its deleter runs when
    the last Tensor holding it goes."""

    __slots__ = ("addr", "deleter")

    def __init__(self, addr, deleter):
        self.addr = addr
        self.deleter = _DELETER(deleter) if deleter else None

    def __del__(self):
        if self.deleter is not None and sys is not None and not sys.is_finalizing():
            self.deleter(self.addr)


def _from_capsule(capsule, name, writable=False):
    """Consumes a DLPack capsule as the protocol asks (renamed "used_...", so
    no other consumer takes it): returns its DLTensor and the owner whose
    collection calls the producer's deleter."""
    cname = _capsule_get_name(capsule)
    if cname == b"dltensor":
        managed = _capsule_get_pointer(capsule, b"dltensor")
        # DLManagedTensor: dl_tensor, manager_ctx, deleter
        addr, deleter_at = managed, ctypes.sizeof(_abi.DLTensor) + 8
    elif cname == b"dltensor_versioned":
        managed = _capsule_get_pointer(capsule, b"dltensor_versioned")
        # DLManagedTensorVersioned: version {major, minor}, manager_ctx,
        # deleter, flags, dl_tensor
        addr, deleter_at = managed + _abi.DL_VERSIONED_TENSOR_OFFSET if managed else 0, 16
        if managed:
            major = ctypes.c_uint32.from_address(managed).value
            if major != 1:
                raise InvalidArgument("%s: a DLPack capsule of version %d; accepted: DLPack 1.x"
                                      % (name, major))
            flags = ctypes.c_uint64.from_address(managed + 24).value
            if writable and flags & _DL_READ_ONLY:
                raise InvalidArgument("%s: a read-only DLPack tensor; accepted: a writable one"
                                      % name)
    else:
        raise InvalidArgument(
            "%s: a capsule named %r; accepted: an unconsumed DLPack capsule ('dltensor' or "
            "'dltensor_versioned'); a capsule can be used once" % (name, cname))
    if not managed:
        raise InvalidArgument("%s: the DLPack capsule holds no tensor" % name)
    dl = _abi.DLTensor()
    # The copy points at the producer's shape/strides, valid until the
    # deleter runs.
    ctypes.memmove(ctypes.addressof(dl), addr, ctypes.sizeof(dl))
    if dl.ndim < 0 or (dl.ndim > 0 and not dl.shape):
        raise InvalidArgument("%s: a DLPack tensor of ndim %d, shape %s; accepted: ndim >= 0 "
                              "and a shape of ndim entries"
                              % (name, dl.ndim, "NULL" if not dl.shape else "given"))
    deleter = ctypes.c_void_p.from_address(managed + deleter_at).value
    if _capsule_set_name(capsule, ctypes.addressof(_USED_NAME[cname])) != 0:
        raise InvalidArgument("%s: the DLPack capsule could not be marked used" % name)
    return dl, _Managed(managed, deleter)


def _from_array_interface(obj, name, writable=False):
    try:
        ai = obj.__array_interface__
    except Exception as e:
        raise _exporter_error(name, obj, "reading {}'s __array_interface__ failed", e) from None
    data = ai.get("data") if isinstance(ai, dict) else None
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], int)
            and not isinstance(data[0], bool) and 0 <= data[0] < 2 ** 64):
        raise InvalidArgument("%s: __array_interface__ data %s; accepted: a (pointer, "
                              "read-only) tuple, the pointer a Python int in 0..2^64-1"
                              % (name, "missing" if data is None else repr(data)))
    if writable and data[1]:
        raise InvalidArgument("%s: a read-only array; accepted: a writable one" % name)
    typestr = ai.get("typestr")
    if not isinstance(typestr, str) or typestr[:1] not in ("<", "|", "=") or \
            typestr[1:] not in _TYPESTR:
        raise InvalidArgument("%s: array type %r; accepted: little-endian int32, uint16 "
                              "(bf16 bits), float32" % (name, typestr))
    code, bits = _TYPESTR[typestr[1:]]
    try:
        shape = tuple(operator.index(s) for s in ai["shape"])
    except (KeyError, TypeError):
        raise InvalidArgument("%s: __array_interface__ shape %r; accepted: a tuple of ints"
                              % (name, ai.get("shape"))) from None
    if any(not 0 <= v < 2 ** 63 for v in shape):
        raise InvalidArgument("%s: shape %r; accepted: dimensions 0..2^63-1" % (name, shape))
    nd = len(shape)
    shape_arr = (ctypes.c_int64 * max(nd, 1))(*shape)
    dl = _abi.DLTensor()
    dl.data = data[0] or None
    dl.device.device_type = _abi.kDLCPU
    dl.ndim = nd
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
    dl.shape = shape_arr
    strides_arr = None
    if ai.get("strides") is not None:
        item = bits // 8
        st = ai["strides"]
        if not isinstance(st, tuple) or len(st) != nd or \
                any(not isinstance(v, int) or v % item or not -2 ** 63 <= v < 2 ** 63
                    for v in st):
            raise InvalidArgument("%s: strides %r; accepted: a tuple of %d ints, whole "
                                  "elements, within int64" % (name, st, nd))
        strides_arr = (ctypes.c_int64 * max(nd, 1))(*(s // item for s in st))
        dl.strides = strides_arr
    return dl, (obj, shape_arr, strides_arr)


_INT32 = (-2 ** 31, 2 ** 31 - 1)


def is_bool(v):
    """Python's bool or numpy's (an int to Python, not a number to pmla)."""
    return isinstance(v, bool) or type(v).__name__ == "bool_"


def _from_list(obj, name):
    shape, rows = [len(obj)], obj
    flat = []
    if rows and isinstance(rows[0], (list, tuple)):
        shape.append(len(rows[0]))
        for i, r in enumerate(rows):
            if not isinstance(r, (list, tuple)) or len(r) != shape[1]:
                raise InvalidArgument("%s: row %d is %s where row 0 has %d elements; accepted: "
                                      "a rectangular list of lists" % (
                                          name, i, "%d long" % len(r)
                                          if isinstance(r, (list, tuple))
                                          else "of type " + type(r).__name__, shape[1]))
            flat.extend(r)
    else:
        flat = list(rows)
    for i, v in enumerate(flat):
        try:
            if is_bool(v):  # not an index to pmla
                raise TypeError
            flat[i] = operator.index(v)
        except TypeError:
            raise InvalidArgument("%s: element %d is %r; accepted: a list of ints"
                                  % (name, i, v)) from None
    bad = next((i for i, v in enumerate(flat) if not _INT32[0] <= v <= _INT32[1]), None)
    if bad is not None:
        raise InvalidArgument("%s: element %d is %d; accepted: int32 values (%d..%d)"
                              % (name, bad, flat[bad], _INT32[0], _INT32[1]))
    data = (ctypes.c_int32 * max(len(flat), 1))(*flat)
    shape_arr = (ctypes.c_int64 * len(shape))(*shape)
    dl = _abi.DLTensor()
    dl.data = ctypes.addressof(data)
    dl.device.device_type = _abi.kDLCPU
    dl.ndim = len(shape)
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = _abi.kDLInt, 32, 1
    dl.shape = shape_arr
    return dl, (data, shape_arr)


def as_tensor(obj, name, bf16=False, writable=False):
    """Converts obj to a Tensor. bf16: a uint16 tensor is taken as bf16 bits.
    writable: the plugin writes it (a read-only array is refused)."""
    if obj is None:
        raise InvalidArgument("%s is None; a tensor is required" % name)
    t = Tensor()
    lib = library_of(obj)
    if is_capsule(obj):
        dl, owner = _from_capsule(obj, name, writable)
        return _finish(t, obj, owner, dl, None, bf16)
    try:
        export = getattr(obj, "__dlpack__", None)
    except Exception as e:
        raise _exporter_error(name, obj, "reading {}'s __dlpack__ failed", e) from None
    if export is not None:
        src = obj
        if lib == "torch" and getattr(obj, "requires_grad", False):
            src = obj.detach()
            export = src.__dlpack__
        if lib == "torch" and str(getattr(src, "dtype", "")) == "torch.float8_e4m3fn":
            src = src.view(sys.modules["torch"].uint8)  # an fp8_e4m3 cache: its bytes
            export = src.__dlpack__
        elif lib in ("numpy", "cupy") and getattr(getattr(obj, "dtype", None), "name",
                                                  "") == "bfloat16":
            src = obj.view("uint16")  # ml_dtypes bfloat16: DLPack has no code for it
            export = src.__dlpack__
            bf16 = True
        try:
            capsule = export()
        except Exception as e:
            if not _has(src, "__array_interface__"):
                raise _exporter_error(name, obj, "{} cannot be exported through DLPack",
                                      e) from None
        else:
            if not is_capsule(capsule):
                raise InvalidArgument("%s: %s.__dlpack__() returned a %s; accepted: a DLPack "
                                      "capsule" % (name, type(obj).__name__,
                                                   type(capsule).__name__))
            dl, owner = _from_capsule(capsule, name, writable)
            return _finish(t, obj, owner, dl, lib, bf16)
        # e.g. a read-only numpy array, which numpy does not export
        dl, owner = _from_array_interface(src, name, writable)
        return _finish(t, obj, owner, dl, lib, bf16)
    if _has(obj, "__array_interface__"):
        dl, owner = _from_array_interface(obj, name, writable)
        return _finish(t, obj, owner, dl, lib, bf16)
    if isinstance(obj, (list, tuple)):
        dl, owner = _from_list(obj, name)
        return _finish(t, obj, owner, dl, None, bf16)
    raise InvalidArgument("%s: a %s.%s is not a tensor; accepted: an object with __dlpack__ "
                          "(torch, numpy, CuPy), a DLPack capsule, or a list of ints"
                          % (name, type(obj).__module__, type(obj).__name__))


def same(t, obj):
    """t was made from obj and still describes it: a tensor's data pointer,
    shape, strides and dtype are read again (each can change in place); a
    list, and an object of a library other than torch, numpy and CuPy, is
    read again every time (its contents, or the memory it exports, can
    change unseen)."""
    return t is not None and t.obj is obj and not isinstance(obj, (list, tuple)) and \
        (t.check is None or t.check() == t.sig)


def stream_handle(stream, name="stream"):
    """An explicit stream argument as an int (0 = NULL)."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        if not 0 <= stream < 2 ** 64:
            raise InvalidArgument("%s: %d; accepted: a handle of 0..2^64-1" % (name, stream))
        return stream
    for attr in ("cuda_stream", "ptr", "value"):  # torch.cuda.Stream, CuPy, c_void_p
        v = getattr(stream, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64:
            return v
        if v is None and attr == "value" and isinstance(stream, ctypes.c_void_p):
            return 0
    raise InvalidArgument("%s: %r; accepted: an int handle, a torch.cuda.Stream, a CuPy "
                          "stream, a ctypes.c_void_p or None" % (name, stream))


def current_stream(t):
    """The producer library's current stream for GPU tensor t, as an int."""
    if t.lib == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(t.dl.device.device_id)
        return torch.cuda.current_stream(t.dl.device.device_id).cuda_stream
    if t.lib == "cupy":
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0
