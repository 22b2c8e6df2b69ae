# SPDX-License-Identifier: MIT
"""The GPU backend `pmla` through torch CUDA tensors: numerics, a CUDA graph
capturing plan + run and replaying equal to eager, device-side input errors,
flash_mla on CUDA. Skipped without CUDA or without a GPU build of pmla."""
import unittest

from _support import (D, DV, Problem, assert_close, bits_f64, cuda_available,
                      lists_block_table, need_torch, np, pmla, rand_bits, ref_decode, torch,
                      torch_bf16, torch_f64)

H = 16


def gpu_skip_reason():
    if not cuda_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        pmla.Builder(H, backend="pmla", max_batch=1).close()
    except pmla.NoDevice as e:
        return "the pmla backend has no GPU here: %s" % e.message
    return None


@need_torch
class TestGPU(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        reason = gpu_skip_reason()
        if reason:
            raise unittest.SkipTest(reason)

    def dense(self, seed, lens, s_q, page):
        need = [max(1, -(-L // page)) for L in lens]
        pages = sum(need) + 2
        pb = Problem(seed, s_q * len(lens), H, pages, page)
        perm = pb.rng.permutation(pages).tolist()
        table, width = [], max(need)
        for n in need:
            table.append(perm[:n] + [0] * (width - n))
            perm = perm[n:]
        qo = [s_q * r for r in range(len(lens) + 1)]
        return pb, qo, table

    def test_dense_and_sparse(self):
        page, s_q = 64, 2
        lens = [0, 1, 100, 700, 2049]
        pb, qo, table = self.dense(1, lens, s_q, page)
        cuda = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")
        with pmla.Builder(H, backend="pmla", page_size=page, max_batch=8, max_q_len=s_q,
                          topk=64) as b:
            b.plan(cuda(qo), block_table=cuda(table), kv_lens=cuda(lens))
            q = torch_bf16(pb.q_bits).cuda()
            kv = torch_bf16(pb.kv_bits).cuda()
            out, lse = b.run(q, kv)
            self.assertTrue(out.is_cuda and lse.is_cuda)
            ref = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
            assert_close(self, torch_f64(out), torch_f64(lse), ref[0], ref[1], "GPU dense")
            idx = pb.rng.integers(0, pb.kv.shape[0], size=(q.shape[0], 64)).astype(np.int32)
            idx[pb.rng.random(idx.shape) < 0.3] = -1
            idx[3] = -1
            b.plan_sparse(torch.from_numpy(idx).cuda(), 2049)
            out, lse = b.run(q, kv, stream=torch.cuda.current_stream())
            ref = ref_decode(pb.q, pb.kv, idx.tolist())
            assert_close(self, torch_f64(out), torch_f64(lse), ref[0], ref[1], "GPU sparse")
            self.assertEqual(b.check_device_error(), 0)

    def test_cuda_graph_replays_plan_and_run(self):
        page, s_q, batch = 64, 2, 4
        lens0 = [5, 300, 64, 1000]
        pb, qo, table = self.dense(2, lens0, s_q, page)
        dev = "cuda"
        qo_t = torch.tensor(qo, dtype=torch.int32, device=dev)
        bt = torch.tensor(table, dtype=torch.int32, device=dev)
        lens = torch.tensor(lens0, dtype=torch.int32, device=dev)
        q = torch_bf16(pb.q_bits).to(dev)
        kv = torch_bf16(pb.kv_bits).to(dev)
        out = torch.empty(batch * s_q, H, DV, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(batch * s_q, H, device=dev)
        b = pmla.Builder(H, backend="pmla", page_size=page, max_batch=batch, max_q_len=s_q)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as torch asks
            b.plan(qo_t, block_table=bt, kv_lens=lens)
            b.run(q, kv, out=out, lse=lse)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            b.plan(qo_t, block_table=bt, kv_lens=lens)
            b.run(q, kv, out=out, lse=lse)
        rng = np.random.default_rng(3)
        for trial in range(3):
            new_lens = [int(x) for x in rng.integers(0, len(table[0]) * page + 1, size=batch)]
            new_lens[trial] = 0
            lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
            q_bits = rand_bits(rng, tuple(q.shape))
            q.copy_(torch_bf16(q_bits).to(dev))
            g.replay()
            b.plan(qo_t, block_table=bt, kv_lens=lens)  # eager, same builder and stream
            e_out, e_lse = b.run(q, kv)
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(out, e_out), "trial %d: graph out != eager" % trial)
            self.assertTrue(torch.equal(lse, e_lse), "trial %d: graph lse != eager" % trial)
            ref = ref_decode(bits_f64(q_bits), pb.kv,
                             lists_block_table(qo, table, new_lens, page))
            assert_close(self, torch_f64(out), torch_f64(lse), ref[0], ref[1],
                         "graph trial %d" % trial)
        self.assertEqual(b.check_device_error(), 0)
        b.close()

    def test_device_input_error(self):
        page = 64
        with pmla.Builder(H, backend="pmla", page_size=page, max_batch=2) as b:
            bt = torch.tensor([[0], [10 ** 6]], dtype=torch.int32, device="cuda")
            b.plan(torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"), block_table=bt,
                   kv_lens=torch.tensor([10, 10], dtype=torch.int32, device="cuda"))
            q = torch.zeros(2, H, D, dtype=torch.bfloat16, device="cuda")
            kv = torch.zeros(2, page, D, dtype=torch.bfloat16, device="cuda")
            b.run(q, kv)  # queued: the kernels skip the bad page and flag it
            with self.assertRaises(pmla.DeviceInputError) as cm:
                b.check_device_error()
            self.assertTrue(cm.exception.flags & 2)
            self.assertIn("page_index", cm.exception.flag_names)
            self.assertIn("check_device_error", cm.exception.message)
            self.assertEqual(b.check_device_error(), 0)  # read and cleared

    def test_wrong_device_type(self):
        with pmla.Builder(H, backend="pmla", page_size=64, max_batch=1) as b:
            with self.assertRaises(pmla.InvalidArgument) as cm:
                b.plan([0, 1], block_table=[[0]], kv_lens=[1])  # host memory
            self.assertIn("qo_indptr", cm.exception.message)

    def test_cupy_arrays(self):
        try:
            import cupy as cp
        except ImportError:
            self.skipTest("CuPy is not installed")
        page, lens = 64, [70, 3]
        pb, qo, table = self.dense(5, lens, 1, page)
        with pmla.Builder(H, backend="pmla", page_size=page, max_batch=2) as b:
            i32 = lambda x: cp.asarray(np.array(x, np.int32))
            b.plan(i32(qo), block_table=i32(table), kv_lens=i32(lens))
            out, lse = b.run(cp.asarray(pb.q_bits), cp.asarray(pb.kv_bits))  # bf16 as uint16
            self.assertIsInstance(out, cp.ndarray)
            self.assertEqual(out.dtype, cp.uint16)
            ref = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
            assert_close(self, bits_f64(cp.asnumpy(out)), cp.asnumpy(lse), ref[0], ref[1],
                         "CuPy")

    def test_flash_mla_cuda(self):
        from test_flash_mla import Case, flash_ref
        fm = pmla.flash_mla
        c = Case(4, [0, 70, 129, 300], 2, h=64, page=64)
        meta, splits = fm.get_mla_metadata(c.cache_seqlens.cuda(), 2 * c.h, 1)
        out, lse = fm.flash_mla_with_kvcache(c.q.cuda(), c.k_cache.cuda(),
                                             c.block_table.cuda(), c.cache_seqlens.cuda(),
                                             512, meta, splits, causal=True)
        ref = flash_ref(bits_f64(c.q_bits), bits_f64(c.kv_bits).reshape(-1, D), c.table,
                        c.lens, c.page, True)
        assert_close(self, torch_f64(out), torch_f64(lse), ref[0], ref[1], "flash_mla CUDA")
        self.assertTrue(bool(torch.isposinf(lse[0]).all()))

    def test_flash_mla_inputs_rewritten_in_place(self):
        # on a GPU the step is planned once; the copies it was planned from
        # are taken again from the rewritten tensors on every call
        from test_flash_mla import in_place_layers
        _, copied = in_place_layers(self, "cuda")
        self.assertTrue(copied)  # the strided table's copy and its repeat


if __name__ == "__main__":
    unittest.main()
