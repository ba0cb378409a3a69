"""The cost model: seconds for one (kernel, config) on one problem, from its KernelFeatures and
a DeviceSpec. Pure Python, so ranking a whole config space costs microseconds per config.

Its job is ranking (the measured best must be among the top few), not exact times. It models:
occupancy (programs per SM, from shared memory, warps and registers), wave quantisation over
the SMs, a pipelined main loop per program (num_stages - 1 loads in flight, so a memory
latency is paid once per tile and again per step when the loop is latency-bound; programs
sharing an SM hide each other's latency), throughput per step from the SM's share of the
tensor-core / CUDA-core / L2 rates, compulsory DRAM traffic as a budget of the whole launch
(with the write-back of the dirty lines it evicts; imperfectly overlapped with the loop), load
imbalance (the longest tile bounds a short launch), the split-K reduction and launch overhead.
It predicts what the measurer reports: a call that finds the L2 evicted, launched from a CUDA
graph when short (`predict`). REPLAY_WARM switches on the older measurer's replays, which
found a small working set still in L2 (the recorded runs 6 and 7 were timed that way). The dense backend (cuBLAS) has
its own roofline, `dense_gemm_seconds`.

The device's resources and rates come from tune/device.py (DeviceSpec). The few constants below were fitted on
the train half of an exhaustive H100 run (benchmarks/fit_model.py --grid,
benchmarks/data/h100-2026-11-22-run6), each explained where it is.
"""
from __future__ import annotations

import math

from .device import DeviceSpec, dtype_name
from .measure import GRAPH_BELOW_S, REPLAY_EVICTS_L2
from .problem import ELEMENT_BYTES, KernelFeatures

# Tile loads by cp.async / TMA (the kernels' main loops) stream through L2 about 1.5x faster than
# the plain loads calibrate() times: block-sparse SpMM moves ~8 TB/s of L2 traffic on the H100
# where calibrate() reports 5.4 (benchmarks/LOG.md; block:32x32 at 50% in benchmarks/data/).
# Kernels whose loads are plain (gathers) declare the difference in their l2_bytes.
L2_TILE_SPEEDUP = 1.5

# A main-loop step's dependent round trips (index, then tile): part of the kernel contract,
# defined in problem.py so kernels declaring longer chains need not import the model.
from .problem import INDEX_CHAIN  # noqa: E402

# Split-K partials meet in memory: an atomic add, an arrival counter, the last program's
# read-back: dependent round trips after the main loop.
SPLIT_FIXUP_TRIPS = 3

# Whether the measurer's graph replays find the previous call's operands in L2. The measurer
# evicts the L2 before each replayed call (measure.cold_replay); benchmarks/fit_model.py sets
# this to True to rescore runs 6 and 7, whose replays did not.
REPLAY_WARM = not REPLAY_EVICTS_L2

# A warm graph replay finds a launch's operands still in L2 (l2_hit_share): all of them
# when they take at most the first share of the L2, none beyond the second (set conflicts, the
# H100's two L2 halves). benchmarks/data/h100-2026-11-22-run6: cuBLAS GEMVs on 34 MB weights
# replay at 3.5 TB/s, above DRAM speed; 90 MB ones at 2.5.
L2_KEEP = (0.5, 0.85)

# The DRAM stream and the main loop overlap imperfectly (the first wave waits for its data, the
# last one drains alone): this share of the shorter of the two shows.
OVERLAP_LOSS = 0.5


# --- occupancy -------------------------------------------------------------------------------

