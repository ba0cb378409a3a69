"""What a config of the CSR family is, which configs are tried for a problem (`space`) and what
each costs for the cost model (`features`). The choices live here, never in the kernel files:
the tuner ranks this space, the kernels run whatever Config they are handed."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...tune.problem import ELEMENT_BYTES, INDEX_CHAIN, KernelFeatures, Problem
from .._bitmap import EXPAND_FLOPS_PER_ELEMENT
from .._common import next_pow2
from .._ell import ELL_WIDTH_STEP
from .expand import padded_k

PATHS = ("row", "row_t", "ell", "dense", "expand")


@dataclass(frozen=True)
class Config:
    path: str  # "row" | "row_t" (row on a token-contiguous copy of x) | "ell" | "dense" | "expand"
    block_m: int  # row: sparse rows per program; dense: rows of the output tile
    block_n: int  # tokens per program
    block_k: int  # row: nonzeros per step of a row; dense: K chunk (multiple of 32)
    num_warps: int = 4
    num_stages: int = 2
    group_m: int = 8  # dense: program swizzle so programs running together share x chunks
    split_k: int = 1  # dense: programs sharing one tile along K (decode: enough programs in flight)


# ---------------------------------------------------------------------------------------------
# the tiles space() tries, in the order it tries them (order matters: equal predictions keep it)
# ---------------------------------------------------------------------------------------------
# row_t, (rows, nonzeros per step, warps): small programs first, 1-2 warps with 32-64 nonzeros
# per row in flight measured best (benchmarks/LOG.md, "CSR decode": qkv N=16, 2x64 on 2 warps
# 12.5 us vs 4x128 on 4 15.2); the 16-token second strip (16 < N <= 64) tries the first three
ROW_T_TILES = ((2, 64, 2), (2, 32, 1), (1, 64, 1), (4, 32, 2), (4, 64, 4), (2, 128, 4), (1, 128, 2), (1, 256, 4))
# ell at N = 1, (rows, warps): the row kernel takes a whole row per step, so only rows and warps vary
ELL_N1_TILES = ((2, 2), (4, 4), (4, 8), (1, 2), (8, 8))
# ell at 1 < N <= 32, (rows, nonzeros per step, warps): row_t's kernel, so row_t's small tiles
ELL_TILES = ((2, 64, 2), (2, 32, 1), (1, 64, 1), (4, 32, 2), (4, 64, 4), (1, 128, 2))
# row, (rows, nonzeros per step): tiles of 1-8K elements, longest steps first; at most 5 per
# token strip are taken (3 for prefill), those whose step fits the typical row
ROW_TILES = ((1, 512), (2, 256), (4, 128), (8, 64), (4, 256), (16, 64), (8, 128),
             (2, 128), (4, 64), (16, 32), (32, 32), (1, 128))
# row, (rows, nonzeros per step), when no tile of ROW_TILES fits: the row path always has a config
ROW_FALLBACK_TILE = (4, 64)
# dense at decode (N <= 32), (block_m, block_k, warps): one token tile, so the rows and K chunk
# vary; each is tried with K split to fill the SMs (see space())
DENSE_DECODE_TILES = ((16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 8), (128, 64, 8))
# dense at prefill (N > 32), (block_m, block_n, block_k, warps, stages): GEMM tiles; block_n is
# capped at N rounded up, duplicates and tiles over 200 KB of shared memory dropped
DENSE_PREFILL_TILES = ((64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 32, 8, 3), (128, 128, 64, 8, 3),
                       (64, 256, 32, 8, 3), (64, 256, 64, 8, 3), (128, 256, 32, 8, 3), (128, 256, 64, 8, 3),
                       (128, 128, 64, 8, 4), (64, 128, 128, 4, 3))
# expand (N >= 128), (block_m, tokens, block_k, warps, stages): the GEMM's tiles; tokens capped at
# N rounded up, block_k at 32 for fp32, duplicates and tiles over 200 KB of shared memory dropped
EXPAND_TILES = ((256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4),
                (128, 128, 64, 8, 4), (256, 128, 64, 8, 4), (128, 128, 32, 4, 4))

# The ell path pads rows within a band; past this spread of row lengths (coefficient of
# variation) bands of 32 rows waste too much to try it
ELL_MAX_CV = 1.0


def ell_padding(st) -> float:
    """Padding entries per row the banded ELL copy is expected to hold: half a width step, and
    about a third of the row-length spread a band of sorted rows covers."""
    return ELL_WIDTH_STEP / 2 + st.items_mean * st.items_cv / 3


def _smem_dense(dtype: str, bm: int, bn: int, bk: int, stages: int) -> int:
    s = ELEMENT_BYTES.get(dtype, 2)
    return stages * bk * bn * s + bm * bk * s


def _tokens_adjacent(problem: Problem) -> bool:
    """x's tokens are contiguous (spmm's X^T): the row path's gather is then vector loads."""
    return problem.layout == "spmm" or problem.op == "spmm"


