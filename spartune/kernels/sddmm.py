"""SDDMM: scale * (a @ b^T) at the stored positions of a CSR or BlockSparse pattern.

a is (M, D), b is (N, D) (any strides), the pattern is (M, N); the result is a new values
tensor shaped like `pattern.values`. fp32 accumulation. Paths (`Config.path`):

* ``"gather"`` (CSR, CUDA cores, Sputnik): a program owns `block_m` rows in `row_order`
  (longest first), keeps their a rows (when D fits one `block_d` chunk), and walks their
  nonzeros `block_n` at a time, gathering
  whole b rows (contiguous along D) and reducing over D in chunks of `block_d`.
* ``"dense"`` (CSR, tensor cores): a program owns `block_m` rows and `per_program` column tiles
  of `block_n` (a multiple of 32). Each tile of a @ b^T is one `tl.dot` per `block_d` chunk of
  D (when D fits one chunk, the a rows are loaded once and reused across the tiles), then the stored entries are written straight
  into `values` through the pattern's bitmap (position = first nonzero of the row at or after
  the tile + prefix count of the bits); tiles with no stored entry are skipped.
* ``"block"`` (BlockSparse, tensor cores): a program owns one block-row and `per_program` of its
  blocks; every block is a small dense (bm, D) @ (D, bk) product. Padding beyond the matrix
  computes to 0 (masked loads), as the format requires.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..formats import CSR, BlockSparse
from ..tune.problem import ELEMENT_BYTES, KernelFeatures, Problem
from ._bitmap import EXPAND_FLOPS_PER_ELEMENT, HW_POPC, csr_bitmap, expand_chunk
from ._common import dot_precision, next_pow2, row_chunk, swizzled_rows

PATHS = ("gather", "dense", "block")


@dataclass(frozen=True)
class Config:
    path: str  # "gather" | "dense" (CSR) | "block" (BlockSparse)
    block_m: int  # gather: rows per program; dense: rows of a tile; block: unused (the block's bm)
    block_n: int  # gather: nonzeros per step; dense: columns of a tile; block: unused (bk)
    block_d: int  # chunk of the shared dimension D
    per_program: int = 1  # dense: column tiles per program; block: blocks per program
    num_warps: int = 4
    num_stages: int = 2


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sddmm_gather_kernel(
    crow_ptr, col_ptr, order_ptr, a_ptr, b_ptr, out_ptr,
    M, D, stride_am, stride_ad, stride_bn, stride_bd, scale,
    R: tl.constexpr, BNNZ: tl.constexpr, BD: tl.constexpr, ONE_D: tl.constexpr,
):
    rows, rvalid, start, length = swizzled_rows(tl.program_id(0), order_ptr, crow_ptr, M, R)
    a_row = a_ptr + rows[:, None] * stride_am  # (R, 1)
    dd = tl.arange(0, BD)
    if ONE_D:  # the rows of a stay in registers for all their nonzeros
        a_all = tl.load(a_row + dd[None, :] * stride_ad, mask=rvalid[:, None] & (dd < D)[None, :], other=0.0)
        a_all = a_all.to(tl.float32)[:, None, :]
    longest = tl.max(length, axis=0)
    for s in range(0, longest, BNNZ):
        m, off = row_chunk(s, start, length, BNNZ)  # (R, BNNZ)
        c = tl.load(col_ptr + off, mask=m, other=0).to(tl.int32)
        b_row = b_ptr + c[:, :, None] * stride_bn  # (R, BNNZ, 1)
        if ONE_D:
            bv = tl.load(b_row + dd[None, None, :] * stride_bd, mask=m[:, :, None] & (dd < D)[None, None, :], other=0.0)
            acc = tl.sum(a_all * bv.to(tl.float32), axis=2)
        else:
            acc = tl.zeros((R, BNNZ), dtype=tl.float32)
            for d0 in range(0, D, BD):
                d = d0 + dd
                dm = d < D
                av = tl.load(a_row + d[None, :] * stride_ad, mask=rvalid[:, None] & dm[None, :], other=0.0)
                bv = tl.load(b_row + d[None, None, :] * stride_bd, mask=m[:, :, None] & dm[None, None, :], other=0.0)
                acc += tl.sum(av.to(tl.float32)[:, None, :] * bv.to(tl.float32), axis=2)
        tl.store(out_ptr + off, (acc * scale).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rows_of_a(a_tile, rvalid, D, BD: tl.constexpr, ONE_D: tl.constexpr):
    """The program's rows of a, loaded once when D fits one chunk (ONE_D); otherwise _scores
    loads them chunk by chunk and this placeholder is never read."""
    dd = tl.arange(0, BD)
    if ONE_D:
        return tl.load(a_tile, mask=rvalid[:, None] & (dd < D)[None, :], other=0.0)
    else:
        return tl.zeros((a_tile.shape[0], BD), dtype=a_tile.dtype.element_ty)


@triton.jit
def _scores(a_full, a_tile, b_tile, rvalid, cvalid, D, stride_ad, stride_bd,
            BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, ONE_D: tl.constexpr, PRECISION: tl.constexpr):
    """(BM, BN) fp32 tile of a @ b^T for the rows of a_tile and the columns of b_tile ((BD, BN)
    pointers to b^T): one dot with the preloaded rows when D fits one chunk, else D in chunks."""
    dd = tl.arange(0, BD)
    if ONE_D:
        bt = tl.load(b_tile, mask=cvalid[None, :] & (dd < D)[:, None], other=0.0)
        s = tl.dot(a_full, bt, input_precision=PRECISION)
    else:
        s = tl.zeros((BM, BN), dtype=tl.float32)
        for d0 in range(0, D, BD):
            dm = (d0 + dd) < D
            av = tl.load(a_tile + d0 * stride_ad, mask=rvalid[:, None] & dm[None, :], other=0.0)
            bt = tl.load(b_tile + d0 * stride_bd, mask=cvalid[None, :] & dm[:, None], other=0.0)
            s = tl.dot(av, bt, s, input_precision=PRECISION)
    return s


@triton.jit
def _sddmm_dense_kernel(
    bits_ptr, woff_ptr, a_ptr, b_ptr, out_ptr,
    M, N, D, NW, stride_am, stride_ad, stride_bn, stride_bd, scale,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, CT: tl.constexpr, ONE_D: tl.constexpr,
    PRECISION: tl.constexpr, HW: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rvalid = rows < M
    bits_row = bits_ptr + rows.to(tl.int64) * NW
    woff_row = woff_ptr + rows.to(tl.int64) * NW
    dd = tl.arange(0, BD)
    cj = tl.arange(0, BN)
    a_tile = a_ptr + rows[:, None] * stride_am + dd[None, :] * stride_ad  # (BM, BD)
    a_full = _rows_of_a(a_tile, rvalid, D, BD, ONE_D)
    tiles = tl.minimum(CT, tl.cdiv(N, BN) - pid_c * CT)
    for t in range(0, tiles):
        n0 = (pid_c * CT + t) * BN
        base = tl.load(woff_row + n0 // 32, mask=rvalid, other=0)
        bit, pos, _ = expand_chunk(bits_row, base, n0, NW, rvalid, BM, BN, HW)
        if tl.max(tl.max(bit.to(tl.int32), axis=1), axis=0) != 0:
            cols = n0 + cj
            b_tile = b_ptr + cols[None, :] * stride_bn + dd[:, None] * stride_bd  # (BD, BN): b^T
            s = _scores(a_full, a_tile, b_tile, rvalid, cols < N, D, stride_ad, stride_bd, BM, BN, BD, ONE_D, PRECISION)
            tl.store(out_ptr + pos, (s * scale).to(out_ptr.dtype.element_ty), mask=bit)


@triton.jit
def _sddmm_block_kernel(
    crow_ptr, bcol_ptr, a_ptr, b_ptr, out_ptr,
    M, N, D, stride_am, stride_ad, stride_bn, stride_bd, scale,
    BMB: tl.constexpr, BKB: tl.constexpr, BD: tl.constexpr, G: tl.constexpr, ONE_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    br = tl.program_id(0)
    first = tl.load(crow_ptr + br).to(tl.int64) + tl.program_id(1) * G  # int64: block offsets grow large
    last = tl.minimum(tl.load(crow_ptr + br + 1).to(tl.int64), first + G)
    ri = tl.arange(0, BMB)
    ci = tl.arange(0, BKB)
    dd = tl.arange(0, BD)
    rows = br * BMB + ri
    rvalid = rows < M
    a_tile = a_ptr + rows[:, None] * stride_am + dd[None, :] * stride_ad
    a_full = _rows_of_a(a_tile, rvalid, D, BD, ONE_D)
    out_tile = out_ptr + ri[:, None] * BKB + ci[None, :]
    for blk in range(first, last):
        cols = tl.load(bcol_ptr + blk) * BKB + ci
        b_tile = b_ptr + cols[None, :] * stride_bn + dd[:, None] * stride_bd  # (BD, BKB)
        s = _scores(a_full, a_tile, b_tile, rvalid, cols < N, D, stride_ad, stride_bd, BMB, BKB, BD, ONE_D, PRECISION)
        tl.store(out_tile + blk * (BMB * BKB), (s * scale).to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------
def launch(a: torch.Tensor, b: torch.Tensor, pattern: CSR | BlockSparse, config: Config, *,
           scale: float = 1.0, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """New values for `pattern`: scale * (a @ b^T) at its stored positions."""
    M, N = pattern.shape
    D = a.shape[1]
    out = torch.empty(pattern.values.shape, dtype=out_dtype or a.dtype, device=a.device)
    if out.numel() == 0:
        return out
    if D == 0:
        return out.zero_()
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    scale = float(scale)
    prec = dot_precision(a.dtype)
    if isinstance(pattern, BlockSparse):
        if config.path != "block":
            raise ValueError(f"a BlockSparse pattern needs the 'block' path, got {config.path!r}")
        bm, bk = pattern.block
        g = config.per_program
        grid = (pattern.block_rows, triton.cdiv(max(1, pattern.stats().items_max), g))
        _sddmm_block_kernel[grid](
            pattern.crow, pattern.col, a, b, out, M, N, D, *strides, scale,
            BMB=bm, BKB=bk, BD=config.block_d, G=g, ONE_D=D <= config.block_d, PRECISION=prec,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
        return out
    if config.path == "gather":
        grid = (triton.cdiv(M, config.block_m),)
        _sddmm_gather_kernel[grid](
            pattern.crow, pattern.col, pattern.row_order, a, b, out, M, D, *strides, scale,
            R=config.block_m, BNNZ=config.block_n, BD=config.block_d, ONE_D=D <= config.block_d,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
    elif config.path == "dense":
        bits, woff = csr_bitmap(pattern)
        ct = config.per_program
        grid = (triton.cdiv(M, config.block_m), triton.cdiv(triton.cdiv(N, config.block_n), ct))
        _sddmm_dense_kernel[grid](
            bits, woff, a, b, out, M, N, D, bits.shape[1], *strides, scale,
            BM=config.block_m, BN=config.block_n, BD=config.block_d, CT=ct, ONE_D=D <= config.block_d,
            PRECISION=prec, HW=HW_POPC, num_warps=config.num_warps, num_stages=config.num_stages,
        )
    else:
        raise ValueError(f"a CSR pattern needs the 'gather' or 'dense' path, got {config.path!r}")
    return out


# ---------------------------------------------------------------------------------------------
# config space and cost-model features
# ---------------------------------------------------------------------------------------------
def _block_of(fmt: str) -> tuple[int, int] | None:
    if fmt.startswith("block:"):
        bm, bk = fmt.split(":", 1)[1].split("x")
        return int(bm), int(bk)
    return None


def space(problem: Problem) -> list[Config]:
    """problem.m, problem.k: the pattern's shape (M, N); problem.n: the shared dimension D."""
    d = max(1, problem.n)
    bd = min(128, max(16, next_pow2(d)))
    blk = _block_of(problem.fmt)
    out: list[Config] = []
    if blk is not None:
        bm, bk = blk
        for g in (1, 2, 4, 8, 16):
            for w in (4, 8):
                if w == 8 and bm * bk < 64 * 64:
                    continue
                out.append(Config("block", bm, bk, bd, per_program=g, num_warps=w, num_stages=2))
        return out
    nnz_cap = max(16, next_pow2(int(problem.stats.items_mean)))
    for r, bnnz in ((1, 64), (1, 128), (2, 32), (2, 64), (4, 16), (4, 32), (8, 16), (1, 32), (2, 16)):
        tile = r * bnnz * bd
        if bnnz <= nnz_cap and tile <= 8192:
            out.append(Config("gather", r, bnnz, bd, num_warps=4 if tile <= 4096 else 8))
    for bm, bn, ct, w in ((64, 64, 1, 4), (64, 64, 8, 4), (64, 128, 4, 4), (128, 64, 4, 8),
                          (128, 128, 1, 8), (128, 128, 4, 8), (64, 32, 8, 4)):
        out.append(Config("dense", bm, bn, bd, per_program=ct, num_warps=w, num_stages=2))
    return out


