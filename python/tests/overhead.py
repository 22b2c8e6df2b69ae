# SPDX-License-Identifier: MIT
"""Per-call cost of Builder.run() against the bare ctypes call of the
backend's decode slot, on a tiny shape (1 request, 16 heads, 1 KV token).
    python3 python/tests/overhead.py [pmla-cpu|pmla]
needs torch (and CUDA for pmla); point it at a build as run-tests.sh does."""
import statistics
import sys
import timeit

import _support  # noqa: F401  (puts pmla on sys.path from the source tree)
import pmla
import torch


def main(backend="pmla-cpu"):
    dev = "cuda" if backend == "pmla" else "cpu"
    torch.set_num_threads(1)
    b = pmla.Builder(16, backend=backend, page_size=16, max_batch=1, cu_count=1)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)
    b.plan(i32([0, 1]), block_table=i32([[0]]), kv_lens=i32([1]))
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16, device=dev)
    kv = torch.zeros(1, 16, 576, dtype=torch.bfloat16, device=dev)
    out = torch.empty(1, 16, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(1, 16, device=dev)
    b.run(q, kv, out=out, lse=lse)
    decode, handle, args = b._decode, b._h, b._args_addr
    cases = {"ctypes decode(builder, &args)": lambda: decode(handle, args),
             "run(q, kv, out=out, lse=lse)": lambda: b.run(q, kv, out=out, lse=lse),
             "run(q, kv) allocating out, lse": lambda: b.run(q, kv),
             "run(new q, kv, out=, lse=)": lambda: b.run(q.view(1, 16, 576), kv, out=out,
                                                         lse=lse)}
    n, times = 1000, {}
    for _ in range(30):
        for name, f in cases.items():
            if f is cases["ctypes decode(builder, &args)"]:
                b.run(q, kv, out=out, lse=lse)  # args point at out/lse again
            times.setdefault(name, []).append(timeit.timeit(f, number=n) / n * 1e6)
            if dev == "cuda":
                torch.cuda.synchronize()
    base = min(times["ctypes decode(builder, &args)"])
    for name, t in times.items():
        print("%-34s min %7.2f us  median %7.2f us  (+%.2f us)"
              % (name, min(t), statistics.median(t), min(t) - base))


if __name__ == "__main__":
    main(*sys.argv[1:])
