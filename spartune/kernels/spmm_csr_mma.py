"""Unstructured (CSR) SpMM for 8-32 tokens on the tensor cores (src/spmm_csr_mma.cu): Flash-LLM's
"load as sparse, compute as dense", linear layout with the fused epilogue.

Why: csr_smem's CUDA cores spend ~2 instructions per product, so from 16 tokens the arithmetic and
x's whole staging bind it (LOG, csr_smem v12-v16). Here the weight streams once as tiles of BR x 64
(kernels/_tiled_csr.py), each tile's nonzeros scattered into a zeroed dense tile in shared memory
and multiplied by x's 64 columns with mma.m16n8k16: a nonzero costs two shared-memory stores
whatever the tokens, and x arrives 64 columns at a time with the weight (no staging up front).
The CTAs cut the tiles by bytes (stream-K), so every shape fills the GPU without a split-K choice.
Config: rows per tile (BR), tokens per CTA (NT), warps and of them along the tokens, the ring's
stages, and CTAs per SM (the grid: occupancy x SMs).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import cuda
from ._common import arrival_counters, grown, next_pow2
from ._tiled_csr import TILE_K, drop_tiled_csr, memo_key, split, tiled_csr
from .cuda.epilogue import check_operands, epilogue_args, or_null
from ..formats import CSR
from ..tune.device import spec_of
from ..tune.problem import KernelFeatures, Problem

DTYPES = ("float16", "bfloat16")
ROWS = (64, 128, 256)
WARPS = (4, 8)
STAGES = (3, 4, 6)
OCCUPANCY = (1, 2, 3)
MAX_TOKENS = 64  # past this, a token tile streams the weight again: the dense GEMM's regime
SMEM_PER_SM = 227 * 1024
# shared-memory work per nonzero (two 2-byte stores: scatter, and its share of the zeroing) and per
# tile, counted as CUDA-core flops for the model (its issue rate stands in for shared memory's)
ISSUE_PER_NONZERO = 8.0
ISSUE_PER_TILE_ROW = 24.0


@dataclass(frozen=True)
class Config:
    br: int  # rows per tile
    nt: int  # tokens per CTA: 8, 16 or 32
    warps: int = 8
    warps_n: int = 1  # warps splitting the tokens
    stages: int = 4
    occupancy: int = 2  # CTAs per SM: the grid is occupancy x SMs (at most one CTA a tile)
    roles: bool = False  # half of the warps multiply, the other half scatter and zero
    ws: bool = False  # warp-specialised (src/spmm_csr_mma_ws.cu): + a copying warp, half fill, half multiply

    def __post_init__(self):  # (TypeError: what dispatch's rebuild of a stored config expects)
        mma_warps = self.warps // 2 if self.roles or self.ws else self.warps
        if self.nt % (8 * self.warps_n) or mma_warps % self.warps_n or \
                (self.br // 16) % (mma_warps // self.warps_n):
            raise TypeError(f"warps must tile {self.br} rows x {self.nt} tokens: got {self}")


def _smem_bytes(config: Config, max_run: int, max_units: int = 0) -> int:
    """Three dense tiles, then the ring's stages (x's tokens x 64 columns, the longest run), then
    the CTA's run starts."""
    pitch = (TILE_K + 8) * 2
    barriers = 8 * (2 * config.stages + 6) + 8 if config.ws else 0
    return 3 * config.br * pitch + config.stages * (config.nt * pitch + max_run * 4) + 4 * (max_units + 1) + barriers


def _expected_run(problem: Problem, br: int) -> int:
    """The longest tile's words, expected: its mean plus 4 sigma (binomial), rounded to loads."""
    mean = br * TILE_K * problem.stats.density
    return 4 * math.ceil((mean + 4 * math.sqrt(mean + 1) * (1 + problem.stats.items_cv)) / 4)


def available(device) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and cuda.available(device)


def space(problem: Problem) -> list[Config]:
    if problem.fmt != "csr" or problem.dtype not in DTYPES or not 1 <= problem.n <= MAX_TOKENS:
        return []
    nt = min(32, max(8, next_pow2(problem.n)))
    out = []
    for br in ROWS:
        run = _expected_run(problem, br)
        for warps in WARPS:
            for wn in (1, 2):
                for stages in STAGES:
                    for occ in OCCUPANCY:
                        try:
                            cfg = Config(br, nt, warps, wn, stages, occ)
                        except TypeError:
                            continue
                        if occ * (_smem_bytes(cfg, run) + 1024) <= SMEM_PER_SM:
                            out.append(cfg)
    return out


def _grid(problem: Problem, config: Config, br_tiles: int) -> int:
    return max(1, min(config.occupancy * spec_of(problem.device).sms, br_tiles))


