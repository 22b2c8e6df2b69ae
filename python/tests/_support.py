# SPDX-License-Identifier: MIT
"""Shared by the pmla Python tests: imports, skips, bf16 helpers and a
float64 reference of MLA decode written here (it shares no code with pmla)."""
import contextlib
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import pmla  # noqa: F401
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, os.path.dirname(HERE))
    import pmla  # noqa: F401

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None

need_numpy = unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
need_torch = unittest.skipIf(torch is None or np is None,
                             "torch and numpy are needed (Debian: python3-torch python3-numpy)")


@contextlib.contextmanager
def environ(**values):
    """Sets (str) or unsets (None) environment variables for a block."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def another_thread_inside(fn, entered, release):
    """Runs fn() on a thread of its own, which sets `entered` once inside
    the call under test and waits there for `release`; the block runs
    while it is held, then the thread is let go and joined. Yields a dict
    that ends up holding fn's "result" (its exception is raised here)."""
    got = {}

    def body():
        try:
            got["result"] = fn()
        except BaseException as e:  # raised below, on the test's thread
            got["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    try:
        if not entered.wait(30):
            raise AssertionError("the other thread never got inside the call")
        yield got
    finally:
        release.set()
        t.join(60)
    if t.is_alive():
        raise AssertionError("the other thread's call did not end")
    if "error" in got:
        raise got["error"]


def cuda_available():
    return torch is not None and torch.cuda.is_available()


D, DV = 576, 512
SCALE = D ** -0.5

# ---- bf16 (round to nearest even, as pmla's reference does)


def bf16_bits(x):
    """float array -> uint16 bf16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bits_f64(bits):
    """uint16 bf16 bits -> float64 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32) \
        .astype(np.float64)


def rand_bits(rng, shape, lo=-1.0, hi=1.0):
    return bf16_bits(rng.uniform(lo, hi, size=shape))


def torch_bf16(bits):
    """uint16 bits (numpy) -> torch.bfloat16 tensor (torch has no uint16 everywhere)."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16).copy()).view(torch.bfloat16)


def torch_bits(t):
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def torch_f64(t):
    return t.detach().cpu().double().numpy()


# ---- reference


def visible(L, q_len, j):
    """Causal MTP: row j of a request with q_len rows and KV length L sees
    positions [0, L - q_len + 1 + j)."""
    return max(0, min(L, L - q_len + 1 + j))


def lists_block_table(qo_indptr, block_table, kv_lens, page):
    out = []
    for r in range(len(qo_indptr) - 1):
        ql = qo_indptr[r + 1] - qo_indptr[r]
        for j in range(ql):
            n = visible(kv_lens[r], ql, j)
            out.append([block_table[r][p // page] * page + p % page for p in range(n)])
    return out


def lists_csr(qo_indptr, kv_indptr, kv_indices, last, page):
    out = []
    for r in range(len(qo_indptr) - 1):
        pages = kv_indices[kv_indptr[r]:kv_indptr[r + 1]]
        L = (len(pages) - 1) * page + last[r] if pages else 0
        ql = qo_indptr[r + 1] - qo_indptr[r]
        for j in range(ql):
            n = visible(L, ql, j)
            out.append([pages[p // page] * page + p % page for p in range(n)])
    return out


def ref_decode(q, kv, lists, scale=SCALE):
    """q float64 [T, H, 576], kv float64 [slots, 576], lists: per token the
    KV slots it attends (-1 skipped). Returns out [T, H, 512] and lse [T, H]
    (natural log; out 0 and lse -inf for an empty list)."""
    T, H, _ = q.shape
    out = np.zeros((T, H, DV))
    lse = np.full((T, H), -np.inf)
    for t in range(T):
        s = [x for x in lists[t] if x >= 0]
        if not s:
            continue
        K = kv[s]
        sc = scale * (q[t] @ K.T)
        m = sc.max(axis=1, keepdims=True)
        p = np.exp(sc - m)
        lsum = p.sum(axis=1, keepdims=True)
        out[t] = (p @ K[:, :DV]) / lsum
        lse[t] = (np.log(lsum) + m)[:, 0]
    return out, lse


def assert_close(tc, out, lse, ref_out, ref_lse, what=""):
    """pmla's tolerance (tests/reference.h): |got - ref| <= 2/128 |ref| + 2^-8
    per element, cosine >= 1 - 1e-5; lse within 1e-3 or both -inf."""
    out = np.asarray(out, dtype=np.float64)
    tc.assertEqual(out.shape, ref_out.shape, what)
    bad = np.abs(out - ref_out) > (2 / 128) * np.abs(ref_out) + 2 ** -8
    tc.assertFalse(bad.any(), "%s: %d bad outputs, first at %s: got %r ref %r" % (
        what, bad.sum(), np.argwhere(bad)[:1].tolist(), out[bad][:1], ref_out[bad][:1]))
    num = float((out * ref_out).sum())
    den = float(np.sqrt((out * out).sum() * (ref_out * ref_out).sum()))
    if den > 0:
        tc.assertGreaterEqual(num / den, 1 - 1e-5, what + ": cosine")
    if lse is not None:
        lse = np.asarray(lse, dtype=np.float64)
        tc.assertEqual(lse.shape, ref_lse.shape, what)
        both_inf = np.isinf(lse) & np.isinf(ref_lse) & (np.sign(lse) == np.sign(ref_lse))
        with np.errstate(invalid="ignore"):
            ok = both_inf | (np.abs(lse - ref_lse) <= 1e-3)
        tc.assertTrue(ok.all(), "%s: lse differs at %s: got %r ref %r" % (
            what, np.argwhere(~ok)[:1].tolist(), lse[~ok][:1], ref_lse[~ok][:1]))


class Problem:
    """A random dense or sparse problem: q/kv bits and their float64 values."""

    def __init__(self, seed, tokens, heads, pages, page):
        rng = self.rng = np.random.default_rng(seed)
        self.heads, self.pages, self.page = heads, pages, page
        self.q_bits = rand_bits(rng, (tokens, heads, D))
        self.kv_bits = rand_bits(rng, (pages, page, D))
        self.q = bits_f64(self.q_bits)
        self.kv = bits_f64(self.kv_bits).reshape(pages * page, D)
