# SPDX-License-Identifier: MIT
"""ctypes mirror of abi/pmla.h, abi/pmla_registry.h and dlpack.h (ABI 1.1)."""
import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_float, c_int,
                    c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64,
                    c_void_p)

ABI_MAJOR = 1
ABI_MINOR = 1


def version(major, minor):
    return ((major & 0xFFFF) << 16) | (minor & 0xFFFF)


def version_str(v):
    return "%d.%d" % (v >> 16, v & 0xFFFF)


ABI_VERSION = version(ABI_MAJOR, ABI_MINOR)

# pmla_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_VERSION = 3
ERR_STRUCT_SIZE = 4
ERR_CAPACITY = 5
ERR_NO_DEVICE = 6
ERR_OUT_OF_MEMORY = 7
ERR_DEVICE = 8
ERR_BAD_STATE = 9
ERR_DEVICE_INPUT = 10
ERR_INTERNAL = 11

DTYPE_BF16 = 1
DTYPE_FP8_E4M3 = 2
DTYPE_FP8_DS_MLA = 3
BUILDER_BATCH_INVARIANT = 1
KV_BLOCK_TABLE = 1
KV_CSR = 2
SPARSE_NO_SPLIT_CAP = 1

BUFFER_NAMES = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr",
                "reduce_final_map", "reduce_partial_map", "partial_out", "partial_lse")
BUF_COUNT = len(BUFFER_NAMES)

DEVERR_BITS = {1: "kv_len", 2: "page_index", 4: "slot_index", 8: "qo_indptr",
               16: "last_page_len", 32: "kv_scale", 32768: "schedule"}

KV_LORA_RANK = 512
ROPE_DIM = 64
HEAD_DIM = KV_LORA_RANK + ROPE_DIM

# dlpack.h
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLROCM = 10
kDLCUDAManaged = 13
kDLFloat8_e4m3fn = 10  # DLPack 1.1's code (a KV cache of PMLA_DTYPE_FP8_E4M3 may use it)
GPU_DEVICE_TYPES = (kDLCUDA, kDLROCM)
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


# Offset of dl_tensor in DLManagedTensorVersioned (DLPack >= 1.0):
# version {u32, u32}, manager_ctx, deleter, flags (u64), dl_tensor.
DL_VERSIONED_TENSOR_OFFSET = 8 + 8 + 8 + 8


class BuilderConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("num_heads", c_uint32),
                ("kv_lora_rank", c_uint32), ("rope_dim", c_uint32), ("q_dtype", c_uint32),
                ("kv_dtype", c_uint32), ("out_dtype", c_uint32), ("page_size", c_uint32),
                ("max_batch", c_uint32), ("max_q_len", c_uint32), ("topk", c_uint32),
                ("softmax_scale", c_float), ("device", c_int32), ("cu_count", c_uint32),
                ("flags", c_uint32), ("invariant_chunk", c_uint32)]


class BuilderInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("cu_count", c_uint32), ("sched_units", c_uint32),
                ("split_cap", c_uint32), ("max_requests", c_uint32),
                ("max_work_items", c_uint32), ("max_partial_slots", c_uint32),
                ("reserved", c_uint32), ("buffer_bytes", c_uint64 * BUF_COUNT),
                ("total_bytes", c_uint64)]


# Tensor pointers are c_void_p so that an address (int) can be stored directly.
class DecodeBatch(Structure):
    _fields_ = [("struct_size", c_uint32), ("kv_layout", c_uint32), ("qo_indptr", c_void_p),
                ("block_table", c_void_p), ("kv_lens", c_void_p), ("kv_indptr", c_void_p),
                ("kv_indices", c_void_p), ("kv_last_page_len", c_void_p),
                ("stream", c_void_p)]


class SparseBatch(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("topk_indices", c_void_p),
                ("max_seq_len", c_int64), ("stream", c_void_p)]


