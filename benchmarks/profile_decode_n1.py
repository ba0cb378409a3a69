"""Decode at N = 1 (issue 4): where the time of a CSR SpMV goes, against the DRAM floor.

    python benchmarks/profile_decode_n1.py [--once]   # --once: one call each, untimed (for ncu)
    python benchmarks/profile_decode_n1.py --space    # row / row_t / ell configs of the space, N = 1, 16, 32

qkv 4096x4096 at 90%, fp16, x (1, K). Prints hot (graph replay) and cold (L2 evicted before
each call, measure.cold_replay) times of cuBLAS, the shipped row kernel over a grid of configs,
an experimental "delta8" kernel (uint8 column gaps, 3 bytes per nonzero instead of 4), and two
streaming references that only read the bytes (the floor of each layout under the same cold
measure).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import spartune as st  # noqa: E402
from spartune.kernels import spmm_csr  # noqa: E402
from spartune.kernels._common import row_chunk  # noqa: E402
from spartune.tune.measure import cold_replay, time_callable  # noqa: E402


@triton.jit
def stream_kernel(a_ptr, b_ptr, out_ptr, n_a, n_b, BLOCK: tl.constexpr):
    """Reads two arrays once (sum kept so nothing is dead code): the bandwidth reference."""
    pid = tl.program_id(0)
    o = pid * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + o, mask=o < n_a, other=0).to(tl.float32)
    b = tl.load(b_ptr + o, mask=o < n_b, other=0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(a, 0) + tl.sum(b, 0))


@triton.jit
def delta8_kernel(start_ptr, gap_ptr, val_ptr, x_ptr, out_ptr, M, stride_xk,
                  R: tl.constexpr, L: tl.constexpr):
    """CSR with uint8 column gaps (a zero-valued filler entry where a gap exceeds 255): the
    columns are a running sum of the gaps, carried from step to step."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rvalid = rows < M
    start = tl.load(start_ptr + rows, mask=rvalid, other=0)
    length = tl.load(start_ptr + rows + 1, mask=rvalid, other=0) - start
    acc = tl.zeros((R, L), dtype=tl.float32)
    carry = tl.full((R,), -1, tl.int32)
    for s in range(0, tl.max(length, axis=0), L):
        m, off = row_chunk(s, start, length, L)
        g = tl.load(gap_ptr + off, mask=m, other=0).to(tl.int32)
        v = tl.load(val_ptr + off, mask=m, other=0.0)
        c = carry[:, None] + tl.cumsum(g, axis=1)
        xv = tl.load(x_ptr + c * stride_xk, mask=m, other=0.0)
        acc += xv.to(tl.float32) * v.to(tl.float32)
        carry = tl.max(c, axis=1)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=rvalid)


