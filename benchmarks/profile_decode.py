"""Decode-size CSR SpMM (issue 4, N <= 32): where the time goes, and experimental kernels.

    python benchmarks/profile_decode.py [--variants row_t,rowr,rowp,...] [--n 16 32]
    ncu ... python benchmarks/profile_decode.py --once --variants rowr   # one call each, for ncu

Times, on qkv 4096x4096 at 90% sparsity, fp16: cuBLAS, the transpose copy, the shipped row_t
kernel and the experimental kernels below (benchmarks/LOG.md, "CSR decode": what each tried
and measured; none moved decode by more than ~20%, so none moved into spartune/kernels).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import spartune as st  # noqa: E402
from spartune.kernels import spmm_csr  # noqa: E402
from spartune.kernels._common import row_chunk, swizzled_rows  # noqa: E402
from spartune.tune.measure import cold_replay  # noqa: E402


@triton.jit
def rowt_prefetch_kernel(crow_ptr, col_ptr, val_ptr, order_ptr, xt_ptr, out_ptr, M, N, stride_xs,
                         R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, PAD_K: tl.constexpr):
    """row_t with the next step's (col, value) loads issued before this step's gather."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, rvalid, start, length = swizzled_rows(pid_r, order_ptr, crow_ptr, M, R)
    toks = pid_n * BN + tl.arange(0, BN)
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, None, :]
    acc3 = tl.zeros((R, BNNZ, BN), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    m, off = row_chunk(0, start, length, BNNZ)
    c = tl.load(col_ptr + off, mask=m, other=PAD_K).to(tl.int32)
    v = tl.load(val_ptr + off, mask=m, other=0.0)
    for s in range(0, longest, BNNZ):
        m2, off2 = row_chunk(s + BNNZ, start, length, BNNZ)
        c2 = tl.load(col_ptr + off2, mask=m2, other=PAD_K).to(tl.int32)
        v2 = tl.load(val_ptr + off2, mask=m2, other=0.0)
        xv = tl.load(x_tok + c[:, :, None] * BN)
        acc3 += xv.to(tl.float32) * v.to(tl.float32)[:, :, None]
        c = c2
        v = v2
    acc = tl.sum(acc3, axis=1)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (toks < N)[None, :])


