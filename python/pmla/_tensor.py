# SPDX-License-Identifier: MIT
"""Tensors in: DLPack (``__dlpack__`` or a capsule), the numpy array
interface, or a (nested) list of ints. Each becomes a ``Tensor``: a DLTensor
owned by Python plus the objects that keep its memory alive."""
import ctypes
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

_DTYPE_NAMES = {(_abi.kDLInt, 32): "int32", (_abi.kDLInt, 64): "int64",
                (_abi.kDLUInt, 16): "uint16", (_abi.kDLFloat, 32): "float32",
                (_abi.kDLFloat, 16): "float16", (_abi.kDLFloat, 64): "float64",
                (_abi.kDLBfloat, 16): "bfloat16", (_abi.kDLUInt, 8): "uint8",
                (_abi.kDLInt, 8): "int8", (10, 8): "float8_e4m3fn"}

# numpy array-interface type strings (little-endian or native) -> DLDataType
_TYPESTR = {"i4": (_abi.kDLInt, 32), "i8": (_abi.kDLInt, 64), "u2": (_abi.kDLUInt, 16),
            "f4": (_abi.kDLFloat, 32), "f2": (_abi.kDLFloat, 16), "f8": (_abi.kDLFloat, 64),
            "u1": (_abi.kDLUInt, 8), "i1": (_abi.kDLInt, 8)}


def library_of(obj):
    """'torch', 'numpy', 'cupy' or None: which library made obj."""
    mod = type(obj).__module__ or ""
    root = mod.split(".", 1)[0]
    return root if root in ("torch", "numpy", "cupy") else None


def is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


class Tensor:
    """A DLTensor (``dl``, at address ``addr``) describing ``obj``; ``owner``
    keeps the exporter's memory and shape arrays alive."""

    __slots__ = ("obj", "owner", "dl", "addr", "shape", "lib", "ptr_check")

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
    t.ptr_check = None
    if lib == "torch":
        ptr = getattr(obj, "data_ptr", None)
        if ptr is not None:
            t.ptr_check = (ptr, ptr())
    return t


def _from_capsule(capsule, name):
    cname = _capsule_get_name(capsule)
    if cname == b"dltensor":
        addr = _capsule_get_pointer(capsule, b"dltensor")
    elif cname == b"dltensor_versioned":
        addr = _capsule_get_pointer(capsule, b"dltensor_versioned")
        addr = addr + _abi.DL_VERSIONED_TENSOR_OFFSET if addr else addr
    else:
        raise InvalidArgument(
            "%s: a capsule named %r; accepted: an unconsumed DLPack capsule ('dltensor' or "
            "'dltensor_versioned'); a capsule can be used once" % (name, cname))
    if not addr:
        raise InvalidArgument("%s: the DLPack capsule holds no tensor" % name)
    dl = _abi.DLTensor()
    # The capsule keeps ownership: its destructor calls the producer's
    # deleter once the capsule (held in Tensor.owner) is collected. The copy
    # points at the producer's shape/strides, valid as long as the capsule.
    ctypes.memmove(ctypes.addressof(dl), addr, ctypes.sizeof(dl))
    return dl


def _from_array_interface(obj, name):
    ai = obj.__array_interface__
    typestr = ai["typestr"]
    if typestr[0] not in "<|=" or typestr[1:] not in _TYPESTR:
        raise InvalidArgument("%s: array type %r; accepted: little-endian int32, uint16 "
                              "(bf16 bits), float32" % (name, typestr))
    code, bits = _TYPESTR[typestr[1:]]
    shape = tuple(int(s) for s in ai["shape"])
    nd = len(shape)
    shape_arr = (ctypes.c_int64 * max(nd, 1))(*shape)
    dl = _abi.DLTensor()
    dl.data = ai["data"][0] if ai.get("data") else None
    dl.device.device_type = _abi.kDLCPU
    dl.ndim = nd
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
    dl.shape = shape_arr
    strides_arr = None
    if ai.get("strides") is not None:
        item = bits // 8
        if any(s % item for s in ai["strides"]):
            raise InvalidArgument("%s: strides %r are not whole elements" % (name, ai["strides"]))
        strides_arr = (ctypes.c_int64 * max(nd, 1))(*(s // item for s in ai["strides"]))
        dl.strides = strides_arr
    return dl, (obj, shape_arr, strides_arr)


def _from_list(obj, name):
    shape, rows = [len(obj)], obj
    flat = []
    if rows and isinstance(rows[0], (list, tuple)):
        shape.append(len(rows[0]))
        for r in rows:
            if not isinstance(r, (list, tuple)) or len(r) != shape[1]:
                raise InvalidArgument("%s: a ragged nested list; accepted: rectangular" % name)
            flat.extend(r)
    else:
        flat = list(rows)
    try:
        data = (ctypes.c_int32 * max(len(flat), 1))(*flat)
    except TypeError:
        raise InvalidArgument("%s: a list that is not all ints" % name) from None
    shape_arr = (ctypes.c_int64 * len(shape))(*shape)
    dl = _abi.DLTensor()
    dl.data = ctypes.addressof(data)
    dl.device.device_type = _abi.kDLCPU
    dl.ndim = len(shape)
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = _abi.kDLInt, 32, 1
    dl.shape = shape_arr
    return dl, (data, shape_arr)


def as_tensor(obj, name, bf16=False):
    """Converts obj to a Tensor. bf16: a uint16 tensor is taken as bf16 bits."""
    if obj is None:
        raise InvalidArgument("%s is None; a tensor is required" % name)
    t = Tensor()
    lib = library_of(obj)
    if is_capsule(obj):
        return _finish(t, obj, obj, _from_capsule(obj, name), None, bf16)
    export = getattr(obj, "__dlpack__", None)
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
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            if not hasattr(src, "__array_interface__"):
                raise InvalidArgument("%s: %s cannot be exported through DLPack: %s"
                                      % (name, type(obj).__name__, e)) from None
        else:
            return _finish(t, obj, (capsule, src), _from_capsule(capsule, name), lib, bf16)
        dl, owner = _from_array_interface(src, name)  # e.g. a read-only numpy array
        return _finish(t, obj, owner, dl, lib, bf16)
    if hasattr(obj, "__array_interface__"):
        dl, owner = _from_array_interface(obj, name)
        return _finish(t, obj, owner, dl, lib, bf16)
    if isinstance(obj, (list, tuple)):
        dl, owner = _from_list(obj, name)
        return _finish(t, obj, owner, dl, None, bf16)
    raise InvalidArgument("%s: a %s.%s is not a tensor; accepted: an object with __dlpack__ "
                          "(torch, numpy, CuPy), a DLPack capsule, or a list of ints"
                          % (name, type(obj).__module__, type(obj).__name__))


def same(t, obj):
    """t was made from obj and still describes it (a torch tensor can be given
    new storage in place: its data pointer is compared)."""
    return t is not None and t.obj is obj and (t.ptr_check is None or
                                               t.ptr_check[0]() == t.ptr_check[1])


def stream_handle(stream, name="stream"):
    """An explicit stream argument as an int (0 = NULL)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "value"):  # torch.cuda.Stream, CuPy, c_void_p
        v = getattr(stream, attr, None)
        if isinstance(v, int):
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
