#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""seeds.py - writes the seed corpus of fuzz_pmla (tests/fuzz/corpus/).

Each seed is a host session that succeeds, spelled in the order in which
fuzz_pmla.c reads its input. (The corpus's regress-* files are not written
here: they are inputs the fuzzer found that made an earlier pmla misbehave,
misaligned tensors, sizes that overflow, offsets from a NULL data pointer,
kept as regression cases.) A choice byte below 224 picks entry
(byte % n) of that choice's list of good values; bytes past the end of an
input read as 0, the first good value. Check a seed with
  PMLA_FUZZ_TRACE=1 tests/fuzz/fuzz-replay tests/fuzz/corpus/NAME

    python3 tests/fuzz/seeds.py [DIR]      (default: the corpus beside this file)
"""
import os
import sys

# the lists of good values, as in fuzz_pmla.c
HEADS = [16, 32, 64, 128, 1, 3, 0, 129]
PAGE = [16, 1, 2, 64, 256, 3, 512, 0]
MAX_BATCH = [1, 2, 3, 8, 65536, 65537, 0]
MAX_Q_LEN = [1, 2, 4, 8, 9, 0]
TOPK = [0, 1, 16, 64, 256, 65536, 65537]
CU = [1, 2, 3, 4, 0, 1025]
VERSIONS = [0x10000, 0x10001, 0x10002, 0x1FFFF, 0x20000, 0x00009, 0, 0xFFFFFFFF]
SEQ_LENS = [0, 1, 127, 128, 129, 4096, 1 << 20]
OP = {"build_decode": 0, "build_sparse": 2, "decode": 3, "query": 5, "copy": 6,
      "check_device_error": 7, "without_builder": 8}
SLOTS, SPAN, BUDGET = 1024, 128, 1 << 14


def below(n, v):
    """The bytes that make below(n) answer v."""
    assert 0 <= v < n
    return [v] if n <= 256 else list(v.to_bytes(4, "big"))


def negotiate(entry=0, lo=0x10000, hi=0x10000):
    return [entry, 0, VERSIONS.index(lo), 0, VERSIONS.index(hi), 0, 0]


def registry(parts=(), name=0, which=0):
    """parts: 'plugin', 'mocks', 'plugin_dir', 'missing', 'empty' or a file
    index; name: index into fuzz_pmla's names; which: 0 pmla-cpu, 192 pmla,
    224 the backend found by name."""
    kinds = {"plugin": [0], "mocks": [1], "plugin_dir": [2], "missing": [3, 7], "empty": [4]}
    b = [len(parts)]
    for p in parts:
        b += kinds[p] if isinstance(p, str) else [5, p]
    return b + [ord("x")] * 15 + [0, name, which]


def config(heads, page, max_batch, max_q_len, topk, cu, ops, tail=None):
    b = [5 if tail else 0, HEADS.index(heads), 0, 0, 0, 0, 0, PAGE.index(page),
         MAX_BATCH.index(max_batch), MAX_Q_LEN.index(max_q_len), TOPK.index(topk), 0, 0,
         CU.index(cu)]
    return b + (tail or []) + [0, 0, ops - 1]


PLAIN_TENSOR = [0, 0, 0]  # no mutation, no strides, no offset


def build_decode(cfg, pages, rows, lens, table, csr=None):
    """rows[r] query rows of request r; block table: lens[r] and table[r]
    (width = len(table[r])); csr: [(pages of r, last_page_len)] and the
    layout becomes CSR with kv_indices = the pages listed in order."""
    P, R = cfg["page"], len(rows)
    width_max = max(1, SPAN // P)
    width = len(table[0]) if table else 1
    b = [OP["build_decode"]] + below(max(1, SLOTS // P), pages - 1) + [R, 0] + rows + [0]
    b += [1 if csr else 0, width - 1]
    for r in range(R):
        b += below(min(width * P, SPAN) + 1, lens[r])
        for j in range(width):
            b += below(pages, table[r][j])
    b += ([0] if R else []) + ([0] if R * width else [])
    nnz = 0
    indices = []
    for r in range(R):
        n, last = csr[r] if csr else ([], 0)
        b += below(width_max + 1, len(n))
        if n:
            b += below(min(P, SPAN), last - 1)
        nnz += len(n)
        indices += n
    for i in indices:
        b += below(pages, i)
    b += [0] + ([0] if nnz else []) + ([0] if R else [])
    b += PLAIN_TENSOR * (4 if csr else 3)
    return b + [0, 0, 0]


def build_sparse(cfg, pages, indices, max_seq_len=4096, flags=0):
    """indices: one list of topk slots (or -1) per query token."""
    P, K = cfg["page"], max(1, cfg["topk"])
    slots = pages * P
    b = [OP["build_sparse"]] + below(max(1, SLOTS // P), pages - 1)
    tokens_max = max(1, min(16, BUDGET // (K * cfg["heads"]), cfg["max_batch"] * cfg["max_q_len"]))
    b += below(tokens_max + 2, len(indices))
    for row in indices:
        assert len(row) == K
        for v in row:
            b += [0] if v < 0 else [32] + below(slots, v)
    b += [0] if indices else []
    b += PLAIN_TENSOR + [flags, 0, SEQ_LENS.index(max_seq_len), 0, 0, 0]
    return b


def decode(cache_4d=False, lse=True):
    return ([OP["decode"]] + PLAIN_TENSOR + [1 if cache_4d else 0] + PLAIN_TENSOR * 3 +
            [0, 0 if lse else 1, 0, 0, 0, 0, 0])


def query():
    return [OP["query"], 0, 0]


def copy(which):
    return [OP["copy"], which, 0, 0]


def check_device_error():
    return [OP["check_device_error"], 0]


def session(heads=16, page=16, max_batch=3, max_q_len=2, topk=0, cu=2, tail=None):
    return {"heads": heads, "page": page, "max_batch": max_batch, "max_q_len": max_q_len,
            "topk": topk, "cu": cu, "tail": tail}


def start(cfg, ops):
    return config(cfg["heads"], cfg["page"], cfg["max_batch"], cfg["max_q_len"], cfg["topk"],
                  cfg["cu"], ops, cfg["tail"])


def seeds():
    out = {}
    c = session()
    out["dense-block-table"] = (negotiate() + registry() + start(c, 5) +
                                build_decode(c, 8, [1, 2, 1], [20, 32, 5],
                                             [[3, 0], [1, 2], [7, 4]]) +
                                decode() + check_device_error() + query() + copy(0))
    c = session(heads=32, page=64, max_batch=8, max_q_len=4, cu=3)
    out["dense-csr-4d-cache"] = (negotiate() + registry() + start(c, 3) +
                                 build_decode(c, 6, [3, 1], [0, 0], [[0], [0]],
                                              csr=[([5, 2], 10), ([1], 64)]) +
                                 decode(cache_4d=True) + decode(lse=False))
    c = session(heads=64, page=64, max_batch=2, max_q_len=2, topk=64, cu=4)
    rows = [[(t * 97 + k * 13) % 256 if (t + k) % 7 else -1 for k in range(64)]
            for t in range(3)]
    out["sparse"] = (negotiate() + registry() + start(c, 5) +
                     build_sparse(c, 4, rows) + decode() +
                     build_sparse(c, 4, rows, max_seq_len=1 << 20, flags=1) + decode() +
                     copy(2))
    c = session(heads=128, page=256, max_batch=65536, max_q_len=8, cu=1)
    out["mtp-wide-pages"] = (negotiate(lo=0x10000, hi=0x1FFFF) +
                             registry(["missing", "empty", "plugin"]) + start(c, 2) +
                             build_decode(c, 2, [1, 0], [100, 0], [[1], [0]]) + decode())
    c = session(tail=[0xEE] * 8)  # a newer host's larger config
    out["newer-host-config"] = (negotiate() + registry() + start(c, 2) +
                                build_decode(c, 2, [1], [7], [[1]]) + decode())
    out["mock-shadows-pmla-cpu"] = (negotiate(entry=1, lo=0x20000, hi=0x10000) +
                                    registry(["mocks", "plugin"], name=0, which=224) +
                                    start(session(), 3) + [OP["without_builder"], 0] +
                                    [OP["build_decode"]])
    out["pmla-without-gpu"] = (negotiate() + registry(["plugin_dir"], name=1, which=192) +
                               start(session(), 2) + [OP["without_builder"], 2])
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    os.makedirs(target, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(target, name), "wb") as f:
            f.write(bytes(data))
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
