# SPDX-License-Identifier: MIT
"""pmla.Builder: one pmla_builder, its plan (build_decode / build_sparse) and
its runs (decode)."""
import ctypes
import functools
import math
import operator
import sys
import threading

from . import _abi
from ._errors import BadState, InvalidArgument, LoadError, Unsupported, make_error
from ._plugin import Plugin, default_plugin
from ._tensor import as_tensor, current_stream, is_bool, same, stream_handle

_UINT32_MAX = 0xFFFFFFFF


def _int(value):
    """value as an int (numpy integers too), or None (bool is not one)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _float(value):
    """value as a float (numpy floats and ints too), or None (bool, str are not one)."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _uint(name, value):
    v = _int(value)
    if v is None or not 0 <= v <= _UINT32_MAX:
        raise InvalidArgument("Builder: %s = %r; accepted: an int in 0..2^32-1 (the plugin "
                              "checks the range it serves)" % (name, value))
    return v


def _in_use(what, call):
    return BadState("%s: the builder is in use by another thread; one builder is used by one "
                    "thread at a time (give each thread its own)" % what, call=call)


def _one_thread(what, call):
    """The method runs holding the builder's _busy lock, or raises BadState
    when another thread holds it."""
    def wrap(fn):
        @functools.wraps(fn)
        def method(self, *args, **kw):
            if not self._busy.acquire(False):
                raise _in_use(what, call)
            try:
                return fn(self, *args, **kw)
            finally:
                self._busy.release()
        return method
    return wrap


def _check_q_to_size(tq):
    """What the plugin checks of q that bounds out's size by q's, checked
    before out and lse are sized from q: a broadcast q of 2^31 tokens, or
    rows narrower than 576, is refused here, not by an allocator asked for
    terabytes (the plugin checks the rest)."""
    shape = tq.shape
    if len(shape) != 3 or shape[2] != _abi.HEAD_DIM:
        raise InvalidArgument("run: q has shape %r; accepted: [tokens, heads, %d]"
                              % (shape, _abi.HEAD_DIM), call="decode")
    if tq.dl.strides and 0 not in shape:
        expect = 1
        for i in (2, 1, 0):
            if shape[i] != 1 and tq.dl.strides[i] != expect:
                raise InvalidArgument("run: q: stride %d in dim %d; accepted: contiguous "
                                      "row-major (%d)" % (tq.dl.strides[i], i, expect),
                                      call="decode")
            expect *= shape[i]


class _Out:
    """An output the builder allocates on each run, in q's library."""

    __slots__ = ("dl", "shape_arr", "make", "ptr")

    def __init__(self, like, shape, code, bits):
        self.dl = dl = _abi.DLTensor()
        self.shape_arr = (ctypes.c_int64 * len(shape))(*shape)
        dl.device = like.dl.device
        dl.ndim = len(shape)
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
        dl.shape = self.shape_arr
        lib = like.lib
        if lib == "torch":
            torch = sys.modules["torch"]
            dtype = torch.bfloat16 if code == _abi.kDLBfloat else torch.float32
            device = like.obj.device
            self.make = lambda: torch.empty(shape, dtype=dtype, device=device)
            self.ptr = lambda t: t.data_ptr()
        elif lib == "numpy":
            np = sys.modules["numpy"]
            dtype = np.uint16 if code == _abi.kDLBfloat else np.float32  # bf16 as bits
            self.make = lambda: np.empty(shape, dtype)
            self.ptr = lambda a: a.__array_interface__["data"][0]
        elif lib == "cupy":
            cp = sys.modules["cupy"]
            dtype = cp.uint16 if code == _abi.kDLBfloat else cp.float32
            dev = like.dl.device.device_id

            def make():
                with cp.cuda.Device(dev):
                    return cp.empty(shape, dtype)
            self.make = make
            self.ptr = lambda a: a.data.ptr
        else:
            raise InvalidArgument(
                "run: out and lse are required when q is not a torch, numpy or CuPy array "
                "(q is a %s)" % type(like.obj).__name__)

    def new(self):
        t = self.make()
        self.dl.data = self.ptr(t)
        return t


