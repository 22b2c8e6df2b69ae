# SPDX-License-Identifier: MIT
"""FlashMLA's Python decode API over pmla.

    from pmla.flash_mla import get_mla_metadata, flash_mla_with_kvcache
    meta, splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_k, h_k)
    for layer in layers:
        out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
                                          512, meta, splits, causal=True)

Served: torch tensors, bf16 q and KV cache (576 = 512 latent + 64 rope), one
KV head, head_dim_v 512, the head counts the plugin serves (1..128 today),
dense (block table, causal or not) and sparse (indices); for sparse also
FlashMLA's FP8 cache (is_fp8_kvcache=True: DeepSeek V3.2's 656-byte rows,
uint8 or float8_e4m3fn). CUDA tensors
run on the "pmla" backend, CPU tensors on "pmla-cpu". Anything else raises
NotImplementedError.

The metadata object stands for one step, as in FlashMLA: make a new one when
cache_seqlens change. It plans the step on its first call (and again when it
is given other block_table / cache_seqlens / indices tensors) and holds the
builders it made; when it is dropped they go back to a pool that later
metadata objects draw from, so steady-state decoding allocates no builders.
"""
import math
import sys
import threading
import weakref

from . import _abi
from ._builder import Builder
from ._errors import Error as PmlaError, Unsupported

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache", "MLAMetadata"]

_POOL_PER_KEY = 4
# and in all: steps of many configurations (softmax scales, head counts)
# would otherwise keep a builder of each until clear_pool()
_POOL_MAX = 32
_DS_MLA_BYTES = 656
_MAX_REQUESTS = 65536  # init_builder's max_batch (pmla.h)
_pool = {}
# re-entrant: a metadata object's finaliser gives builders back, and the
# cycle collector may run it inside a locked region on the same thread
_pool_lock = threading.RLock()


def _not_served(what):
    return NotImplementedError("pmla.flash_mla: %s is not served by pmla (it serves bf16 q and "
                               "KV cache, head_dim 576 = 512 + 64, one KV head, head_dim_v "
                               "512, the query head counts init_builder accepts)" % what)


def _take_builder(key):
    with _pool_lock:
        idle = _pool.get(key)
        # a pooled builder may have been closed since (the cycle collector
        # finalises a dropped metadata object and its builders together)
        while idle:
            b = idle.pop()
            if b._h is not None:
                return b
    backend, device, heads, page_size, max_q_len, topk, scale, max_batch, kv_dtype = key
    try:
        return Builder(heads, backend=backend, page_size=page_size, max_batch=max_batch,
                       max_q_len=max_q_len, topk=topk, softmax_scale=scale, device=device,
                       kv_dtype=kv_dtype)
    except Unsupported as e:
        raise _not_served("this configuration (%s)" % e.message) from e


def _give_back(key, builder):
    builder._step = builder._rc = None
    with _pool_lock:
        idle = _pool.setdefault(key, [])
        if len(idle) < _POOL_PER_KEY and sum(map(len, _pool.values())) < _POOL_MAX:
            idle.append(builder)
            return
        if not idle:
            del _pool[key]
    builder.close()


def clear_pool():
    """Closes the idle builders kept for later metadata objects."""
    with _pool_lock:
        idle = [b for lst in _pool.values() for b in lst]
        _pool.clear()
    for b in idle:
        b.close()


class _NotATensor(NotImplementedError, AttributeError):
    """Raised for a tensor operation on an opaque metadata object (an
    AttributeError too, so hasattr answers False)."""


