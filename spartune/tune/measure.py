"""Timing on the GPU, as /work/.library/device/METHOD.md and DESIGN.md ask: a warm-up call
(compiles stay out), the median of triton.testing.do_bench, CUDA-graph replay for short calls
(where launch gaps would dominate), and no cache left warm by the previous call: do_bench
flushes the L2 before each call, and the graph replay writes an L2-evicting buffer before each
call and subtracts that write's own time. A decode weight of a few MB (or a dense copy of 32 MB)
would otherwise be timed from L2, which a model's layers never find (each evicts the last).
GPU only; importing it needs no GPU.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

GRAPH_BELOW_S = 150e-6  # below this a call is also timed by graph replay (host launch costs ~50 us)
REPLAY_EVICTS_L2 = True  # graph replays start from an evicted L2, as do_bench's calls do
# How times are taken, part of every tuning-DB key: entries timed another way (the warm replays,
# then cold ones as two separate medians, chosen before the CSR ell path existed; v1 timed
# cuSPARSELt inside a capture, without the copy of x its own graph replay costs; v2 ranked long
# calls by separate timings, before the tuner's finalists were timed in turns; v3 timed a CUDA
# family's candidates with their launch bound again on every call, so host time could cut fast
# ones: LOG, session 36; v4 ranked our best against dense at a margin by the write-evicted
# timing, which flatters latency-bound kernels: LOG, session 43) are not reused.
MEASURER = "cold-replay-paired-v6" if REPLAY_EVICTS_L2 else "warm-replay"


def rotating(fn: Callable, arg_sets: Sequence[tuple]) -> Callable[[], object]:
    """A zero-argument callable that calls fn(*args) with the next set on every call.

    Under graph capture each captured call keeps its own set, so replays rotate too."""
    if not arg_sets:
        raise ValueError("arg_sets must hold at least one set of arguments")
    cycle = itertools.cycle(arg_sets)
    return lambda: fn(*next(cycle))


def sets_to_rotate(bytes_per_set: float, l2_bytes: int, most: int = 16) -> int:
    """How many input sets make the working set at least twice the L2, so that a call never
    finds its inputs left in the cache by the previous one."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(most, math.ceil(2 * l2_bytes / bytes_per_set)))


# The tuner's timing: shorter than a benchmark's (do_bench's median of ~50 calls at prefill,
# 15 paired replay rounds at decode), so that a new shape is tuned in well under a second once
# its kernels are compiled. Precise enough to rank: configs within a few percent are a draw.
TUNE_WARMUP_MS, TUNE_REP_MS = 5, 20
LAUNCH_SLACK_S = 100e-6  # a single call between two events also holds its host launch (Python: tens of us)


def time_callable(fn: Callable[[], object], *, graph: bool | None = None, warmup_ms: int = 25,
                  rep_ms: int = 100, cold: bool = REPLAY_EVICTS_L2, bound: float | None = None) -> float:
    """Median seconds of one call of `fn` (launch included), each call finding a cold L2.

    graph=None decides by length: a call whose do_bench time is under GRAPH_BELOW_S is
    re-timed by CUDA graph replay (if it can be captured) and the smaller time kept. Short
    kernels launched from Python are host-bound under do_bench (tens of us of launch cost),
    so without this every implementation would measure its launcher, not its kernel. Both
    timings evict the L2 before each call (do_bench by its flush, the replay by cold_replay).
    cold=False replays without the eviction (calibration: L2 reads, an empty launch).
    bound: a call that alone takes longer (the faster of two, after the first, which compiles) is
    not timed further: its time, a warm underestimate, is returned at once (the tuner's slow
    candidates).
    Exceptions from fn (compile errors, launch failures) propagate: the tuner records them.
    """
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    def replay():
        if cold:
            return cold_replay(fn, rep_ms)
        return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3

    fn()  # compile and load outside the timed region
    torch.cuda.synchronize()
    if bound is not None:  # the faster of two single calls (a graph's first replay uploads it)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        once = math.inf
        for _ in range(2):
            start.record()
            fn()
            end.record()
            end.synchronize()
            once = min(once, start.elapsed_time(end) * 1e-3)
        if once > bound + LAUNCH_SLACK_S:
            return once
    if graph is True:
        return replay()
    t = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3
    if graph is None and t < GRAPH_BELOW_S:
        try:
            t = min(t, replay())
        except Exception:  # not capturable (a host sync, a library that allocates): keep do_bench's time
            torch.cuda.synchronize()
    return t


_EVICT: dict = {}
_CAPTURE_STREAMS: dict = {}