def features(problem: Problem, config: Config) -> KernelFeatures:
    row_tiles, k_tiles = math.ceil(problem.m / config.br), math.ceil(problem.k / TILE_K)
    tiles = row_tiles * k_tiles
    ctas = _grid(problem, config, tiles)
    token_tiles = math.ceil(problem.n / config.nt)
    nnz = problem.stats.nnz
    word_bytes = 4 * (nnz + 2 * tiles)
    x_l2 = tiles * config.nt * TILE_K * 2
    split_rows = min(ctas, tiles) + row_tiles  # partial slots written and read (at most)
    return KernelFeatures(
        programs=ctas * token_tiles,
        tiles=ctas * token_tiles,
        mma_flops=2.0 * tiles * config.br * TILE_K * config.nt * token_tiles,
        fma_flops=2.0 * token_tiles * (ISSUE_PER_NONZERO * nnz + ISSUE_PER_TILE_ROW * tiles * config.br),
        dram_bytes=word_bytes + problem.n * problem.k * 2 + problem.n * problem.m * 2,
        l2_bytes=(word_bytes + x_l2) * token_tiles + problem.n * problem.m * 2,
        steps_max=math.ceil(tiles / ctas) + 1,
        steps_mean=tiles / ctas,
        smem_bytes=_smem_bytes(config, _expected_run(problem, config.br)),
        num_warps=config.warps,
        num_stages=config.stages,
        split_k=1,
        launches=1,
        reduce_bytes=2.0 * 4 * split_rows * config.br * config.nt * token_tiles if ctas > row_tiles else 0.0,
        regs_per_thread=0,
    )


def layout(A: CSR, config: Config):
    return tiled_csr(A, config.br)


def release_unused(A: CSR, configs) -> None:
    """Each tile height keeps its own copy of the weight: drop those no chosen config reads."""
    drop_tiled_csr(A, {memo_key(c.br) for c in configs if isinstance(c, Config)})


def _instance(config: Config, dtype: torch.dtype, act: int = 0, **probe):
    if config.ws:
        return cuda.instance("spmm_csr_mma_ws.cu", "spmm_csr_mma_ws", {
            "SPARTUNE_BF16": int(dtype == torch.bfloat16), "BR": config.br, "NT": config.nt, "STAGES": config.stages,
            "FILL_W": config.warps // 2, "MMA_W": config.warps // 2, **({"SPARTUNE_ACT": act} if act else {})},
            arch_specific=True)
    return cuda.instance("spmm_csr_mma.cu", "spmm_csr_mma", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "BR": config.br, "NT": config.nt, "WARPS": config.warps,
        "WARPS_N": config.warps_n, "STAGES": config.stages, **({"ROLES": 1} if config.roles else {}),
        **({"SPARTUNE_ACT": act} if act else {}), **probe})


def instances(problem: Problem, config: Config) -> list:
    from ._epilogue import ACTIVATION_CODES

    return [_instance(config, getattr(torch, problem.dtype), ACTIVATION_CODES[problem.epilogue.activation])]


@functools.lru_cache(maxsize=None)
def _kernel(config: Config, dtype: torch.dtype, index: int, act: int):
    return cuda.load(_instance(config, dtype, act), torch.device("cuda", index))


_WORKSPACE: dict = {}  # device -> the partial sums' slots


def launch(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
           residual=None, scale: float = 1.0) -> torch.Tensor:
    """out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual; strides of x, out, residual free."""
    run = bind(A, x, out, config, bias=bias, activation=activation, residual=residual, scale=scale)
    return run(x, out, bias, residual)


def _x_in_place(x: torch.Tensor) -> bool:
    """Whether the kernel's 16-byte copies read x's rows where they are."""
    return x.stride(1) == 1 and (x.stride(0) % 8 == 0 or x.shape[0] == 1) and x.data_ptr() % 16 == 0


def bind(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
         residual=None, scale: float = 1.0):
    """launch's checks and set-up done once: run(x, out, bias, residual) launches on tensors laid
    out as these, giving only their addresses (dispatch keeps one per layout)."""
    from ._epilogue import ACTIVATION_CODES

    M, K = A.shape
    N = x.shape[0]
    check_operands(A, x, out, bias, residual)
    if M == 0 or N == 0:
        return lambda x, out, bias, residual: out
    tiled = layout(A, config)
    tiles = tiled.row_tiles * tiled.k_tiles
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    ctas = max(1, min(config.occupancy * sms, tiles))
    bounds, row_split, max_units = split(A, tiled, ctas)
    smem = _smem_bytes(config, tiled.max_run, max_units)
    if smem > SMEM_PER_SM:
        raise ValueError(f"{config}: a tile of up to {tiled.max_run} nonzeros needs {smem} bytes of shared memory")
    token_tiles = math.ceil(N / config.nt)
    grid = (ctas, token_tiles, 1)
    slots = token_tiles * (ctas + tiled.row_tiles) * config.br * config.nt
    device = x.device
    ws = grown(_WORKSPACE, device, slots, lambda n: torch.empty(n, dtype=torch.float32, device=device))
    counters = arrival_counters(device, token_tiles * tiled.row_tiles)
    in_place = _x_in_place(x)
    pitch = x.stride(0) if in_place and N > 1 else -(-K // 8) * 8
    kernel = _kernel(config, A.values.dtype, device.index, ACTIVATION_CODES[activation])
    prepared = kernel.prepare(grid, (32 * (config.warps + config.ws), 1, 1), tiled.words, tiled.ptr, bounds, row_split, x, out,
                              or_null(bias), or_null(residual), ws, counters, M, N, K, tiled.k_tiles,
                              tiled.row_tiles, pitch, tiled.max_run, max_units, *epilogue_args(out, bias, residual, activation,
                                                                                     scale),
                              shmem=smem, slots=(4, 5, 6, 7))

    def run(x, out, bias, residual):
        if not in_place:  # rows of whole 16-byte chunks
            xp = torch.zeros(N, pitch, dtype=x.dtype, device=x.device)
            xp[:, :K] = x
            x = xp
        prepared(x, out, bias, residual)
        return out
    return run