class _Opaque:
    """FlashMLA's older API returned its metadata as int32 tensors, which
    CUDA-graph paths copy into buffers of their own (.size(), .copy_(),
    slicing). pmla's metadata is not a tensor: such uses get this message,
    not a bare AttributeError or TypeError."""

    __slots__ = ()

    @classmethod
    def _not_a_tensor(cls, what):
        return _NotATensor(
            "pmla.flash_mla: %s on %s: pmla's metadata is an opaque object, not a tensor; "
            "copying FlashMLA's metadata tensors into CUDA-graph buffers is not served (keep "
            "the object from get_mla_metadata alive and pass it again)" % (what, cls.__name__))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._not_a_tensor("." + name)

    def __getitem__(self, key):
        raise self._not_a_tensor("indexing")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise cls._not_a_tensor(getattr(func, "__name__", str(func)))


class _NumSplits(_Opaque):
    """FlashMLA's num_splits: opaque here (the schedule lives in the builder).
    It refers to its metadata weakly, so a dropped metadata object is freed
    (and its builders pooled) at once, not by the cycle collector."""

    __slots__ = ("_metadata", "__weakref__")

    def __init__(self, metadata):
        self._metadata = weakref.ref(metadata)

    @property
    def metadata(self):
        return self._metadata()

    def __repr__(self):
        return "<pmla.flash_mla num_splits of %r>" % (self.metadata,)


class MLAMetadata(_Opaque):
    """FlashMLA's tile_scheduler_metadata: the builders and the plan of one
    step. Opaque; made by get_mla_metadata."""

    def __init__(self, batch, num_q_tokens_per_head_k, num_heads_q, topk):
        self.batch = batch
        self.num_q_tokens_per_head_k = num_q_tokens_per_head_k
        self.num_heads_q = num_heads_q
        self.topk = topk
        self._builders = {}
        self._plan = None  # (builder, mode, inputs..., derived tensors)
        self._qo = {}
        self.num_splits = _NumSplits(self)
        # held by each flash_mla_with_kvcache call: the object's builders and
        # plan serve one thread at a time
        self._busy = threading.Lock()

    def __copy__(self):
        """The same step with builders of its own: two objects never share
        a builder (each plans it for itself and gives it back when dropped)."""
        return MLAMetadata(self.batch, self.num_q_tokens_per_head_k, self.num_heads_q, self.topk)

    def __deepcopy__(self, memo):
        return self.__copy__()

    def _builder(self, key):
        b = self._builders.get(key)
        if b is None or b._h is None:  # closed since (its plugin closed, say)
            b = self._builders[key] = _take_builder(key)
        return b

    def release(self):
        """Returns this step's builders to the pool now (also done when the
        object is dropped). Refused (RuntimeError) while a
        flash_mla_with_kvcache call on this object runs on another thread."""
        if not self._busy.acquire(False):
            raise RuntimeError("pmla.flash_mla: release() while this tile_scheduler_metadata "
                               "is in use by another thread's flash_mla_with_kvcache; release "
                               "it once that call has returned")
        try:
            builders, self._builders, self._plan = self._builders, {}, None
        finally:
            self._busy.release()
        for key, b in builders.items():
            if b._h is not None:
                _give_back(key, b)

    def __del__(self):
        if sys is None or sys.is_finalizing():
            return
        try:
            self.release()
        except Exception:  # pragma: no cover - never raise from a finalizer
            pass

    def __repr__(self):
        return "<pmla.flash_mla.MLAMetadata batch=%s q_tokens_per_head_k=%s builders=%d>" % (
            self.batch, self.num_q_tokens_per_head_k, len(self._builders))


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=1,
                     num_heads_q=None, is_fp8_kvcache=False, topk=None):
    """FlashMLA's get_mla_metadata, in both of its forms: with the step's
    arguments (cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...) or
    with none (FlashMLA's newest API). Returns (tile_scheduler_metadata,
    num_splits): opaque objects for flash_mla_with_kvcache. No device work:
    the step is planned on the first flash_mla_with_kvcache call."""
    if num_heads_k != 1:
        raise _not_served("num_heads_k = %r" % (num_heads_k,))
    batch = None
    if cache_seqlens is not None:
        shape = getattr(cache_seqlens, "shape", None)
        batch = int(shape[0]) if shape is not None and len(shape) == 1 else None
    meta = MLAMetadata(batch, num_q_tokens_per_head_k, num_heads_q, topk)
    return meta, meta.num_splits


