"""Tensor-core SpMM for BlockSparse and ShuffledBlock (Shfl-BW) weights, fused epilogue.

out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual, in PyTorch's linear layout; x's tiles
may pass through an input prologue, act(x + x_bias[k]), as they are loaded.
A program owns one *unit* (a block-row of bm rows, or a Shfl-BW group of V rows) and a strip
of BN tokens; it walks the unit's stored blocks (or chunks of BK kept columns, see `chunked`),
multiplying the dense (BM, BK) tile of A with the (BK, BN) slice of x^T on the tensor cores.
Shfl-BW's row permutation is applied by the store: row r of group g lands at perm[g*V + r].
spmm(A, X) is the same kernel on strided views (x = X.T, out = Y.T): nothing is copied.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..formats import BlockSparse, ShuffledBlock, memo, pointers_from_counts, unit_of_items
from ..tune.problem import INDEX_CHAIN, KernelFeatures, Problem
from ._common import align16, grouped_order, launch_cache, launch_cached
from ._epilogue import ACTIVATION_CODES, epilogue, epilogue_store, prologue


@triton.jit
def _blocked_spmm_kernel(
    x_ptr, a_ptr, crow_ptr, col_ptr, perm_ptr, out_ptr, bias_ptr, res_ptr, x_bias_ptr,
    M, K, N, n_units, stride_xn, stride_xk, stride_on, stride_om, stride_rn, stride_rm, scale,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
    SHUFFLED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, HAS_PRE: tl.constexpr, PRE_ACT: tl.constexpr,
):
    # Program order: GROUP units sweep all token strips together, so their A tiles and the
    # strips of x they share stay in L2.
    unit, strip = grouped_order(tl.program_id(0), n_units, tl.cdiv(N, BN), GROUP)

    offs_m = tl.arange(0, BM)
    offs_k = tl.arange(0, BK)
    offs_n = strip * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    x_strip = x_ptr + offs_n[None, :] * stride_xn
    start = tl.load(crow_ptr + unit)
    end = tl.load(crow_ptr + unit + 1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # A's blocks (BSR) or chunks (Shfl-BW) are (BM, BK) tiles stored one after another
    a_tile = a_ptr + start.to(tl.int64) * (BM * BK) + offs_m[:, None] * BK + offs_k[None, :]
    for p in range(start, end):
        if SHUFFLED:  # the chunk's BK kept columns, each a row of x^T to gather
            kk = tl.load(col_ptr + p * BK + offs_k).to(tl.int64)
        else:
            kk = tl.load(col_ptr + p).to(tl.int64) * BK + offs_k
        a = tl.load(a_tile)
        a_tile += BM * BK
        x_addr = x_strip + kk[:, None] * stride_xk
        if EVEN_K and EVEN_N:
            xt = tl.load(x_addr)
        else:
            xt = tl.load(x_addr, mask=(kk[:, None] < K) & n_ok[None, :], other=0.0)
        if HAS_PRE:
            xt = prologue(xt, x_bias_ptr, kk[:, None], kk[:, None] < K, PRE_ACT)
        acc = tl.dot(a, xt, acc)

    slot = unit * BM + offs_m
    m_ok = slot < M
    feat = tl.load(perm_ptr + slot, mask=m_ok, other=0) if SHUFFLED else slot
    epilogue_store(acc, feat.to(tl.int64), m_ok, offs_n, n_ok, out_ptr, stride_on, stride_om, res_ptr, stride_rn,
                   stride_rm, scale, bias_ptr, HAS_BIAS, ACT, HAS_RES)


@triton.jit
def _blocked_spmm_tma_kernel(
    x_desc, a_desc, out_desc, crow_ptr, col_ptr, bias_ptr, res_ptr, x_bias_ptr,
    M, K, N, n_units, stride_rn, stride_rm, scale,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, PERSISTENT: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, HAS_PRE: tl.constexpr, PRE_ACT: tl.constexpr,
):
    """BSR only, x and out K-/M-contiguous: tiles move by the tensor memory accelerator
    (TMA), which also zero-fills and clips the edges, so the loop carries no masks.
    PERSISTENT: one program per SM slot walks tiles pid, pid + P, ... in a flattened loop, meant
    to start the next tile's loads during this tile's epilogue; measured, it does not overlap
    them and never beats the grid (benchmarks/LOG.md v3, v4)."""
    n_strips = tl.cdiv(N, BN)
    n_tiles = n_units * n_strips
    step = n_tiles  # a grid of tiles: one per program
    if PERSISTENT:
        step = tl.num_programs(0)
    for tile in tl.range(tl.program_id(0), n_tiles, step, flatten=PERSISTENT):
        unit, strip = grouped_order(tile, n_units, n_strips, GROUP)
        n0 = strip * BN
        start = tl.load(crow_ptr + unit)
        end = tl.load(crow_ptr + unit + 1)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for p in range(start, end):
            c = tl.load(col_ptr + p)
            a = a_desc.load([p * BM, 0])
            xt = x_desc.load([n0, c * BK])
            if HAS_PRE:
                kk = c * BK + tl.arange(0, BK)
                xt = prologue(xt, x_bias_ptr, kk[None, :], kk[None, :] < K, PRE_ACT)
            acc = tl.dot(a, xt.T, acc)
        feat = unit * BM + tl.arange(0, BM)
        offs_n = n0 + tl.arange(0, BN)
        m_ok = feat < M
        mask = m_ok[:, None] & (offs_n < N)[None, :]
        y = epilogue(acc, feat[:, None], m_ok[:, None], offs_n[None, :] * stride_rn + feat[:, None] * stride_rm, mask,
                     scale, bias_ptr, res_ptr, HAS_BIAS, ACT, HAS_RES)
        out_desc.store([n0, unit * BM], y.to(out_desc.dtype).T)


@dataclass(frozen=True)
class Config:
    bn: int  # tokens per program
    bk: int  # K per step: the block width (BSR) or a chunk of kept columns (Shfl-BW)
    num_warps: int
    num_stages: int
    group: int = 8  # units that sweep the token strips together
    tma: bool = False  # BSR: move tiles by TMA (when x and out are row-contiguous and aligned)
    persistent: bool = False  # TMA path: one program per SM slot looping over tiles


SMEM_BYTES = 227 * 1024


def _unit_shape(problem: Problem) -> tuple[int, int | None]:
    """(rows per unit, fixed K step or None) from the format signature."""
    kind, _, rest = problem.fmt.partition(":")
    if kind == "block":
        bm, bk = rest.split("x")
        return int(bm), int(bk)
    if kind == "shfl":
        return int(rest), None
    raise ValueError(f"spmm_blocked does not handle format {problem.fmt!r}")


def space(problem: Problem) -> list[Config]:
    bm, fixed_bk = _unit_shape(problem)
    elt = 4 if problem.dtype == "float32" else 2
    n_cap = max(16, triton.next_power_of_2(problem.n))
    out = []
    for bk in (fixed_bk,) if fixed_bk else (32, 64):
        for bn in (16, 32, 64, 128, 256):
            if bn > n_cap or bm * bn > 128 * 256:
                continue
            for num_warps in (4, 8):
                if bm * bn // (num_warps * 32) > 256:  # accumulator registers per thread
                    continue
                for num_stages in (2, 3, 4, 5):
                    if num_stages * (bm * bk + bk * bn) * elt > SMEM_BYTES:
                        continue
                    for group in (1, 8):
                        for tma in (False, True) if fixed_bk else (False,):
                            if tma and num_stages * (bm * bk + bk * bn) * elt + bm * bn * elt > SMEM_BYTES:
                                continue  # TMA stages the output tile in shared memory too
                            out.append(Config(bn, bk, num_warps, num_stages, group, tma))
                            if tma and num_stages >= 3:
                                out.append(Config(bn, bk, num_warps, num_stages, group, tma, True))
    return out


# Fitted on the train half of benchmarks/data/h100-2026-11-22-run6 (benchmarks/fit_model.py):
TMA_EXTRA_TRIP = 0.25  # TMA loads: the mbarrier wait, in round trips per step


def features(problem: Problem, config: Config) -> KernelFeatures:
    bm, _ = _unit_shape(problem)
    s = problem.stats
    elt = 4 if problem.dtype == "float32" else 2
    shuffled = problem.fmt.startswith("shfl")
    strips = triton.cdiv(problem.n, config.bn)
    tiles = s.units * strips
    # K steps per unit: blocks (BSR) or chunks of BK kept columns (Shfl-BW, the last one of each
    # group padded: half a chunk more on average)
    per_step = config.bk // s.item_cols
    steps_mean = s.items_mean / per_step + (0.5 if shuffled else 0.0)
    steps_max = triton.cdiv(s.items_max, per_step)
    steps_total = steps_mean * tiles
    k_eff = steps_total * config.bk / max(tiles, 1)  # K walked per tile
    a_bytes = s.units * steps_mean * config.bk * bm * elt
    x_bytes = problem.n * problem.k * elt
    y_bytes = problem.n * problem.m * elt
    # A is re-read once per token strip and x once per unit holding its columns (LOG.md: the
    # x re-reads bound the block kernels), all through L2
    a_l2 = steps_total * bm * config.bk * elt
    x_l2 = steps_total * config.bk * config.bn * elt
    if shuffled and problem.layout == "linear" and problem.n > 1:
        # kept columns gathered from a K-contiguous x: tokens are K apart, so every element
        # is its own 32-byte sector (LOG.md v1: ~20x slower than the spmm layout)
        x_l2 *= 32 // elt
    l2_bytes = a_l2 + x_l2 + y_bytes
    threads = 32 * config.num_warps
    # registers: the fp32 accumulator, ~40 for addresses and loop state
    regs = 40 + bm * config.bn // threads
    chain_scale = 1.0  # the model's steps are index -> tile round trips (problem.INDEX_CHAIN)
    smem = config.num_stages * (bm * config.bk + config.bk * config.bn) * elt + (bm * config.bn * elt if config.tma else 0)
    if config.tma:  # (BSR only)
        # a TMA load signals an mbarrier the warps then wait on: a longer chain per step (~15%
        # slower at decode, ~2% at prefill where the loop is throughput-bound; run6)
        chain_scale *= (INDEX_CHAIN + TMA_EXTRA_TRIP) / INDEX_CHAIN
    if config.persistent and config.tma:
        # launch() runs one or two programs per SM (_sm_slots) however many would fit, and their
        # tiles one after another (LOG.md v3): as a grid of tiles capped at that residency, the
        # cap declared as the shared memory that leaves room for no more (KernelFeatures has no
        # grid-size field; 2.3x slower than the grid at bn=16, about equal at decode, run6)
        cap = 2 if config.bn * config.num_stages <= 512 else 1
        smem = max(smem, SMEM_BYTES // (cap + 1))
    return KernelFeatures(
        # persistent programs: the flattened tl.range does not overlap a tile's loads with the
        # previous tile (never faster than the grid, LOG.md v3), so its tiles run as if launched
        # one per program
        programs=tiles,
        tiles=tiles,
        mma_flops=2.0 * tiles * bm * config.bn * k_eff,
        fma_flops=0.0,
        dram_bytes=a_bytes + x_bytes + y_bytes + (s.units * s.items_mean) * 4,
        l2_bytes=l2_bytes,
        # a longer dependent chain per step is declared as more steps (the work is spread over
        # them, so only the latency grows)
        steps_max=math.ceil(steps_max * chain_scale),
        steps_mean=steps_mean * chain_scale,
        smem_bytes=smem,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        regs_per_thread=min(255, regs),
    )


def launch(A, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None, residual=None, scale=1.0,
           prologue=None):
    """out = act(scale * x' @ A^T + bias) + residual, x (N, K) and out (N, M) of any strides;
    x' = x, or act'(x + x_bias) for prologue = (x_bias, act'), applied to x's tiles on load."""
    M, K, bm, n_units, shuffled, perm, a_desc = _weight_args(A)
    x_bias, pre_act = prologue if prologue is not None else (out, None)
    if shuffled:
        bk = config.bk
        values, ptr, cols = chunked(A, bk)
    else:
        bk = A.block[1]
        values, ptr, cols = A.values, A.crow, A.col
    N = x.shape[0]
    res = residual if residual is not None else out
    grid = (n_units * triton.cdiv(N, config.bn),)
    if grid[0] == 0:
        return out
    has_bias, has_res, has_pre = bias is not None, residual is not None, prologue is not None
    bias = bias if has_bias else out
    act, pre = ACTIVATION_CODES[activation], ACTIVATION_CODES[pre_act]
    # what specialises the kernel beyond the weight's sizes (fixed per A): the config, the epilogue,
    # N, dtypes, strides and 16-byte alignments
    key = (config, N, has_bias, act, has_res, has_pre, pre, x.dtype, out.dtype, bias.dtype, res.dtype, x_bias.dtype,
           values.dtype, x.stride(0), x.stride(1), out.stride(0), out.stride(1), res.stride(0), res.stride(1),
           align16(x), align16(out), align16(bias), align16(res), align16(x_bias), align16(values))
    cache = launch_cache(A, "_blocked_launches")

    def constexprs(**own):  # built on a cache miss only
        return dict(own, HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res, HAS_PRE=has_pre, PRE_ACT=pre,
                    num_warps=config.num_warps, num_stages=config.num_stages)

    if config.tma and a_desc is not None and _tma_ready(x) and _tma_ready(out):
        if config.persistent:
            grid = (min(grid[0], _sm_slots(x.device, config)),)
        launch_cached(cache, key, _blocked_spmm_tma_kernel, grid, (
            _descriptor(x, [config.bn, bk]), a_desc, _descriptor(out, [config.bn, bm]),
            A.crow, A.col, bias, res, x_bias,
            M, K, N, n_units, res.stride(0), res.stride(1), float(scale),
        ), lambda: constexprs(BM=bm, BN=config.bn, BK=bk, GROUP=config.group, PERSISTENT=config.persistent))
        return out
    launch_cached(cache, key, _blocked_spmm_kernel, grid, (
        x, values, ptr, cols, perm, out, bias, res, x_bias,
        M, K, N, n_units, x.stride(0), x.stride(1), out.stride(0), out.stride(1), res.stride(0), res.stride(1),
        float(scale),
    ), lambda: constexprs(BM=bm, BN=config.bn, BK=bk, GROUP=config.group, SHUFFLED=shuffled,
                          EVEN_K=shuffled or K % bk == 0,
                          EVEN_N=N % config.bn == 0))
    return out


def _weight_args(A) -> tuple:
    """What launch needs of the weight, computed once per (immutable) weight object: the host
    cost of a launch is paid on every call of a tuned op."""
    cached = A.__dict__.get("_blocked_args")
    if cached is None:
        if isinstance(A, ShuffledBlock):
            bm, shuffled, perm, a_desc = A.v, True, A.perm, None
        elif isinstance(A, BlockSparse):
            (bm, bk), shuffled, perm = A.block, False, A.crow
            nnzb = A.values.shape[0]
            # TMA reads the (nnzb * bm, bk) value rows; no descriptor over an empty array
            a_desc = TensorDescriptor(A.values, [nnzb * bm, bk], [bk, 1], [bm, bk]) if nnzb else None
        else:
            raise TypeError(f"spmm_blocked takes BlockSparse or ShuffledBlock, got {type(A).__name__}")
        cached = (*A.shape, bm, len(A.crow) - 1, shuffled, perm, a_desc)
        object.__setattr__(A, "_blocked_args", cached)
    return cached


def chunked(A: ShuffledBlock, bk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shfl-BW in the kernel's layout: each group's kept columns cut into chunks of bk, values as
    (chunks, V, bk) tiles stored like BSR blocks (aligned whole-tile loads), chunk pointers per
    group and the chunks' column indices (chunks, bk). A group's last chunk is padded with zero
    values over its last kept column repeated, so the loop needs no mask and the padding adds no
    term that was not already there. The pattern's part is built once; the values are scattered
    again after they change (without a host sync, so even inside a CUDA graph capture)."""
    ptr, cols, chunk, lane, n_chunks = memo(A, f"_shfl_chunk_pattern_{bk}", lambda: _chunk_pattern(A, bk),
                                            of_values=False)

    def scatter():
        values = torch.zeros(n_chunks, A.v, bk, dtype=A.values.dtype, device=A.values.device)
        values[chunk, :, lane] = A.values.T  # kept column t -> chunk[t], lane[t]
        return values

    return memo(A, f"_shfl_chunks_{bk}", scatter), ptr, cols


def release_unused(A, configs) -> None:
    """Shfl-BW keeps a chunked copy per BK the tuner measured: drop those no chosen config reads."""
    configs = [c for c in configs if isinstance(c, Config)]  # (sddmm's on the same pattern read none)
    kept = {f"_shfl_chunks_{c.bk}" for c in configs} | {f"_shfl_chunk_pattern_{c.bk}" for c in configs}
    for key in [k for k in A.__dict__ if k.startswith("_shfl_chunk") and k not in kept]:
        del A.__dict__[key]


def _chunk_pattern(A: ShuffledBlock, bk: int):
    """(chunk pointers, chunk columns, each kept column's chunk and lane, chunks)."""
    counts = A.cols_per_group().long()
    ptr = pointers_from_counts((counts + bk - 1) // bk)
    n_chunks, total = int(ptr[-1]), A.col.numel()
    group = unit_of_items(A.crow)
    pos = torch.arange(total, device=A.col.device) - A.crow.long()[group]
    chunk, lane = ptr.long()[group] + pos // bk, pos % bk
    # each group's last kept column (groups without one have no chunks, so never read theirs)
    last = A.col.long()[(A.crow.long()[1:] - 1).clamp(min=0)] if total else torch.zeros_like(counts)
    cols = last[unit_of_items(ptr)].to(torch.int32)[:, None].repeat(1, bk)
    cols[chunk, lane] = A.col.to(torch.int32)
    return ptr, cols, chunk, lane, n_chunks


def _descriptor(t: torch.Tensor, block: list) -> TensorDescriptor:
    """A TMA descriptor for a tensor _tma_ready has already checked (skips the re-validation
    TensorDescriptor's constructor would do on every call)."""
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = t, list(t.shape), list(t.stride()), block, "zero"
    return desc


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA needs a unit last stride, 16-byte aligned rows and base."""
    return (
        t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
        and t.shape[0] > 0
        and t.shape[1] > 0
    )


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _sm_slots(device: torch.device, config: Config) -> int:
    """Persistent programs: two per SM when the accumulator and stages leave room for two."""
    return _sm_count(device) * (2 if config.bn * config.num_stages <= 512 else 1)