@triton.jit
def flat_kernel(crow_ptr, col_ptr, val_ptr, xt_ptr, out_ptr, M, N, stride_xs,
                R: tl.constexpr, RD: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, PAD_K: tl.constexpr):
    """R consecutive rows as one flat stream of nonzeros (contiguous, affine loads, no idle
    lanes); the segmented sum per row is a tensor-core dot of a one-hot (rows, nonzeros)
    matrix holding the values with the gathered (nonzeros, tokens) strips of x."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_r * R + tl.arange(0, RD)
    rvalid = (tl.arange(0, RD) < R) & (rows < M)
    starts = tl.load(crow_ptr + rows, mask=rvalid, other=0)
    ends = tl.load(crow_ptr + rows + 1, mask=rvalid, other=0)
    lo = tl.load(crow_ptr + pid_r * R)
    hi = tl.load(crow_ptr + tl.minimum(pid_r * R + R, M))
    toks = pid_n * BN + tl.arange(0, BN)
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, :]
    acc = tl.zeros((RD, BN), dtype=tl.float32)
    for s in range(lo, hi, BNNZ):
        off = s + tl.arange(0, BNNZ)
        m = off < hi
        c = tl.load(col_ptr + off, mask=m, other=PAD_K).to(tl.int32)
        v = tl.load(val_ptr + off, mask=m, other=0.0)
        xv = tl.load(x_tok + c[:, None] * BN)  # (BNNZ, BN)
        hot = (off[None, :] >= starts[:, None]) & (off[None, :] < ends[:, None])
        w = tl.where(hot, v[None, :], 0.0).to(xv.dtype)
        acc = tl.dot(w, xv, acc)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (toks < N)[None, :])


def ell_slabs(A, R):
    """Sliced ELL of A: rows in A.row_order (longest first), slices of R rows, each padded to
    its longest row and stored slot-major (slot j of the slice's R rows adjacent), padding
    pointing at x's zero row K. Returns (vals, cols, slice_off, slice_len, rows)."""
    M, K = A.shape
    dev = A.crow.device
    order = A.row_order.long()
    lens = (A.crow[1:] - A.crow[:-1]).long()
    S = -(-M // R)
    lp = F.pad(lens[order], (0, S * R - M))
    J = lp.view(S, R).max(1).values
    off = torch.zeros(S + 1, dtype=torch.long, device=dev)
    off[1:] = torch.cumsum(J * R, 0)
    total = int(off[-1])
    nnz = A.values.numel()
    pos = torch.empty(M, dtype=torch.long, device=dev)
    pos[order] = torch.arange(M, device=dev)
    row = torch.repeat_interleave(torch.arange(M, device=dev), lens, output_size=nnz)
    j = torch.arange(nnz, device=dev) - A.crow[:-1].long()[row]
    p = pos[row]
    flat = off[p // R] + j * R + p % R
    vals = torch.zeros(total, dtype=A.values.dtype, device=dev)
    vals[flat] = A.values
    cols = torch.full((total,), K, dtype=A.col.dtype, device=dev)
    cols[flat] = A.col
    rows = torch.full((S * R,), -1, dtype=torch.int32, device=dev)
    rows[:M] = A.row_order
    return vals, cols, off.to(torch.int32), J.to(torch.int32), rows


@triton.jit
def slab_kernel(off_ptr, len_ptr, rows_ptr, col_ptr, val_ptr, xt_ptr, out_ptr, M, N, stride_xs, PAD_K,
                R: tl.constexpr, RD: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, SCALE_B: tl.constexpr):
    """One slice of R rows (sliced ELL, slot-major) and a strip of BN tokens. The flat stream of
    the slice is read in contiguous steps of BF entries; the per-row sum is a tensor-core dot
    with a constant (RD, BF) selector (entry f belongs to row f % R): SCALE_B multiplies the
    gathered x strips by their values in fp16 (products rounded once, sums in fp32), else the
    selector carries the values."""
    s = tl.program_id(0)
    pid_n = tl.program_id(1)
    base = tl.load(off_ptr + s)
    total = tl.load(len_ptr + s) * R
    f = tl.arange(0, BF)
    r = tl.arange(0, RD)
    ident = (f[None, :] % R) == r[:, None]
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, :]
    acc = tl.zeros((RD, BN), dtype=tl.float32)
    for i in range(0, total, BF):
        m = i + f < total
        c = tl.load(col_ptr + base + i + f, mask=m, other=PAD_K).to(tl.int32)
        v = tl.load(val_ptr + base + i + f, mask=m, other=0.0)
        xv = tl.load(x_tok + c[:, None] * BN)
        if SCALE_B:
            acc = tl.dot(ident.to(xv.dtype), xv * v[:, None].to(xv.dtype), acc)
        else:
            acc = tl.dot(tl.where(ident, v[None, :], 0.0).to(xv.dtype), xv, acc)
    rows = tl.load(rows_ptr + s * R + r, mask=r < R, other=-1)
    toks = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=(rows >= 0)[:, None] & (toks < N)[None, :])


@triton.jit
def _nonzeros(val_ptr, col_ptr, off, m, PAD_K, CG: tl.constexpr):
    """A step's values and columns (padding lanes: value 0, column PAD_K = x's zero row); CG
    keeps the stream out of L1, which then holds x alone."""
    if CG:
        v = tl.load(val_ptr + off, mask=m, other=0.0, cache_modifier=".cg")
        c = tl.load(col_ptr + off, mask=m, other=PAD_K, cache_modifier=".cg")
    else:
        v = tl.load(val_ptr + off, mask=m, other=0.0)
        c = tl.load(col_ptr + off, mask=m, other=PAD_K)
    return v, c.to(tl.int32)


@triton.jit
def rowk_kernel(crow_ptr, woff_ptr, col_ptr, val_ptr, order_ptr, xt_ptr, out_ptr, ws_ptr, lock_ptr,
                M, N, KW, stride_xs, PAD_K,
                R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, KC: tl.constexpr, SPLIT: tl.constexpr,
                CG: tl.constexpr = False):
    """row_t over one K slice of KC columns (program id 1), so the x^T rows a program gathers
    (KC x BN) stay in L1 while every program on the SM works on the same slice. Partial sums
    go to ws (SPLIT, N, M) fp32; the last program of a row block adds them (fixed order:
    deterministic) and stores."""
    rb = tl.program_id(0)
    q = tl.program_id(1)
    slot = rb * R + tl.arange(0, R)
    rvalid = slot < M
    rows = tl.load(order_ptr + slot, mask=rvalid, other=0)
    w_lo = q * (KC // 32)
    start = tl.load(woff_ptr + rows.to(tl.int64) * KW + w_lo, mask=rvalid & (w_lo < KW), other=0)
    w_hi = w_lo + KC // 32
    end_row = tl.load(crow_ptr + rows + 1, mask=rvalid, other=0)
    end = tl.load(woff_ptr + rows.to(tl.int64) * KW + w_hi, mask=rvalid & (w_hi < KW), other=0)
    end = tl.where(w_hi < KW, end, end_row)
    length = tl.where(rvalid, end - start, 0)
    x_tok = xt_ptr + tl.program_id(2) * stride_xs + tl.arange(0, BN)[None, None, :]
    acc3 = tl.zeros((R, BNNZ, BN), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    for s in range(0, longest, BNNZ):
        m, off = row_chunk(s, start, length, BNNZ)
        v, c = _nonzeros(val_ptr, col_ptr, off, m, PAD_K, CG)
        if CG:
            xv = tl.load(x_tok + c[:, :, None] * BN, eviction_policy="evict_last")
        else:
            xv = tl.load(x_tok + c[:, :, None] * BN)
        acc3 += xv.to(tl.float32) * v.to(tl.float32)[:, :, None]
    acc = tl.sum(acc3, axis=1)  # (R, BN)
    toks = tl.program_id(2) * BN + tl.arange(0, BN)
    omask = rvalid[:, None] & (toks < N)[None, :]
    part = toks[None, :].to(tl.int64) * M + rows[:, None]
    tl.store(ws_ptr + q.to(tl.int64) * N * M + part, acc, mask=omask)
    tl.debug_barrier()
    lock = lock_ptr + rb * tl.num_programs(2) + tl.program_id(2)
    arrived = tl.atomic_add(lock, 1, sem="acq_rel")
    if arrived == SPLIT - 1:
        total = tl.zeros((R, BN), dtype=tl.float32)
        for qq in range(0, SPLIT):
            total += tl.load(ws_ptr + qq * N * M + part, mask=omask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + part, total.to(out_ptr.dtype.element_ty), mask=omask)
        tl.atomic_xchg(lock, 0)


def padded_csr(A, align=8):
    """A copy of A's (col, value) arrays with every row starting at a multiple of `align`
    entries (padding: column K, x's zero row; value 0), so a row's indices load as 16-byte
    vectors. Returns (starts, lengths, cols, vals), lengths unpadded."""
    M, K = A.shape
    dev = A.crow.device
    lens = (A.crow[1:] - A.crow[:-1]).long()
    plen = (lens + align - 1) // align * align
    starts = torch.zeros(M + 1, dtype=torch.long, device=dev)
    starts[1:] = torch.cumsum(plen, 0)
    nnz = A.values.numel()
    row = torch.repeat_interleave(torch.arange(M, device=dev), lens, output_size=nnz)
    dst = starts[:-1][row] + torch.arange(nnz, device=dev) - A.crow[:-1].long()[row]
    total = int(starts[-1])
    cols = torch.full((total,), K, dtype=A.col.dtype, device=dev)
    cols[dst] = A.col
    vals = torch.zeros(total, dtype=A.values.dtype, device=dev)
    vals[dst] = A.values
    return starts[:-1].to(torch.int32), lens.to(torch.int32), cols, vals


@triton.jit
def rowv_kernel(start_ptr, len_ptr, col_ptr, val_ptr, order_ptr, xt_ptr, out_ptr, M, N, stride_xs, PAD_K,
                R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, PREFETCH: tl.constexpr):
    """row_t on the padded CSR: 16-byte loads of indices and values; optionally the next
    step's indices and values are loaded before this step's gather."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = pid_r * R + tl.arange(0, R)
    rvalid = slot < M
    rows = tl.load(order_ptr + slot, mask=rvalid, other=0)
    start = tl.multiple_of(tl.load(start_ptr + rows, mask=rvalid, other=0), 8)
    length = tl.load(len_ptr + rows, mask=rvalid, other=0)
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, None, :]
    acc3 = tl.zeros((R, BNNZ, BN), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    j = tl.arange(0, BNNZ)
    off = start[:, None] + j[None, :]
    m = j[None, :] < length[:, None]
    c = tl.load(col_ptr + off, mask=m, other=PAD_K).to(tl.int32)
    v = tl.load(val_ptr + off, mask=m, other=0.0)
    for s in range(0, longest, BNNZ):
        if PREFETCH:
            m2 = (s + BNNZ + j)[None, :] < length[:, None]
            c2 = tl.load(col_ptr + off + s + BNNZ, mask=m2, other=PAD_K).to(tl.int32)
            v2 = tl.load(val_ptr + off + s + BNNZ, mask=m2, other=0.0)
        else:
            m2 = (s + j)[None, :] < length[:, None]
            c = tl.load(col_ptr + off + s, mask=m2, other=PAD_K).to(tl.int32)
            v = tl.load(val_ptr + off + s, mask=m2, other=0.0)
        xv = tl.load(x_tok + c[:, :, None] * BN)
        acc3 += xv.to(tl.float32) * v.to(tl.float32)[:, :, None]
        if PREFETCH:
            c = c2
            v = v2
    acc = tl.sum(acc3, axis=1)
    toks = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (toks < N)[None, :])


def packed_words(A):
    """One int32 per nonzero: column in the high 16 bits, the fp16 value's bits in the low 16.
    A 4-byte element is what Triton's pipeliner turns into cp.async (2-byte loads it does not)."""
    M, K = A.shape
    assert K < 2**15 and A.values.dtype == torch.float16
    v = A.values.view(torch.int16).to(torch.int32) & 0xFFFF
    return (A.col.to(torch.int32) << 16) | v


@triton.jit
def rowp_kernel(crow_ptr, pk_ptr, order_ptr, xt_ptr, out_ptr, M, N, stride_xs, PAD_K,
                R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, NS: tl.constexpr, XCA: tl.constexpr = False, CG: tl.constexpr = False):
    """row_t on packed (column, value) words, the loop software-pipelined NS deep by Triton."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, rvalid, start, length = swizzled_rows(pid_r, order_ptr, crow_ptr, M, R)
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, None, :]
    acc3 = tl.zeros((R, BNNZ, BN), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    for s in tl.range(0, longest, BNNZ, num_stages=NS):
        m, off = row_chunk(s, start, length, BNNZ)
        if CG:
            w = tl.load(pk_ptr + off, mask=m, other=PAD_K << 16, cache_modifier=".cg")
        else:
            w = tl.load(pk_ptr + off, mask=m, other=PAD_K << 16)
        c = (w >> 16) & 0xFFFF
        v = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        if XCA:
            xv = tl.load(x_tok + c[:, :, None] * BN, eviction_policy="evict_last")
        else:
            xv = tl.load(x_tok + c[:, :, None] * BN)
        acc3 += xv.to(tl.float32) * v.to(tl.float32)[:, :, None]
    acc = tl.sum(acc3, axis=1)
    toks = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (toks < N)[None, :])


@triton.jit
def rowr_kernel(crow_ptr, col_ptr, val_ptr, order_ptr, xt_ptr, out_ptr, M, N, stride_xs, PAD_K,
                R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, CG: tl.constexpr):
    """row_t that reduces over the nonzero axis every step: a (R, BN) accumulator instead of
    (R, BNNZ, BN), trading shuffles per step for registers (occupancy)."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, rvalid, start, length = swizzled_rows(pid_r, order_ptr, crow_ptr, M, R)
    x_tok = xt_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, None, :]
    acc = tl.zeros((R, BN), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    for s in range(0, longest, BNNZ):
        m, off = row_chunk(s, start, length, BNNZ)
        v, c = _nonzeros(val_ptr, col_ptr, off, m, PAD_K, CG)
        xv = tl.load(x_tok + c[:, :, None] * BN)
        acc += tl.sum(xv.to(tl.float32) * v.to(tl.float32)[:, :, None], axis=1)
    toks = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + toks[None, :] * M + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (toks < N)[None, :])


def xt_copy(x, bn, xt=None):
    """row_t's padded token-strip copy of x, made by the shipped transpose kernel."""
    N, K = x.shape
    strips = triton.cdiv(N, bn)
    if xt is None:
        xt = torch.empty(strips * (K + 1) * bn, dtype=x.dtype, device=x.device)
    spmm_csr._transpose_pad_kernel[(triton.cdiv(K + 1, 64), strips)](
        x, xt, N, K, x.stride(0), x.stride(1), BT=bn, BK=64, num_warps=4)
    return xt


# every variant: its configs (the ones measured in benchmarks/LOG.md) and how to launch one
VARIANTS = {
    "row_t": [(2, 64, 2), (4, 64, 4)],  # (rows, nonzeros per step, warps): the shipped kernel
    "prefetch": [(2, 64, 2), (4, 64, 4), (4, 128, 4)],
    "rowr": [(2, 64, 2), (4, 64, 2), (2, 128, 2), (1, 128, 1), (4, 32, 1), (1, 256, 2)],
    "rowp": [(2, 64, 2), (4, 32, 2), (2, 32, 1), (1, 64, 1)],
    "rowv": [(2, 64, 2), (4, 32, 2), (8, 32, 4)],
    "rowk": [(2, 64, 2), (8, 64, 4), (4, 32, 2)],  # K slices of 1024 columns
    "slab": [(8, 128, 4), (8, 256, 4), (4, 128, 2), (16, 256, 4)],  # (rows per slice, entries per step, warps)
    "flat": [(8, 128, 4), (16, 256, 4)],
}


def launcher(variant, cfg, A, x, xt, out, bn, cache):
    """A zero-argument launch of one experimental kernel (the x^T strips xt already made)."""
    M, K = A.shape
    N = x.shape[0]
    r, step, wps = cfg
    grid = (triton.cdiv(M, r), triton.cdiv(N, bn))
    xs = (K + 1) * bn
    if variant == "row_t":
        return lambda: spmm_csr._spmm_rowt_kernel[grid](
            A.crow, A.col, A.values, A.row_order, xt, out, out, out, M, N, 1, bn, xs,
            out.stride(0), out.stride(1), 0, 0, 1.0, (0,), R=r, BN=bn, BNNZ=step, PAD_K=K, NB=0, SENTINEL=0,
            HAS_BIAS=False, ACT=0, HAS_RES=False, num_warps=wps, num_stages=2)
    if variant == "prefetch":
        return lambda: rowt_prefetch_kernel[grid](A.crow, A.col, A.values, A.row_order, xt, out, M, N, xs,
                                                  R=r, BN=bn, BNNZ=step, PAD_K=K, num_warps=wps)
    if variant == "rowr":
        return lambda: rowr_kernel[grid](A.crow, A.col, A.values, A.row_order, xt, out, M, N, xs, K,
                                         R=r, BN=bn, BNNZ=step, CG=True, num_warps=wps)
    if variant == "rowp":
        pk = cache.setdefault("packed", packed_words(A))
        return lambda: rowp_kernel[grid](A.crow, pk, A.row_order, xt, out, M, N, xs, K,
                                         R=r, BN=bn, BNNZ=step, NS=1, XCA=True, CG=True, num_warps=wps)
    if variant == "rowv":
        starts, lens, pcols, pvals = cache.setdefault("padded", padded_csr(A))
        return lambda: rowv_kernel[grid](starts, lens, pcols, pvals, A.row_order, xt, out, M, N, xs, K,
                                         R=r, BN=bn, BNNZ=step, PREFETCH=True, num_warps=wps)
    if variant == "rowk":
        kc = 1024
        split = triton.cdiv(K, kc)
        _, woff = spmm_csr.csr_bitmap(A)
        ws = torch.empty(split * N * M, device=x.device, dtype=torch.float32)
        locks = torch.zeros(grid[0] * grid[1], device=x.device, dtype=torch.int32)
        return lambda: rowk_kernel[(grid[0], split, grid[1])](
            A.crow, woff, A.col, A.values, A.row_order, xt, out, ws, locks, M, N, woff.shape[1], xs, K,
            R=r, BN=bn, BNNZ=step, KC=kc, SPLIT=split, CG=True, num_warps=wps)
    if variant == "slab":
        vals, cols, off, lens, orows = cache.setdefault(("slab", r), ell_slabs(A, r))
        return lambda: slab_kernel[(off.numel() - 1, grid[1])](
            off, lens, orows, cols, vals, xt, out, M, N, xs, K,
            R=r, RD=max(r, 16), BN=bn, BF=step, SCALE_B=True, num_warps=wps, num_stages=3)
    if variant == "flat":
        return lambda: flat_kernel[grid](A.crow, A.col, A.values, xt, out, M, N, xs,
                                         R=r, RD=max(r, 16), BN=bn, BNNZ=step, PAD_K=K, num_warps=wps)
    raise ValueError(variant)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="row_t,rowr", help=f"comma-separated, of {','.join(VARIANTS)}")
    p.add_argument("--once", action="store_true", help="one call of each kernel, untimed (for ncu)")
    p.add_argument("--n", type=int, nargs="*", default=[16, 32])
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    M = K = 4096
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    rows, cache = [], {}

    def hot(fn):
        fn()
        torch.cuda.synchronize()
        return float("nan") if args.once else do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3

    def cold(fn):
        return float("nan") if args.once else cold_replay(fn) * 1e6

    for N in args.n:
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        ref = F.linear(x.float(), w.float())
        rows.append((N, "cuBLAS", hot(lambda: F.linear(x, w)), cold(lambda: F.linear(x, w)), ""))
        for bn in sorted({min(N, 32), 16}):
            xt = xt_copy(x, bn)
            rows.append((N, f"transpose bn={bn}", hot(lambda: xt_copy(x, bn, xt)), float("nan"), ""))
            for variant in args.variants.split(","):
                for cfg in VARIANTS[variant]:
                    r, step, wps = cfg
                    if variant.startswith("row") and r * step * bn > 64 * 32 * wps:
                        continue  # over 64 fp32 accumulators per thread
                    name = f"{variant} {r}x{step} w{wps} bn{bn}"
                    try:
                        kern = launcher(variant, cfg, A, x, xt, out, bn, cache)
                        out.fill_(float("nan"))
                        t_kernel = hot(kern)
                        err = ((out.float() - ref).norm() / ref.norm()).item()
                        whole = lambda: (xt_copy(x, bn, xt), kern())  # noqa: E731
                        rows.append((N, name, t_kernel, cold(whole), f"{err:.1e}" if err < 2e-2 else f"WRONG {err:.1e}"))
                    except Exception as e:  # noqa: BLE001
                        rows.append((N, name, float("nan"), float("nan"), f"FAILED {str(e)[:80]}"))
    print(f"qkv {M}x{K} d=0.1 nnz={A.values.numel()} col {A.col.dtype}; us: kernel alone, hot (graph replay); "
          "whole (transpose + kernel), cold (L2 flushed); cuBLAS: hot and cold")
    for N, name, t_hot, t_cold, note in rows:
        print(f"N={N:3d} {name:32s} {t_hot:8.2f} {t_cold:8.2f}  {note}")


if __name__ == "__main__":
    main()
