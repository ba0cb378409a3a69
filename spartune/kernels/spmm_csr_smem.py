"""Unstructured (CSR) SpMM for decode on CUDA cores, x staged in shared memory
(src/spmm_csr_smem.cu), linear layout with the fused epilogue.

Why a CUDA family: at 8-32 tokens every nonzero needs a strip of x, and the Triton kernels
gather it through L1, one cache line per nonzero, which bound them at ~2x the decode floor
(benchmarks/LOG.md, "CSR decode"); Triton has no indexed load from shared memory. Here a CTA
copies its slice of K of x into shared memory once and each nonzero costs one 16-byte shared
load per lane and 8 tokens; the weight streams once from a sliced ELL copy
(kernels/_sliced_ell.py) whose slot order avoids bank conflicts. Config: tokens per CTA (NT), K
per slice (KS, split over CTAs, partial sums reduced in order by the last CTA of a row block: a
CTA's warp rows, dealt over the matrix so that long and short rows mix), warps per CTA, groups
of rows per warp (GPW: the rows one staged slice of x serves; the copy costs as much as
streaming the rows' nonzeros when too few rows share it), lanes per row (QS) and warps per
group (KW: on a short matrix, many warps share one group's chunks with K whole in the CTA,
their sums meeting in shared memory instead of partials through global memory) and, on Hopper,
clusters (CK: a row block's K slices as one cluster, so each CTA stages only its slice of x and
the slices' sums meet through distributed shared memory instead of global partials), and tokens
per lane (TPL: at 16 tokens a lane decodes, loads and addresses each word once for 16 products).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import cuda
from ._sliced_ell import SLOTS_PER_LOAD, drop_sliced_ell, memo_key, sliced_ell
from ._common import arrival_counters, next_pow2
from .cuda.epilogue import check_operands, epilogue_args, or_null
from ..formats import CSR
from ..tune.device import spec_of
from ..tune.problem import KernelFeatures, Problem, fp16_reduction_allowed

DTYPES = ("float16", "bfloat16")
K_SLICES = (256, 512, 1024, 2048, 4096, 8192)
WARPS = (4, 8)
GROUPS_PER_WARP = (1, 2, 4, 8, 16)
# warps taking turns over one group's chunks, and the CTA sizes and groups tried with them
WARPS_PER_GROUP = (4, 8, 16, 32)
# 12, 24 and 28 warps make 3, 6 or 7 rows of warps: row blocks of a size that fills 132 SMs
# more evenly than powers of two do (7B up at N = 8: 115 CTAs of 96 rows, not 86 of 128)
SHARED_WARPS = (8, 12, 16, 24, 28, 32)
SHARED_GROUPS = (1, 2, 4)
# qs = 4 never measured best and the model ranked it too high (benchmarks/LOG.md, csr_smem v4);
# the kernel still takes it
LANES_PER_ROW = (1, 2)
SMEM_LIMIT = 227 * 1024  # Hopper's opt-in maximum per CTA (sm_80: 163 KB; space() checks the device)
ROWS_COPY_MAX = 1024  # a CTA of up to this many team rows copies their output rows on chip
MAX_SLICES = 64
MAX_PARTIALS_BYTES = 256 << 20  # split-K's fp32 partials (4 x tokens x slices x rows): past this, no split
MAX_TOKEN_TILES = 65535  # the grid's z
MAX_CLUSTER = 8  # the portable cluster size: a clustered row block holds at most this many slices
# Wide N: each token tile streams the weight again, so past this many tokens only very sparse
# weights (Sputnik's regime) are worth trying
WIDE_N, WIDE_MAX_DENSITY = 64, 0.06
# Per (nonzero, token) a lane issues a conversion and an FMA, plus per nonzero a shared load and
# the word's decoding over 8 tokens: ~2.4 instructions per FMA, declared as FMA flops; over 16
# tokens a lane (tpl = 16) ~2.0 (SASS of the main loop: 469 instructions per 12 words x 16 tokens
# against 301 per 12 x 8)
ISSUE_PER_FMA = {8: 2.4, 16: 2.0}
# fp16 with reduced-precision reductions allowed (torch's default) and 16 or more tokens a CTA
# (`half_sums`): a chunk's products summed in fp16 pairs, no conversion per product: the main loop's
# SASS 0.62x (tpl 8) and 0.59x (tpl 16) the instructions
HALF_SUMS_ISSUE = 0.6
HALF_SUMS_MIN_TOKENS = 16
# 16 tokens a lane pays where the arithmetic outweighs x's staging: each SM's share of the
# nonzeros per column of K at least this many (70B up, 21.7: 2.64x against 2.49 at N = 16); at
# 3-8 (qkv, 7B up and down) it measured 0-10% slower and the model could not tell (LOG, v12)
TPL16_MIN_NNZ_PER_SM_COLUMN = 12.0


@dataclass(frozen=True)
class Config:
    nt: int  # tokens per CTA: 8, 16 or 32 (more tokens: more CTAs along the grid's z)
    ks: int  # columns of K per slice (one CTA's shared-memory copy of x)
    warps: int  # warps per CTA
    gpw: int = 1  # groups of rows each warp serves, one after another
    qs: int = 1  # lanes splitting each row's nonzeros: a warp serves 32 / (nt / tpl * qs) rows
    kw: int = 1  # warps sharing each group's chunks (a CTA holds warps / kw rows of warps)
    ck: int = 1  # > 1: the slices (exactly ck) of a row block form a cluster (sm_90)
    tpl: int = 8  # tokens per lane: 8, or 16 where nt >= 16 (a lane's 16 sums in fp32)

    def __post_init__(self):  # (TypeError: what dispatch's rebuild of a stored config expects)
        if self.tpl not in ISSUE_PER_FMA or self.nt % self.tpl:
            raise TypeError(f"tokens per lane must be 8, or 16 with nt >= 16: got {self}")


def _team(config: Config) -> tuple[int, int, int]:
    """(lanes per row and chunk, rows per warp R, bank positions P) of a config."""
    team = config.nt // config.tpl
    return team, 32 // (team * config.qs), 8 // team


def _plane_rows(config: Config) -> int:
    """Rows of each 8-token plane of x in shared memory (the template's PS)."""
    _, _, P = _team(config)
    return config.ks + P + (2 if config.tpl == 16 and P == 4 else 0)


def _smem_bytes(config: Config) -> int:
    """x's slice; with kw > 1 each warp's 32 lanes x tpl fp32 sums; with clusters the CTA's rows'
    fp32 sums for its peers; the CTA's output rows (up to ROWS_COPY_MAX)."""
    sums = config.warps * 32 * config.tpl * 4 if config.kw > 1 else 0
    team_rows = _team_rows(config)
    shared = team_rows * config.nt * 4 if config.ck > 1 else 0
    rows_copy = team_rows * 4 if _rows_copied(config) else 0
    return _plane_rows(config) * config.nt * 2 + sums + shared + rows_copy


def _team_rows(config: Config) -> int:
    """A CTA's team rows (the template's TEAM_ROWS): warp rows x groups x rows per group."""
    return config.warps // config.kw * config.gpw * _team(config)[1]


def _rows_copied(config: Config) -> bool:
    """Whether the CTA copies its output rows on chip (the template's ROWS_COPY, set from here)."""
    return _team_rows(config) <= ROWS_COPY_MAX


def available(device) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and cuda.available(device)


def space(problem: Problem) -> list[Config]:
    """fp16 / bf16 CSR in the linear layout (spmm's x = X.T runs on it too); all tokens up to
    WIDE_N, beyond that only very sparse weights."""
    if problem.fmt != "csr" or problem.dtype not in DTYPES or problem.n < 1:
        return []
    if problem.n > WIDE_N and problem.stats.density > WIDE_MAX_DENSITY:
        return []
    nt = min(32, max(8, next_pow2(problem.n)))
    hopper = problem.device.endswith("sm_90")
    limit = SMEM_LIMIT if hopper or not problem.device else 99 * 1024
    sms = spec_of(problem.device).sms  # a config whose grid cannot fill half of them is left out (unless gpw = 1)
    sixteen = nt >= 16 and problem.stats.nnz / (sms * max(problem.k, 1)) >= TPL16_MIN_NNZ_PER_SM_COLUMN
    out = []
    for ks in _slice_widths(problem.k):
        slices = math.ceil(problem.k / ks)
        candidates = [Config(nt, ks, warps, gpw, qs) for warps in WARPS for qs in LANES_PER_ROW
                      for gpw in GROUPS_PER_WARP]
        candidates += [Config(nt, ks, warps, gpw, 1, kw) for kw in WARPS_PER_GROUP for warps in SHARED_WARPS
                       if warps % kw == 0 for gpw in SHARED_GROUPS]
        if hopper and 1 < slices <= MAX_CLUSTER:
            candidates += [dataclasses.replace(c, ck=slices) for c in candidates]
        if sixteen:
            candidates += [dataclasses.replace(c, tpl=16) for c in candidates]
        for cfg in candidates:
            if _smem_bytes(cfg) <= limit and (cfg.gpw == 1 or _ctas(problem, cfg) * 2 >= sms) \
                    and _partials_bytes(problem, cfg) <= MAX_PARTIALS_BYTES:
                out.append(cfg)
    return out if math.ceil(problem.n / nt) <= MAX_TOKEN_TILES else []


def _slice_widths(k: int) -> list[int]:
    """K_SLICES up to the power of two at or above K, each that leaves a short last slice followed
    by K cut evenly into as many slices (a multiple of 32 columns): 4096-column slices of
    K = 11008 leave a last one of 2816, and the CTAs of the full slices set the time of a
    one-wave launch."""
    out = []
    for ks in K_SLICES:
        slices = math.ceil(k / ks)
        if ks > max(K_SLICES[0], next_pow2(k)) or slices > MAX_SLICES:
            continue
        out.append(ks)
        if slices > 1 and k % ks:
            even = 32 * math.ceil(k / slices / 32)
            out += [even] if even < ks and even not in K_SLICES else []
    return out


def _partials_bytes(problem: Problem, config: Config) -> int:
    """Split K's fp32 partials (a cluster's stay on chip: see features)."""
    slices = math.ceil(problem.k / config.ks)
    if slices == 1 or config.ck > 1:
        return 0
    R = _team(config)[1]
    rows = math.ceil(problem.m / R) * R
    return 4 * math.ceil(problem.n / config.nt) * config.nt * slices * rows


def _ctas(problem: Problem, config: Config) -> int:
    groups = math.ceil(problem.m / _team(config)[1])
    return _row_blocks(groups, config) * math.ceil(problem.k / config.ks) * math.ceil(problem.n / config.nt)


def _row_blocks(groups: int, config: Config) -> int:
    return math.ceil(groups / (config.warps // config.kw * config.gpw))


def _slots_per_row(problem: Problem, config: Config) -> float:
    """Expected slots of a row in one block: the longest of R rows' nonzeros in the slice,
    rounded up to whole 16-byte loads."""
    st = problem.stats
    _, R, _ = _team(config)
    share = min(config.ks, problem.k) / max(problem.k, 1)
    mean = st.items_mean * share
    spread = math.sqrt(mean * (1.0 - min(st.density, 1.0)) + (mean * st.items_cv) ** 2)
    longest = mean + spread * math.sqrt(2.0 * math.log(R))
    step = SLOTS_PER_LOAD * config.qs
    return math.ceil(longest / step) * step


def features(problem: Problem, config: Config) -> KernelFeatures:
    _, R, _ = _team(config)
    groups = math.ceil(problem.m / R)
    slices = math.ceil(problem.k / config.ks)
    tiles_n = math.ceil(problem.n / config.nt)
    programs = _ctas(problem, config)
    slots = _slots_per_row(problem, config)
    word_bytes = groups * R * slices * slots * 4
    x_bytes = problem.n * problem.k * 2
    y_bytes = problem.n * problem.m * 2
    staged = programs * min(config.ks, problem.k) * config.nt * 2  # every CTA's copy of its x slice
    # split K's partials are written and read back; a cluster's are read once from its peers'
    # shared memory, and its barrier and wait for the slowest slice stand in the split-K fix-up's
    # place (measured against their unclustered twins, clusters won 25 of 54 pairs: LOG session 19)
    partials = 2 * _partials_bytes(problem, config) if config.ck == 1 else \
        _partials_bytes(problem, dataclasses.replace(config, ck=1))
    steps = config.gpw * slots / (SLOTS_PER_LOAD * config.qs * config.kw)
    return KernelFeatures(
        programs=programs,
        tiles=programs,
        mma_flops=0.0,
        fma_flops=2.0 * groups * R * slices * slots * config.nt * tiles_n * ISSUE_PER_FMA[config.tpl]
        * (HALF_SUMS_ISSUE if half_sums(config, problem.fp16_reduction) else 1.0),
        dram_bytes=word_bytes + x_bytes + y_bytes,
        l2_bytes=word_bytes * tiles_n + staged + y_bytes,
        steps_max=int(steps) + 1,
        steps_mean=steps,
        smem_bytes=_smem_bytes(config),
        num_warps=config.warps,
        num_stages=4,  # three 16-byte loads of words in flight per lane
        split_k=slices,
        launches=1,
        reduce_bytes=partials,
        regs_per_thread=64,  # the kernel's launch bounds cap it there
        cluster=config.ck,
    )


def layout(A: CSR, config: Config):
    """The sliced ELL copy this config streams (built once per weight and memoised)."""
    _, R, P = _team(config)
    return sliced_ell(A, R, config.ks, P, config.qs)


def release_unused(A: CSR, configs) -> None:
    """Each (rows per warp, slice) keeps its own copy of the weight: drop those no chosen config reads."""
    keep = set()
    for c in configs:
        if isinstance(c, Config):
            _, R, P = _team(c)
            keep.add(memo_key(R, c.ks, P, c.qs))
    drop_sliced_ell(A, keep)


_kernels: dict[tuple, object] = {}


def _kernel(config: Config, dtype: torch.dtype, device: torch.device):
    half = half_sums(config, fp16_reduction_allowed(dtype))  # (read once: the key and the instance agree)
    key = (config, dtype, device.index, half)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = cuda.load(_instance(config, dtype, half), device)
    return kernel


def half_sums(config: Config, allowed: bool) -> bool:
    """Whether fp16 products are summed in fp16 pairs, 4 nonzeros at a time, before the fp32 sums:
    where torch allows reduced-precision reductions in fp16 matmuls
    (`torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`, on by default; cuBLAS
    then sums split-K partials in fp16), at 16 tokens a CTA or more (N >= 9). There the loop's
    issue binds and the lighter loop won 4-10%; at 8 tokens the stream binds and its longer chains
    lost 1-3% (LOG, session 24). Relative error ~4e-4 against ~2e-4 with fp32 sums; a 4-product
    partial past 65504 overflows where fp32 sums would not. The tuning key holds the flag
    (Problem.fp16_reduction), and the launch reads it again (the key and the kernel agree)."""
    return config.nt >= HALF_SUMS_MIN_TOKENS and allowed


def _instance(config: Config, dtype: torch.dtype, half: bool):
    return cuda.instance("spmm_csr_smem.cu", "spmm_csr_smem", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "NT": config.nt, "WARPS": config.warps, "KS": config.ks,
        "GPW": config.gpw, "QS": config.qs, "KW": config.kw, **({"CK": config.ck} if config.ck > 1 else {}),
        **({"TPL": config.tpl} if config.tpl != 8 else {}), **({"HALF_SUMS": 1} if half else {}),
        **({"ROWS_COPY": 1} if _rows_copied(config) else {})},
        arch_specific=config.ck > 1)


def instances(problem: Problem, config: Config) -> list:
    """The kernel a launch of `config` loads (compiled ahead by the tuner)."""
    return [_instance(config, getattr(torch, problem.dtype), half_sums(config, problem.fp16_reduction))]


def _x_rows(x: torch.Tensor) -> int:
    """How the kernel stages x (Hopper, rows contiguous: `stmatrix` transposes 8 x 8 blocks):
    2 where every row starts 16-byte aligned (8 columns a load), 1 where column pairs are
    4-byte aligned, else 0 (element by element)."""
    if x.stride(1) != 1 or _capability(x.device.index)[0] < 9:
        return 0
    for mode, elements in ((2, 8), (1, 2)):
        if (x.stride(0) % elements == 0 or x.shape[0] == 1) and x.data_ptr() % (2 * elements) == 0:
            return mode
    return 0


@functools.cache
def _capability(index) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def launch(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
           residual=None, scale: float = 1.0) -> torch.Tensor:
    """out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual; strides of x, out, residual free."""
    run = bind(A, x, out, config, bias=bias, activation=activation, residual=residual, scale=scale)
    return run(x, out, bias, residual)


def bind(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
         residual=None, scale: float = 1.0):
    """launch's checks and set-up done once: run(x, out, bias, residual) launches on tensors laid
    out as these (shapes, strides, dtypes, 16-byte alignment; the same epilogue), giving only
    their addresses (dispatch keeps one per layout)."""
    M, K = A.shape
    N = x.shape[0]
    check_operands(A, x, out, bias, residual)
    if M == 0 or N == 0:
        return lambda x, out, bias, residual: out
    if config.ck > 1 and (math.ceil(K / config.ks) != config.ck or _capability(x.device.index) != (9, 0)):
        raise ValueError(f"a cluster holds a row block's K slices, exactly {math.ceil(K / config.ks)} of "
                         f"{config.ks} columns here, and needs sm_90: got {config}")
    ell = layout(A, config)
    _, R, _ = _team(config)
    grid = (_row_blocks(ell.groups, config), ell.slices, math.ceil(N / config.nt))
    split = ell.slices > 1 and config.ck == 1  # K slices summed through a workspace, one per call
    ws_numel = grid[2] * ell.slices * ell.groups * R * config.nt
    device = x.device  # (the bound run holds no operand of this call)
    workspace = (lambda: torch.empty(ws_numel, dtype=torch.float32, device=device)) if split else lambda: None
    counters = arrival_counters(x.device, grid[0] * grid[2]) if split else or_null(None)
    kernel = _kernel(config, A.values.dtype, x.device)
    prepared = kernel.prepare(grid, (32 * config.warps, 1, 1), ell.words, ell.offsets, ell.rows, x, out,
                              or_null(bias), or_null(residual), or_null(workspace()), counters, M, N, K, ell.groups,
                              ell.slices, np.int64(x.stride(0)), np.int64(x.stride(1)), _x_rows(x),
                              *epilogue_args(out, bias, residual, activation, scale), shmem=_smem_bytes(config),
                              slots=(3, 4, 5, 6, 7))

    def run(x, out, bias, residual):
        prepared(x, out, bias, residual, workspace())
        return out
    return run