def _capacity(n, what):
    """The builder's max_batch for a step of n pmla requests: the next power
    of two (so nearby sizes share pooled builders), at most what
    init_builder accepts."""
    if n > _MAX_REQUESTS:
        raise _not_served("%s = %d requests in one call (at most %d)" % (what, n, _MAX_REQUESTS))
    return min(1 << max(0, (int(n) - 1).bit_length()), _MAX_REQUESTS)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None,
                           topk_length=None, extra_topk_length=None):
    """FlashMLA's flash_mla_with_kvcache.

    q [b, s_q, h_q, 576] bf16; k_cache [num_blocks, page_block_size, 1, 576]
    bf16; block_table int32 [b, max_blocks] and cache_seqlens int32 [b]
    (dense), or indices int32 [b, s_q, topk] of KV slots (block * page +
    offset, -1 unused; sparse). causal: with s_q > 1, query row j of a
    request of length L sees positions [0, L - s_q + 1 + j); otherwise each
    row sees all L. Returns out [b, s_q, h_q, 512] (q's dtype) and lse
    [b, h_q, s_q] fp32; a row with nothing to attend gives out 0 and lse
    +inf. Sparse steps also take topk_length int32 [b] (request i reads only
    indices[i, :, :topk_length[i]]) and attn_sink fp32 [h_q] (out scaled by
    exp(lse) / (exp(lse) + exp(attn_sink)), lse unchanged; applied here to
    the bf16 out, so it is rounded once more than in FlashMLA). A second
    cache (extra_k_cache, extra_indices_in_kvcache, extra_topk_length) is
    not served. q, block_table, cache_seqlens and indices may be strided
    (copied when they are); k_cache must be contiguous."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        raise TypeError("pmla.flash_mla: q must be a torch.Tensor (got %s)" % type(q).__name__)
    for name, x in (("k_cache", k_cache), ("block_table", block_table),
                    ("cache_seqlens", cache_seqlens), ("indices", indices),
                    ("attn_sink", attn_sink), ("topk_length", topk_length)):
        if not (x is None and name != "k_cache") and not isinstance(x, torch.Tensor):
            raise TypeError("pmla.flash_mla: %s must be a torch.Tensor%s (got %s)"
                            % (name, "" if name == "k_cache" else " or None", type(x).__name__))
    meta = tile_scheduler_metadata
    if not isinstance(meta, MLAMetadata):
        raise TypeError("pmla.flash_mla: tile_scheduler_metadata must come from "
                        "pmla.flash_mla.get_mla_metadata (got %s)" % type(meta).__name__)
    if not meta._busy.acquire(False):
        raise RuntimeError("pmla.flash_mla: this tile_scheduler_metadata is in use by another "
                           "thread; pmla's metadata holds builders that serve one thread at a "
                           "time: make one with get_mla_metadata for each thread")
    try:
        return _with_kvcache(torch, q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                             softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                             extra_k_cache, extra_indices_in_kvcache, topk_length,
                             extra_topk_length)
    finally:
        meta._busy.release()


def _with_kvcache(torch, q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                  softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                  extra_indices_in_kvcache, topk_length, extra_topk_length):
    if extra_k_cache is not None or extra_indices_in_kvcache is not None or \
            extra_topk_length is not None:
        raise _not_served("a second KV cache (extra_k_cache, extra_indices_in_kvcache, "
                          "extra_topk_length)")
    if indices is None and (attn_sink is not None or topk_length is not None):
        raise ValueError("pmla.flash_mla: attn_sink and topk_length are for sparse attention "
                         "(with indices); FlashMLA's dense decode takes neither")
    if indices is not None and causal:
        raise ValueError("pmla.flash_mla: causal must be False with indices (sparse "
                         "attention), as in FlashMLA")
    if is_fp8_kvcache and indices is None:
        raise _not_served("a dense fp8 KV cache (is_fp8_kvcache=True without indices)")
    if head_dim_v != _abi.KV_LORA_RANK:
        raise _not_served("head_dim_v = %r" % (head_dim_v,))
    if topk_length is not None and (topk_length.dtype.is_floating_point or
                                    topk_length.dtype.is_complex or
                                    topk_length.dtype == torch.bool):
        raise ValueError("pmla.flash_mla: topk_length has dtype %s; expected int32 [batch]"
                         % (topk_length.dtype,))
    if q.dim() != 4:
        raise ValueError("pmla.flash_mla: q has shape %s; expected [batch, s_q, heads_q, 576]"
                         % (tuple(q.shape),))
    if q.shape[-1] != _abi.HEAD_DIM:
        raise _not_served("head_dim = %d" % q.shape[-1])
    if q.dtype != torch.bfloat16:
        raise _not_served("q dtype %s" % q.dtype)
    if k_cache.dim() != 4:
        raise ValueError("pmla.flash_mla: k_cache has shape %s; expected [num_blocks, "
                         "page_block_size, 1, 576]" % (tuple(k_cache.shape),))
    if k_cache.shape[2] != 1:
        raise _not_served("num_heads_k = %d" % k_cache.shape[2])
    if is_fp8_kvcache:  # DeepSeek V3.2's 656-byte rows, as bytes
        if k_cache.shape[3] != _DS_MLA_BYTES or k_cache.dtype not in (
                torch.uint8, torch.int8, getattr(torch, "float8_e4m3fn", torch.uint8)):
            raise _not_served("an fp8 KV cache of %s x %d (pmla serves DeepSeek V3.2's "
                              "layout: %d bytes per token)" % (k_cache.dtype, k_cache.shape[3],
                                                               _DS_MLA_BYTES))
        kv_dtype = "fp8_ds_mla"
    elif k_cache.shape[3] != _abi.HEAD_DIM:
        raise _not_served("a KV cache head_dim of %d" % k_cache.shape[3])
    elif k_cache.dtype != torch.bfloat16:
        raise _not_served("KV cache dtype %s" % k_cache.dtype)
    else:
        kv_dtype = "bf16"
    if not k_cache.is_contiguous():
        # a copy of the whole cache on every call would cost more than the
        # attention; pmla reads pages of one contiguous tensor
        raise _not_served("a k_cache that is not contiguous (strides %s, where pmla reads "
                          "one contiguous [num_blocks, page_block_size, 1, %d] tensor)"
                          % (tuple(k_cache.stride()), k_cache.shape[3]))
    b, s_q, h_q, _ = (int(x) for x in q.shape)
    page = int(k_cache.shape[1])
    if attn_sink is not None and (tuple(attn_sink.shape) != (h_q,) or
                                  attn_sink.dtype != torch.float32):
        raise ValueError("pmla.flash_mla: attn_sink has shape %s and dtype %s; expected "
                         "[%d] float32" % (tuple(attn_sink.shape), attn_sink.dtype, h_q))
    if softmax_scale is None:
        scale = _abi.HEAD_DIM ** -0.5
    else:
        try:
            scale = float(softmax_scale)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("pmla.flash_mla: softmax_scale = %r; expected a float"
                             % (softmax_scale,)) from None
    if q.is_cuda:
        backend, device = "pmla", q.device.index if q.device.index is not None else \
            torch.cuda.current_device()
    else:
        backend, device = "pmla-cpu", 0
    tokens = b * s_q
    if block_table is not None and (block_table.dim() != 2 or int(block_table.shape[0]) != b):
        raise ValueError("pmla.flash_mla: block_table has shape %s; expected [%d, max_blocks] "
                         "(q's batch)" % (tuple(block_table.shape), b))
    if cache_seqlens is not None and tuple(cache_seqlens.shape) != (b,):
        raise ValueError("pmla.flash_mla: cache_seqlens has shape %s; expected [%d] (q's "
                         "batch)" % (tuple(cache_seqlens.shape), b))

    if indices is not None:
        mode = "sparse"
        if indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s_q):
            raise ValueError("pmla.flash_mla: indices has shape %s; expected [%d, %d, topk]"
                             % (tuple(indices.shape), b, s_q))
        topk = int(indices.shape[2])
        if topk < 1:
            raise ValueError("pmla.flash_mla: indices has shape %s; expected [%d, %d, topk] "
                             "with topk >= 1" % (tuple(indices.shape), b, s_q))
        if meta.topk is not None and meta.topk != topk:
            raise ValueError("pmla.flash_mla: indices has topk %d; the metadata was made for "
                             "topk=%d" % (topk, meta.topk))
        key = (backend, device, h_q, page, 1, topk, scale, _capacity(tokens, "b * s_q"),
               kv_dtype)
    elif causal and s_q > 1:
        mode = "causal"
        if s_q > 8:
            raise _not_served("causal decode with s_q = %d (at most 8 query tokens per "
                              "request)" % s_q)
        key = (backend, device, h_q, page, s_q, 0, scale, _capacity(b, "b"), kv_dtype)
    else:
        mode = "flat"  # every query row sees the whole cache: one request per row
        key = (backend, device, h_q, page, 1, 0, scale,
               _capacity(tokens, "b" if s_q == 1 else "b * s_q (causal=False)"), kv_dtype)
    builder = meta._builder(key)

    # FlashMLA reads block_table and indices on every call (DeepSeek V3.2
    # rewrites one indices buffer per layer under one metadata); the plan
    # depends only on the shapes and the lengths. pmla-cpu plans again every
    # call, so its checks see the values as they are now; on a GPU, where the
    # kernels read the remembered tensors as they are, the copies a plan was
    # made from (masked, repeated or made contiguous) are taken again.
    plan = meta._plan
    inputs = (block_table, cache_seqlens, indices, topk_length)
    # the same tensors, also where they are now: set_ or resize_ moves a
    # tensor's memory under the same object
    where = tuple(None if x is None else (x.data_ptr(), tuple(x.shape), x.stride())
                  for x in inputs)
    if plan is None or plan[0] is not builder or plan[1] != mode or \
            any(x is not y for x, y in zip(plan[2], inputs)) or plan[3] != (b, s_q, where) or \
            builder._step_kind is None or backend == "pmla-cpu":
        meta._plan = None  # until this plan is made
        refresh = _plan(meta, builder, mode, q, k_cache, block_table, cache_seqlens, indices,
                        topk_length, b, s_q, page)
        meta._plan = (builder, mode, inputs, (b, s_q, where), refresh)
    else:
        for copy_again in plan[4]:
            copy_again()

    q2 = q.reshape(tokens, h_q, _abi.HEAD_DIM)
    if not q2.is_contiguous():
        q2 = q2.contiguous()
    if is_fp8_kvcache and k_cache.dtype != torch.uint8:
        k_cache = k_cache.view(torch.uint8)
    out, lse = builder.run(q2, k_cache)
    if attn_sink is not None:
        out = _sink(torch, out, lse, attn_sink)
    out = out.view(b, s_q, h_q, _abi.KV_LORA_RANK)
    lse = lse.view(b, s_q, h_q).transpose(1, 2).contiguous()
    lse.masked_fill_(lse == -math.inf, math.inf)  # FlashMLA: +inf for an empty row
    return out, lse


def _sink(torch, out, lse, attn_sink):
    """out [tokens, h_q, 512] times exp(lse) / (exp(lse) + exp(sink)) per
    head; lse [tokens, h_q] natural log, -inf for an empty row (out 0);
    attn_sink [h_q] float32, checked by the caller."""
    w = torch.sigmoid(lse - attn_sink.to(lse.device))
    w = torch.where(torch.isneginf(lse), torch.zeros_like(w), w)  # not NaN for -inf - -inf
    return (out.float() * w.unsqueeze(-1)).to(out.dtype)


def _derived(derive, source, copies):
    """derive(source) for a plan; where that is a copy (not a view of
    source), a function that takes it again into the same memory joins
    copies."""
    out = derive(source)
    if out.data_ptr() != source.data_ptr():
        copies.append(lambda: out.copy_(derive(source)))
    return out


def _plan(meta, builder, mode, q, k_cache, block_table, cache_seqlens, indices, topk_length,
          b, s_q, page):
    """Plans the step; returns the functions that take its copies of the
    caller's tensors again (for a later call with the same tensors)."""
    torch = sys.modules["torch"]
    dev = q.device
    copies = []
    if block_table is not None:
        block_table = _derived(lambda t: t.contiguous(), block_table, copies)
    if cache_seqlens is not None:
        cache_seqlens = _derived(lambda t: t.contiguous(), cache_seqlens, copies)
    if mode == "sparse":
        if topk_length is not None:  # positions past a request's length read nothing
            if tuple(topk_length.shape) != (b,):
                raise ValueError("pmla.flash_mla: topk_length has shape %s; expected [%d]"
                                 % (tuple(topk_length.shape), b))
            past = torch.arange(indices.shape[2], device=indices.device) >= \
                topk_length.to(indices.device).view(b, 1, 1)
            topk = _derived(
                lambda t: t.masked_fill(past, -1).reshape(b * s_q, t.shape[2]).contiguous(),
                indices, copies)
        else:
            topk = _derived(lambda t: t.reshape(b * s_q, t.shape[2]).contiguous(), indices,
                            copies)
        if cache_seqlens is not None and not cache_seqlens.is_cuda and cache_seqlens.numel():
            max_seq_len = int(cache_seqlens.max())
        else:  # an upper bound without a device sync (it only sets the split cap)
            max_seq_len = int(k_cache.shape[0]) * page
        with _rows_named("topk_indices[t] is indices[t // %d][t %% %d]" % (s_q, s_q),
                         s_q > 1):
            builder.plan_sparse(topk, max_seq_len)
        return copies
    if block_table is None or cache_seqlens is None:
        raise ValueError("pmla.flash_mla: dense decode needs block_table and cache_seqlens "
                         "(or pass indices for sparse decode)")
    if mode == "causal":
        qk = ("causal", b, s_q, str(dev))
        qo = meta._qo.get(qk)
        if qo is None:
            qo = meta._qo[qk] = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32,
                                             device=dev)
        builder.plan(qo, block_table=block_table, kv_lens=cache_seqlens)
        return copies
    qk = ("flat", b * s_q, str(dev))
    qo = meta._qo.get(qk)
    if qo is None:
        qo = meta._qo[qk] = torch.arange(0, b * s_q + 1, dtype=torch.int32, device=dev)
    if s_q > 1:
        block_table = _derived(lambda t: t.repeat_interleave(s_q, dim=0), block_table, copies)
        cache_seqlens = _derived(lambda t: t.repeat_interleave(s_q), cache_seqlens, copies)
    with _rows_named("with causal=False each query row is a request of its own: kv_lens[i] "
                     "and block_table[i] are cache_seqlens[i // %d] and block_table[i // %d]"
                     % (s_q, s_q), s_q > 1):
        builder.plan(qo, block_table=block_table, kv_lens=cache_seqlens)
    return copies


class _rows_named:
    """Appends to a pmla error raised inside how its indices map to the
    caller's (a step planned over rows derived from FlashMLA's arguments)."""

    def __init__(self, mapping, when):
        self.mapping, self.when = mapping, when

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if self.when and isinstance(err, PmlaError) and err.message:
            err.message += " (pmla.flash_mla: %s)" % self.mapping
            err.args = (err.message,)
        return False
