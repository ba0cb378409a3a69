"""N = 16 decode by merged column order and a one-hot MMA (issue 4; benchmarks/LOG.md, "N = 16 at
3x: the one design left"). An experiment, not a package path.

    python benchmarks/probe_merged_decode.py           # GPU: times beside cuBLAS and the ell path
    python benchmarks/probe_merged_decode.py --sass    # no GPU: compile for sm_90, count instructions

Blocks of 16 consecutive rows keep their nonzeros sorted by column (a local row id per entry),
so consecutive entries sit ~10/16 columns apart and share 128-byte lines of x^T: the L1 serves
several per wavefront instead of one each. The scatter into the 16 rows is a tensor-core product
out[16, 16] += onehot_v[16, G] @ x_rows[G, 16]; Gluon places both operands directly in mma.sync's
register layouts (no shared memory), which plain tl.dot does not (it stages them in shared
memory and turns the gather into cp.async.cg, bypassing the L1). A block's stream is split over
S one-warp programs whose partial sums meet by fp32 atomics.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
MMA = gl.constexpr(_MMA)
A_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))
B_L = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA, k_width=2))


@gluon.jit
def _ranges(G: gl.constexpr, BN: gl.constexpr):
    """The 16 rows and G entries of the A fragment, the G entries and BN tokens of B's."""
    return (gl.arange(0, 16, layout=gl.SliceLayout(1, A_L)), gl.arange(0, G, layout=gl.SliceLayout(0, A_L)),
            gl.arange(0, G, layout=gl.SliceLayout(1, B_L)), gl.arange(0, BN, layout=gl.SliceLayout(0, B_L)))


@gluon.jit
def _onehot(r_ids, rr, v, G: gl.constexpr):
    """(16, G): entry j's value in its local row, zero elsewhere."""
    return gl.where(r_ids[:, None] == rr[None, :], v[None, :], gl.zeros([16, G], gl.float16, A_L))


@gluon.jit
def _add_partials(acc, out_ptr, blk, M, BN: gl.constexpr):
    """A program's (16 rows, BN tokens) partial sums into the fp32 output (N, M)."""
    rows = blk * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, MMA))
    toks = gl.arange(0, BN, layout=gl.SliceLayout(0, MMA))
    gl.atomic_add(out_ptr + toks[None, :] * M + rows[:, None], acc, mask=(rows < M)[:, None], sem="relaxed")


@gluon.jit
def merged_kernel(mcol_ptr, mval_ptr, mrow_ptr, xt_ptr, out_ptr, M, BLEN, CHUNK,
                  G: gl.constexpr, BN: gl.constexpr):
    blk = gl.program_id(0)
    base = blk * BLEN + gl.program_id(1) * CHUNK
    r_ids, ka, kb, tok = _ranges(G, BN)
    acc = gl.zeros([16, BN], gl.float32, MMA)
    for s in range(0, CHUNK, G):
        v = gl.load(mval_ptr + base + s + ka)
        rr = gl.load(mrow_ptr + base + s + ka).to(gl.int32)
        c = gl.load(mcol_ptr + base + s + kb).to(gl.int32)
        onehot = _onehot(r_ids, rr, v, G)
        xg = gl.load(xt_ptr + c[:, None] * BN + tok[None, :])
        acc = mma_v2(onehot, xg, acc)
    _add_partials(acc, out_ptr, blk, M, BN)


@gluon.jit
def _entries(mcol_ptr, mval_ptr, mrow_ptr, at, CHUNK, ka, kb, PAD: gl.constexpr):
    """Step `at`'s (columns, values, local rows); past the chunk: the zero row, 0, row 0."""
    va = (at + ka) < CHUNK
    vb = (at + kb) < CHUNK
    v = gl.load(mval_ptr + at + ka, mask=va, other=0.0)
    rr = gl.load(mrow_ptr + at + ka, mask=va, other=0).to(gl.int32)
    c = gl.load(mcol_ptr + at + kb, mask=vb, other=PAD).to(gl.int32)
    return c, v, rr


@gluon.jit
def merged_pipelined_kernel(mcol_ptr, mval_ptr, mrow_ptr, xt_ptr, out_ptr, M, BLEN, CHUNK,
                            G: gl.constexpr, BN: gl.constexpr, PAD: gl.constexpr):
    """merged_kernel with the entries loaded two steps ahead and the x rows one step ahead."""
    blk = gl.program_id(0)
    base = blk * BLEN + gl.program_id(1) * CHUNK
    r_ids, ka, kb, tok = _ranges(G, BN)
    mc = mcol_ptr + base
    mv = mval_ptr + base
    mr = mrow_ptr + base
    c0, v0, r0 = _entries(mc, mv, mr, 0, CHUNK, ka, kb, PAD)
    c1, v1, r1 = _entries(mc, mv, mr, G, CHUNK, ka, kb, PAD)
    x0 = gl.load(xt_ptr + c0[:, None] * BN + tok[None, :])
    acc = gl.zeros([16, BN], gl.float32, MMA)
    for s in range(0, CHUNK, G):
        c2, v2, r2 = _entries(mc, mv, mr, s + 2 * G, CHUNK, ka, kb, PAD)
        x1 = gl.load(xt_ptr + c1[:, None] * BN + tok[None, :])
        onehot = _onehot(r_ids, r0, v0, G)
        acc = mma_v2(onehot, x0, acc)
        x0, v0, r0 = x1, v1, r1
        c1, v1, r1 = c2, v2, r2
    _add_partials(acc, out_ptr, blk, M, BN)