def features(problem: Problem, config: Config) -> KernelFeatures:
    st = problem.stats
    M, N, D = problem.m, problem.k, max(1, problem.n)
    s = ELEMENT_BYTES.get(problem.dtype, 2)
    nnz = st.nnz
    ab = (M + N) * D * s
    dchunks = -(-D // config.block_d)
    if config.path == "block":
        bm, bk = _block_of(problem.fmt) or (config.block_m, config.block_n)
        nnzb = int(round(st.items_mean * st.units))
        g = config.per_program
        programs = st.units * max(1, -(-st.items_max // g))
        out_b = nnzb * bm * bk * s
        return KernelFeatures(
            programs=programs, tiles=max(1, nnzb), mma_flops=2.0 * nnzb * bm * bk * dchunks * config.block_d,
            fma_flops=0.0, dram_bytes=float(ab + out_b + 8 * nnzb),
            l2_bytes=float(nnzb * bk * D * s + st.units * -(-max(1.0, st.items_mean) // g) * bm * D * s + out_b),
            steps_max=min(g, st.items_max), steps_mean=float(min(g, st.items_mean)),
            smem_bytes=(bm + bk) * config.block_d * s, num_warps=config.num_warps, num_stages=config.num_stages,
        )
    idx = 2 if N < 2**15 else 4
    if config.path == "gather":
        r, bnnz = config.block_m, config.block_n
        programs = -(-M // r)
        steps_max = -(-st.items_max // bnnz)
        steps_mean = math.ceil(st.items_mean / bnnz) if st.items_mean else 0
        return KernelFeatures(
            programs=programs, tiles=programs, mma_flops=0.0, fma_flops=2.0 * nnz * D,
            dram_bytes=float(ab + nnz * (idx + s) + 8 * M),
            l2_bytes=float(nnz * D * s + M * D * s * max(1, steps_mean) + nnz * (idx + s)),
            steps_max=int(steps_max), steps_mean=float(steps_mean),
            smem_bytes=r * bnnz * 4, num_warps=config.num_warps, num_stages=config.num_stages,
        )
    bm, bn, ct = config.block_m, config.block_n, config.per_program
    tm, tn = -(-M // bm), -(-N // bn)
    programs = tm * -(-tn // ct)
    bitmap = 2 * M * (-(-N // 32)) * 4
    return KernelFeatures(
        programs=programs, tiles=tm * tn,
        mma_flops=2.0 * tm * bm * tn * bn * dchunks * config.block_d,
        fma_flops=EXPAND_FLOPS_PER_ELEMENT * tm * bm * tn * bn,
        dram_bytes=float(ab + bitmap + nnz * s),
        l2_bytes=float(N * D * s * tm + M * D * s * (-(-tn // ct)) + bitmap + nnz * s),
        steps_max=min(ct, tn), steps_mean=float(min(ct, tn)),
        smem_bytes=(bm + bn) * config.block_d * s * config.num_stages,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


__all__ = ["Config", "PATHS", "features", "launch", "space"]