def space(problem: Problem) -> list[Config]:
    """Valid configs of the five paths for this problem (about 15-40)."""
    n = max(1, problem.n)
    out: list[Config] = []
    # --- row path: Sputnik, CUDA cores ---------------------------------------------------------
    # steps longer than the typical row waste lanes; tiles of 1-8K elements keep registers sane
    nnz_cap = max(32, next_pow2(int(problem.stats.items_mean)))
    bns = {min(next_pow2(n), 32)} | ({8} if n > 8 else set()) | ({16} if n > 16 else set())
    if n > 64:  # prefill: the row path gathers nnz x N elements and cannot win; a few configs
        bns = {64}
    if 1 < n <= 64 and not _tokens_adjacent(problem):
        # row_t: (rows, nonzeros, tokens) tiles of <= 64 fp32 accumulators per thread; all tokens
        # in one strip up to 32 (one pass over the values)
        # (16 < N <= 64 also in 16-token strips: each strip's x copy is a smaller L1 footprint)
        for bn in sorted({min(next_pow2(n), 32)} | ({16} if n > 16 else set()), reverse=True):
            tiles = ROW_T_TILES if bn == min(next_pow2(n), 32) else ROW_T_TILES[:3]
            for r, bnnz, w in tiles:
                if bnnz <= max(64, nnz_cap) and r * bnnz * bn <= 64 * 32 * w:
                    out.append(Config("row_t", r, bn, bnnz, num_warps=w, num_stages=2))
    if n <= 32 and problem.stats.items_cv <= ELL_MAX_CV:
        # --- ell: the row kernels on the banded ELL copy (decode: the row-pointer round trip
        # before the first index load is gone; benchmarks/LOG.md, "CSR decode at N = 1") -------
        if n == 1:  # the row kernel, a whole row per step: (rows, warps)
            step = min(512, max(64, nnz_cap))
            for r, w in ELL_N1_TILES:
                out.append(Config("ell", r, 1, step, num_warps=w, num_stages=2))
        else:  # row_t's kernel (x copied token-contiguous unless it already is)
            bn = min(next_pow2(n), 32)
            for r, bnnz, w in ELL_TILES:
                if bnnz <= max(64, nnz_cap) and r * bnnz * bn <= 64 * 32 * w:
                    out.append(Config("ell", r, bn, bnnz, num_warps=w, num_stages=2))
    for bn in sorted(bns):
        picked = 0
        for r, bnnz in ROW_TILES:
            tile = r * bn * bnnz
            if bnnz > nnz_cap or not 1024 <= tile <= 8192 or picked >= (5 if n <= 64 else 3):
                continue
            out.append(Config("row", r, bn, bnnz, num_warps=4 if tile <= 4096 else 8, num_stages=2))
            picked += 1
        if not picked:
            r, bnnz = ROW_FALLBACK_TILE
            out.append(Config("row", r, bn, bnnz, num_warps=4, num_stages=2))
    # --- dense path: tensor cores -----------------------------------------------------------
    if n <= 32:
        # decode: few tiles, so K is split until ~4 programs per SM are in flight
        bn = max(16, next_pow2(n))
        for bm, bk, w in DENSE_DECODE_TILES:
            tiles = -(-problem.m // bm) * -(-n // bn)
            chunks = -(-problem.k // bk)
            want = next_pow2(-(-528 // max(1, tiles)))
            for split in sorted({1, min(want, max(1, chunks // 2)), min(2 * want, max(1, chunks // 2))}):
                out.append(Config("dense", bm, bn, bk, num_warps=w, num_stages=3, split_k=split))
    else:
        for bm, bn, bk, w, st in DENSE_PREFILL_TILES:
            bn = min(bn, max(16, next_pow2(n)))
            c = Config("dense", bm, bn, bk, num_warps=w, num_stages=st)
            if c not in out and _smem_dense(problem.dtype, bm, bn, bk, st) <= 200 * 1024:
                out.append(c)
    # --- expand path: densify once, then a dense tensor-core GEMM (prefill) ---------------------
    if n >= 128:
        s = ELEMENT_BYTES.get(problem.dtype, 2)
        for bm, bt, bk, w, st in EXPAND_TILES:
            bt = min(bt, max(16, next_pow2(n)))
            if s == 4 and bk > 32:
                bk = 32
            c = Config("expand", bm, bt, bk, num_warps=w, num_stages=st)
            if c not in out and st * (bm + bt) * bk * s <= 200 * 1024:
                out.append(c)
    return out


# The dense path's fused expansion, per element, in units of the standalone expand kernel's
# (fitted on the train half of benchmarks/data/h100-2026-11-22-run6, benchmarks/fit_model.py)
FUSED_EXPAND_COST = 2.5


def features(problem: Problem, config: Config) -> KernelFeatures:
    st = problem.stats
    M, K, N = problem.m, problem.k, max(1, problem.n)
    s = ELEMENT_BYTES.get(problem.dtype, 2)
    idx = 2 if K < 2**15 else 4
    nnz = st.nnz
    epi = problem.epilogue
    epi_bytes = (M * s if epi.bias else 0) + (N * M * s if epi.residual else 0)
    y_bytes = N * M * s
    x_bytes = N * K * s
    if config.path in ("row", "row_t", "ell"):
        r, bn, bnnz = config.block_m, config.block_n, config.block_k
        strips = -(-N // bn)
        programs = -(-M // r) * strips
        ell = config.path == "ell"
        # x gather: a token-contiguous x (spmm's X^T) moves useful bytes; the linear layout pays
        # about one sector per gathered element when nonzeros are sparse along K
        adjacent = _tokens_adjacent(problem) or config.path in ("row_t", "ell") or N == 1
        per_elem = s if adjacent else min(32.0, s / max(st.density, 1e-6))
        gather = nnz * strips * bn * per_elem
        copied = config.path in ("row_t", "ell") and N > 1 and not _tokens_adjacent(problem)
        copy = 2 * x_bytes if copied else 0
        padding = ell_padding(st) if ell else 0.0  # per row; streamed like the nonzeros
        stream = (nnz + M * padding) * (s + idx) + (4 if ell else 12) * M
        # a program runs as long as its longest row; rows are sorted, so about the mean. The
        # row paths load their row pointers before the first index: one dependent round trip
        # more, declared as a share of a step's index -> tile chain (problem.INDEX_CHAIN)
        prologue = 0.0 if ell else 1.0 / INDEX_CHAIN
        steps_max = math.ceil(-(-st.items_max // bnnz) + prologue)
        steps_mean = prologue + max(0.0, math.ceil(
            (st.items_mean * (1 + 0.5 * st.items_cv / max(1, r) ** 0.5) + padding) / bnnz))
        return KernelFeatures(
            programs=programs, tiles=programs, mma_flops=0.0,
            # in flop-equivalents (2 per instruction): ~3.5 SASS instructions per (nonzero, token)
            # with vector loads of x, ~14 without
            fma_flops=2.0 * nnz * strips * bn * (3.5 if adjacent else 14.0),
            dram_bytes=float(stream + x_bytes + y_bytes + epi_bytes + copy),
            l2_bytes=float(stream * strips + gather + y_bytes + epi_bytes + copy),
            steps_max=int(steps_max), steps_mean=float(steps_mean),
            smem_bytes=r * bn * 4, num_warps=config.num_warps, num_stages=config.num_stages,
            regs_per_thread=min(255, max(48, 32 + r * bn * bnnz // (32 * config.num_warps))),
            launches=2 if copied else 1,
        )
    if config.path == "expand":
        bm, bt, bk = config.block_m, config.block_n, config.block_k
        kp = padded_k(K)
        tm, tn, tk = -(-M // bm), -(-N // bt), -(-kp // bk)
        bitmap = M * (-(-K // 32)) * 4
        dense_w = M * kp * s  # written by the expand kernel, read back by the GEMM
        return KernelFeatures(
            programs=tm * tn, tiles=tm * tn,
            mma_flops=2.0 * tm * bm * tn * bt * tk * bk,
            fma_flops=EXPAND_FLOPS_PER_ELEMENT * M * kp,  # once per element, not per token tile
            dram_bytes=float(nnz * s + bitmap + 2 * dense_w + x_bytes + y_bytes + epi_bytes),
            l2_bytes=float(nnz * s + bitmap + dense_w + dense_w * tn + x_bytes * tm + y_bytes + epi_bytes),
            steps_max=tk, steps_mean=float(tk),
            smem_bytes=config.num_stages * (bm + bt) * bk * s,
            num_warps=config.num_warps, num_stages=config.num_stages,
            regs_per_thread=min(255, 40 + bm * bt // (32 * config.num_warps)), launches=2,
        )
    bm, bn, bk, split = config.block_m, config.block_n, config.block_k, config.split_k
    tm, tn, tk = -(-M // bm), -(-N // bn), -(-K // bk)
    programs = tm * tn * split
    steps = -(-tk // split)
    reduce = 3 * 4 * tm * bm * tn * bn * split if split > 1 else 0  # fp32 atomics + read-back + reset
    threads = 32 * config.num_warps
    regs = min(255, 40 + (bm * bn + 2 * bm * bk) // threads)  # fits ptxas's counts on sm_90 within ~10%
    bitmap = M * (-(-K // 32)) * 4
    w_bytes = nnz * s + bitmap + 4 * M
    return KernelFeatures(
        programs=programs, tiles=programs,  # with split-K every (tile, share of K) is a work item
        mma_flops=2.0 * tm * bm * tn * bn * tk * bk,
        # the expansion runs per token tile inside the GEMM's loop, where it measured about
        # FUSED_EXPAND_COST times the standalone expand kernel's cost per element (run6: the
        # dense path was predicted 2x fast at every N; registers shared with the accumulator)
        fma_flops=FUSED_EXPAND_COST * EXPAND_FLOPS_PER_ELEMENT * tm * bm * tk * bk * tn,
        dram_bytes=float(w_bytes + x_bytes + y_bytes + epi_bytes),
        l2_bytes=float(w_bytes * tn + x_bytes * tm + y_bytes + epi_bytes),
        steps_max=steps, steps_mean=float(steps),
        smem_bytes=_smem_dense(problem.dtype, bm, bn, bk, config.num_stages),
        # the expansion's bitmap -> values chain is prefetched one chunk ahead by hand, whatever
        # num_stages pipelines (x): one step in flight
        num_warps=config.num_warps, num_stages=2, split_k=split,
        reduce_bytes=float(reduce), regs_per_thread=regs,
    )
