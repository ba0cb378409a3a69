"""Unstructured (CSR) SpMM for 8-32 tokens on the tensor cores, A's fragments decoded in
registers from bitmap tiles (src/spmm_csr_bitmap.cu, kernels/_bitmap_tiles.py), linear layout
with the fused epilogue.

Why: csr_smem pays ~2.4 instructions per (nonzero, token) on CUDA cores, so its time grows with
the tokens and the density (80% at N = 16: 1.45x; N = 32: slower than dense); a bitmap tile costs
~60 instructions to decode at any density and its mma covers 8 tokens for each n8 block. csr_tc
(LOG, "csr_tc v1b") lost because it expanded tiles through shared memory; here nothing of A
touches shared memory. Config: tokens per CTA (NT), pairs of 16-column tiles per slice of K (KP:
split over CTAs, partials reduced in order by the last CTA of a row block) and warps per CTA (one
row tile of 16 each; each stages its records and words in shared memory, WORDS_PER_PAIR a pair
of tiles at once: ~20% density).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import cuda
from ._bitmap_tiles import bitmap_tiles
from ._common import arrival_counters, next_pow2
from .cuda.epilogue import check_operands, epilogue_args, or_null
from ..formats import CSR
from ..tune.problem import Problem

DTYPES = ("float16", "bfloat16")
SLICES = (256, 512, 1024, 2048, 4096)  # columns of K per slice
WARPS = (4, 8, 16)
SMEM_LIMIT = 227 * 1024
WORDS_PER_PAIR = 80  # each warp's buffer: past this many words a pair of tiles, a slice is staged in segments


@dataclass(frozen=True)
class Config:
    nt: int  # tokens per CTA: 8, 16 or 32
    kp: int  # pairs of 16-column tiles per slice (32 * kp columns)
    warps: int  # warps per CTA, a row tile of 16 each
    rpw: int = 1  # row tiles each warp takes in turn (> 1: two buffers, the next one's copy in flight)


def _words_per_warp(config: Config) -> int:
    return max(512, WORDS_PER_PAIR * config.kp)


def _smem_bytes(config: Config) -> int:
    """x's slice, then each warp's records (64 bytes a pair of tiles) and words."""
    x = config.nt * (32 * config.kp + 8) * 2
    buffers = 2 if config.rpw > 1 else 1
    return x + config.warps * buffers * (64 * config.kp + 4 * _words_per_warp(config))


def available(device) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and cuda.available(device)


def space(problem: Problem) -> list[Config]:
    if problem.fmt != "csr" or problem.dtype not in DTYPES or not 1 <= problem.n <= 32:
        return []
    nt = min(32, max(8, next_pow2(problem.n)))
    out = []
    for ks in SLICES:
        if ks > max(SLICES[0], next_pow2(problem.k)):
            continue
        for warps in WARPS:
            for rpw in (1, 2, 4):
                cfg = Config(nt, ks // 32, warps, rpw)
                if _smem_bytes(cfg) <= SMEM_LIMIT:
                    out.append(cfg)
    return out


_kernels: dict[tuple, object] = {}


def _instance(config: Config, dtype: torch.dtype):
    return cuda.instance("spmm_csr_bitmap.cu", "spmm_csr_bitmap", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "NT": config.nt, "WARPS": config.warps, "KP": config.kp,
        "VW": _words_per_warp(config), "RPW": config.rpw})


def instances(problem: Problem, config: Config) -> list:
    return [_instance(config, getattr(torch, problem.dtype))]


def _kernel(config: Config, dtype: torch.dtype, device: torch.device):
    key = (config, dtype, device.index)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = cuda.load(_instance(config, dtype), device)
    return kernel


@functools.cache
def _capability(index) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def launch(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
           residual=None, scale: float = 1.0) -> torch.Tensor:
    """out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual; strides of x, out, residual free."""
    M, K = A.shape
    N = x.shape[0]
    if M == 0 or N == 0:
        return out
    check_operands(A, x, out, bias, residual)
    t = bitmap_tiles(A)
    slices = math.ceil(t.k_tiles / (2 * config.kp))
    grid = (math.ceil(t.row_tiles / (config.warps * config.rpw)), slices, math.ceil(N / config.nt))
    if slices > 1:
        ws = torch.empty(grid[2] * slices * t.row_tiles * 16 * config.nt, dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[2])
    else:
        ws = counters = or_null(None)
    x_vec = int(x.stride(1) == 1 and (x.stride(0) % 8 == 0 or N == 1) and x.data_ptr() % 16 == 0)
    kernel = _kernel(config, A.values.dtype, x.device)
    kernel(grid, (32 * config.warps, 1, 1), t.records, t.words, t.tile_base, x, out, or_null(bias),
           or_null(residual), ws, counters, M, N, K, t.row_tiles, t.k_tiles, slices, np.int64(x.stride(0)),
           np.int64(x.stride(1)), x_vec, *epilogue_args(out, bias, residual, activation, scale),
           shmem=_smem_bytes(config))
    return out
