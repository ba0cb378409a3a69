"""Unstructured (CSR) SpMM for decode on the tensor cores (src/spmm_csr_tc.cu), linear layout
with the fused epilogue.

Why: csr_smem's CUDA cores spend ~20 instructions per nonzero and 8 tokens (a conversion and an
FMA per product), so from 16 tokens on it is bound by issue, not by the weight's bytes
(benchmarks/LOG.md, "csr_smem v5"). Here a warp expands each 16 x 64 tile of A from its words
(kernels/_tile_words.py) into shared memory and multiplies it densely with mma.m16n8k16: the
cost of a tile hardly grows with the tokens. Config: tokens per CTA (NT), K tiles of 64 per
slice (KT: the x slice a CTA stages; slices are summed in order by the last CTA of a row block),
warps per CTA and row tiles of 16 per warp (RPW: the row tiles that share each K tile's x
fragments in registers).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import cuda
from ._common import arrival_counters, next_pow2
from ._tile_words import TILE_K, TILE_M, rounds_per_warp, tile_words
from .cuda.epilogue import check_operands, epilogue_args, or_null
from ..formats import CSR
from ..tune.problem import KernelFeatures, Problem

DTYPES = ("float16", "bfloat16")
K_TILES = (2, 4, 8, 16, 32)  # (a lane holds each K tile's start)
WARPS = (4, 8)
ROWS_PER_WARP = (1, 2, 4)
MAX_TOKENS = 32  # decode: past this the weight streams once per 32 tokens, dense wins
SMEM_LIMIT = 227 * 1024
MAX_PARTIALS_BYTES = 256 << 20
# mma.sync m16n8k16 runs at about 2/3 of cuBLAS's rate; the scatter and the zeroing cost ~6
# instructions per word and ~12 per tile and lane, declared as CUDA-core FMA flops
MMA_RATE = 2.0 / 3.0
ISSUE_PER_WORD, ISSUE_PER_TILE = 6, 12


@dataclass(frozen=True)
class Config:
    nt: int  # tokens per CTA: 8, 16 or 32
    kt: int  # K tiles of 64 per slice (one CTA's staged x)
    warps: int  # warps per CTA
    rpw: int = 1  # row tiles of 16 per warp


def _tile_halves() -> int:
    return 16 * 72 + 8  # spmm_csr_tc.cu's TILE


def _smem_bytes(config: Config, rounds: int) -> int:
    """The staged x slice (NT rows, 16-byte padded), each warp's expanded tile and its buffer of
    `rounds` rounds of words."""
    return (config.nt * (64 * config.kt + 8) + config.warps * _tile_halves()) * 2 + config.warps * rounds * 128


def _expected_rounds(problem: Problem, config: Config) -> int:
    """A warp's rounds of words in one slice, from the density (with a margin for the longest)."""
    per_tile = math.ceil(problem.stats.density * TILE_M * TILE_K * 1.25 / 32)
    return per_tile * min(config.kt, math.ceil(problem.k / TILE_K)) * config.rpw


def available(device) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and cuda.available(device) and torch.cuda.get_device_capability(device) >= (8, 0)


def space(problem: Problem) -> list[Config]:
    """fp16 / bf16 CSR in the linear layout, up to 32 tokens."""
    if problem.fmt != "csr" or problem.dtype not in DTYPES or not 1 <= problem.n <= MAX_TOKENS:
        return []
    nt = min(32, max(8, next_pow2(problem.n)))
    k_tiles = math.ceil(problem.k / TILE_K)
    limit = SMEM_LIMIT if problem.device.endswith("sm_90") or not problem.device else 99 * 1024
    out = []
    for kt in K_TILES:
        if kt > max(K_TILES[0], next_pow2(k_tiles)):
            continue
        for warps in WARPS:
            for rpw in ROWS_PER_WARP:
                cfg = Config(nt, kt, warps, rpw)
                if _smem_bytes(cfg, _expected_rounds(problem, cfg)) <= limit \
                        and _partials_bytes(problem, cfg) <= MAX_PARTIALS_BYTES:
                    out.append(cfg)
    return out


def _slices(problem: Problem, config: Config) -> int:
    return math.ceil(math.ceil(problem.k / TILE_K) / config.kt)


def _partials_bytes(problem: Problem, config: Config) -> int:
    slices = _slices(problem, config)
    if slices == 1:
        return 0
    return 4 * math.ceil(problem.n / config.nt) * config.nt * slices * math.ceil(problem.m / TILE_M) * TILE_M


