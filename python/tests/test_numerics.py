# SPDX-License-Identifier: MIT
"""pmla-cpu through pmla.Builder against the float64 reference in
_support.py: block table and CSR, ragged lengths with zeros, s_q 1..4,
sparse with -1 holes; tensors from numpy, torch, DLPack capsules and lists."""
import unittest

from _support import (DV, Problem, assert_close, bits_f64, lists_block_table, lists_csr,
                      need_numpy, need_torch, np, pmla, ref_decode, torch, torch_bf16,
                      torch_f64)

H = 16


def cpu(**kw):
    return pmla.Builder(H, backend="pmla-cpu", **kw)


def dense_case(seed, lens, s_q, page, extra_pages=3):
    """Requests with KV lengths `lens`, s_q query rows each, pages shuffled."""
    need = [max(1, -(-L // page)) for L in lens]
    pages = sum(need) + extra_pages
    tokens = s_q * len(lens)
    pb = Problem(seed, tokens, H, pages, page)
    perm = pb.rng.permutation(pages).tolist()
    width = max(need)
    table, at = [], 0
    for n in need:
        row = perm[at:at + n]
        at += n
        table.append(row + [0] * (width - n))
    qo = [s_q * r for r in range(len(lens) + 1)]
    return pb, qo, table


@need_numpy
class TestNumpy(unittest.TestCase):
    def test_block_table_ragged(self):
        page = 16
        lens = [0, 1, 15, 16, 33, 70]
        pb, qo, table = dense_case(1, lens, 1, page)
        b = cpu(page_size=page, max_batch=8)
        b.plan(np.array(qo, np.int32), block_table=np.array(table, np.int32),
               kv_lens=np.array(lens, np.int32))
        out, lse = b.run(pb.q_bits, pb.kv_bits)
        self.assertEqual(out.dtype, np.uint16)  # bf16 bits: numpy has no bfloat16
        self.assertEqual(lse.dtype, np.float32)
        ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
        assert_close(self, bits_f64(out), lse, ref_out, ref_lse, "numpy block table")
        self.assertTrue((out[0] == 0).all() and np.isneginf(lse[0]).all())

    def test_head_counts(self):
        page, lens = 16, [9, 0, 40]
        for heads in (1, 3, 8, 128):
            pb = Problem(80 + heads, len(lens), heads, 6, page)
            table = [[0, 1, 2], [3, 0, 0], [4, 5, 1]]
            qo = [0, 1, 2, 3]
            with pmla.Builder(heads, backend="pmla-cpu", page_size=page, max_batch=4) as b:
                b.plan(qo, block_table=table, kv_lens=lens)
                out, lse = b.run(pb.q_bits, pb.kv_bits)
            ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
            assert_close(self, bits_f64(out), lse, ref_out, ref_lse, "heads=%d" % heads)

    def test_batch_invariant(self):
        # request 0 (1500 tokens) alone and as the first of 9, cu_count 4:
        # the default build splits it differently in the two batches
        page = 16
        lens = [1500, 30, 700, 5, 0, 260, 900, 44, 1200]
        pb, qo, table = dense_case(7, lens, 2, page)
        got = {}
        for flag in (False, True):
            for n in (1, len(lens)):
                b = cpu(page_size=page, max_batch=16, max_q_len=2, cu_count=4,
                        batch_invariant=flag)
                self.assertEqual(b.config["batch_invariant"], flag)
                b.plan(np.array(qo[:n + 1], np.int32),
                       block_table=np.array(table[:n], np.int32),
                       kv_lens=np.array(lens[:n], np.int32))
                out, lse = b.run(pb.q_bits[:2 * n], pb.kv_bits)
                got[flag, n] = (out[:2].copy(), lse[:2].copy())
                b.close()
        alone, inside = got[True, 1], got[True, len(lens)]
        self.assertTrue((alone[0] == inside[0]).all() and (alone[1] == inside[1]).all())
        ref_out, ref_lse = ref_decode(pb.q[:2], pb.kv,
                                      lists_block_table(qo[:2], table[:1], lens[:1], page))
        assert_close(self, bits_f64(alone[0]), alone[1], ref_out, ref_lse, "batch invariant")
        # the default mode is free to differ; it is what the flag is for
        self.assertFalse((got[False, 1][0] == got[False, len(lens)][0]).all()
                         and (got[False, 1][1] == got[False, len(lens)][1]).all())

    def test_batch_invariant_chunk(self):
        # the host's least chunk: request 0 (1500 tokens) in chunks of 256,
        # the same bits alone and first of 9, and still the reference's
        page = 16
        lens = [1500, 30, 700, 5, 0, 260, 900, 44, 1200]
        pb, qo, table = dense_case(8, lens, 2, page)
        got = {}
        for n in (1, len(lens)):
            b = cpu(page_size=page, max_batch=16, max_q_len=2, cu_count=4,
                    batch_invariant=True, invariant_chunk=256)
            self.assertEqual(b.config["invariant_chunk"], 256)
            b.plan(np.array(qo[:n + 1], np.int32), block_table=np.array(table[:n], np.int32),
                   kv_lens=np.array(lens[:n], np.int32))
            out, lse = b.run(pb.q_bits[:2 * n], pb.kv_bits)
            got[n] = (out[:2].copy(), lse[:2].copy())
            b.close()
        alone, inside = got[1], got[len(lens)]
        self.assertTrue((alone[0] == inside[0]).all() and (alone[1] == inside[1]).all())
        ref_out, ref_lse = ref_decode(pb.q[:2], pb.kv,
                                      lists_block_table(qo[:2], table[:1], lens[:1], page))
        assert_close(self, bits_f64(alone[0]), alone[1], ref_out, ref_lse, "chunks of 256")

    def test_fp8_e4m3_cache(self):
        # per-tensor e4m3 bytes with one fp32 scale, as vLLM's fp8 cache
        page, lens = 16, [30, 0, 50]
        pb, qo, table = dense_case(9, lens, 1, page)
        rng = np.random.default_rng(9)
        raw = (rng.integers(0, 256, size=pb.kv_bits.shape, dtype=np.uint8) & 0xbf)
        e, m = (raw >> 3) & 15, (raw & 7).astype(np.float64)
        val = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * np.exp2(e - 7.0))
        val = np.where(raw & 0x80, -val, val) * 0.375
        b = cpu(page_size=page, max_batch=4, kv_dtype="fp8_e4m3")
        self.assertEqual(b.config["kv_dtype"], "fp8_e4m3")
        b.plan(np.array(qo, np.int32), block_table=np.array(table, np.int32),
               kv_lens=np.array(lens, np.int32))
        with self.assertRaisesRegex(pmla.InvalidArgument, "kv_scale"):
            b.run(pb.q_bits, raw)
        out, lse = b.run(pb.q_bits, raw, kv_scale=np.array([0.375], np.float32))
        ref_out, ref_lse = ref_decode(pb.q, val.reshape(-1, val.shape[-1]),
                                      lists_block_table(qo, table, lens, page))
        assert_close(self, bits_f64(out), lse, ref_out, ref_lse, "fp8_e4m3")
        with self.assertRaisesRegex(pmla.InvalidArgument, "kv_dtype"):
            cpu(kv_dtype="fp4")

    def test_read_only_and_list_inputs(self):
        page = 16
        lens = [5, 40]
        pb, qo, table = dense_case(2, lens, 1, page)
        qo_ro = np.array(qo, np.int32)
        qo_ro.setflags(write=False)  # DLPack refuses read-only arrays: array interface
        b = cpu(page_size=page)
        b.plan(qo_ro, block_table=table, kv_lens=tuple(lens))
        out = np.empty((2, H, DV), np.uint16)
        lse = np.empty((2, H), np.float32)
        got_out, got_lse = b.run(pb.q_bits, pb.kv_bits, out=out, lse=lse)
        self.assertIs(got_out, out)
        self.assertIs(got_lse, lse)
        ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
        assert_close(self, bits_f64(out), lse, ref_out, ref_lse, "read-only / lists")


@need_torch
class TestTorch(unittest.TestCase):
    def check(self, b, pb, lists, what, **run_kw):
        q = torch_bf16(pb.q_bits)
        kv = torch_bf16(pb.kv_bits)
        out, lse = b.run(q, kv, **run_kw)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(lse.dtype, torch.float32)
        ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists)
        assert_close(self, torch_f64(out), torch_f64(lse), ref_out, ref_lse, what)
        return out, lse

    def test_block_table_mtp(self):
        page = 16
        lens = [0, 1, 3, 17, 64, 99]
        b = cpu(page_size=page, max_batch=8, max_q_len=4)
        for s_q in (1, 2, 3, 4):
            pb, qo, table = dense_case(10 + s_q, lens, s_q, page)
            t = lambda x: torch.tensor(x, dtype=torch.int32)
            b.plan(t(qo), block_table=t(table), kv_lens=t(lens))
            self.check(b, pb, lists_block_table(qo, table, lens, page), "block table s_q=%d"
                       % s_q)

    def test_csr_mtp_mixed_rows(self):
        page = 8
        lens = [0, 2, 8, 9, 50]
        rows = [1, 3, 2, 4, 1]  # query rows per request
        b = cpu(page_size=page, max_batch=8, max_q_len=4)
        qo = [0]
        for r in rows:
            qo.append(qo[-1] + r)
        pb = Problem(20, qo[-1], H, 20, page)
        perm = pb.rng.permutation(20).tolist()
        kv_indptr, kv_indices, last = [0], [], []
        for L in lens:
            n = -(-L // page)
            kv_indices += perm[:n]
            perm = perm[n:]
            kv_indptr.append(len(kv_indices))
            last.append(L - (n - 1) * page if n else 0)
        t = lambda x: torch.tensor(x, dtype=torch.int32)
        b.plan(t(qo), kv_indptr=t(kv_indptr), kv_indices=t(kv_indices),
               kv_last_page_len=t(last))
        self.check(b, pb, lists_csr(qo, kv_indptr, kv_indices, last, page), "CSR")

    def test_sparse_with_holes(self):
        page, topk, tokens = 16, 40, 6
        pb = Problem(30, tokens, H, 8, page)
        idx = pb.rng.integers(0, 8 * page, size=(tokens, topk)).astype(np.int32)
        idx[pb.rng.random((tokens, topk)) < 0.3] = -1
        idx[2, :] = -1  # a token with nothing to attend
        idx[4, :] = idx[4, 0]  # one slot listed topk times
        b = cpu(page_size=page, max_batch=8, topk=topk)
        b.plan_sparse(torch.from_numpy(idx), 8 * page)
        out, lse = self.check(b, pb, idx.tolist(), "sparse")
        self.assertTrue(bool((out[2] == 0).all()) and bool(torch.isneginf(lse[2]).all()))
        b.plan_sparse(torch.from_numpy(idx), 8 * page, split_cap=False)
        self.check(b, pb, idx.tolist(), "sparse uncapped")

    def test_kv_4d_given_outputs_and_no_lse(self):
        page = 16
        lens = [20, 7]
        pb, qo, table = dense_case(40, lens, 1, page)
        b = cpu(page_size=page)
        b.plan(qo, block_table=table, kv_lens=lens)
        q = torch_bf16(pb.q_bits)
        kv4 = torch_bf16(pb.kv_bits).unsqueeze(2)  # [pages, page, 1, 576]
        out = torch.empty(2, H, DV, dtype=torch.bfloat16)
        got, lse = b.run(q, kv4, out=out, return_lse=False)
        self.assertIs(got, out)
        self.assertIsNone(lse)
        ref_out, _ = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
        assert_close(self, torch_f64(out), None, ref_out, None, "4-D KV, no lse")

    def test_reuse_sees_new_contents_and_new_tensors(self):
        page = 16
        lens = [30, 5]
        pb, qo, table = dense_case(50, lens, 1, page)
        lists = lists_block_table(qo, table, lens, page)
        b = cpu(page_size=page)
        b.plan(torch.tensor(qo, dtype=torch.int32), block_table=torch.tensor(
            table, dtype=torch.int32), kv_lens=torch.tensor(lens, dtype=torch.int32))
        q = torch_bf16(pb.q_bits)
        kv = torch_bf16(pb.kv_bits)
        out1, _ = b.run(q, kv)
        out2, _ = b.run(q, kv)  # the prepared call
        self.assertTrue(torch.equal(out1, out2))
        self.assertNotEqual(out1.data_ptr(), out2.data_ptr())  # a fresh output per run
        q.mul_(-1)  # in place: same tensor, new values
        out3, lse3 = b.run(q, kv)
        ref_out, ref_lse = ref_decode(-pb.q, pb.kv, lists)
        assert_close(self, torch_f64(out3), torch_f64(lse3), ref_out, ref_lse, "in place")
        q.set_(q.clone())  # new storage under the same object
        q.mul_(-1)
        out4, lse4 = b.run(q, kv)
        ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists)
        assert_close(self, torch_f64(out4), torch_f64(lse4), ref_out, ref_lse, "set_")

    def test_dlpack_capsules_and_grad(self):
        import torch.utils.dlpack as tdl
        page = 16
        lens = [12, 40]
        pb, qo, table = dense_case(60, lens, 1, page)
        b = cpu(page_size=page)
        b.plan(tdl.to_dlpack(torch.tensor(qo, dtype=torch.int32)),
               block_table=tdl.to_dlpack(torch.tensor(table, dtype=torch.int32)),
               kv_lens=np.array(lens, np.int32))  # numpy through __dlpack__
        q = torch_bf16(pb.q_bits).requires_grad_()
        kv = tdl.to_dlpack(torch_bf16(pb.kv_bits))
        out = torch.empty(2, H, DV, dtype=torch.bfloat16)
        lse = torch.empty(2, H)
        b.run(q, kv, out=tdl.to_dlpack(out), lse=lse)
        ref_out, ref_lse = ref_decode(pb.q, pb.kv, lists_block_table(qo, table, lens, page))
        assert_close(self, torch_f64(out), torch_f64(lse), ref_out, ref_lse, "capsules")

    def test_numpy_and_torch_agree(self):
        page = 16
        lens = [33, 0, 64]
        pb, qo, table = dense_case(70, lens, 1, page)
        b = cpu(page_size=page, max_batch=4)
        b.plan(qo, block_table=table, kv_lens=lens)
        out_np, lse_np = b.run(pb.q_bits, pb.kv_bits)
        out_t, lse_t = b.run(torch_bf16(pb.q_bits), torch_bf16(pb.kv_bits))
        self.assertTrue(np.array_equal(out_np.view(np.int16), out_t.view(torch.int16).numpy()))
        self.assertTrue(np.array_equal(lse_np, lse_t.numpy()))


if __name__ == "__main__":
    unittest.main()
