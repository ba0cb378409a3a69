"""Row-wise softmax over the stored entries of a CSR or BlockSparse matrix: softmax(scale * A).

Max-subtracted, fp32 inside, result in A's dtype with A's pattern. An empty row stays empty
(nothing to write; a row whose entries are all -inf gives zeros, not NaN). For BlockSparse,
the padding of edge blocks (columns >= K, rows >= M) takes no part and is written as 0.

Paths (`Config.path`):
* ``"row"`` (CSR): a program owns `block_m` rows in `row_order` (longest first) and walks them
  `block_n` entries at a time; a row that fits in one step is read once, longer rows take an
  online max/sum pass and a write pass.
* ``"block"`` (BlockSparse): a program owns `block_m` rows of one block-row (a divisor of bm)
  and walks the block-row's blocks: an online max/sum pass over (block_m, bk) tiles, then a
  write pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..formats import CSR, BlockSparse
from ..tune.problem import ELEMENT_BYTES, KernelFeatures, Problem
from ._common import next_pow2, swizzled_rows

PATHS = ("row", "block")


@dataclass(frozen=True)
class Config:
    path: str  # "row" (CSR) | "block" (BlockSparse)
    block_m: int  # rows per program
    block_n: int  # row: entries per step; block: unused (the block's bk)
    num_warps: int = 4


@triton.jit
def _online_update(mx, tot, x):
    """One chunk of the running (max, sum of exp) per row; -inf rows (nothing seen) stay safe."""
    new = tl.maximum(mx, tl.max(x, axis=1))
    safe = tl.where(new == float("-inf"), 0.0, new)
    return new, tot * tl.exp(mx - safe) + tl.sum(tl.exp(x - safe[:, None]), axis=1)


@triton.jit
def _normaliser(mx, tot):
    """(shift, 1 / sum) per row; an empty row gets (0, 1), so it writes nothing odd."""
    return tl.where(mx == float("-inf"), 0.0, mx), 1.0 / tl.where(tot == 0.0, 1.0, tot)


@triton.jit
def _softmax_row_kernel(crow_ptr, order_ptr, val_ptr, out_ptr, M, scale,
                        R: tl.constexpr, BLOCK: tl.constexpr):
    rows, rvalid, start, length = swizzled_rows(tl.program_id(0), order_ptr, crow_ptr, M, R)
    longest = tl.max(length, axis=0)
    jj = tl.arange(0, BLOCK)
    if longest <= BLOCK:
        m = jj[None, :] < length[:, None]
        off = start[:, None] + jj[None, :]
        x = tl.load(val_ptr + off, mask=m, other=float("-inf")).to(tl.float32) * scale
        x = tl.where(m, x, float("-inf"))
        mx = tl.max(x, axis=1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        e = tl.exp(x - mx[:, None])
        tot = tl.sum(e, axis=1)
        tot = tl.where(tot == 0.0, 1.0, tot)
        tl.store(out_ptr + off, (e / tot[:, None]).to(out_ptr.dtype.element_ty), mask=m)
    else:
        mx = tl.full((R,), float("-inf"), tl.float32)
        tot = tl.zeros((R,), tl.float32)
        for s in range(0, longest, BLOCK):
            j = s + jj
            m = j[None, :] < length[:, None]
            x = tl.load(val_ptr + start[:, None] + j[None, :], mask=m, other=float("-inf")).to(tl.float32) * scale
            x = tl.where(m, x, float("-inf"))
            mx, tot = _online_update(mx, tot, x)
        safe, inv = _normaliser(mx, tot)
        for s in range(0, longest, BLOCK):
            j = s + jj
            m = j[None, :] < length[:, None]
            off = start[:, None] + j[None, :]
            x = tl.load(val_ptr + off, mask=m, other=float("-inf")).to(tl.float32) * scale
            x = tl.where(m, x, float("-inf"))
            tl.store(out_ptr + off, (tl.exp(x - safe[:, None]) * inv[:, None]).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _softmax_block_kernel(crow_ptr, bcol_ptr, val_ptr, out_ptr, M, K, scale,
                          RB: tl.constexpr, BMB: tl.constexpr, BKB: tl.constexpr):
    br = tl.program_id(0)
    sub = tl.program_id(1)
    first = tl.load(crow_ptr + br).to(tl.int64)  # int64: block offsets grow large
    last = tl.load(crow_ptr + br + 1).to(tl.int64)
    ri = sub * RB + tl.arange(0, RB)  # rows inside the block
    ci = tl.arange(0, BKB)
    rvalid = (br * BMB + ri) < M
    tile = ri[:, None] * BKB + ci[None, :]
    mx = tl.full((RB,), float("-inf"), tl.float32)
    tot = tl.zeros((RB,), tl.float32)
    for blk in range(first, last):
        cvalid = (tl.load(bcol_ptr + blk) * BKB + ci) < K
        m = rvalid[:, None] & cvalid[None, :]
        x = tl.load(val_ptr + blk * (BMB * BKB) + tile).to(tl.float32) * scale
        x = tl.where(m, x, float("-inf"))
        mx, tot = _online_update(mx, tot, x)
    safe, inv = _normaliser(mx, tot)
    for blk in range(first, last):
        cvalid = (tl.load(bcol_ptr + blk) * BKB + ci) < K
        m = rvalid[:, None] & cvalid[None, :]
        off = blk * (BMB * BKB) + tile
        x = tl.load(val_ptr + off).to(tl.float32) * scale
        y = tl.where(m, tl.exp(x - safe[:, None]) * inv[:, None], 0.0)
        tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty))


def launch(A: CSR | BlockSparse, config: Config, *, scale: float = 1.0) -> torch.Tensor:
    """Values of softmax(scale * A) over each row's stored entries, A's pattern and dtype."""
    out = torch.empty_like(A.values)
    if out.numel() == 0:
        return out
    M, K = A.shape
    if isinstance(A, BlockSparse):
        if config.path != "block":
            raise ValueError(f"a BlockSparse matrix needs the 'block' path, got {config.path!r}")
        bm, bk = A.block
        rb = min(config.block_m, bm)
        _softmax_block_kernel[(A.block_rows, bm // rb)](
            A.crow, A.col, A.values, out, M, K, float(scale), RB=rb, BMB=bm, BKB=bk,
            num_warps=config.num_warps,
        )
        return out
    if config.path != "row":
        raise ValueError(f"a CSR matrix needs the 'row' path, got {config.path!r}")
    _softmax_row_kernel[(triton.cdiv(M, config.block_m),)](
        A.crow, A.row_order, A.values, out, M, float(scale), R=config.block_m, BLOCK=config.block_n,
        num_warps=config.num_warps,
    )
    return out


def space(problem: Problem) -> list[Config]:
    fmt = problem.fmt
    if fmt.startswith("block:"):
        bm, bk = (int(v) for v in fmt.split(":", 1)[1].split("x"))
        out = []
        for rb in (8, 16, 32, 64, 128):
            if rb <= bm and 512 <= rb * bk <= 8192:
                out.append(Config("block", rb, bk, num_warps=4 if rb * bk <= 4096 else 8))
        return out or [Config("block", min(bm, 16), bk)]
    st = problem.stats
    fit = min(4096, max(32, next_pow2(st.items_max)))  # one step holds the longest row
    out = []
    for block in sorted({fit, min(fit, 1024), min(fit, 256)}):
        for r in (1, 2, 4, 8, 16, 32):
            if 256 <= r * block <= 8192:
                out.append(Config("row", r, block, num_warps=4 if r * block <= 4096 else 8))
    return out or [Config("row", 1, fit)]


def features(problem: Problem, config: Config) -> KernelFeatures:
    st = problem.stats
    s = ELEMENT_BYTES.get(problem.dtype, 2)
    if config.path == "block":
        bm, bk = (int(v) for v in problem.fmt.split(":", 1)[1].split("x"))
        nnzb = st.items_mean * st.units
        stored = nnzb * bm * bk
        programs = st.units * (bm // min(config.block_m, bm))
        return KernelFeatures(
            programs=programs, tiles=programs, mma_flops=0.0, fma_flops=8.0 * stored,
            dram_bytes=float(2 * stored * s), l2_bytes=float(3 * stored * s),
            steps_max=2 * st.items_max, steps_mean=2 * st.items_mean, smem_bytes=config.block_m * 8,
            num_warps=config.num_warps, num_stages=1,
        )
    r, block = config.block_m, config.block_n
    steps = math.ceil(st.items_max / block) if st.items_max else 0
    passes = 1 if steps <= 1 else 2
    return KernelFeatures(
        programs=-(-st.rows // r), tiles=-(-st.rows // r), mma_flops=0.0, fma_flops=8.0 * st.nnz,
        dram_bytes=float(2 * st.nnz * s + 8 * st.rows), l2_bytes=float((passes + 1) * st.nnz * s + 8 * st.rows),
        steps_max=steps * passes, steps_mean=float(math.ceil(st.items_mean / block) * passes),
        smem_bytes=r * 8, num_warps=config.num_warps, num_stages=1,
    )


__all__ = ["Config", "PATHS", "features", "launch", "space"]