def programs_per_sm(f: KernelFeatures, device: DeviceSpec) -> int:
    """Programs resident on one SM at once; 0 when one program does not fit at all."""
    if f.smem_bytes > device.smem_per_program or f.num_warps * 32 * f.regs_per_thread > device.regs_per_sm:
        return 0
    limits = [device.max_programs_per_sm, device.max_warps_per_sm // max(1, f.num_warps)]
    if f.smem_bytes > 0:
        limits.append(device.smem_per_sm // (f.smem_bytes + device.smem_reserved))
    if f.regs_per_thread > 0:
        limits.append(device.regs_per_sm // (f.num_warps * 32 * f.regs_per_thread))
    return max(0, min(limits))


# --- the model -------------------------------------------------------------------------------

def _loop_time(steps: float, work_s: float, resident: int, stages: int, latency: float) -> float:
    """One program's main loop: `steps` trips of `work_s` throughput each, `resident` programs
    sharing the SM's throughput, stages - 1 loads in flight. The first load's latency is never
    hidden; after the prologue a step takes the longer of the SM's work for all resident
    programs and latency / loads in flight (Little's law). Without pipelining a program waits
    for every load, but the other resident programs run meanwhile."""
    ahead = max(stages - 1, 0)
    shared = resident * work_s
    if ahead == 0:
        return steps * max(shared, latency + work_s)
    steady = max(shared, latency / ahead)
    return latency + min(steps, ahead) * shared + max(0.0, steps - ahead) * steady


def predict(features: KernelFeatures, device: DeviceSpec, dtype, *, graphed: bool = True) -> float:
    """Predicted seconds for one call (launch included); math.inf when the config cannot run.

    `graphed`: launches cost the in-graph latency, as the measurer replays short kernels in
    CUDA graphs and ops are meant to be captured.

    The time the measurer reports (measure.time_callable): operands from DRAM through an L2 full
    of dirty lines (its flush or eviction write), launched in a graph when short. With
    REPLAY_WARM (the recorded runs' measurer), a replay under GRAPH_BELOW_S found the operands
    in L2 when they fit (warm), and the smaller of the two is kept.
    """
    f = features
    cold = _predict(f, device, dtype, graphed, hit=None)
    hit = l2_hit_share(f.dram_bytes, device)
    if graphed and REPLAY_WARM and hit > 0:
        warm = _predict(f, device, dtype, graphed, hit=hit)
        if warm < GRAPH_BELOW_S:
            return min(cold, warm)
    return cold


def l2_hit_share(working_set: float, device: DeviceSpec) -> float:
    """Share of a working set that a graph replay finds left in L2 by the previous replay: all
    of it up to L2_KEEP[0] of the L2's size, none beyond L2_KEEP[1], linear in between."""
    lo, hi = L2_KEEP
    return min(1.0, max(0.0, (hi - working_set / device.l2_bytes) / (hi - lo)))


def _predict(f: KernelFeatures, device: DeviceSpec, dtype, graphed: bool, hit: float | None) -> float:
    """One launch, cold (hit None: after the measurer's flush) or warm (a share `hit` of the
    working set in L2)."""
    rate_mma = device.matrix_rate(dtype) / device.sms  # per SM; also checks dtype
    launch = f.launches * (device.graph_launch_s if graphed else device.launch_s)
    if f.tiles <= 0:
        return launch
    occupancy = programs_per_sm(f, device)
    if occupancy == 0 or f.programs <= 0:
        return math.inf
    rate_fma = device.fma / device.sms
    rate_l2 = L2_TILE_SPEEDUP * device.l2_bw / device.sms
    if hit is None:
        latency, dram = device.mem_latency_s, _dram_seconds(f.dram_bytes, device)
    else:  # replayed: the misses stream from DRAM through an L2 of clean lines (no write-backs)
        latency = device.l2_latency_s + (1.0 - hit) * (device.mem_latency_s - device.l2_latency_s)
        dram = (1.0 - hit) * f.dram_bytes / device.dram_bw
    # The main loop is bound per SM by its MMA, FMA and L2 traffic; a tile's work is spread
    # over its steps, and a tile costs at least one step (its output is written regardless).
    tile_s = max(f.mma_flops / rate_mma, f.fma_flops / rate_fma, f.l2_bytes / rate_l2) / f.tiles
    mean_steps = max(f.steps_mean, 1.0)

    work_s = tile_s / mean_steps
    chain = INDEX_CHAIN * latency

    def wave(n: int, steps: float) -> float:
        """Time of a wave of n concurrent programs each walking `steps` steps; programs on
        one SM share its throughput."""
        resident = math.ceil(n / min(device.sms, n))
        return _loop_time(steps, work_s, resident, f.num_stages, chain)

    def longest(n: int, steps: float, steps_long: float) -> float:
        """A wave of n programs of which one per SM walks `steps_long` steps, the others
        `steps`: its own latency chain, or the SM's throughput for all of them."""
        resident = math.ceil(n / min(device.sms, n))
        alone = _loop_time(steps_long, work_s, 1, f.num_stages, chain)
        return max(alone, chain + ((resident - 1) * steps + steps_long) * work_s)

    slots = min(f.programs, device.cluster_ctas(f.cluster, occupancy))  # programs running at once
    if slots <= 0:  # a cluster larger than the device holds
        return math.inf
    steps_max = max(f.steps_max, 1)
    if f.programs >= f.tiles:
        # a tile per program, scheduled in waves; the last wave may be partial
        full, rest = divmod(f.tiles, slots)
        body = full * wave(slots, mean_steps) + (wave(rest, mean_steps) if rest else 0.0)
        tail = longest(min(slots, f.tiles), mean_steps, steps_max)
    else:
        # persistent programs loop over tiles; their pipeline runs across tile boundaries
        per_slot = math.ceil(f.tiles / slots)
        body = wave(slots, per_slot * mean_steps)
        tail = longest(slots, per_slot * mean_steps, (per_slot - 1) * mean_steps + steps_max)
    # compulsory DRAM traffic is a budget of the whole launch (what each SM pulls through L2,
    # re-reads included, is already bounded in the loop)
    dram += latency
    loop = max(body, tail)
    reduce = f.reduce_bytes / device.dram_bw  # split-K partials, spread over the whole chip
    if f.split_k > 1:  # and the last program of a tile waits for the others' partials
        reduce += SPLIT_FIXUP_TRIPS * latency
    return launch + max(loop, dram) + OVERLAP_LOSS * min(loop, dram) + reduce


# Share of the bytes a cold call reads that first cost a write-back of a dirty line (the flush's
# or the eviction write's). 1.0 was fitted when only calls above GRAPH_BELOW_S ran cold; run 8
# (every call cold) suggests less: benchmarks/LOG.md, "tuner with cold replays".
WRITEBACK_SHARE = 1.0


def _dram_seconds(read_bytes: float, device: DeviceSpec) -> float:
    """Reading `read_bytes` from DRAM through an L2 full of dirty lines (dram_bw counts bytes
    read + written)."""
    return (read_bytes + WRITEBACK_SHARE * min(read_bytes, device.l2_bytes)) / device.dram_bw


# --- dense GEMM: a tiled kernel's features, and the cuBLAS backend on the same scale -----------

def gemm_features(m: int, k: int, n: int, dtype, *, bm: int = 128, bn: int = 128, bk: int | None = None,
                  stages: int = 4, warps: int = 8, split_k: int = 1) -> KernelFeatures:
    """Features of a well-tuned tiled dense GEMM (m, k) x (k, n): an approximation of cuBLAS.
    Each output tile reads its A rows and B columns through L2; split-K partials go through
    memory in fp32. bk defaults to 128 bytes of K (64 halves, 32 floats)."""
    elt = ELEMENT_BYTES[dtype_name(dtype)]
    bk = bk or 128 // elt
    out_tiles = math.ceil(m / bm) * math.ceil(n / bn)
    tiles = out_tiles * split_k
    steps = math.ceil(math.ceil(k / bk) / split_k)
    partial = m * n * 4
    return KernelFeatures(
        programs=tiles,
        tiles=tiles,
        mma_flops=2.0 * out_tiles * bm * bn * math.ceil(k / bk) * bk,
        fma_flops=0.0,
        dram_bytes=(m * k + k * n + m * n) * elt,
        l2_bytes=tiles * steps * (bm + bn) * bk * elt + m * n * elt,
        steps_max=steps,
        steps_mean=steps,
        smem_bytes=stages * (bm + bn) * bk * elt,
        num_warps=warps,
        num_stages=stages,
        split_k=split_k,
        reduce_bytes=2 * split_k * partial if split_k > 1 else 0.0,
    )


# cuBLAS as the model sees it: its main loop keeps DENSE_STAGES - 1 loads in flight, and its
# heuristics split K at most in two (run6: 768x3072 at N <= 128 takes 6.4 us, as an unsplit
# 48-step K loop would; splitting further would predict half that).
DENSE_STAGES = 4
DENSE_SPLITS = (1, 2)

# A copy into a transposed `out` (the spmm layout: out = Y.T) is a strided transpose: measured on
# the H100 at ~3.3 us per MB of output against ~0.7 us for a contiguous copy (benchmarks/data/).
TRANSPOSED_COPY_SLOWDOWN = 5.0


def dense_gemm_seconds(m: int, k: int, n: int, dtype, device: DeviceSpec, *, layout: str = "linear",
                       out_copy: bool | None = None, graphed: bool = True) -> float:
    """Predicted time of the dense backend (backends.dense_linear): cuBLAS's GEMM on the
    decompressed (m, k) weight, plus a copy of its (n, m) result into `out` when it cannot write
    there directly.

    The GEMM runs at the calibrated matrix rate (calibrate() times cuBLAS itself; its TMA-fed
    tiles are not L2-bound the way gemm_features' are), quantised in waves of output tiles over
    the SMs for the best of a few tilings and split-K factors, as its heuristics would choose;
    each wave walks K in a pipelined loop that is latency-bound when the tile is small (what
    makes long-K GEMVs slower than short-K ones). It is never faster than streaming its operands
    from DRAM (or, with REPLAY_WARM, from L2 where a warm replay left them: decode sizes).
    `layout` "spmm" (x = X.T, out = Y.T): `out` is transposed, so the backend copies (a
    transpose). `out_copy` overrides whether a copy happens (runs before fe55e6a always copied).
    `graphed` as in predict(): the measurer's graph replay (in-graph launches); False for plain
    do_bench timing (host launches)."""
    elt = ELEMENT_BYTES[dtype_name(dtype)]
    rate_sm = device.matrix_rate(dtype) / device.sms
    operands = (m * k + k * n + m * n) * elt

    bk = 128 // elt  # K per main-loop step

    def gemm(latency: float, stream: float) -> float:
        compute = math.inf
        for bm, bn in ((128, 256), (128, 128), (64, 128), (128, 64), (64, 64)):
            tiles = math.ceil(m / bm) * math.ceil(n / bn)
            for split_k in DENSE_SPLITS:
                waves = math.ceil(tiles * split_k / device.sms)
                steps = math.ceil(k / split_k / bk)
                # a pipelined K loop (DENSE_STAGES deep) per wave; split-K partials meet in a
                # second pass (one more launch and round trip)
                wave = _loop_time(steps, 2.0 * bm * bn * bk / rate_sm, 1, DENSE_STAGES, latency)
                fixup = launch + latency if split_k > 1 else 0.0
                compute = min(compute, waves * wave + fixup)
        return launch + latency + max(compute, stream)

    launch = device.graph_launch_s if graphed else device.launch_s
    seconds = gemm(device.mem_latency_s, _dram_seconds(operands, device))
    hit = l2_hit_share(operands, device)
    if graphed and REPLAY_WARM and hit > 0:  # operands (partly) left in L2 by a warm replay, as in predict()
        warm = gemm(device.l2_latency_s + (1.0 - hit) * (device.mem_latency_s - device.l2_latency_s),
                    operands * ((1.0 - hit) / device.dram_bw + hit / device.l2_bw))
        if warm < GRAPH_BELOW_S:
            seconds = min(seconds, warm)
    if out_copy if out_copy is not None else (layout == "spmm" and n > 1):  # (1, m) is both layouts
        slowdown = TRANSPOSED_COPY_SLOWDOWN if layout == "spmm" else 1.0
        seconds += launch + 2.0 * m * n * elt / device.dram_bw * slowdown
    return seconds
