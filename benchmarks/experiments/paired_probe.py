"""Probe (session 17): does a kernel's time depend on the kernel before it? cuBLAS and our best
2:4 config (fixed, no tuner) timed alone (do_bench), in turns with each other, in turns with
themselves, and in turns after an idle gap (torch.cuda._sleep), all with the L2 evicted before
each call. fp16 2:4, N = 2048."""
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from spartune.kernels import spmm_nm as K  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402
from spartune.tune.measure import _evict_buffer, interleaved  # noqa: E402

CFG = K.Config(bm=128, bn=256, num_warps=12, warps_k=1, ksteps=4, variant="wgmma", stages=5, group_m=16, cluster_m=1)
SHAPES = {"7b-up": (11008, 4096), "13b-up": (13824, 5120), "70b-up": (28672, 8192)}
N = int(os.environ.get("N", "2048"))


def gapped(fns, gap_cycles, rounds=21):
    """As interleaved, with an idle kernel of gap_cycles before each eviction (outside the events)."""
    evict = _evict_buffer()
    names = list(fns)
    marks = {n: [] for n in names}
    for n in names:
        fns[n]()
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            torch.cuda._sleep(gap_cycles)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            evict.zero_()
            s.record()
            fns[n]()
            e.record()
            marks[n].append((s, e))
    torch.cuda.synchronize()
    return {n: statistics.median(s.elapsed_time(e) * 1e-3 for s, e in marks[n]) for n in names}


for name, (M, Kd) in SHAPES.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=g)
    A = sparsify_weight(w, "2:4")
    wd = A.to_dense()
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=g)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    dense = lambda: F.linear(x, wd)  # noqa: E731
    ours = lambda: K.launch(A, x, out, CFG)  # noqa: E731
    ours()
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    for rep in range(2):
        db_d = do_bench(dense, warmup=10, rep=100, return_mode="median") * 1e-3
        db_o = do_bench(ours, warmup=10, rep=100, return_mode="median") * 1e-3
        pair = interleaved({"dense": dense, "ours": ours})
        dd = interleaved({"dense": dense, "dense_b": dense})
        oo = interleaved({"ours": ours, "ours_b": ours})
        gap = gapped({"dense": dense, "ours": ours}, gap_cycles=4_000_000)  # ~2-3 ms idle
        print(f"{name} N={N} rep {rep}: do_bench dense {us(db_d)} ours {us(db_o)} ({db_d / db_o:.2f}x) | turns "
              f"dense {us(pair['dense'])} ours {us(pair['ours'])} ({pair['ratio:ours']:.2f}x) | dense after dense "
              f"{us(dd['dense'])} | ours after ours {us(oo['ours'])} ({dd['dense'] / oo['ours']:.2f}x) | after a gap "
              f"dense {us(gap['dense'])} ours {us(gap['ours'])} ({gap['dense'] / gap['ours']:.2f}x)", flush=True)