class DecodeArgs(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("q", c_void_p),
                ("kv_cache", c_void_p), ("out", c_void_p), ("lse", c_void_p),
                ("stream", c_void_p),
                ("kv_scale", c_void_p)]


# The builder handle is passed as c_void_p; structs by address (c_void_p too:
# an int converts faster than a byref object).
INIT_BUILDER = CFUNCTYPE(c_int, c_void_p, POINTER(c_void_p))
DESTROY_BUILDER = CFUNCTYPE(None, c_void_p)
QUERY_BUILDER = CFUNCTYPE(c_int, c_void_p, c_void_p)
BUILD_DECODE = CFUNCTYPE(c_int, c_void_p, c_void_p)
BUILD_SPARSE = CFUNCTYPE(c_int, c_void_p, c_void_p)
DECODE = CFUNCTYPE(c_int, c_void_p, c_void_p)
LAST_ERROR = CFUNCTYPE(c_char_p, c_void_p)
CHECK_DEVICE_ERROR = CFUNCTYPE(c_int, c_void_p, POINTER(c_uint32))
COPY_BUFFER = CFUNCTYPE(c_int, c_void_p, c_int, c_void_p, c_uint64)


class Backend(Structure):
    _fields_ = [("struct_size", c_uint32), ("abi_version", c_uint32), ("name", c_char_p),
                ("description", c_char_p), ("init_builder", INIT_BUILDER),
                ("destroy_builder", DESTROY_BUILDER), ("query_builder", QUERY_BUILDER),
                ("build_decode", BUILD_DECODE), ("build_sparse", BUILD_SPARSE),
                ("decode", DECODE), ("last_error", LAST_ERROR),
                ("check_device_error", CHECK_DEVICE_ERROR), ("copy_buffer", COPY_BUFFER)]


def _check_layout():
    # the frozen 1.0 offsets of pmla.h (LP64)
    if ctypes.sizeof(c_void_p) != 8:
        return
    assert Backend.init_builder.offset == 24 and Backend.copy_buffer.offset == 88
    assert ctypes.sizeof(Backend) == 96
    assert BuilderConfig.softmax_scale.offset == 44 and ctypes.sizeof(BuilderConfig) == 64
    assert BuilderInfo.buffer_bytes.offset == 32 and ctypes.sizeof(BuilderInfo) == 104
    assert DecodeBatch.stream.offset == 56 and ctypes.sizeof(DecodeBatch) == 64
    assert SparseBatch.max_seq_len.offset == 16 and ctypes.sizeof(SparseBatch) == 32
    assert DecodeArgs.kv_scale.offset == 48 and ctypes.sizeof(DecodeArgs) == 56
    assert ctypes.sizeof(DLTensor) == 48


_check_layout()


def declare_registry(lib):
    """Sets the prototypes of libpmla-registry's functions on a CDLL."""
    lib.pmla_registry_open.argtypes = [c_char_p, POINTER(c_void_p)]
    lib.pmla_registry_open.restype = c_int
    lib.pmla_registry_close.argtypes = [c_void_p]
    lib.pmla_registry_close.restype = None
    lib.pmla_registry_count.argtypes = [c_void_p]
    lib.pmla_registry_count.restype = c_size_t
    lib.pmla_registry_backend.argtypes = [c_void_p, c_size_t]
    lib.pmla_registry_backend.restype = POINTER(Backend)
    lib.pmla_registry_backend_path.argtypes = [c_void_p, c_size_t]
    lib.pmla_registry_backend_path.restype = c_char_p
    lib.pmla_registry_backend_version.argtypes = [c_void_p, c_size_t]
    lib.pmla_registry_backend_version.restype = c_uint32
    lib.pmla_registry_find.argtypes = [c_void_p, c_char_p]
    lib.pmla_registry_find.restype = POINTER(Backend)
    lib.pmla_registry_diagnostics.argtypes = [c_void_p]
    lib.pmla_registry_diagnostics.restype = c_char_p
    lib.pmla_status_name.argtypes = [c_int]
    lib.pmla_status_name.restype = c_char_p

