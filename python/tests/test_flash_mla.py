# SPDX-License-Identifier: MIT
"""pmla.flash_mla (FlashMLA's decode API) on pmla-cpu against a small
reference of FlashMLA's semantics: out [b, s_q, h, 512], lse [b, h, s_q],
causal rows for s_q > 1, out 0 and lse +inf for a row with nothing to attend."""
import copy
import gc
import threading
import unittest

from _support import (D, DV, another_thread_inside, assert_close, bits_f64, need_torch, np,
                      pmla, rand_bits, ref_decode, torch, torch_bf16, torch_f64, visible)

fm = pmla.flash_mla


def flash_ref(q, kv, block_table, seqlens, page, causal, indices=None, scale=D ** -0.5):
    """FlashMLA's results in float64: q [b, s_q, h, 576], kv [slots, 576]."""
    b, s_q, h, _ = q.shape
    lists = []
    for r in range(b):
        for j in range(s_q):
            if indices is not None:
                lists.append([int(x) for x in indices[r, j]])
                continue
            L = int(seqlens[r])
            n = visible(L, s_q, j) if causal else L
            lists.append([int(block_table[r][p // page]) * page + p % page for p in range(n)])
    out, lse = ref_decode(q.reshape(b * s_q, h, D), kv, lists, scale)
    lse = np.where(np.isneginf(lse), np.inf, lse)
    return out.reshape(b, s_q, h, DV), lse.reshape(b, s_q, h).transpose(0, 2, 1)


class Case:
    def __init__(self, seed, lens, s_q, h=16, page=16, blocks=None):
        rng = self.rng = np.random.default_rng(seed)
        self.b, self.s_q, self.h, self.page = len(lens), s_q, h, page
        need = [max(1, -(-L // page)) for L in lens]
        blocks = blocks or sum(need) + 2
        self.q_bits = rand_bits(rng, (self.b, s_q, h, D))
        self.kv_bits = rand_bits(rng, (blocks, page, 1, D))
        perm = rng.permutation(blocks).tolist()
        width, table = max(need), []
        for n in need:
            table.append(perm[:n] + [0] * (width - n))
            perm = perm[n:]
        self.table = table
        self.lens = lens
        self.q = torch_bf16(self.q_bits)
        self.k_cache = torch_bf16(self.kv_bits)
        self.block_table = torch.tensor(table, dtype=torch.int32)
        self.cache_seqlens = torch.tensor(lens, dtype=torch.int32)

    def ref(self, causal, indices=None):
        return flash_ref(bits_f64(self.q_bits), bits_f64(self.kv_bits).reshape(-1, D),
                         self.table, self.lens, self.page, causal, indices)


def cut_to_lengths(idx, lengths):
    """indices [b, s_q, topk] with positions past topk_length[i] of request
    i set to -1: what FlashMLA's topk_length reads."""
    cut = idx.copy()
    past = np.arange(idx.shape[2])[None, None, :] >= np.asarray(lengths)[:, None, None]
    cut[np.broadcast_to(past, cut.shape)] = -1
    return cut


def in_place_layers(test, device):
    """FlashMLA reads block_table and indices on every call: one metadata
    object, the same tensors rewritten in place between layers (as DeepSeek
    V3.2 does with its indices), each layer against the reference. Covers
    the inputs pmla copies: indices masked by topk_length, a block table
    repeated for s_q > 1 without causal, a strided block table, and one
    moved to other memory under the same object."""
    c = Case(31, [40, 40, 25], 2, blocks=12)
    dev = torch.device(device)
    q, k_cache = c.q.to(dev), c.k_cache.to(dev)
    slots = c.k_cache.shape[0] * c.page
    topk = 16
    lengths = torch.tensor([16, 7, 11], dtype=torch.int32, device=dev)
    indices = torch.zeros(c.b, c.s_q, topk, dtype=torch.int32, device=dev)
    meta, _ = fm.get_mla_metadata()
    for layer in range(3):
        idx = c.rng.integers(0, slots, size=(c.b, c.s_q, topk)).astype(np.int32)
        indices.copy_(torch.from_numpy(idx))
        out, lse = fm.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None,
                                             indices=indices, topk_length=lengths)
        ref = c.ref(False, cut_to_lengths(idx, lengths.cpu().numpy()))
        assert_close(test, torch_f64(out), torch_f64(lse), ref[0], ref[1],
                     "%s sparse layer %d" % (device, layer))
    seqlens = c.cache_seqlens.to(dev)
    for strided in (False, True):
        wide = torch.zeros(c.b, 2 * 3, dtype=torch.int32, device=dev)
        table = wide[:, ::2] if strided else torch.zeros(c.b, 3, dtype=torch.int32, device=dev)
        meta, splits = fm.get_mla_metadata(seqlens, c.s_q * c.h, 1)
        for layer in range(3):
            perm = c.rng.permutation(c.k_cache.shape[0])[:9].reshape(3, 3).tolist()
            table.copy_(torch.tensor(perm, dtype=torch.int32))
            out, lse = fm.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, splits,
                                                 causal=False)
            ref = flash_ref(bits_f64(c.q_bits), bits_f64(c.kv_bits).reshape(-1, D), perm,
                            c.lens, c.page, False)
            assert_close(test, torch_f64(out), torch_f64(lse), ref[0], ref[1],
                         "%s dense s_q=2, %s table, layer %d"
                         % (device, "strided" if strided else "contiguous", layer))
    copied = meta._plan is not None and bool(meta._plan[4])  # the strided table's copies
    # a table that pmla reads itself (causal, contiguous: no copy), moved to
    # other memory under the same object (set_) and the old memory freed
    table = torch.tensor(perm, dtype=torch.int32, device=dev)
    for layer in range(3):
        perm = c.rng.permutation(c.k_cache.shape[0])[:9].reshape(3, 3).tolist()
        if layer:
            table.set_(torch.tensor(perm, dtype=torch.int32, device=dev))
        else:
            table.copy_(torch.tensor(perm, dtype=torch.int32))
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out, lse = fm.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, splits,
                                             causal=True)
        ref = flash_ref(bits_f64(c.q_bits), bits_f64(c.kv_bits).reshape(-1, D), perm, c.lens,
                        c.page, True)
        assert_close(test, torch_f64(out), torch_f64(lse), ref[0], ref[1],
                     "%s dense s_q=2 causal, table moved by set_, layer %d" % (device, layer))
    return meta, copied


@need_torch
class TestFlashMLA(unittest.TestCase):
    def check(self, c, out, lse, causal, indices=None, what=""):
        self.assertEqual(tuple(out.shape), (c.b, c.s_q, c.h, DV))
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(tuple(lse.shape), (c.b, c.h, c.s_q))
        self.assertEqual(lse.dtype, torch.float32)
        ref_out, ref_lse = c.ref(causal, indices)
        assert_close(self, torch_f64(out), torch_f64(lse), ref_out, ref_lse, what)

    def test_dense_causal_s_q_1_to_4(self):
        for s_q in (1, 2, 3, 4):
            c = Case(s_q, [0, 2, 16, 45, 70], s_q)
            meta, splits = fm.get_mla_metadata(c.cache_seqlens, s_q * c.h, 1)
            out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table,
                                                 c.cache_seqlens, 512, meta, splits,
                                                 causal=True)
            self.check(c, out, lse, True, what="causal s_q=%d" % s_q)
            self.assertTrue(bool(torch.isposinf(lse[0]).all()))  # empty request: +inf
            self.assertTrue(bool((out[0] == 0).all()))

    def test_dense_not_causal(self):
        c = Case(7, [1, 30, 0], 3, h=32)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, 3 * c.h, 1, num_heads_q=c.h)
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens,
                                             512, meta, splits, causal=False)
        self.check(c, out, lse, False, what="not causal")

    def test_sparse_with_holes(self):
        c = Case(8, [40, 40], 2)
        topk = 24
        slots = c.k_cache.shape[0] * c.page
        idx = c.rng.integers(0, slots, size=(c.b, c.s_q, topk)).astype(np.int32)
        idx[c.rng.random(idx.shape) < 0.25] = -1
        idx[1, 0, :] = -1  # nothing to attend
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.s_q * c.h, 1, c.h, topk=topk)
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, None, c.cache_seqlens, 512, meta,
                                             splits, indices=torch.from_numpy(idx))
        self.check(c, out, lse, False, indices=idx, what="sparse")
        self.assertTrue(bool(torch.isposinf(lse[1, :, 0]).all()))
        self.assertTrue(bool((out[1, 0] == 0).all()))

    def test_sparse_fp8_ds_mla(self):
        # DeepSeek V3.2's cache: per token 512 e4m3 in 4 tiles with fp32
        # scales, then 64 bf16 rope; FlashMLA passes it as float8_e4m3fn bytes
        rng = np.random.default_rng(21)
        b, s_q, h, page, blocks, topk = 3, 2, 16, 64, 6, 128
        raw = rng.integers(0, 256, size=(blocks * page, 656), dtype=np.uint8)
        raw[:, :512] &= 0xbf  # finite e4m3 of magnitude <= 1.875
        scales = np.exp2(-rng.integers(0, 4, size=(blocks * page, 4))).astype(np.float32)
        raw[:, 512:528] = scales.view(np.uint8).reshape(-1, 16)
        rope = rand_bits(rng, (blocks * page, 64))
        raw[:, 528:] = rope.view(np.uint8).reshape(-1, 128)
        e = (raw[:, :512] >> 3) & 15
        m = (raw[:, :512] & 7).astype(np.float64)
        val = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * np.exp2(e - 7.0))
        val = np.where(raw[:, :512] & 0x80, -val, val) * np.repeat(scales, 128, axis=1)
        kv64 = np.concatenate([val, bits_f64(rope)], axis=1)
        idx = rng.integers(0, blocks * page, size=(b, s_q, topk)).astype(np.int32)
        idx[rng.random(idx.shape) < 0.2] = -1
        q_bits = rand_bits(rng, (b, s_q, h, D))
        k_cache = torch.from_numpy(raw.reshape(blocks, page, 1, 656))
        if hasattr(torch, "float8_e4m3fn"):
            k_cache = k_cache.view(torch.float8_e4m3fn)
        meta, splits = fm.get_mla_metadata(None, s_q * h, 1, h, is_fp8_kvcache=True, topk=topk)
        out, lse = fm.flash_mla_with_kvcache(torch_bf16(q_bits), k_cache, None, None, 512, meta,
                                             splits, is_fp8_kvcache=True,
                                             indices=torch.from_numpy(idx))
        ref_out, ref_lse = flash_ref(bits_f64(q_bits), kv64, None, None, page, False, idx)
        assert_close(self, torch_f64(out), torch_f64(lse), ref_out, ref_lse, "sparse fp8")

    def test_sparse_topk_length_and_attn_sink(self):
        # FlashMLA's newest arguments: request i reads indices[i, :, :topk_length[i]],
        # and attn_sink scales out by exp(lse) / (exp(lse) + exp(sink)) per head
        c = Case(14, [40, 40, 40], 2)
        topk = 16
        slots = c.k_cache.shape[0] * c.page
        idx = c.rng.integers(0, slots, size=(c.b, c.s_q, topk)).astype(np.int32)
        lengths = np.array([16, 5, 0], np.int32)
        sink = torch.from_numpy(c.rng.normal(size=c.h).astype(np.float32))
        sink[0], sink[1] = float("inf"), float("-inf")
        meta, _ = fm.get_mla_metadata()
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, None, None, 512, meta, None,
                                             indices=torch.from_numpy(idx),
                                             topk_length=torch.from_numpy(lengths),
                                             attn_sink=sink)
        ref_out, ref_lse = c.ref(False, cut_to_lengths(idx, lengths))
        s64 = sink.double().numpy()
        with np.errstate(over="ignore", invalid="ignore"):
            w = np.where(np.isposinf(ref_lse), 0.0, 1.0 / (1.0 + np.exp(s64[None, :, None] -
                                                                         ref_lse)))
        ref_out = ref_out * w.transpose(0, 2, 1)[..., None]
        assert_close(self, torch_f64(out), torch_f64(lse), ref_out, ref_lse, "sink, lengths")
        self.assertTrue(bool((out[:, :, 0] == 0).all()))  # sink +inf: out 0
        self.assertTrue(bool((out[2] == 0).all()) and bool(torch.isposinf(lse[2]).all()))

    def test_strided_inputs(self):
        # FlashMLA takes q and block_table with only their last dimension
        # contiguous; pmla copies those, and refuses a strided cache
        c = Case(15, [30, 9], 2)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.s_q * c.h, 1)
        wide_q = torch.zeros(c.b, c.s_q, 2 * c.h, D, dtype=torch.bfloat16)
        wide_q[:, :, ::2] = c.q
        wide_t = torch.zeros(c.b, 2 * c.block_table.shape[1], dtype=torch.int32)
        wide_t[:, ::2] = c.block_table
        out, lse = fm.flash_mla_with_kvcache(wide_q[:, :, ::2], c.k_cache, wide_t[:, ::2],
                                             c.cache_seqlens, 512, meta, splits, causal=True)
        self.check(c, out, lse, True, what="strided q and block_table")
        wide_k = torch.zeros(c.k_cache.shape[0], c.page, 1, 2 * D, dtype=torch.bfloat16)
        wide_k[..., :D] = c.k_cache
        with self.assertRaisesRegex(NotImplementedError, "not contiguous"):
            fm.flash_mla_with_kvcache(c.q, wide_k[..., :D], c.block_table, c.cache_seqlens, 512,
                                      meta, splits, causal=True)

    def test_one_metadata_many_layers(self):
        c = Case(9, [17, 33], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        for layer in range(3):
            kv = torch_bf16(rand_bits(c.rng, tuple(c.k_cache.shape)))
            out, lse = fm.flash_mla_with_kvcache(c.q, kv, c.block_table, c.cache_seqlens, 512,
                                                 meta, splits, causal=True)
            ref = flash_ref(bits_f64(c.q_bits), torch_f64(kv).reshape(-1, D), c.table, c.lens,
                            c.page, True)
            assert_close(self, torch_f64(out), torch_f64(lse), ref[0], ref[1], "layer %d" % layer)
        self.assertEqual(len(meta._builders), 1)

    def test_inputs_rewritten_in_place_between_layers(self):
        in_place_layers(self, "cpu")

    def test_metadata_is_not_a_tensor(self):
        # FlashMLA's older API returned int32 tensors that CUDA-graph paths
        # copy into buffers of their own; pmla's objects say they are not
        meta, splits = fm.get_mla_metadata(torch.tensor([5], dtype=torch.int32), 16, 1)
        for use in (lambda: meta.size(0), lambda: torch.zeros(4).copy_(meta),
                    lambda: splits[:2], lambda: torch.zeros(2).copy_(splits)):
            with self.assertRaisesRegex(NotImplementedError, "not a tensor"):
                use()
        self.assertFalse(hasattr(meta, "size"))

    def test_builders_return_to_the_pool(self):
        fm.clear_pool()
        c = Case(10, [5, 6], 1, h=64)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta,
                                  splits)
        (builder,) = meta._builders.values()
        del meta, splits
        gc.collect()
        meta2, splits2 = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens,
                                             512, meta2, splits2)
        self.assertIs(next(iter(meta2._builders.values())), builder)
        self.check(c, out, lse, False, what="pooled builder")
        fm.clear_pool()

    def test_dropped_metadata_never_hands_out_a_closed_builder(self):
        # the metadata and its builders become garbage together; the cycle
        # collector may close a builder after it went back to the pool
        fm.clear_pool()
        c = Case(12, [5, 6], 1, h=64)
        for i in range(4):
            meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
            out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table,
                                                 c.cache_seqlens, 512, meta, splits)
            self.check(c, out, lse, False, what="step %d" % i)
            del meta, splits, out, lse
            gc.collect()
        # a metadata object freed by the cycle collector while this thread
        # holds the pool's lock gives its builders back without deadlock
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta,
                                  splits)
        cycle = [meta]
        cycle.append(cycle)
        del meta, splits, cycle
        with fm._pool_lock:
            gc.collect()
        fm.clear_pool()

    def test_a_metadata_object_serves_one_thread_at_a_time(self):
        # its builders take one thread at a time: a second thread's call
        # while the first is inside one is refused, not run over the same
        # builders (which hung pmla-cpu's workers)
        c = Case(14, [9, 30], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        entered, release = threading.Event(), threading.Event()

        class Gated(torch.Tensor):
            """A block table whose data_ptr() waits: holds its caller
            inside flash_mla_with_kvcache"""
            __torch_function__ = torch._C._disabled_torch_function_impl

            def data_ptr(self):
                entered.set()
                release.wait(30)
                return super().data_ptr()

        gated = torch.Tensor._make_subclass(Gated, c.block_table)
        first = lambda: fm.flash_mla_with_kvcache(c.q, c.k_cache, gated, c.cache_seqlens, 512,
                                                  meta, splits)
        with another_thread_inside(first, entered, release) as got:
            with self.assertRaisesRegex(RuntimeError, "in use by another thread"):
                fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512,
                                          meta, splits)
        self.check(c, *got["result"], False, what="the first thread's call")
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512,
                                             meta, splits)
        self.check(c, out, lse, False, what="the next call")

    def test_the_pool_keeps_a_bounded_number_of_builders(self):
        # one metadata object per softmax scale, each released: the idle
        # builders kept for later steps stay within the pool's bound
        c = Case(20, [9], 1)
        fm.clear_pool()
        for i in range(fm._POOL_MAX + 8):
            meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
            fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta,
                                      splits, softmax_scale=0.01 * (i + 1))
            meta.release()
        with fm._pool_lock:
            idle = sum(map(len, fm._pool.values()))
        self.assertEqual(idle, fm._POOL_MAX)
        fm.clear_pool()

    def test_release_during_a_call_is_refused(self):
        # release() pooled the builders of a call in flight, which then ran
        # over a step another metadata object planned: wrong results, no error
        c = Case(17, [9, 30], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        seen = []

        class Releases(torch.Tensor):
            """A block table whose data_ptr() releases the metadata (as
            another thread would) inside flash_mla_with_kvcache"""
            __torch_function__ = torch._C._disabled_torch_function_impl

            def data_ptr(self):
                if not seen:
                    seen.append(1)
                    meta.release()
                return super().data_ptr()

        hook = torch.Tensor._make_subclass(Releases, c.block_table)
        with self.assertRaisesRegex(RuntimeError, "release\\(\\) while"):
            fm.flash_mla_with_kvcache(c.q, c.k_cache, hook, c.cache_seqlens, 512, meta, splits)
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512,
                                             meta, splits)
        self.check(c, out, lse, False, what="the call after the refused release")
        meta.release()

    def test_metadata_outlives_a_closed_plugin(self):
        # its builders closed with the default plugin: the next call takes
        # new ones instead of failing on every later call
        c = Case(18, [9, 30], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta,
                                  splits)
        fm.clear_pool()
        # the last registry that maps the plugin: the tests after this one
        # load it again (which crashed a GPU init_builder while dlclose
        # unmapped the plugin)
        pmla.default_plugin().close()
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512,
                                             meta, splits)
        self.check(c, out, lse, False, what="after the default plugin closed")

    def test_arguments_of_other_types_are_named(self):
        c = Case(19, [9], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        call = lambda **kw: fm.flash_mla_with_kvcache(
            c.q, kw.pop("k", c.k_cache), kw.pop("bt", c.block_table), kw.pop("seq", c.cache_seqlens),
            512, meta, splits, **kw)
        for kw, name in (({"k": c.k_cache.view(torch.int16).numpy()}, "k_cache"), ({"bt": [[0]]}, "block_table"),
                         ({"seq": [9]}, "cache_seqlens"),
                         ({"indices": [[[0]]]}, "indices"),
                         ({"topk_length": [1]}, "topk_length"),
                         ({"attn_sink": [0.0]}, "attn_sink")):
            with self.assertRaisesRegex(TypeError, "%s must be a torch.Tensor" % name,
                                        msg=repr(kw)):
                call(**kw)
        idx = torch.zeros(c.b, 1, 64, dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, "topk_length has dtype torch.float32"):
            call(bt=None, seq=None, indices=idx, topk_length=torch.tensor([1.5]))
        with self.assertRaisesRegex(ValueError, "softmax_scale = 10"):
            call(softmax_scale=10 ** 400)
        # attn_sink is checked before anything runs
        with self.assertRaisesRegex(ValueError, "attn_sink has shape"):
            call(bt=None, seq=None, indices=idx, attn_sink=torch.zeros(3))

    def test_a_copied_metadata_object_has_builders_of_its_own(self):
        # a copy that shared the original's builders would run the step the
        # other planned last, and give them back to the pool while in use
        c = Case(16, [9, 30], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens, 512, meta,
                                  splits)
        for dup in (copy.copy(meta), copy.deepcopy(meta)):
            out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens,
                                                 512, dup, dup.num_splits)
            self.check(c, out, lse, False, what="a copy")
            shared = set(map(id, meta._builders.values())) & set(map(id, dup._builders.values()))
            self.assertEqual(shared, set())

    def test_arguments_are_named_as_flash_mla_names_them(self):
        # pmla plans over rows derived from FlashMLA's arguments; its
        # refusals name the caller's arguments, or say how rows map to them
        c = Case(15, [9, 20, 5, 30], 2)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.s_q * c.h, 1)
        call = lambda bt=c.block_table, seq=c.cache_seqlens: fm.flash_mla_with_kvcache(
            c.q, c.k_cache, bt, seq, 512, meta, splits)
        with self.assertRaisesRegex(ValueError, r"cache_seqlens has shape \(3,\); expected \[4\]"):
            call(seq=c.cache_seqlens[:3])
        with self.assertRaisesRegex(ValueError, r"block_table has shape \(3, 2\); expected \[4, "):
            call(bt=c.block_table[:3])
        long = c.cache_seqlens.clone()
        long[1] = 300  # past the block table's two pages
        with self.assertRaisesRegex(pmla.InvalidArgument,
                                    r"kv_lens\[2\].*cache_seqlens\[i // 2\]"):
            call(seq=long)
        empty = torch.zeros(c.b, c.s_q, 0, dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, "topk >= 1"):
            fm.flash_mla_with_kvcache(c.q, c.k_cache, None, None, 512, meta, splits,
                                      indices=empty)
        # more query rows than one builder serves: said in FlashMLA's terms
        q = torch.zeros(1, 1, 1, D, dtype=torch.bfloat16).expand(8193, 8, 1, D)
        bt = torch.zeros(1, 1, dtype=torch.int32).expand(8193, 1)
        seq = torch.ones(8193, dtype=torch.int32)
        with self.assertRaisesRegex(NotImplementedError, r"b \* s_q .* = 65544 requests"):
            fm.flash_mla_with_kvcache(q, c.k_cache, bt, seq, 512, meta, splits)

    def test_metadata_without_arguments(self):
        # FlashMLA's newest form: get_mla_metadata() and plan on first use
        c = Case(13, [9, 0, 17], 2)
        meta, splits = fm.get_mla_metadata()
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens,
                                             512, meta, splits, causal=True)
        self.check(c, out, lse, True, what="get_mla_metadata()")

    def test_softmax_scale(self):
        c = Case(11, [20], 1)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens, c.h, 1)
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, c.cache_seqlens,
                                             512, meta, splits, softmax_scale=0.1)
        q64 = bits_f64(c.q_bits)
        ref_out, ref_lse = ref_decode(q64.reshape(1, c.h, D),
                                      bits_f64(c.kv_bits).reshape(-1, D),
                                      [[c.table[0][p // 16] * 16 + p % 16 for p in range(20)]],
                                      0.1)
        assert_close(self, torch_f64(out).reshape(1, c.h, DV), torch_f64(lse).reshape(1, c.h),
                     ref_out, ref_lse, "scale 0.1")

    def test_not_served(self):
        c = Case(12, [4], 1)
        seq = c.cache_seqlens
        with self.assertRaisesRegex(NotImplementedError, "num_heads_k"):
            fm.get_mla_metadata(seq, 2 * c.h, 2)
        meta, splits = fm.get_mla_metadata(seq, c.h, 1)
        call = lambda q=c.q, k=c.k_cache, **kw: fm.flash_mla_with_kvcache(
            q, k, c.block_table, seq, kw.pop("dv", 512), meta, splits, **kw)
        with self.assertRaisesRegex(NotImplementedError, "dense fp8"):
            call(is_fp8_kvcache=True)
        with self.assertRaisesRegex(NotImplementedError, "head_dim_v = 256"):
            call(dv=256)
        with self.assertRaisesRegex(NotImplementedError, "num_heads_k = 2"):
            call(k=c.k_cache.expand(-1, -1, 2, -1))
        with self.assertRaisesRegex(NotImplementedError, "float16"):
            call(q=c.q.half())
        with self.assertRaisesRegex(NotImplementedError, "num_heads = 256"):
            call(q=c.q.repeat(1, 1, 16, 1))
        with self.assertRaisesRegex(NotImplementedError, "s_q = 9"):
            call(q=c.q.expand(-1, 9, -1, -1).contiguous(), causal=True)
        with self.assertRaises(TypeError):
            fm.flash_mla_with_kvcache(c.q, c.k_cache, c.block_table, seq, 512, object())
        idx = torch.zeros(c.b, c.s_q, 8, dtype=torch.int32)
        with self.assertRaisesRegex(NotImplementedError, "second KV cache"):
            call(indices=idx, extra_k_cache=c.k_cache, extra_indices_in_kvcache=idx)
        if hasattr(torch, "float8_e5m2"):  # one byte a value, but not e4m3
            with self.assertRaisesRegex(NotImplementedError, "fp8 KV cache"):
                call(k=torch.zeros(2, 16, 1, 656, dtype=torch.float8_e5m2), indices=idx,
                     is_fp8_kvcache=True)
        with self.assertRaisesRegex(ValueError, "causal must be False"):
            call(indices=idx, causal=True)
        with self.assertRaisesRegex(ValueError, "sparse attention"):
            call(attn_sink=torch.zeros(c.h))
        with self.assertRaisesRegex(ValueError, "attn_sink has shape"):
            call(indices=idx, attn_sink=torch.zeros(c.h + 1))
        # FlashMLA's own sparse tests pass every argument, the unused as None
        out, lse = fm.flash_mla_with_kvcache(c.q, c.k_cache, None, None, 512, meta, None, None,
                                             False, False, idx, None, None, None, None, None)
        self.assertEqual(tuple(out.shape), (c.b, c.s_q, c.h, DV))


if __name__ == "__main__":
    unittest.main()
