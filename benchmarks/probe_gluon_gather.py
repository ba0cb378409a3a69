"""Does a shared-memory gather in Gluon beat the L1 for decode's x gather? (issue 4, N = 16)

    python benchmarks/probe_gluon_gather.py            # GPU: times, and the implied decode cost
    python benchmarks/probe_gluon_gather.py --sass     # no GPU: compile for sm_90, count instructions

Triton 3.6 rewrites every tl.gather into a warp-local layout (shuffles; OptimizeThreadLocality),
so its shared-memory lowering is reachable only from Gluon, where layouts are the author's. This
probe times that lowering on decode's shape: a window of x^T (BK columns x 16 tokens, packed
four tokens per int64) held by the program, and G nonzeros per call gathering their 32-byte row
of it, unpacked to fp32 and multiplied by a value, as the decode kernel would. One call stores
the window to shared memory (the lowering does, every call), then loads G x 4 int64.
"""
from __future__ import annotations

import argparse
import collections
import re

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gather_probe(xq_ptr, idx_ptr, val_ptr, out_ptr, calls,
                 BK: gl.constexpr, G: gl.constexpr, num_warps: gl.constexpr):
    # every thread holds whole rows of four int64 (16 tokens); rows spread over lanes and
    # warps, so the gather axis crosses warps: the lowering goes through shared memory
    L: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [num_warps, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, L)
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, L))
    k = gl.arange(0, BK, layout=rows_l)
    pid = gl.program_id(0)
    src = gl.load(xq_ptr + (pid % 64) * BK * 4 + k[:, None] * 4 + q[None, :])  # (BK, 4) int64
    j = gl.arange(0, G, layout=rows_l)
    a0 = gl.zeros([G, 4], gl.float32, L)
    a1 = gl.zeros([G, 4], gl.float32, L)
    a2 = gl.zeros([G, 4], gl.float32, L)
    a3 = gl.zeros([G, 4], gl.float32, L)
    for c in range(calls):
        off = (pid * calls + c) * G + j
        col = gl.load(idx_ptr + off)
        v = gl.load(val_ptr + off).to(gl.float32)[:, None]
        g = gl.gather(src, col[:, None] + gl.zeros([G, 4], gl.int32, L), 0)  # (G, 4) int64
        a0 += (g & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * v
        a1 += ((g >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * v
        a2 += ((g >> 32) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * v
        a3 += ((g >> 48) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * v
    s = gl.sum(a0 + a1 + a2 + a3, axis=0)
    gl.store(out_ptr + pid * 4 + q, s)


def sass(BK, G, warps):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"xq_ptr": "*i64", "idx_ptr": "*i32", "val_ptr": "*fp16", "out_ptr": "*fp32", "calls": "i32",
           "BK": "constexpr", "G": "constexpr", "num_warps": "constexpr"}
    src = GluonASTSource(gather_probe, sig, {"BK": BK, "G": G, "num_warps": warps},
                         {(i,): [["tt.divisibility", 16]] for i in range(4)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ops = collections.Counter(re.sub(r'@!?U?P\w+ ', '', ln.split('\t')[-1]).split()[0]
                              for ln in k.asm["sass"].splitlines() if '\t' in ln)
    print(BK, G, warps, {o: n for o, n in ops.items() if o.startswith(("LDS", "STS", "SHFL", "BAR", "LDG"))},
          "total", sum(ops.values()), "smem", k.metadata.shared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true")
    args = ap.parse_args()
    shapes = ((256, 1024, 4), (512, 2048, 8), (256, 512, 4), (1024, 2048, 8))
    if args.sass:
        for s in shapes:
            sass(*s)
        return
    from triton.testing import do_bench
    dev = "cuda"
    for BK, G, W in shapes:
        programs, calls = 132 * 8, 16
        xq = torch.randint(-2**62, 2**62, (64 * BK * 4,), device=dev, dtype=torch.int64)
        idx = torch.randint(0, BK, (programs * calls * G,), device=dev, dtype=torch.int32)
        val = torch.randn(programs * calls * G, device=dev, dtype=torch.float16)
        out = torch.empty(programs * 4, device=dev, dtype=torch.float32)
        f = lambda: gather_probe[(programs,)](xq, idx, val, out, calls, BK=BK, G=G, num_warps=W)  # noqa: E731
        f()
        t = do_bench(f, rep=50) * 1e-3
        nz = programs * calls * G
        # decode qkv at 90%, N = 16: 1.68 M nonzeros, each one 32-byte x row
        print(f"BK={BK} G={G} warps={W}: {t * 1e6:8.1f} us for {nz / 1e6:.1f} M nonzeros x 16 tokens "
              f"-> {t / nz * 1.68e6 * 1e6:5.2f} us for decode's 1.68 M (L1 path's gather bound: 6.4-7.2 us)")


if __name__ == "__main__":
    main()