def capture_stream():
    """One side stream per device for every graph capture and its warm-up. A new stream per
    capture leaked: cuBLAS takes a 32 MB workspace per (handle, stream) that torch keeps for the
    process, so each dense baseline timed in a graph left ~100 MB behind (benchmarks/LOG.md,
    session 27)."""
    import torch

    device = torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return stream


def capture(body: Callable[[], object], reps: int = 1, warmups: int = 1):
    """(a CUDA graph of `reps` calls of body, the last call's output), captured on the capture
    stream after `warmups` calls there (what a call allocates or builds lazily is made before)."""
    import torch

    graph, stream = torch.cuda.CUDAGraph(), capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            body()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                out = body()
    torch.cuda.synchronize()
    return graph, out


def _events():
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def replay_seconds(graph, calls: int, events) -> float:
    """Seconds per call of one replay of `graph` (holding `calls` calls), between two events."""
    start, end = events
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / calls


def _evict_buffer():
    """A buffer of twice the L2 (per device), whose write evicts every operand from L2."""
    import torch

    device = torch.cuda.current_device()
    evict = _EVICT.get(device)
    if evict is None:
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        evict = _EVICT[device] = torch.empty(max(2 * l2, 1 << 20) // 4, dtype=torch.int32, device="cuda")
    return evict


def interleaved(fns: dict[str, Callable[[], object]], rounds: int = 21, idle_cycles: int = 0) -> dict[str, float]:
    """Seconds per call of each of `fns` (medians), timed in turns, the order rotating each round,
    the L2 evicted before every call; and under "ratio:<name>" the median over rounds of the first
    fn's time over <name>'s. Why: a long GEMM runs the H100 at its 700 W cap, where the clock
    (1.0-1.3 GHz) follows the board's recent load, so two kernels timed apart differ by up to ~15%
    for that alone (benchmarks/LOG.md, sessions 16-17); in turns both meet the same states.
    idle_cycles > 0: the GPU idles that long (a sleeping kernel, outside the timed events) before
    each call's eviction write, so every call starts from about the same cool state, the most
    repeatable of the two. For calls of ~100 us and more: the events are read at the end, so the
    host keeps the GPU's queue ahead and its launch time stays out."""
    import statistics

    import torch

    if not fns or rounds < 1 or idle_cycles < 0:
        raise ValueError(f"interleaved needs callables, rounds >= 1 and idle_cycles >= 0; got {len(fns)} callables, "
                         f"rounds={rounds}, idle_cycles={idle_cycles}")
    evict = _evict_buffer()
    names = list(fns)
    for name in names:  # warm-up: compiles, lazy allocations, tuning
        fns[name]()
    marks = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if idle_cycles:
                torch.cuda._sleep(idle_cycles)
            evict.zero_()
            start.record()
            fns[name]()
            end.record()
            marks[name].append((start, end))
    torch.cuda.synchronize()
    times = {name: [s.elapsed_time(e) * 1e-3 for s, e in marks[name]] for name in names}
    out = {name: statistics.median(t) for name, t in times.items()}
    for name in names[1:]:
        out[f"ratio:{name}"] = statistics.median(a / b for a, b in zip(times[names[0]], times[name]))
    return out


def cold_replay(fn: Callable[[], object], rep_ms: float = 100) -> float:
    """Seconds per call of `fn` replayed in a CUDA graph after a write of twice the L2 (so no
    operand is left in L2 by the previous call), minus the replayed write alone. The two graphs
    are replayed in turns and the median of the paired differences is kept, so a drift of the
    ~35 us write between rounds cancels instead of landing on a short call. Rounds of ~1 ms
    (more rounds when rep_ms > 10). Raises when nothing is left.
    (Known, benchmarks/LOG.md: the write leaves dirty lines whose write-back the call's reads
    pay and the next write saves; do_bench's flush charges it the same way.)"""
    import torch

    evict = _evict_buffer()
    events = _events()
    timed = lambda graph, reps: replay_seconds(graph, reps, events)  # noqa: E731
    both = lambda: (evict.zero_(), fn())  # noqa: E731
    graphs = []  # reset at the end: their memory goes back at once, not when they are collected
    try:
        graphs.append(capture(both)[0])
        once = timed(graphs[0], 1)  # a first estimate sizes the rounds: ~1 ms each, so the
        reps = max(8, min(50, int(1e-3 / max(once, 1e-6))))  # write's jitter averages over the calls
        rounds = 7 if rep_ms <= 10 else 15
        graphs += [capture(both, reps)[0], capture(evict.zero_, reps)[0]]
        g_both, g_write = graphs[1:]
        timed(g_both, reps), timed(g_write, reps)  # first replays warm up, untimed

        def pair(i: int) -> float:  # the order alternates, so a linear drift cancels too
            if i % 2:
                write = timed(g_write, reps)
                return timed(g_both, reps) - write
            return timed(g_both, reps) - timed(g_write, reps)

        diffs = sorted(pair(i) for i in range(rounds))
    finally:
        torch.cuda.synchronize()
        for g in graphs:
            g.reset()
    t = diffs[len(diffs) // 2]
    if not t > 0:  # the write's own jitter exceeded the call: time_callable keeps do_bench's time
        raise RuntimeError(f"cold replay: no time left after subtracting the eviction write ({t:.3g} s)")
    return t


class RotationUnfit(RuntimeError):
    """rotated_replay would need more operand copies than allowed (a small weight) or more memory
    than is free: an expected limit, not a failure."""


def rotated_replay(call: Callable[[object], object], operand, nbytes: float, *, reps: int = 4,
                   rounds: int = 7, most: int | None = None) -> float:
    """Seconds per call(operand), timed on `operand` and distinct deep copies of it (together at
    least twice the L2) called in turn from one CUDA graph with nothing between them: each call
    finds its operand evicted by the others' reads, as a model's layers find theirs (METHOD.md's
    rotation of input sets). Beside cold_replay because its eviction write leaves dirty lines that
    clean reads never meet, which costs bandwidth-bound calls (cuBLAS at decode) ~15-20% and
    latency-bound ones little (benchmarks/LOG.md, sessions 34 and 43): benchmarks report both.
    nbytes: what one call reads of its operand. most: raise RotationUnfit (before copying) where
    more operands than that are needed, or where the copies and what each call builds of them (a
    layout, a dense copy: nbytes) would take over half the device's free memory (the tuner then
    keeps its first timings). Each operand's first call runs on the current stream, so what it builds goes
    back to that stream's memory pool, not the capture stream's."""
    import statistics

    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    count = max(2, math.ceil(2 * l2 / max(nbytes, 1)))  # no cap: fewer copies of a small weight would stay in L2
    if most is not None:
        extra = (count - 1) * (operand.nbytes + nbytes)
        if count > most or extra > torch.cuda.mem_get_info()[0] / 2:
            raise RotationUnfit(f"rotation needs {count} weights ({extra / 2**20:.0f} MiB of copies and their "
                                f"layouts): over {most} or half the free memory")
    graph = None
    try:  # whatever fails, nothing queued may still read a copy (or write the caller's output) after
        with torch.no_grad():  # (a trained weight's copies record no autograd history)
            operands = [operand] + [_fresh_copy(operand) for _ in range(count - 1)]
        fns = [lambda o=o: call(o) for o in operands]
        for fn in fns:  # layouts, dense copies, bindings
            fn()
        torch.cuda.synchronize()
        graph, _ = capture(lambda: [fn() for fn in fns], reps)
        events = _events()
        graph.replay()  # the first replay uploads the graph
        times = [replay_seconds(graph, reps * len(fns), events) for _ in range(rounds)]
    finally:
        torch.cuda.synchronize()
        if graph is not None:
            graph.reset()
    return statistics.median(times)


def _fresh_copy(operand):
    """A copy of a tensor or sparse format holding new memory and nothing else: a format's memos
    (its layouts, captured graphs) are not copied, and its first call builds its own."""
    from ..formats import SparseFormat

    if isinstance(operand, SparseFormat):
        return SparseFormat.from_spec(operand.spec, [t.clone() for t in operand.tensor_list()], trusted=True)
    return operand.clone()


def measure_candidate(candidate, bound: float | None = None, *, brief: bool = True) -> float:
    """The tuner's default measurer: time the candidate's prepared `run` (a single call when
    that already takes longer than `bound` seconds). brief: the tuner's short timing (fast mode);
    False times as time_callable does by default (exhaustive runs: the model's data)."""
    if candidate.run is None:
        raise ValueError(f"candidate {candidate.backend} has no run callable to measure")
    timing = dict(warmup_ms=TUNE_WARMUP_MS, rep_ms=TUNE_REP_MS) if brief else {}
    return time_callable(candidate.run, graph=candidate.graph, bound=bound, **timing)


def in_turns(candidates, *, brief: bool = True) -> list[float]:
    """Seconds per call of each candidate's prepared `run`, timed in turns (interleaved): how the
    tuner ranks the finalists of long calls."""
    fns = {i: c.run for i, c in enumerate(candidates)}
    if any(fn is None for fn in fns.values()):
        raise ValueError("a candidate has no run callable to measure")
    times = interleaved(fns, rounds=11 if brief else 21)
    return [times[i] for i in fns]
