# SPDX-License-Identifier: MIT
"""pmla: MLA decode attention (DeepSeek-style, 512 latent + 64 rope dims)
through the pmla plugin ABI, over ctypes.

    import pmla
    plugin = pmla.load()                       # registry + plugins
    b = pmla.Builder(16, backend="pmla-cpu")   # or "pmla" on a GPU
    b.plan(qo_indptr, block_table=bt, kv_lens=lens)
    out, lse = b.run(q, kv_cache)

pmla.flash_mla offers FlashMLA's decode API (get_mla_metadata,
flash_mla_with_kvcache) on top. Only the standard library is needed at
import; tensors come from torch, numpy, CuPy or anything with __dlpack__.
"""
from ._abi import ABI_MAJOR, ABI_MINOR, HEAD_DIM, KV_LORA_RANK, ROPE_DIM
from ._errors import (BadState, Capacity, DeviceError, DeviceInputError, Error, InternalError,
                      InvalidArgument, LoadError, NoDevice, OutOfMemory, StructSize,
                      Unsupported, VersionError, error_class)
from ._plugin import BackendInfo, Plugin, default_plugin, load
from ._builder import Builder
from . import flash_mla

__all__ = ["load", "default_plugin", "Plugin", "BackendInfo", "Builder", "flash_mla", "Error",
           "InvalidArgument", "Unsupported", "VersionError", "StructSize", "Capacity",
           "NoDevice", "OutOfMemory", "DeviceError", "BadState", "DeviceInputError",
           "InternalError", "LoadError", "error_class", "ABI_MAJOR", "ABI_MINOR", "HEAD_DIM",
           "KV_LORA_RANK", "ROPE_DIM"]
