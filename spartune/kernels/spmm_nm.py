"""2:4 SpMM for NM weights on the sparse tensor cores (mma.sp m16n8k32), fused epilogue.

out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual, in PyTorch's linear layout; x and
out may have any strides (spmm's x = X.T runs on the same kernel). The first CUDA family: the
template is src/spmm_nm.cu, the tile sizes its -D defines. The weight is packed once, in the
order mma.sp's lanes hold it (cuda/sparse_mma.py), and memoised on the format object.
A simple mma.sync kernel for decode and a baseline for prefill (wgmma.sp comes later).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import cuda
from ._epilogue import ACTIVATION_CODES
from ..formats import memo
from ..tune.problem import KernelFeatures, Problem

DTYPES = ("float16", "bfloat16")
_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
SMEM_BYTES = 48 * 1024  # static shared memory: the x tile must fit without opting in


@dataclass(frozen=True)
class Config:
    bm: int  # rows of A per CTA (multiple of 16)
    bn: int  # tokens per CTA (multiple of 8)
    num_warps: int
    warps_k: int = 1  # of the warps, how many split K (decode: few row tiles, so parallelism in K)
    ksteps: int = 4  # 32-wide K steps per warp and staged chunk of x


def _warp_grid(config: Config) -> tuple[int, int] | None:
    """(warps along rows, along tokens), or None when the warps cannot tile the CTA."""
    if config.num_warps % config.warps_k:
        return None
    mt, nt, warps = config.bm // 16, config.bn // 8, config.num_warps // config.warps_k
    wm = min(warps, mt)
    wn = warps // wm
    if wm * wn != warps or mt % wm or nt % wn:
        return None
    return wm, wn


def _smem_bytes(config: Config) -> int:
    """The staged x chunk, or the K parts' partial sums where larger (they share the buffer)."""
    x_tile = config.bn * (32 * config.ksteps * config.warps_k + 8) * 2
    partial = (config.warps_k - 1) * config.bm * config.bn * 4
    return max(x_tile, partial)


def space(problem: Problem) -> list[Config]:
    """Valid configs: only 2:4 in fp16/bf16 runs on mma.sp (fp32 falls back to other backends)."""
    if problem.fmt != "2:4" or problem.dtype not in DTYPES:
        return []
    n_cap = max(8, 1 << math.ceil(math.log2(max(problem.n, 1))))
    out = []
    for bn in (8, 16, 32, 64, 128):
        if bn > n_cap:
            continue
        shapes = _DECODE if bn <= 16 else [(bm, w, 1) for bm in (64, 128) for w in (4, 8)]
        for bm, warps, warps_k in shapes:
            cfg = Config(bm, bn, warps, warps_k)
            if _warp_grid(cfg) is not None and _smem_bytes(cfg) <= SMEM_BYTES:
                out.append(cfg)
    return out


# (bm, warps, warps_k) for narrow token tiles: few row tiles' worth of CTAs, so small BM and K
# split over warps keep enough loads in flight
_DECODE = [(16, 4, 4), (32, 4, 2), (32, 4, 4), (64, 4, 1), (64, 4, 2), (64, 8, 4), (128, 4, 1), (128, 8, 2)]


def features(problem: Problem, config: Config) -> KernelFeatures:
    elt = 2
    mt = math.ceil(problem.m / 16)
    kt = math.ceil(problem.k / 32)
    row_tiles = math.ceil(mt * 16 / config.bm)
    strips = math.ceil(problem.n / config.bn)
    tiles = row_tiles * strips
    k_pad = kt * 32
    a_bytes = mt * 16 * k_pad // 2 * elt + mt * kt * 16 * 4  # values + metadata words
    x_bytes = problem.n * problem.k * elt
    y_bytes = problem.n * problem.m * elt
    # A is re-read once per token strip, x once per row tile, all through L2
    a_l2 = strips * a_bytes
    x_l2 = row_tiles * strips * config.bn * k_pad * elt
    wm, wn = _warp_grid(config)
    threads = 32 * config.num_warps
    # registers: accumulators, two sets of A fragments (prefetch), B, addresses
    regs = 40 + config.bm * config.bn * config.warps_k // threads + 2 * (config.bm // 16 // wm) * config.ksteps * 5
    regs += config.bn * 32 * config.ksteps * config.warps_k // (2 * threads)  # the next x chunk
    steps = math.ceil(kt / config.warps_k)  # a warp's mma.sp K steps (32 columns each)
    return KernelFeatures(
        programs=tiles,
        tiles=tiles,
        mma_flops=2.0 * tiles * config.bm * config.bn * k_pad / 2,  # sparse: half the math of dense
        fma_flops=0.0,
        dram_bytes=a_bytes + x_bytes + y_bytes,
        l2_bytes=a_l2 + x_l2 + y_bytes,
        steps_max=steps,
        steps_mean=float(steps),
        smem_bytes=_smem_bytes(config),
        num_warps=config.num_warps,
        num_stages=2,  # the next chunk's A and x loaded into registers while this one multiplies
        regs_per_thread=min(255, regs),
    )


