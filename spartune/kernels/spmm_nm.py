"""2:4 and V:N:M SpMM on the sparse tensor cores, fused epilogue.

out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual, in PyTorch's linear layout; x and
out may have any strides (spmm's x = X.T runs on the same kernels). Two variants of one family,
chosen by the tuner per problem (`Config.variant`):
- "mma" (src/spmm_nm.cu): warp-level `mma.sp.sync` m16n8k32 on sm_80+, x staged by hand, K split
  across warps: decode, where the weight's bytes are the floor;
- "wgmma" (src/spmm_nm_wgmma.cu): Hopper's warpgroup `wgmma.mma_async.sp` (sm_90a) fed by TMA
  through a producer/consumer pipeline of shared-memory stages: prefill, where the math is.
The weight is packed once (`packed`), in one layout both variants read: 512-byte units of 8 x 8
core matrices per (16-row tile, 32-wide K step), as wgmma.sp reads A from shared memory and
ldmatrix gives mma.sp's fragments, the metadata in mma.sp's register order (cuda/sparse_mma.py;
wgmma.sp keeps mma.sp's per-warp layout), memoised on the format object.
V:N:M weights (VENOM) are the 2:4 matrix over each V-row block's kept columns plus a map from
those columns to x's; the "mma" variant gathers x through the map as it stages it, the "wgmma"
variant reads x^T (K, tokens), where a kept column is a contiguous row of tokens, and its
producer warpgroup gathers those rows by cp.async. With N = 2 and M a multiple of 4, a V:N:M
weight is a 2:4 one over all of K too: `Config.as_24` runs it on the 2:4 kernels (no gather;
where the gather's L2 traffic bounds, V = 64 at prefill, that is faster despite twice the
products).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from . import cuda
from ._common import arrival_counters, scratch
from ._epilogue import ACTIVATION_CODES
from .cuda.epilogue import NULL, check_operands, epilogue_args, or_null
from .transpose import tokens_major
from ..formats import VNM, PackedNM, PackedVNM, memo
from ..formats.nm import tile_order, tile_steps
from ..tune.device import spec_of
from ..tune.problem import KernelFeatures, Problem

DTYPES = ("float16", "bfloat16")
SMEM_BYTES = 48 * 1024  # static shared memory: the x tile must fit without opting in
MAX_GRID_Y = 65535  # the mma variant's row blocks (its grid's y)
PIPE_SMEM = 112 * 1024  # the cp.async ring's dynamic shared memory: two CTAs per SM at most


@dataclass(frozen=True)
class Config:
    bm: int  # rows of A per CTA (multiple of 16; wgmma: 128 or 256)
    bn: int  # tokens per CTA (multiple of 8; wgmma: 64, 128 or 256)
    num_warps: int
    warps_k: int = 1  # mma: of the warps, how many split K (decode: few row tiles, so parallelism in K)
    ksteps: int = 4  # mma: 32-wide K steps per warp and staged chunk of x
    variant: str = "mma"  # "mma" (mma.sp.sync, sm_80+) | "wgmma" (wgmma.sp + TMA, sm_90a)
    # wgmma: shared-memory stages of the pipeline (64 of K each); mma: 2 = the next chunk
    # prefetched into registers, >= 3 = a cp.async ring of that many shared-memory stages
    stages: int = 2
    group_m: int = 8  # wgmma: tile order, groups of group_m row blocks (L2 reuse of x and A)
    # 2:4: CTAs of a cluster (adjacent row blocks, the same tokens) multicasting each x box (wgmma)
    # or chunk (mma, the ring on sm_90: decode's small BM otherwise re-reads all of x per row
    # block, LOG session 18)
    cluster_m: int = 1
    # wgmma, V:N:M with M a multiple of 4: run the weight as 2:4 over all of K (its 2 nonzeros in
    # an M-column block leave at most 2 in each of the block's groups of 4): twice the kept
    # columns' products, but x by TMA, shared by every row block, instead of gathered per V rows
    # (at V = 64 the gather's L2 traffic bounds it: LOG, session 16)
    as_24: bool = False
    # mma, V:N:M on the ring, linear layout, few tokens: x's rows staged whole in shared memory
    # once per CTA, each chunk's kept columns read from there (GATHER 3) instead of from an x^T
    # copy, a second launch that costs a fifth of a decode call (LOG, session 17)
    x_whole: bool = False


# Sparse tensor-core peaks measured on the H100 (PERF-NOTES.md), dense-equivalent TFLOP/s, and
# cuBLAS's dense rate that the cost model's tensor-core rate stands for: a variant's mma_flops
# feature is its dense-equivalent flops scaled by DENSE / peak, so the model ranks the variants
# by how fast their instruction really is.
MMA_SP_PEAK, WGMMA_SP_PEAK, DENSE_PEAK = 954.0, 1720.0, 765.0
WGMMA_THREADS = 384  # a producer warpgroup and two consumers
WGMMA_BK = 64  # K per stage: one 128-byte swizzled row of x
SMEM_LIMIT_HOPPER = 227 * 1024
L2_REUSE_BYTES = 40e6  # what of the H100's 50 MB L2 reuse can count on


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


@functools.lru_cache(maxsize=None)
def _smem_bytes(config: Config, gather: int = 0) -> int:
    """mma: the staged x chunk, or the K parts' partial sums where larger (they share the
    buffer); the chunk's x tile as spmm_nm.cu's GATHER lays it out: token rows (0, 1), kept
    columns' k-major rows of 8 tokens (2, 3) or one token's row (4).
    (The wgmma variant's: `_wgmma_smem_bytes`.)"""
    kc = 32 * config.ksteps * config.warps_k
    x_tile = kc * 2 if gather == 4 else kc * ((config.bn // 8) | 1) * 8 * 2 if gather in (2, 3) \
        else config.bn * (kc + 8) * 2
    partial = (config.warps_k - 1) * config.bm * config.bn * 4
    if config.stages >= 3:  # each stage: the x chunk and every warp's A fragments (16 + 4 bytes a lane)
        wm, wn = _warp_grid(config)
        frags = config.num_warps // wn * (config.bm // 16 // wm) * config.ksteps * 32  # (token warps share A's)
        barriers = 8 * config.stages if config.cluster_m > 1 else 0  # a cluster's x chunks land on mbarriers
        return max(config.stages * (x_tile + frags * 20), partial) + barriers
    return max(x_tile, partial)


def _wgmma_smem_bytes(config: Config, boxes: int) -> int:
    """The stages (x: one TMA box for 2:4, `boxes` gathered ones for V:N:M; A's values and
    metadata) and the output staged for the epilogue a part at a time: 2:4's persistent CTAs keep
    it apart (the producer fills the next tile's stages meanwhile), V:N:M's share the stages; plus
    the barriers and 1 KB of alignment (as spmm_nm_wgmma.cu)."""
    stage = max(boxes, 1) * config.bn * WGMMA_BK * 2 + config.bm * WGMMA_BK // 2 * 2 + config.bm * 2 * 4
    staged = _epi_tokens(config) * (config.bm + 4) * 4
    pipe = config.stages * stage
    return (pipe + staged if boxes == 0 else max(pipe, staged)) + 16 * config.stages + 16 + 1024


def _epi_tokens(config: Config) -> int:
    """Tokens of the output the wgmma epilogue stages at once (spmm_nm_wgmma.cu's EPI_TOKENS)."""
    return min(4096 // config.bm, config.bn)


def _vnm(fmt: str) -> tuple[int, int] | None:
    """(V, M) of a V:N:M signature ("64:2:8"), None for anything else."""
    parts = fmt.split(":")
    return (int(parts[0]), int(parts[2])) if len(parts) == 3 and parts[1] == "2" else None


def space(problem: Problem) -> list[Config]:
    """Valid configs: 2:4 and V:N:M in fp16/bf16 run on mma.sp (fp32 falls back to other
    backends); the wgmma variant on Hopper (sm_90), for 2:4 with K a multiple of 8 (TMA's 16-byte
    row pitch). An mma V:N:M tile stays inside one V-row block; a wgmma one covers one block, or
    two of V = BM / 2 rows (a box of x per consumer)."""
    if problem.dtype not in DTYPES:
        return []
    if problem.fmt == "2:4":
        return _mma_space(problem) + _wgmma_space(problem)
    vnm = _vnm(problem.fmt)
    if vnm is None:
        return []
    mma = [c for c in _mma_space(problem, gather=True) if vnm[0] % c.bm == 0]
    # as_24 keeps a 2:4 copy of the weight, twice its kept values: not under the lean memory policy
    as_24 = [dataclasses.replace(c, as_24=True) for c in _wgmma_space(problem)] \
        if vnm[1] % 4 == 0 and problem.memory != "lean" else []
    return mma + [c for c in _wgmma_space(problem, vnm[0]) if wgmma_boxes(c, vnm[0])] + as_24


def _mma_smem_bytes(config: Config, vnm: bool, n: int = 0, k: int = 0) -> int:
    """The mma variant's shared memory for n tokens: the ring's x tile as `mma_gather` lays it out
    (V:N:M), and with x_whole x's rows (n tokens at most, k columns rounded up to 8) behind it."""
    ring = _smem_bytes(config, mma_gather(config, n) if vnm else 0)
    return ring + (_x_rows_bytes(config, n, k) if config.x_whole else 0)


def _x_rows_bytes(config: Config, n: int, k: int) -> int:
    return min(config.bn, n) * -(-k // 8) * 8 * 2


def mma_gather(config: Config, n: int = 0) -> int:
    """The mma variant's V:N:M gather (spmm_nm.cu's GATHER) for n tokens: x^T rows by the cp.async
    ring (2), x's rows staged whole for the ring (3; 4 for one token), or x element by element (1)."""
    if config.stages < 3:
        return 1
    return (4 if n == 1 and config.bn == 8 else 3) if config.x_whole else 2


def wgmma_boxes(config: Config, v: int) -> int:
    """Boxes of gathered x per stage of a V:N:M wgmma tile: 1 if the tile's rows share their kept
    columns, 2 if each consumer's half is its own V-row block, 0 if the tile cannot run V."""
    if v % config.bm == 0:
        return 1
    return 2 if 2 * v == config.bm else 0


def _wgmma_space(problem: Problem, v: int = 0) -> list[Config]:
    # at 32 tokens or fewer most of a 64-wide wgmma tile is padding, and the mma variant streams the
    # weight faster (measured at N = 1 and 16, LOG "spmm_nm mma variant, v3"): decode is mma's
    if not problem.device.endswith("sm_90") or (problem.k % 8 and not v) or problem.n <= 32:  # (n_bucket's edge)
        return []
    if v and problem.k * (problem.n + 8) >= 2**31:  # the gather's 32-bit offsets into x^T
        return []
    out = []
    for bm, bn in ((128, 64), (128, 128), (128, 256), (256, 64), (256, 128)):
        if bn > max(64, problem.n * 2):  # no tile wider than twice the tokens
            continue
        # 2:4 on 4+ row blocks: pairs of CTAs multicasting x (group_m then counts pairs)
        clusters = ((1, (4, 8, 16, 32)),) if v or problem.m < 4 * bm else ((1, (4, 8, 16, 32)), (2, (4, 8, 16)))
        for stages in (3, 4, 5) if v else (4, 5):  # (two boxes of x: 3 stages fit at BN = 256)
            for cluster_m, groups in clusters:
                for group_m in groups:
                    cfg = Config(bm, bn, WGMMA_THREADS // 32, variant="wgmma", stages=stages, group_m=group_m,
                                 cluster_m=cluster_m)
                    if v and not wgmma_boxes(cfg, v):
                        continue
                    if _wgmma_smem_bytes(cfg, wgmma_boxes(cfg, v) if v else 0) <= SMEM_LIMIT_HOPPER:
                        out.append(cfg)
    return out


def _mma_space(problem: Problem, gather: bool = False) -> list[Config]:
    n_cap = max(8, 1 << math.ceil(math.log2(max(problem.n, 1))))
    hopper = problem.device.endswith("sm_90")  # clusters and bulk copies

    def one_wave(c: Config) -> bool:
        """Whether the CTAs (one an SM) all run at once: row blocks in whole clusters, times token
        strips, against the clusters the device's GPCs place."""
        ctas = math.ceil(problem.m / (c.bm * c.cluster_m)) * c.cluster_m * math.ceil(max(problem.n, 1) / c.bn)
        return ctas <= spec_of(problem.device).cluster_ctas(c.cluster_m, 1)

    out = []
    for bn in (8, 16, 32, 64, 128):
        if bn > n_cap:
            continue
        shapes = _DECODE if bn <= 16 else [(bm, w, 1) for bm in (64, 128) for w in (4, 8)]
        for bm, warps, warps_k in shapes:
            # decode: twice the K steps per chunk puts twice the weight's bytes in flight per warp
            for ksteps in (4, 8) if bn <= 16 else (4,):
                # decode: the weight's chunks two stages ahead through a cp.async ring (4 stages
                # were never faster on the Llama shapes: LOG "spmm_nm mma variant, v3")
                # (it copies x in 16-byte rows: the linear layout with K % 8 == 0; V:N:M, rows
                # of x^T, any layout)
                ring = bn <= 16 and (gather or problem.layout == "linear" and problem.k % 8 == 0)
                # V:N:M where the ring runs: the ring only. Off it x is gathered element by element
                # (GATHER 1), which the model does not see: a 16-token such config, predicted at the
                # top, timed 220-280 us against the ring's 22-36 (7B down, N = 16), and at N = 8-16
                # they took 1-4 of fast mode's ~6 slots (LOG, session 36)
                for stages in ((3,) if gather else (2, 3)) if ring else (2,):
                    cfg = Config(bm, bn, warps, warps_k, ksteps, stages=stages)
                    # V:N:M in the linear layout: the ring also with x's rows whole (no x^T copy)
                    whole = (False, True) if gather and stages == 3 and problem.layout == "linear" else (False,)
                    # 2:4 on the ring with several tokens: clusters of 2 or 4 row blocks sharing x's chunks
                    clusters = (1, 2, 4) if stages == 3 and not gather and problem.n > 1 and hopper else (1,)
                    if _warp_grid(cfg) is None or warps > 8 and not (hopper and stages == 3):
                        continue
                    # (16 warps: one CTA an SM with all of Hopper's shared memory for the ring)
                    cap = SMEM_BYTES if stages == 2 else PIPE_SMEM if warps <= 8 else SMEM_LIMIT_HOPPER
                    for c in (dataclasses.replace(cfg, x_whole=w, cluster_m=m) for w in whole for m in clusters):
                        if warps > 8 and not one_wave(c):
                            continue
                        smem = _mma_smem_bytes(c, gather, problem.n, problem.k)
                        if smem <= cap \
                                and math.ceil(problem.m / (bm * c.cluster_m)) * c.cluster_m <= MAX_GRID_Y:
                            out.append(c)
    return out


# (bm, warps, warps_k) for narrow token tiles: few row tiles' worth of CTAs, so small BM and K
# split over warps keep enough loads in flight
# (16, 8, 8) and (32, 8, 4): a short M (7B down: 4096 rows) needs 8 warps a CTA splitting K
# (LOG, session 17: 2:4 N = 1 25.1 us against 25.6, 64:2:8 16.4 against 18.8)
# (16, 4, 2), (16, 8, 4), (32, 8, 2), (64, 8, 1): at 16 tokens, two warps split the tile's tokens
# (8-token work per warp), sharing A's fragments on the ring (LOG, session 18)
# (32, 16, 8) on Hopper's ring where its CTAs fit one wave of SMs: one CTA an SM with the
# ring's bytes in flight of two 8-warp ones (7B down at 16 tokens: two 8-warp CTAs an SM would need
# 16-row blocks, staging x twice as often; with more row blocks than SMs it lost 10-25% to the
# waves: LOG, session 26)
_DECODE = [(16, 4, 4), (16, 8, 8), (32, 4, 2), (32, 4, 4), (32, 8, 4), (64, 4, 1), (64, 4, 2), (64, 8, 4),
           (128, 4, 1), (128, 8, 2), (16, 4, 2), (16, 8, 4), (32, 8, 2), (64, 8, 1), (32, 16, 8)]


def features(problem: Problem, config: Config) -> KernelFeatures:
    if config.variant == "wgmma":
        return _wgmma_features(problem, config)
    elt = 2
    mt = math.ceil(problem.m / 16)
    vnm = _vnm(problem.fmt)
    k_kept = problem.k if vnm is None else math.ceil(problem.k / vnm[1]) * 4
    kt = tile_steps(k_kept)  # K steps of the 2:4 matrix (V:N:M: its kept columns), as packed
    row_tiles = math.ceil(mt * 16 / (config.bm * config.cluster_m)) * config.cluster_m  # whole clusters
    strips = math.ceil(problem.n / config.bn)
    tiles = row_tiles * strips
    k_pad = kt * 32
    a_bytes = mt * 16 * k_pad // 2 * elt + mt * kt * 16 * 4  # values + metadata words
    x_bytes = problem.n * problem.k * elt
    y_bytes = problem.n * problem.m * elt
    # A is re-read once per token strip, x once per row tile (a cluster's tiles: once), all through L2
    a_l2 = strips * a_bytes
    x_l2 = row_tiles // config.cluster_m * strips * config.bn * k_pad * elt
    wm, wn = _warp_grid(config)
    threads = 32 * config.num_warps
    # registers: accumulators, A fragments (two sets: the prefetch, unless the cp.async ring
    # holds it), B, addresses
    ring = config.stages >= 3
    regs = 40 + config.bm * config.bn * config.warps_k // threads + (1 if ring else 2) * (config.bm // 16 // wm) * config.ksteps * 5
    if not ring:
        regs += config.bn * 32 * config.ksteps * config.warps_k // (2 * threads)  # the next x chunk
    # the main loop's trips: chunks of ksteps K steps a warp, each one round trip with the stages'
    # chunks in flight (counting K steps charged ksteps round trips a chunk: the model then ranked
    # long chunks last and missed the best decode configs, LOG session 38)
    steps = math.ceil(kt / (config.warps_k * config.ksteps))
    copy_bytes = 2 * x_bytes if vnm and ring and problem.layout == "linear" and not config.x_whole else 0  # x^T
    if config.x_whole:  # each CTA reads its tokens' rows of x whole (the chunks' tiles come from them)
        x_l2 = tiles * _x_rows_bytes(config, problem.n, problem.k)
    return KernelFeatures(
        programs=tiles,
        tiles=tiles,
        mma_flops=2.0 * tiles * config.bm * config.bn * k_pad * DENSE_PEAK / MMA_SP_PEAK,
        fma_flops=0.0,
        dram_bytes=a_bytes + x_bytes + y_bytes + copy_bytes,
        l2_bytes=a_l2 + x_l2 + y_bytes + copy_bytes,
        steps_max=steps,
        steps_mean=float(steps),
        smem_bytes=_mma_smem_bytes(config, vnm is not None, problem.n, problem.k),
        num_warps=config.num_warps,
        num_stages=config.stages,  # chunks in flight: registers (2) or the ring's stages
        regs_per_thread=min(255, regs),
        launches=2 if copy_bytes else 1,  # the x^T copy is a kernel of its own
        cluster=config.cluster_m,
    )


def _wgmma_features(problem: Problem, config: Config) -> KernelFeatures:
    if config.as_24:
        return _wgmma_features(dataclasses.replace(problem, fmt="2:4"), _as_plain_24(config))
    elt = 2
    row_tiles = math.ceil(problem.m / config.bm)
    strips = math.ceil(problem.n / config.bn)
    tiles = row_tiles * strips
    vnm = _vnm(problem.fmt)
    boxes = wgmma_boxes(config, vnm[0]) if vnm else 0
    k_kept = problem.k if vnm is None else math.ceil(problem.k / vnm[1]) * 4
    stages_k = 2 * math.ceil(k_kept / (2 * WGMMA_BK))
    k_pad = stages_k * WGMMA_BK
    a_bytes = row_tiles * config.bm * k_pad // 2 * elt + row_tiles * config.bm * k_pad // 8  # values + metadata
    x_bytes = problem.n * problem.k * elt
    y_bytes = problem.n * problem.m * elt
    # V:N:M gathers from x^T (a copy of a linear x); 2:4's TMA reads x (a copy of spmm's X.T)
    copy_bytes = 2 * x_bytes if (vnm is not None) == (problem.layout == "linear") else 0
    # DRAM reads under the grouped tile order: the CTAs running at once (one per SM) cover
    # group_m row blocks x (SMs / group_m) token strips; A is read again for each such set of
    # strips and x for each group, unless both fit in L2 together
    a_reads = x_reads = 1.0
    group_rows = config.group_m * config.cluster_m  # row blocks of a group (group_m counts clusters)
    if a_bytes + x_bytes > L2_REUSE_BYTES:
        a_reads = max(1.0, strips * group_rows / spec_of(problem.device).sms)
        x_reads = max(1.0, row_tiles / group_rows)
    return KernelFeatures(
        programs=tiles,
        tiles=tiles,
        mma_flops=2.0 * tiles * config.bm * config.bn * k_pad * DENSE_PEAK / WGMMA_SP_PEAK,
        fma_flops=0.0,
        dram_bytes=a_bytes * a_reads + x_bytes * x_reads + y_bytes + copy_bytes,
        l2_bytes=strips * a_bytes + boxes * row_tiles * strips * config.bn * k_pad * elt / config.cluster_m + y_bytes
        + copy_bytes,
        steps_max=stages_k,
        steps_mean=float(stages_k),
        smem_bytes=_wgmma_smem_bytes(config, boxes),
        num_warps=config.num_warps,
        num_stages=config.stages,
        regs_per_thread=168,
        cluster=config.cluster_m,
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
    """(values, metadata, Mt, Kt): the one packing both variants read, built once per weight (and
    values version). Per (16-row tile, 32-wide K step), a unit of 512 bytes of kept values (16 x 16)
    as 8 x 8 core matrices, K-major without swizzle: (8-row half, K core matrix, row, 8 values),
    which wgmma.sp reads from shared memory as it lands and mma.sp's ldmatrix turns into its A
    fragment; and 16 words of metadata in mma.sp's register order (those of lanes 4g, 4g + 1:
    selector 0 reads no other). Units go (tile, K step): a decode warp streams its rows' K in one
    run; the wgmma producer takes a (BM rows, 2 K steps) stage with one 3-D TMA box (`a_maps`).
    Rows pad to 16 and K to 128 (an even number of wgmma stages) with zero values and valid
    metadata. V:N:M: the 2:4 matrix over the kept columns (4 per M-column block). One layout for
    both variants: a weight run at decode and prefill holds its packing once (LOG, session 29)."""
    if isinstance(A, (PackedNM, PackedVNM)):  # the format's own values, in this order already: the metadata beside them
        mt, kt = A.tiles, A.k_steps
        # (construction refuses misaligned values; a trusted rebuild over a view could still hand one)
        values = A.values if A.values.data_ptr() % 16 == 0 else A.values.clone()
        meta = memo(A, _META_KEY, lambda: _metadata(A, A._matrix_cols()), of_values=False)
        return values.view(mt, kt, 2, 2, 8, 8), meta, mt, kt
    if isinstance(A, VNM):
        return memo(A, _PACKED_KEY, lambda: _pack(A, A.col_blocks * 4))
    if (A.n, A.m) != (2, 4):
        raise ValueError(f"spmm_nm runs 2:4 and V:N:M weights, got {A.n}:{A.m}")
    return memo(A, _PACKED_KEY, lambda: _pack(A, A.shape[1]))


def packed_as_24(A: VNM) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """`packed` of a V:N:M weight's 2:4 copy (`VNM.as_2to4`, made for the packing and not kept)."""
    if not isinstance(A, VNM):
        raise ValueError(f"as_24 runs a V:N:M weight as 2:4; this one is {A.signature}")
    return memo(A, _AS_24_KEY, lambda: packed(A.as_2to4()))


_PACKED_KEY, _AS_24_KEY, _META_KEY = "_nm_packed", "_nm_as24_packed", "_nm_packed_meta"


def column_offsets(A: VNM) -> torch.Tensor:
    """The mma variant's column map: A's own kept-column offsets (uint8, (row blocks, col blocks,
    4), each inside its M-column block); the kernel adds the block's first column. Contiguous and
    at an even address (GATHER 4 reads two offsets at once), else a copy."""
    if A.cols.is_contiguous() and A.cols.data_ptr() % 2 == 0:
        return A.cols
    return memo(A, "_nm_column_offsets", lambda: A.cols.clone(memory_format=torch.contiguous_format),
                of_values=False)


def column_map(A: VNM) -> torch.Tensor:
    """int32 (row blocks, Kt * 32): the column of x behind each column of the packed 2:4 matrix
    of a V:N:M weight (Kt as `packed`'s); -1 past the matrix (padding reads zero). Depends on the
    pattern only."""
    return memo(A, "_nm_column_map", lambda: _column_map(A), of_values=False)


def _column_map(A: VNM) -> torch.Tensor:
    kt = tile_steps(A.col_blocks * 4)
    base = torch.arange(A.col_blocks, device=A.cols.device).view(1, -1, 1) * A.m
    cols = (base + A.cols.long()).reshape(A.row_blocks, -1)
    cols = torch.where(cols < A.shape[1], cols, -1)
    return torch.nn.functional.pad(cols, (0, kt * 32 - cols.shape[1]), value=-1).to(torch.int32).contiguous()


def _pack(A, cols: int):
    """A canonical NM / VNM weight's packing: its values in tile order (as PackedNM / PackedVNM
    store them) and its metadata words."""
    mt, kt = math.ceil(A.values.shape[0] / 16), tile_steps(cols)
    return tile_order(A.values, mt, kt).view(mt, kt, 2, 2, 8, 8), _metadata(A, cols), mt, kt


def _metadata(A, cols: int) -> torch.Tensor:
    """`packed`'s metadata words of A (its pattern alone), K padded to `tile_steps(cols)` steps."""
    from .cuda.sparse_mma import metadata_words

    idx, _, _ = _padded_positions(A, cols)
    return metadata_words(idx)[..., _META_LANES].contiguous()


def _padded_positions(A, cols: int) -> tuple[torch.Tensor, int, int]:
    """(A's positions padded to whole tiles and `tile_steps(cols)` K steps with (0, 1) pairs, tiles, K steps)."""
    idx = A.positions.to(torch.int64)
    rows, kept = idx.shape
    mt, kt = math.ceil(rows / 16), tile_steps(cols)
    pad_r, pad_k = mt * 16 - rows, kt * 16 - kept
    fill = torch.tensor([0, 1], device=idx.device).repeat(max(pad_k, 0) // 2)  # positions (0, 1)
    idx = torch.cat([idx, fill.expand(rows, -1)], dim=1)
    idx = torch.cat([idx, torch.tensor([0, 1], device=idx.device).repeat(kt * 8).expand(pad_r, -1)], dim=0)
    return idx, mt, kt


def a_maps(values: torch.Tensor, meta: torch.Tensor, bm: int) -> tuple[bytes, bytes]:
    """The wgmma producer's TMA descriptors of `packed`'s values and metadata: 3-D, (unit, tile,
    K step) at strides (Kt units, 1 unit), boxes of (a unit, bm / 16 tiles, 2 K steps), so that a
    stage lands as (K step, tile), each (K step, 64-row block) a 2 KB block of core matrices as
    wgmma.sp reads it; tiles past the weight read zeros (their rows are never stored)."""
    mt, kt = values.shape[:2]
    return (cuda.tensor_map_3d(values.view(mt, kt, 256), (256, bm // 16, 2)),
            cuda.tensor_map_3d(meta, (16, bm // 16, 2)))


def wgmma_column_map(A: VNM, bm: int) -> tuple[torch.Tensor, int]:
    """(`column_map` padded with -1 to the row blocks the wgmma variant's BM-row tiles cover (its
    x gather reads zeros there), the stages before the first -1 of any block: the kernel's copies
    skip the check there)."""
    def build():
        cols = column_map(A)
        blocks = max(cols.shape[0], math.ceil(A.shape[0] / bm) * bm // A.v)
        cols = torch.nn.functional.pad(cols, (0, 0, 0, blocks - cols.shape[0]), value=-1).contiguous()
        gaps = torch.nonzero((cols < 0).any(0))
        full = int(gaps[0, 0]) // WGMMA_BK if len(gaps) else cols.shape[1] // WGMMA_BK
        return cols, full
    return memo(A, f"_nm_wgmma_map_{bm}", build, of_values=False)


def release_unused(A, configs) -> None:
    """The tuner's measurements pack the weight for every variant they time (V:N:M's maps and its
    as_24 packing beside the one packing): only what a chosen config reads stays, or a sparse
    weight would hold more than its dense size."""
    keep = set()
    for c in configs:
        if not isinstance(c, Config):
            continue
        if c.as_24:
            keep.add(_AS_24_KEY)
            continue
        keep |= {_PACKED_KEY, _META_KEY}
        if isinstance(A, VNM):  # the gathers' column maps
            keep |= {"_nm_column_offsets"} if c.variant != "wgmma" else \
                {k for k in A.__dict__ if k.startswith("_nm_wgmma_map_")}
    for key in [k for k in A.__dict__ if k.startswith("_nm_") and k not in keep]:
        del A.__dict__[key]


def keeps_copy(config: Config) -> bool:
    """as_24 runs on a 2:4 copy of a V:N:M weight, twice its kept values (not under lean)."""
    return config.as_24


@functools.lru_cache(maxsize=None)
def _as_plain_24(config: Config) -> Config:
    """An as_24 config as the 2:4 one it runs (cached: a launch asks on every call)."""
    return dataclasses.replace(config, as_24=False)


_kernels: dict[tuple, object] = {}  # (config, dtype, device index) -> loaded kernel


def _kernel(config: Config, dtype: torch.dtype, device: torch.device, gather: int = 0, act: int = 0,
            res: bool = False):
    key = (config, dtype, device.index, gather, act, res)
    kernel = _kernels.get(key)
    if kernel is None:  # (checked once per device, not on every call)
        if config.variant == "mma" and config.cluster_m > 1 and torch.cuda.get_device_capability(device) != (9, 0):
            raise ValueError(f"an mma cluster needs sm_90 (the space offers it there only), got {config}")
        kernel = _kernels[key] = cuda.load(_instance(config, dtype, gather, act, res), device)
    return kernel


def instances(problem: Problem, config: Config) -> list:
    """The kernel a launch of `config` loads for `problem` (compiled ahead by the tuner)."""
    vnm = None if config.as_24 else _vnm(problem.fmt)
    gather = 0 if vnm is None else wgmma_boxes(config, vnm[0]) if config.variant == "wgmma" \
        else mma_gather(config, problem.n)
    return [_instance(config, getattr(torch, problem.dtype), gather, ACTIVATION_CODES[problem.epilogue.activation],
                      problem.epilogue.residual)]


def _instance(config: Config, dtype: torch.dtype, gather: int = 0, act: int = 0, res: bool = False):
    """gather: 0 for 2:4; V:N:M: `mma_gather(config, n)` (mma), or the boxes of x per stage (wgmma).
    act: the activation's code, compiled into the instance (its epilogue, unrolled over every
    accumulator, then inlines one activation). res: a wgmma instance for calls with a residual
    (the copy engine loads it; the mma variant reads any residual the same way)."""
    if config.variant == "wgmma":
        cluster = {"CLUSTER_M": config.cluster_m} if config.cluster_m > 1 else {}
        residual = {"SPARTUNE_RES": 1} if res else {}
        return cuda.instance("spmm_nm_wgmma.cu", "spmm_nm_wgmma", {
            "SPARTUNE_BF16": int(dtype == torch.bfloat16), "BM": config.bm, "BN": config.bn,
            "STAGES": config.stages, "GATHER": gather, "SPARTUNE_ACT": act, **cluster, **residual},
            arch_specific=True)
    cluster = {"CLUSTER_M": config.cluster_m} if config.cluster_m > 1 else {}
    return cuda.instance("spmm_nm.cu", "spmm_nm", {
        "SPARTUNE_BF16": int(dtype == torch.bfloat16), "BM": config.bm, "BN": config.bn,
        "WARPS": config.num_warps, "WARPS_K": config.warps_k, "KSTEPS": config.ksteps, "GATHER": int(gather),
        "SPARTUNE_ACT": act,
        "PIPE": config.stages if config.stages >= 3 else 0, **cluster}, arch_specific=config.cluster_m > 1)


def launch(A, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None, residual=None,
           scale=1.0):
    """out = act(scale * x @ A^T + bias) + residual, x (N, K) and out (N, M) of any strides.
    The wgmma variant's split tails use one workspace per device (as the split-K families do):
    launches running at once on two streams of a device must not both split."""
    run = bind(A, x, out, config, bias=bias, activation=activation, residual=residual, scale=scale)
    return run(x, out, bias, residual)


def bind(A, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None, residual=None,
         scale=1.0):
    """launch's checks and set-up done once: run(x, out, bias, residual) launches on tensors laid
    out as these (shapes, strides, dtypes, 16-byte alignment; the same epilogue), giving only
    their addresses (dispatch keeps one per layout: a call's host time is then the launch's)."""
    check_operands(A, x, out, bias, residual)
    if x.shape[0] == 0 or A.shape[0] == 0:
        return _nothing
    epilogue = (or_null(bias), or_null(residual), *epilogue_args(out, bias, residual, activation, scale))
    if config.as_24:
        if config.variant != "wgmma":
            raise ValueError(f"as_24 runs a V:N:M weight on the wgmma variant, got {config}")
        return _bind_wgmma(A, x, out, _as_plain_24(config), epilogue, as_24=True)
    if config.variant == "wgmma":
        return _bind_wgmma(A, x, out, config, epilogue)
    return _bind_mma(A, x, out, config, epilogue)


def _nothing(x, out, bias, residual):
    return out


def _bind_mma(A, x, out, config: Config, epilogue: tuple):
    values, meta, mt, kt = packed(A)
    M, K = A.shape
    N = x.shape[0]
    vnm = isinstance(A, VNM)
    if vnm and A.v % config.bm:
        raise ValueError(f"a V:N:M tile must stay in one block of {A.v} rows, got bm={config.bm}")
    if config.cluster_m > 1 and (vnm or config.stages < 3 or config.cluster_m not in (2, 4, 8)):
        raise ValueError(f"an mma cluster of 2, 4 or 8 row blocks shares 2:4's x chunks on the cp.async ring "
                         f"(stages >= 3), got {config}")
    x_vec = int(not vnm and x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0)
    if config.stages >= 3 and not (x_vec or vnm):  # the ring copies x in 16-byte vectors: the register path
        config = dataclasses.replace(config, stages=2, cluster_m=1)
    if config.cluster_m > 1 and K % 8:  # (its bulk copies move whole 16-byte units of x's rows)
        config = dataclasses.replace(config, cluster_m=1)
    if config.cluster_m > 1 and config.ksteps * config.warps_k % 4:
        # (K steps pad to fours: a chunk of another size could then lie wholly past K, where a
        # cluster's copies would expect no bytes)
        raise ValueError(f"an mma cluster walks K in chunks of a multiple of 4 K steps, got {config}")
    row_blocks = -(-mt * 16 // (config.bm * config.cluster_m)) * config.cluster_m  # whole clusters
    if row_blocks > MAX_GRID_Y:
        raise ValueError(f"{config}: {row_blocks} row blocks of {config.bm}, past the grid's {MAX_GRID_Y}: a larger bm")
    if config.x_whole and not (vnm and config.stages >= 3):
        raise ValueError(f"x_whole runs V:N:M on the cp.async ring (stages >= 3), got {config}")
    gather = mma_gather(config, N) if vnm else 0
    kernel = _kernel(config, values.dtype, x.device, gather, epilogue[-2])  # (the activation's code)
    cols, map_rows, map_pitch, m_block = (column_offsets(A), A.v, A.col_blocks * 4, A.m) if vnm else (NULL, 1, 0, 1)
    if vnm:
        K = kt * 32  # the kept columns, read through the map
    sxn, sxk = x.stride(0), x.stride(1)
    kx = x.shape[1]
    in_place = False
    if gather == 2:  # rows of x^T (made by each call): its row pitch, and the tokens readable per row in sxn
        in_place, sxk, sxn = _tokens_major_pitch(x)
    if gather >= 3:  # x's rows staged by 16-byte copies where they are aligned
        x_vec = int(sxk == 1 and (sxn % 8 == 0 or N == 1) and x.data_ptr() % 16 == 0)
    p_bias, p_res, *rest = epilogue
    grid = (-(-N // config.bn), row_blocks, 1)
    prepared = kernel.prepare(grid, (32 * config.num_warps, 1, 1), values, meta, NULL, out, p_bias, p_res, cols,
                              map_rows, map_pitch, m_block, M, K, N, mt, kt, sxn, sxk, x_vec, kx, *rest,
                              shmem=_mma_smem_bytes(config, vnm, N, kx) if config.stages >= 3 else 0,
                              slots=(2, 3, 4, 5))

    def run(x, out, bias, residual):
        prepared(_tokens_major(x, in_place) if gather == 2 else x, out, bias, residual)
        return out
    return run


_NO_TENSOR_MAP = bytes(128)  # V:N:M's launches gather x by hand


def _bind_wgmma(A, x, out, config: Config, epilogue: tuple, as_24: bool = False):
    """as_24: A (V:N:M) runs as the 2:4 matrix it also is, from its as_24 packing."""
    vnm = isinstance(A, VNM) and not as_24
    boxes = wgmma_boxes(config, A.v) if vnm else 0
    if vnm and not boxes:
        raise ValueError(f"a V:N:M wgmma tile covers one block of {A.v} rows or two halves, got bm={config.bm}")
    M, N = A.shape[0], x.shape[0]
    if vnm and A.shape[1] * (-(-N // 8) * 8) >= 2**31:
        raise ValueError(f"x^T of {A.shape[1]} rows x {N} tokens: the wgmma gather's 32-bit offsets overflow")
    values, meta, _, kt = packed_as_24(A) if as_24 else packed(A)
    stages_k = kt // 2
    a_map, e_map = a_maps(values, meta, config.bm)
    box_rows = config.bn // config.cluster_m  # each CTA's share of a box of x
    # x's address goes in per call (its copy, where one is made, too): NULL / no descriptor here
    if vnm:
        in_place, ldx, n_alloc = _tokens_major_pitch(x)
        (cols, full_stages), v_rows = wgmma_column_map(A, config.bm), A.v
        x_copied = False
    else:
        # TMA reads rows of K contiguous halves at a 16-byte pitch (spmm's X.T): else a copy
        x_copied = bool(x.stride(1) != 1 or (N > 1 and x.stride(0) % 8) or x.data_ptr() % 16)
        ldx, n_alloc, cols, v_rows, full_stages = 0, 0, NULL, 1, 0
    kernel = _kernel(config, values.dtype, x.device, boxes, epilogue[-2], epilogue[1] is not NULL)  # (act, residual)
    # (a V:N:M weight's rows pad to V, which may pass them; a cluster's row blocks come whole)
    row_blocks = math.ceil(M / (config.bm * config.cluster_m)) * config.cluster_m
    p_bias, p_res, *rest = epilogue
    tiles = row_blocks * math.ceil(N / config.bn)
    ws = counters = NULL
    if vnm:  # one CTA a tile
        grid = tiles
    else:  # persistent CTAs, a cluster per SM pair (or SM): whole tiles, then the last round's in halves of K
        sms = _sm_count(x.device)
        grid = sms // config.cluster_m * config.cluster_m
        # a split tail's halves keep their partial sums in ws (the kernel decides whether to split):
        # sized for any tile and taken when bound, before any CUDA graph is captured (a capture
        # must not allocate)
        ws = scratch(_WORKSPACE, x.device, torch.float32, sms * 128 * 256)
        counters = arrival_counters(x.device, sms)
    # a 16-bit out in rows of tokens along M (and a residual so, if any): its tiles stored by the
    # tensor copy engine, the residual's loaded by it
    son, som, srn, srm, out_code, _, res_code, _, _ = rest
    tma_out = int(_copy_engine_rows(out, out_code, son, som, M, N) and
                  (p_res is NULL or _copy_engine_rows(p_res, res_code, srn, srm, M, N)))
    tma_res = int(tma_out and p_res is not NULL)
    args = (_NO_TENSOR_MAP, _NO_TENSOR_MAP, _NO_TENSOR_MAP, tma_out, tma_res, a_map, e_map, NULL, cols, ldx, n_alloc,
            v_rows, full_stages, out, p_bias, p_res, M, N, stages_k, row_blocks, config.group_m, ws, counters, *rest)
    # per call: x's descriptor (2:4) or x^T (V:N:M), out's and the residual's descriptors, out, bias, residual
    prepared = kernel.prepare((grid, 1, 1), (WGMMA_THREADS, 1, 1), *args, shmem=_wgmma_smem_bytes(config, boxes),
                              slots=(0, 7, 1, 2, 13, 14, 15), reads=(values, meta))
    epi_tokens = _epi_tokens(config)

    def run(x, out, bias, residual):
        out_map = cuda.tensor_map_2d(out, 64, epi_tokens) if tma_out else _NO_TENSOR_MAP
        res_map = cuda.tensor_map_2d(residual, 64, epi_tokens) if tma_res else _NO_TENSOR_MAP
        if vnm:
            prepared(_NO_TENSOR_MAP, _tokens_major(x, in_place), out_map, res_map, out, bias, residual)
        else:
            x_map = cuda.tensor_map_2d(x.contiguous() if x_copied else x, WGMMA_BK, box_rows)
            prepared(x_map, None, out_map, res_map, out, bias, residual)
        return out
    return run


def _copy_engine_rows(t: torch.Tensor, code: int, s_tokens: int, s_m: int, M: int, N: int) -> bool:
    """Whether the wgmma epilogue's boxes (64 rows of M x tokens) map onto t by TMA: 16-bit,
    contiguous along M, rows of tokens 16-byte aligned and apart (one row each: a residual
    broadcast over tokens takes the threads' path)."""
    return code in (0, 1) and s_m == 1 and s_tokens % 8 == 0 and (s_tokens >= M or N == 1) and t.data_ptr() % 16 == 0


_WORKSPACE: dict = {}  # (device, dtype) -> the split tail's partial sums


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tokens_major(x: torch.Tensor, in_place: bool) -> torch.Tensor:
    """x (N, K) as x^T (K, tokens) with rows of whole 16-byte chunks: in place, or the copy
    (`_tokens_major_pitch` says which, once per layout)."""
    return x.t() if in_place else tokens_major(x, 8)


def _tokens_major_pitch(x: torch.Tensor) -> tuple[bool, int, int]:
    """(whether x^T is read in place, its row pitch, the tokens readable per row) for
    `_tokens_major(x)`: spmm's x = X.T is read in place (where the kernel's 32-bit offsets reach
    its last row); otherwise one copy, N rounded up to 8 (the tokens past N are zeros)."""
    N, K = x.shape
    if x.stride(0) == 1 and N % 8 == 0 and (K == 1 or x.stride(1) % 8 == 0) and x.data_ptr() % 16 == 0 \
            and K * x.stride(1) < 2**31:
        return True, x.stride(1) if K > 1 else N, N
    return False, -(-N // 8) * 8, -(-N // 8) * 8