def features(problem: Problem, config: Config) -> KernelFeatures:
    row_tiles, k_tiles = math.ceil(problem.m / TILE_M), math.ceil(problem.k / TILE_K)
    slices = _slices(problem, config)
    tiles_n = math.ceil(problem.n / config.nt)
    row_blocks = math.ceil(row_tiles / (config.warps * config.rpw))
    programs = row_blocks * slices * tiles_n
    st = problem.stats
    per_tile = st.density * TILE_M * TILE_K
    tiles = row_tiles * k_tiles
    busy = 1.0 - (1.0 - min(st.density, 1.0)) ** (TILE_M * TILE_K)  # tiles with any nonzero
    rounds = tiles * busy * math.ceil(max(per_tile, 1.0) / 32)  # (the expected count, rounded up)
    word_bytes = rounds * 32 * 4
    x_bytes = problem.n * problem.k * 2
    y_bytes = problem.n * problem.m * 2
    staged = programs * min(config.kt * TILE_K, problem.k) * config.nt * 2
    issue = (rounds * ISSUE_PER_WORD + tiles * busy * ISSUE_PER_TILE) * 32 * tiles_n
    return KernelFeatures(
        programs=programs,
        tiles=programs,
        mma_flops=2.0 * tiles * busy * TILE_M * TILE_K * config.nt * tiles_n / MMA_RATE,
        fma_flops=2.0 * issue,
        dram_bytes=word_bytes + x_bytes + y_bytes,
        l2_bytes=word_bytes * tiles_n + staged + y_bytes,
        steps_max=config.kt * config.rpw,
        steps_mean=float(min(config.kt, k_tiles) * config.rpw),
        smem_bytes=_smem_bytes(config, _expected_rounds(problem, config)),
        num_warps=config.warps,
        num_stages=1,
        split_k=slices,
        launches=1,
        reduce_bytes=2 * _partials_bytes(problem, config),
    )


@functools.cache
def _smem_limit(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


_kernels: dict[tuple, object] = {}


def _kernel(config: Config, dtype: torch.dtype, device: torch.device):
    key = (config, dtype, device.index)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = cuda.load(_instance(config, dtype), device)
    return kernel


def _instance(config: Config, dtype: torch.dtype):
    return cuda.instance("spmm_csr_tc.cu", "spmm_csr_tc", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "NT": config.nt, "WARPS": config.warps, "KT": config.kt,
        "RPW": config.rpw})


def instances(problem: Problem, config: Config) -> list:
    """The kernel a launch of `config` loads (compiled ahead by the tuner)."""
    return [_instance(config, getattr(torch, problem.dtype))]


def _x_vec(x: torch.Tensor) -> bool:
    """Whether rows of x can be staged by 16-byte cp.async (contiguous, aligned rows)."""
    return x.stride(1) == 1 and (x.stride(0) % 8 == 0 or x.shape[0] == 1) and x.data_ptr() % 16 == 0


def launch(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
           residual=None, scale: float = 1.0) -> torch.Tensor:
    """out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual; strides of x, out, residual free."""
    M, K = A.shape
    N = x.shape[0]
    if M == 0 or N == 0:
        return out
    check_operands(A, x, out, bias, residual)
    layout = tile_words(A)
    slices = math.ceil(layout.k_tiles / config.kt)
    grid = (math.ceil(layout.row_tiles / (config.warps * config.rpw)), slices, math.ceil(N / config.nt))
    if slices > 1:
        ws = torch.empty(grid[2] * slices * layout.row_tiles * TILE_M * config.nt, dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[2])
    else:
        ws = counters = or_null(None)
    rounds = rounds_per_warp(A, config.kt, config.warps, config.rpw)
    shmem = _smem_bytes(config, rounds)
    if shmem > _smem_limit(x.device):
        raise ValueError(f"csr_tc {config}: a warp's words need {rounds} rounds, {shmem} bytes of shared memory "
                         f"in all, past the device's {_smem_limit(x.device)}")
    kernel = _kernel(config, A.values.dtype, x.device)
    kernel(grid, (32 * config.warps, 1, 1), layout.words, layout.starts, x, out, or_null(bias), or_null(residual),
           ws, counters, M, N, K, layout.row_tiles, layout.k_tiles, slices, rounds, np.int64(x.stride(0)),
           np.int64(x.stride(1)), int(_x_vec(x)), *epilogue_args(out, bias, residual, activation, scale),
           shmem=shmem)
    return out