def merged_layout(w: torch.Tensor, parts: int, G: int):
    """(cols, values, local rows, block length): per block of 16 rows its entries sorted by
    column, padded (column K: the zero row of x^T's copy, value 0) to one length for all blocks."""
    M, K = w.shape
    r, c = torch.nonzero(w, as_tuple=True)
    blk = r // 16
    order = torch.argsort(blk * (K + 1) + c)
    r, c, blk = r[order], c[order], blk[order]
    counts = torch.bincount(blk, minlength=-(-M // 16))
    step = parts * G
    blen = int(-(-int(counts.max()) // step) * step)
    pos = torch.arange(r.numel(), device=w.device) - (torch.cumsum(counts, 0) - counts)[blk]
    dest = blk * blen + pos
    n = counts.numel() * blen
    cols = torch.full((n,), K, dtype=torch.int16, device=w.device)
    vals = torch.zeros(n, dtype=w.dtype, device=w.device)
    lrow = torch.zeros(n, dtype=torch.int8, device=w.device)
    cols[dest], vals[dest], lrow[dest] = c.to(torch.int16), w[r, c], (r % 16).to(torch.int8)
    return cols, vals, lrow, blen


def sass(G, BN, kernel=None):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"mcol_ptr": "*i16", "mval_ptr": "*fp16", "mrow_ptr": "*i8", "xt_ptr": "*fp16", "out_ptr": "*fp32",
           "M": "i32", "BLEN": "i32", "CHUNK": "i32", "G": "constexpr", "BN": "constexpr"}
    src = GluonASTSource(merged_kernel, sig, {"G": G, "BN": BN}, {(i,): [["tt.divisibility", 16]] for i in range(8)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    ops = collections.Counter(re.sub(r'@!?U?P\w+ ', '', ln.split('\t')[-1]).split()[0]
                              for ln in k.asm["sass"].splitlines() if '\t' in ln)
    print(G, BN, {o: n for o, n in ops.items() if o.startswith(("LDG", "LDS", "STS", "HMMA", "RED", "ATOM", "BAR", "SEL"))},
          "total", sum(ops.values()), "smem", k.metadata.shared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true")
    args = ap.parse_args()
    if args.sass:
        for G, BN in ((32, 16), (64, 16), (32, 32)):
            sass(G, BN)
        return
    import torch.nn.functional as F

    import spartune as st
    from spartune.kernels import spmm_csr
    from spartune.tune.measure import cold_replay, time_callable
    gen = torch.Generator(device="cuda").manual_seed(0)
    M = K = 4096
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    for N in (16, 32):
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
        ref = F.linear(x.float(), w.float())
        dense = lambda: F.linear(x, w)  # noqa: E731
        print(f"N={N} cuBLAS hot {time_callable(dense, graph=True, cold=False, rep_ms=20) * 1e6:.2f} "
              f"cold {cold_replay(dense) * 1e6:.2f}")
        out16 = torch.empty(N, M, device="cuda", dtype=torch.float16)
        ell = spmm_csr.Config("ell", 1, min(N, 32), 64, num_warps=1)
        f = lambda: spmm_csr.launch(A, x, out16, ell)  # noqa: E731
        print(f"N={N} ell 1x64 w1 (whole op) hot {time_callable(f, graph=True, cold=False, rep_ms=20) * 1e6:.2f} "
              f"cold {cold_replay(f) * 1e6:.2f}")
        xt = torch.zeros((K + 1) * N, device="cuda", dtype=torch.float16)
        out = torch.zeros(N, M, device="cuda", dtype=torch.float32)
        for parts, G, piped in ((8, 32, 0), (16, 64, 0), (4, 32, 1), (8, 32, 1), (16, 32, 1), (8, 64, 1),
                                (16, 64, 1), (4, 64, 1)):
            cols, vals, lrow, blen = merged_layout(w, parts, G)
            grid = (-(-M // 16), parts)

            def run(cols=cols, vals=vals, lrow=lrow, blen=blen, parts=parts, G=G, grid=grid, piped=piped):
                spmm_csr._transpose_pad_kernel[(triton.cdiv(K + 1, 64), 1)](
                    x, xt, N, K, x.stride(0), x.stride(1), BT=N, BK=64, num_warps=4)
                out.zero_()
                if piped:
                    merged_pipelined_kernel[grid](cols, vals, lrow, xt, out, M, blen, blen // parts,
                                                  G=G, BN=N, PAD=K, num_warps=1)
                else:
                    merged_kernel[grid](cols, vals, lrow, xt, out, M, blen, blen // parts, G=G, BN=N, num_warps=1)

            try:
                run()
                torch.cuda.synchronize()
                err = ((out - ref).norm() / ref.norm()).item()
                h = time_callable(run, graph=True, cold=False, rep_ms=20) * 1e6
                c = cold_replay(run) * 1e6
                print(f"N={N} merged{' pipelined' if piped else ''} parts={parts} G={G} (block {blen}, pad {blen * grid[0] / A.values.numel() - 1:.1%}) "
                      f"hot {h:.2f} cold {c:.2f} err {err:.1e}")
            except Exception as e:  # noqa: BLE001
                print(f"N={N} merged{' pipelined' if piped else ''} parts={parts} G={G} FAILED {str(e).splitlines()[0][:150]}")


if __name__ == "__main__":
    main()