@triton.jit
def ell_kernel(col_ptr, val_ptr, x_ptr, out_ptr, M, stride_xk, LCAP,
               R: tl.constexpr, L: tl.constexpr):
    """Rows padded to LCAP slots (column 0, value 0): every address is known at launch, so the
    index and value loads start without waiting for a row pointer (one dependent level less)."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    j = tl.arange(0, L)
    m = (rows < M)[:, None] & (j < LCAP)[None, :]
    off = rows[:, None] * LCAP + j[None, :]
    c = tl.load(col_ptr + off, mask=m, other=0).to(tl.int32)
    v = tl.load(val_ptr + off, mask=m, other=0.0)
    xv = tl.load(x_ptr + c * stride_xk, mask=m, other=0.0)
    acc = tl.sum(xv.to(tl.float32) * v.to(tl.float32), axis=1)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=rows < M)


def ell(A: st.CSR, mult: int = 8):
    """(cols, values, LCAP): rows padded to the longest row, rounded up to `mult` slots."""
    M, K = A.shape
    lengths = (A.crow[1:] - A.crow[:-1]).long()
    lcap = -(-int(lengths.max()) // mult) * mult
    row_of = torch.repeat_interleave(torch.arange(M, device=A.col.device), lengths)
    pos = torch.arange(A.col.numel(), device=A.col.device) - A.crow[:-1].long()[row_of]
    cols = torch.zeros(M * lcap, dtype=A.col.dtype, device=A.col.device)
    vals = torch.zeros(M * lcap, dtype=A.values.dtype, device=A.col.device)
    cols[row_of * lcap + pos] = A.col
    vals[row_of * lcap + pos] = A.values
    return cols, vals, lcap


def delta8(A: st.CSR):
    """(starts, gaps uint8, values) of A with a filler (gap 255, value 0) per 255 columns skipped."""
    M, K = A.shape
    crow, col = A.crow.long(), A.col.long()
    lengths = crow[1:] - crow[:-1]
    prev = torch.cat([col.new_full((1,), -1), col[:-1]])
    prev[crow[:-1][lengths > 0]] = -1  # a row's first gap counts from column -1
    gap = col - prev
    fill = (gap - 1) // 255
    per = fill + 1
    pos = torch.cumsum(per, 0) - 1  # where each real entry lands
    total = int(per.sum())
    gaps = torch.full((total,), 255, dtype=torch.int64, device=col.device)
    gaps[pos] = gap - 255 * fill
    vals = torch.zeros(total, dtype=A.values.dtype, device=col.device)
    vals[pos] = A.values
    row_of = torch.repeat_interleave(torch.arange(M, device=col.device), lengths)
    rlen = torch.zeros(M, dtype=torch.int64, device=col.device).index_add_(0, row_of, per)
    starts = torch.zeros(M + 1, dtype=torch.int32, device=col.device)
    starts[1:] = torch.cumsum(rlen, 0).to(torch.int32)
    return starts, gaps.to(torch.uint8), vals


def space_table():
    """Every row, row_t and ell config of spmm_csr.space through launch(), hot and cold, beside
    cuBLAS, at N = 1, 16, 32 (the whole op: the copy of x included where a path makes one)."""
    from spartune.tune.problem import Problem
    gen = torch.Generator(device="cuda").manual_seed(0)
    M = K = 4096
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    print(f"qkv {M}x{K} d=0.1; us hot (graph replay) / cold (L2 evicted); x = cuBLAS cold / ours cold")
    for N in (1, 16, 32):
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        ref = F.linear(x.float(), w.float())
        dense = lambda: F.linear(x, w)  # noqa: E731
        dh, dc = time_callable(dense, graph=True, cold=False, rep_ms=20) * 1e6, cold_replay(dense) * 1e6
        print(f"N={N:2d} cuBLAS {dh:7.2f} {dc:7.2f}")
        rows = []
        for c in spmm_csr.space(Problem("linear", "csr", M, K, N, "float16", A.stats())):
            if c.path not in ("row", "row_t", "ell"):
                continue
            f = lambda c=c: spmm_csr.launch(A, x, out, c)  # noqa: E731
            out.fill_(float("nan"))
            f()
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            h = time_callable(f, graph=True, cold=False, rep_ms=20) * 1e6
            cold = cold_replay(f) * 1e6
            rows.append((cold, h, c, err))
        for cold, h, c, err in sorted(rows, key=lambda t: t[0]):
            print(f"N={N:2d} {c.path:6s} {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} {h:7.2f} {cold:7.2f} "
                  f"x{dc / cold:5.2f} {'' if err < 2e-2 else f'WRONG {err:.1e}'}")


def main():
    if "--space" in sys.argv:
        return space_table()
    once = "--once" in sys.argv  # one call of each (after a warm-up), untimed: for ncu
    gen = torch.Generator(device="cuda").manual_seed(0)
    M = K = 4096
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    nnz = A.values.numel()
    x = torch.randn(1, K, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(1, M, device="cuda", dtype=torch.float16)
    ref = F.linear(x.float(), w.float())
    rows = []

    def timed(name, fn, check=True):
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        if once:
            fn()
            torch.cuda.synchronize()
            return
        err = ((out.float() - ref).norm() / ref.norm()).item() if check else 0.0
        h = time_callable(fn, graph=True, cold=False, rep_ms=20) * 1e6
        c = cold_replay(fn) * 1e6
        rows.append((name, h, c, "" if err < 2e-2 else f"WRONG {err:.1e}"))

    timed("cuBLAS", lambda: F.linear(x, w), check=False)
    ident = torch.arange(M, device="cuda", dtype=torch.int32)
    for r, bnnz, wps in ((4, 256, 4), (8, 128, 4), (1, 512, 4), (2, 512, 4), (1, 512, 2), (2, 256, 2),
                         (1, 256, 1), (2, 128, 1), (4, 128, 2), (2, 512, 2), (4, 256, 2), (1, 128, 1)):
        for order, oname in ((A.row_order, "sorted"), (ident, "natural")):
            def f(r=r, bnnz=bnnz, wps=wps, order=order):
                spmm_csr._spmm_row_kernel[(triton.cdiv(M, r), 1)](
                    A.crow, A.col, A.values, order, x, out, out, out, M, 1, x.stride(0), x.stride(1),
                    out.stride(0), out.stride(1), 0, 0, 1.0, (0,), R=r, BN=1, BNNZ=bnnz, NB=0, SENTINEL=0,
                    HAS_BIAS=False, ACT=0, HAS_RES=False, num_warps=wps, num_stages=2)
            timed(f"row {r}x{bnnz} w{wps} {oname}", f)
    ecols, evals, lcap = ell(A)
    for r, wps in ((1, 2), (2, 2), (2, 4), (4, 4), (1, 1), (4, 8)):
        timed(f"ell {r}x512 w{wps} (lcap {lcap})", lambda r=r, wps=wps: ell_kernel[(triton.cdiv(M, r),)](
            ecols, evals, x, out, M, x.stride(1), lcap, R=r, L=triton.next_power_of_2(lcap), num_warps=wps))
    starts, gaps, vals = delta8(A)
    for r, L, wps in ((1, 512, 4), (2, 512, 4), (4, 256, 4), (2, 256, 2), (1, 512, 8), (4, 512, 8)):
        timed(f"delta8 {r}x{L} w{wps}", lambda r=r, L=L, wps=wps: delta8_kernel[(triton.cdiv(M, r),)](
            starts, gaps, vals, x, out, M, x.stride(1), R=r, L=L, num_warps=wps))
    sink = torch.empty(1 << 16, device="cuda", dtype=torch.float32)
    for name, a, b in (("stream int16 col + fp16 val (CSR)", A.col, A.values),
                       ("stream uint8 gap + fp16 val (delta8)", gaps, vals)):
        n = max(a.numel(), b.numel())
        for blk in (4096, 16384):
            timed(f"{name} b{blk}", lambda a=a, b=b, blk=blk: stream_kernel[(triton.cdiv(n, blk),)](
                a, b, sink, a.numel(), b.numel(), BLOCK=blk, num_warps=8), check=False)
    print(f"qkv {M}x{K} d=0.1 nnz={nnz}, delta8 entries {gaps.numel()} "
          f"({(gaps.numel() - nnz) / nnz:.2%} fillers); N=1; us hot (graph replay) / cold (L2 evicted)")
    for name, h, c, note in rows:
        print(f"{name:44s} {h:8.2f} {c:8.2f}  {note}")


if __name__ == "__main__":
    main()