class _RunCache:
    __slots__ = ("q", "kv", "out", "lse", "kv_scale", "want_lse", "tensors", "alloc_out",
                 "alloc_lse", "stream_fn", "stream_arg")


_KV_DTYPES = {"bf16": _abi.DTYPE_BF16, "fp8_e4m3": _abi.DTYPE_FP8_E4M3,
              "fp8_ds_mla": _abi.DTYPE_FP8_DS_MLA}


def _kv_dtype(value):
    if isinstance(value, str) and value in _KV_DTYPES:
        return _KV_DTYPES[value]
    code = _int(value)
    if code is not None and code in _KV_DTYPES.values():
        return code
    raise InvalidArgument("Builder: kv_dtype = %r; accepted: %s" % (
        value, ", ".join(repr(k) for k in _KV_DTYPES)))


class Builder:
    """One pmla builder: init_builder's persistent buffers, a step's schedule
    (plan / plan_sparse) and decodes over it (run).

    num_heads: query heads (1..128 with this plugin; pmla.h's PMLA_MAX_HEADS). backend:
    "pmla" (GPU) or "pmla-cpu". page_size: KV tokens per page (power of two,
    1..256). max_batch: requests per step. max_q_len: query tokens per request
    (1..8; causal MTP). topk: 0 for dense only, else the sparse top-k width.
    softmax_scale: default 576**-0.5. device: GPU ordinal (0 for pmla-cpu).
    cu_count: 0 = every CU / every CPU of the calling thread's affinity
    mask. plugin: a pmla.Plugin (default: load()).
    batch_invariant: a request's out and lse do not depend on the rest of
    the step nor on cu_count (PMLA_BUILDER_BATCH_INVARIANT).
    invariant_chunk: with batch_invariant, the least chunk a request is read
    in, in KV positions (a multiple of 64 up to 2**20; 0: the plugin's).
    kv_dtype: the KV cache's storage, "bf16", "fp8_e4m3" (576 e4m3 per token;
    run() then needs kv_scale) or "fp8_ds_mla" (DeepSeek V3.2's 656 bytes).

    One builder is used by one thread at a time. Tensors given to plan() are
    held until the next plan(); the caller must not change them before the
    last run() of that step."""

    def __init__(self, num_heads, *, backend="pmla", page_size=64, max_batch=256, max_q_len=1,
                 topk=0, softmax_scale=None, device=0, cu_count=0, plugin=None,
                 batch_invariant=False, kv_dtype="bf16", invariant_chunk=0):
        self._h = None
        if plugin is not None and not isinstance(plugin, Plugin):
            raise InvalidArgument("Builder: plugin = %r; accepted: a pmla.Plugin (pmla.load()) "
                                  "or None (the default plugin)" % (plugin,))
        self._plugin = plugin if plugin is not None else default_plugin()
        be = self._plugin.backend(backend)
        scale = _abi.HEAD_DIM ** -0.5 if softmax_scale is None else _float(softmax_scale)
        if scale is None:
            raise InvalidArgument("Builder: softmax_scale = %r; accepted: a float (the plugin "
                                  "checks the range it serves)" % (softmax_scale,))
        f32 = ctypes.c_float(scale).value
        if math.isfinite(scale) and scale != 0 and (f32 == 0 or not math.isfinite(f32)):
            # the config holds a float: say what the caller gave, not what it
            # rounds to
            raise InvalidArgument("Builder: softmax_scale = %r rounds to %r as the config's "
                                  "float32; accepted: a finite value > 0 up to FLT_MAX / "
                                  "log2(e) (about 2.3586e38)" % (softmax_scale, f32),
                                  call="init_builder")
        dev = _int(device)
        if dev is None or not -2**31 <= dev < 2**31:
            raise InvalidArgument("Builder: device = %r; accepted: an int ordinal" % (device,))
        device = dev
        num_heads, page_size, max_batch, max_q_len, topk, cu_count, invariant_chunk = (
            _uint(n, v) for n, v in (("num_heads", num_heads), ("page_size", page_size),
                                     ("max_batch", max_batch), ("max_q_len", max_q_len),
                                     ("topk", topk), ("cu_count", cu_count),
                                     ("invariant_chunk", invariant_chunk)))
        kvd = _kv_dtype(kv_dtype)
        if not is_bool(batch_invariant):
            raise InvalidArgument("Builder: batch_invariant = %r (%s); accepted: a bool"
                                  % (batch_invariant, type(batch_invariant).__name__))
        batch_invariant = bool(batch_invariant)
        if batch_invariant or invariant_chunk or kvd != _abi.DTYPE_BF16:
            # 1.1 features: a 1.0 plugin would ignore flags (the tail of a
            # larger config) and refuses FP8 caches
            agreed = next((b.agreed_version for b in self._plugin.backends
                           if b.name == backend), None)
            if agreed is not None and tuple(int(x) for x in agreed.split(".")) < (1, 1):
                raise Unsupported("Builder: %s needs ABI 1.1; backend %r agreed %s" % (
                    "batch_invariant" if batch_invariant
                    else "invariant_chunk" if invariant_chunk else "kv_dtype=%r" % (kv_dtype,),
                    backend, agreed), call="init_builder")
        cfg = _abi.BuilderConfig(
            struct_size=ctypes.sizeof(_abi.BuilderConfig), num_heads=num_heads,
            kv_lora_rank=_abi.KV_LORA_RANK, rope_dim=_abi.ROPE_DIM, q_dtype=_abi.DTYPE_BF16,
            kv_dtype=kvd, out_dtype=_abi.DTYPE_BF16,
            page_size=page_size, max_batch=max_batch,
            max_q_len=max_q_len, topk=topk,
            softmax_scale=scale, device=device, cu_count=cu_count,
            flags=_abi.BUILDER_BATCH_INVARIANT if batch_invariant else 0,
            invariant_chunk=invariant_chunk)
        self._be = be
        self._decode = be.decode
        self.backend = be.name
        self.config = {"num_heads": num_heads, "page_size": page_size, "max_batch": max_batch,
                       "max_q_len": max_q_len, "topk": topk, "softmax_scale": cfg.softmax_scale,
                       "device": device, "cu_count": cu_count,
                       "batch_invariant": bool(batch_invariant), "kv_dtype": kv_dtype,
                       "invariant_chunk": invariant_chunk}
        self._batch = _abi.DecodeBatch(struct_size=ctypes.sizeof(_abi.DecodeBatch))
        self._sparse = _abi.SparseBatch(struct_size=ctypes.sizeof(_abi.SparseBatch))
        self._args = _abi.DecodeArgs(struct_size=ctypes.sizeof(_abi.DecodeArgs))
        self._args_addr = ctypes.addressof(self._args)
        self._step = None  # {name: Tensor} of the step built last
        self._step_kind = None
        self._rc = None
        # held for each call into the native builder: a second thread's call
        # meanwhile is refused (pmla.h: one builder is used by one thread at a
        # time; overlapping calls could hang or corrupt the step)
        self._busy = threading.Lock()
        plugin = self._plugin
        # under the lock Plugin.close takes first: no close unloads the plugin
        # between this check and the builder's adoption (init_builder and
        # last_error run inside the plugin), and a close begun after it sees
        # this builder
        with plugin._lock:
            if plugin._closing:
                raise LoadError("Builder: the plugin was closed (Plugin.close); load another")
            handle = ctypes.c_void_p()
            st = be.init_builder(ctypes.addressof(cfg), ctypes.byref(handle))
            if st != _abi.OK:
                raise make_error(st, be.error_message(None), "init_builder")
            self._h = handle.value
            be.registry.adopt(self._h, be.destroy_builder)
            plugin._builders.add(self)

    # ---- helpers
    def _handle(self, call):
        if self._h is None:
            raise BadState("the builder is closed", call=call)
        return self._h

    def _fail(self, st, call):
        raise make_error(st, self._be.error_message(self._h), call)

    def _tensors(self, call, pairs, required):
        prev = self._step or {}
        out = {}
        for name, obj in pairs:
            if obj is None and name not in required:
                continue  # as_tensor refuses a required one
            t = prev.get(name)
            out[name] = t if same(t, obj) else as_tensor(obj, "%s: %s" % (call, name))
        return out

    @staticmethod
    def _stream(stream, first):
        if stream is not None:
            return stream_handle(stream)
        return current_stream(first) if first.is_gpu else 0

    # ---- queries
    @property
    @_one_thread("info", "query_builder")
    def info(self):
        """query_builder: cu_count, sched_units, split_cap, max_requests,
        max_work_items, max_partial_slots, buffer_bytes ({name: bytes}),
        total_bytes."""
        return self._query()

    def _query(self):
        h = self._handle("query_builder")
        info = _abi.BuilderInfo(struct_size=ctypes.sizeof(_abi.BuilderInfo))
        st = self._be.query_builder(h, ctypes.addressof(info))
        if st != _abi.OK:
            self._fail(st, "query_builder")
        d = {f: getattr(info, f) for f in ("cu_count", "sched_units", "split_cap",
                                           "max_requests", "max_work_items",
                                           "max_partial_slots")}
        d["buffer_bytes"] = dict(zip(_abi.BUFFER_NAMES, info.buffer_bytes))
        d["total_bytes"] = info.total_bytes
        return d

    @_one_thread("buffer", "copy_buffer")
    def buffer(self, name):
        """A copy of one persistent buffer (see pmla.h) as bytes; waits for
        pending work. For tests and debugging."""
        if name not in _abi.BUFFER_NAMES:
            raise InvalidArgument("buffer: %r; accepted: %s" % (name, ", ".join(_abi.BUFFER_NAMES)))
        which = _abi.BUFFER_NAMES.index(name)
        size = self._query()["buffer_bytes"][name]
        dst = ctypes.create_string_buffer(max(size, 1))
        st = self._be.copy_buffer(self._handle("copy_buffer"), which, dst, size)
        if st != _abi.OK:
            self._fail(st, "copy_buffer")
        return dst.raw[:size]

    # ---- plan
    @_one_thread("plan", "build_decode")
    def plan(self, qo_indptr, block_table=None, kv_lens=None, *, kv_indptr=None,
             kv_indices=None, kv_last_page_len=None, stream=None):
        """Builds the schedule of one dense step (build_decode). All int32 on
        the backend's device. Block-table layout: block_table [batch,
        max_pages] and kv_lens [batch]; CSR layout: kv_indptr [batch + 1],
        kv_indices [pages], kv_last_page_len [batch]. qo_indptr [batch + 1]
        gives each request's query rows (0..max_q_len, causal)."""
        h = self._handle("build_decode")
        self._step_kind = None  # a plan refused here leaves no step, as one the plugin refuses
        bt = block_table is not None or kv_lens is not None
        csr = kv_indptr is not None or kv_indices is not None or kv_last_page_len is not None
        if bt == csr or (bt and (block_table is None or kv_lens is None)) or \
                (csr and (kv_indptr is None or kv_indices is None or kv_last_page_len is None)):
            raise InvalidArgument(
                "plan: give block_table and kv_lens (block-table layout), or kv_indptr, "
                "kv_indices and kv_last_page_len (CSR layout)", call="build_decode")
        ts = self._tensors("plan", (("qo_indptr", qo_indptr), ("block_table", block_table),
                                    ("kv_lens", kv_lens), ("kv_indptr", kv_indptr),
                                    ("kv_indices", kv_indices),
                                    ("kv_last_page_len", kv_last_page_len)),
                           ("qo_indptr",))
        b = self._batch
        b.kv_layout = _abi.KV_BLOCK_TABLE if bt else _abi.KV_CSR
        for name in ("qo_indptr", "block_table", "kv_lens", "kv_indptr", "kv_indices",
                     "kv_last_page_len"):
            t = ts.get(name)
            setattr(b, name, t.addr if t is not None else None)
        b.stream = self._stream(stream, ts["qo_indptr"])
        st = self._be.build_decode(h, ctypes.addressof(b))
        # a failed build leaves no step: drop the old step's tensors either way
        self._step, self._step_kind = (ts, "dense") if st == _abi.OK else (None, None)
        if st != _abi.OK:
            self._fail(st, "build_decode")

    @_one_thread("plan_sparse", "build_sparse")
    def plan_sparse(self, topk_indices, max_seq_len, *, stream=None, split_cap=True):
        """Builds the schedule of one sparse step (build_sparse): topk_indices
        int32 [tokens, topk] of KV slots (page * page_size + offset, -1
        unused); max_seq_len, the step's longest KV length (host int, sets the
        split cap; split_cap=False schedules uncapped)."""
        h = self._handle("build_sparse")
        self._step_kind = None
        msl = _int(max_seq_len)
        if msl is None or not -2**63 <= msl < 2**63:
            raise InvalidArgument("plan_sparse: max_seq_len = %r; accepted: an int in "
                                  "0..2^63-1" % (max_seq_len,), call="build_sparse")
        max_seq_len = msl
        ts = self._tensors("plan_sparse", (("topk_indices", topk_indices),), ("topk_indices",))
        s = self._sparse
        s.flags = 0 if split_cap else _abi.SPARSE_NO_SPLIT_CAP
        s.topk_indices = ts["topk_indices"].addr
        s.max_seq_len = max_seq_len
        s.stream = self._stream(stream, ts["topk_indices"])
        st = self._be.build_sparse(h, ctypes.addressof(s))
        self._step, self._step_kind = (ts, "sparse") if st == _abi.OK else (None, None)
        if st != _abi.OK:
            self._fail(st, "build_sparse")

    # ---- run
    def _prepare(self, q, kv_cache, out, lse, kv_scale, want_lse):
        """The run's tensors and argument struct. Everything is checked
        before self._args changes, so a refused run leaves it pointing at
        the tensors of the cached run (self._rc), which keeps them alive."""
        c = _RunCache()
        c.q, c.kv, c.out, c.lse, c.kv_scale, c.want_lse = q, kv_cache, out, lse, kv_scale, \
            want_lse
        old = self._rc
        prev = old.tensors if old is not None else {}  # reused where the same objects come
        ts = {}
        bf16_kv = self.config["kv_dtype"] in ("bf16", _abi.DTYPE_BF16)
        for name, obj in (("q", q), ("kv_cache", kv_cache), ("out", out), ("lse", lse),
                          ("kv_scale", kv_scale)):
            if obj is None and name not in ("q", "kv_cache"):
                continue  # as_tensor refuses a required one
            t = prev.get(name)
            bf16 = name in ("q", "out") or (name == "kv_cache" and bf16_kv)
            ts[name] = t if same(t, obj) else as_tensor(obj, "run: " + name, bf16=bf16,
                                                        writable=name in ("out", "lse"))
        c.tensors = ts
        tq = ts["q"]
        c.alloc_out = c.alloc_lse = None
        if out is None or (lse is None and want_lse):
            _check_q_to_size(tq)
            T, H = tq.shape[0], tq.shape[1]
            if out is None:
                c.alloc_out = _Out(tq, (T, H, _abi.KV_LORA_RANK), _abi.kDLBfloat, 16)
            if lse is None and want_lse:
                c.alloc_lse = _Out(tq, (T, H), _abi.kDLFloat, 32)
        # the default stream, read on every run: torch's / CuPy's current one
        c.stream_fn = None
        c.stream_arg = None
        if tq.is_gpu:
            if tq.lib == "torch":
                torch = sys.modules["torch"]
                raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
                c.stream_fn = raw if raw is not None else \
                    (lambda d: torch.cuda.current_stream(d).cuda_stream)
                c.stream_arg = tq.dl.device.device_id
            elif tq.lib == "cupy":
                cp = sys.modules["cupy"]
                c.stream_fn = lambda _d: cp.cuda.get_current_stream().ptr
                c.stream_arg = 0
        a = self._args
        a.q = tq.addr
        a.kv_cache = ts["kv_cache"].addr
        a.kv_scale = ts["kv_scale"].addr if kv_scale is not None else None
        a.out = ctypes.addressof(c.alloc_out.dl) if c.alloc_out else ts["out"].addr
        if lse is not None:
            a.lse = ts["lse"].addr
        elif c.alloc_lse is not None:
            a.lse = ctypes.addressof(c.alloc_lse.dl)
        else:
            a.lse = None
        self._rc = c
        return c

    def run(self, q, kv_cache, out=None, lse=None, stream=None, *, return_lse=True,
            kv_scale=None):
        """One decode over the step built last: q bf16 [tokens, heads, 576],
        kv_cache [pages, page_size, 576] or [pages, page_size, 1, 576] (bf16;
        fp8_e4m3: uint8 or float8_e4m3fn; fp8_ds_mla: uint8 of width 656).
        kv_scale: fp32 [1] tensor on the cache's device, fp8_e4m3 only.
        Writes out bf16 [tokens, heads, 512] and lse fp32 [tokens, heads]
        (natural log; -inf for a row with nothing to attend, NaN for a row
        with a NaN score), allocating them
        with q's library when not given (return_lse=False: no lse). numpy
        and CuPy have no bfloat16: bf16 values travel as uint16 bit patterns.
        stream: a stream handle; default the current torch (or CuPy) stream
        for GPU tensors. Returns (out, lse)."""
        if not self._busy.acquire(False):  # inline: run() is the per-layer hot path
            raise _in_use("run", "decode")
        try:
            if self._step_kind is None and self._step is not None:
                # the plugin still holds the step before a plan refused here
                # (self._step keeps its tensors alive); running it would ignore
                # that refusal
                raise BadState("run: the last plan was refused, so there is no step to run; plan "
                               "again", call="decode")
            c = self._rc
            if c is None or c.q is not q or c.kv is not kv_cache or c.out is not out or \
                    c.lse is not lse or c.kv_scale is not kv_scale or c.want_lse is not return_lse \
                    or not all(t.check is None or t.check() == t.sig for t in c.tensors.values()):
                if self._h is None:
                    raise BadState("the builder is closed", call="decode")
                c = self._prepare(q, kv_cache, out, lse, kv_scale, return_lse)
            if c.alloc_out is not None:
                out = c.alloc_out.new()
            if c.alloc_lse is not None:
                lse = c.alloc_lse.new()
            if stream is not None:
                stream = stream if type(stream) is int and 0 <= stream < 2 ** 64 else \
                    stream_handle(stream)
            elif c.stream_fn is not None:
                stream = c.stream_fn(c.stream_arg)
            self._args.stream = stream
            st = self._decode(self._h, self._args_addr)
            if st:
                self._fail(st, "decode")
            return out, lse
        finally:
            self._busy.release()

    # ---- errors, lifetime
    @_one_thread("check_device_error", "check_device_error")
    def check_device_error(self):
        """Waits for the builder's pending work and reads (and clears) the
        device error word. Returns 0, or raises DeviceInputError whose .flags
        holds the bits."""
        h = self._handle("check_device_error")
        flags = ctypes.c_uint32(0)
        st = self._be.check_device_error(h, ctypes.byref(flags))
        if st != _abi.OK:
            err = make_error(st, self._be.error_message(h), "check_device_error")
            err.flags = flags.value
            raise err
        return flags.value

    def close(self):
        """Destroys the builder (frees its buffers). Idempotent. Refused
        (BadState) while another thread is inside a call on it."""
        if getattr(self, "_h", None) is None:
            return
        if not self._busy.acquire(False):
            raise _in_use("close", "destroy_builder")
        try:
            h, self._h = self._h, None
            self._step = self._rc = None
            if h is not None:
                self._be.registry.release(h)  # a no-op once the registry has closed it
        finally:
            self._busy.release()

    def __del__(self):
        if getattr(self, "_h", None) is None or sys is None or sys.is_finalizing():
            return
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<pmla.Builder %s heads=%d page_size=%d max_batch=%d max_q_len=%d topk=%d%s>" % (
            self.backend, self.config["num_heads"], self.config["page_size"],
            self.config["max_batch"], self.config["max_q_len"], self.config["topk"],
            "" if self._h is not None else " closed")