def available(device) -> bool:
    """CUDA, NVRTC through cuda.core, and sm_80+ (mma.sp m16n8k32)."""
    device = torch.device(device)
    if device.type != "cuda" or not cuda.available(device):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


# selector 0 reads metadata from lanes 4g + 0 and 4g + 1 only: keeping those 16 words of each
# tile's 32 cuts the weight's bytes by 1/10 (a lane reads word 2g + t % 2)
_META_LANES = [4 * g + h for g in range(8) for h in range(2)]


def packed(A) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(values (Mt, Kt, 32, 8), metadata (Mt, Kt, 16) int32, Mt, Kt) in mma.sp's register order,
    built once per weight (and values version): rows padded to 16 and K to 32 with zeros."""
    if (A.n, A.m) != (2, 4):
        raise ValueError(f"spmm_nm runs 2:4 weights, got {A.n}:{A.m}")
    return memo(A, "_nm_packed", lambda: _pack(A))


def _pack(A):
    from .cuda.sparse_mma import pack_compressed

    rows, cols = A.shape
    mt, kt = math.ceil(rows / 16), math.ceil(cols / 32)
    kept = A.values.shape[1]
    pad_r, pad_k = mt * 16 - rows, kt * 16 - kept
    values = torch.nn.functional.pad(A.values, (0, pad_k, 0, pad_r))
    idx = A.idx.to(torch.int64)
    fill = torch.tensor([0, 1], device=idx.device).repeat(max(pad_k, 0) // 2)  # positions (0, 1)
    idx = torch.cat([idx, fill.expand(rows, -1)], dim=1)
    idx = torch.cat([idx, torch.tensor([0, 1], device=idx.device).repeat(kt * 8).expand(pad_r, -1)], dim=0)
    v, meta = pack_compressed(values, idx)
    return v.contiguous(), meta[..., _META_LANES].contiguous(), mt, kt


_kernels: dict[tuple, object] = {}  # (config, dtype, device index) -> loaded kernel
_NULL = np.uint64(0)  # an absent bias / residual (a bare 0 would be passed as an int32)


def _kernel(config: Config, dtype: torch.dtype, device: torch.device):
    key = (config, dtype, device.index)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = cuda.load(_instance(config, dtype), device)
    return kernel


def _instance(config: Config, dtype: torch.dtype):
    return cuda.instance("spmm_nm.cu", "spmm_nm", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "BM": config.bm, "BN": config.bn,
        "WARPS": config.num_warps, "WARPS_K": config.warps_k, "KSTEPS": config.ksteps})


def launch(A, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None, residual=None,
           scale=1.0):
    """out = act(scale * x @ A^T + bias) + residual, x (N, K) and out (N, M) of any strides."""
    values, meta, mt, kt = packed(A)
    M, K = A.shape
    N = x.shape[0]
    if N == 0 or M == 0:
        return out
    if x.dtype != values.dtype:
        raise TypeError(f"x must be {values.dtype} like the weight, got {x.dtype}")
    kernel = _kernel(config, values.dtype, x.device)
    x_vec = int(x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0)
    res = residual
    grid = (math.ceil(mt * 16 / config.bm), math.ceil(N / config.bn), 1)
    kernel(grid, (32 * config.num_warps, 1, 1), values, meta, x, out, bias if bias is not None else _NULL,
           res if res is not None else _NULL, M, K, N, mt, kt, x.stride(0), x.stride(1), x_vec,
           out.stride(0), out.stride(1), res.stride(0) if res is not None else 0,
           res.stride(1) if res is not None else 0, _CODES[out.dtype],
           _CODES[bias.dtype] if bias is not None else 0, _CODES[residual.dtype] if residual is not None else 0,
           ACTIVATION_CODES[activation], float(scale))
    return out
