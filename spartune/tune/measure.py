"""Timing on the GPU, as /work/.library/device/METHOD.md and DESIGN.md ask: a warm-up call
(compiles stay out), the median of triton.testing.do_bench, CUDA-graph replay for kernels
under ~20 us (where launch gaps would dominate), and rotation over several input sets where
repeated runs on one buffer would measure the cache. GPU only; importing it needs no GPU.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

GRAPH_BELOW_S = 150e-6  # below this a call is also timed by graph replay (host launch costs ~50 us)


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


def time_callable(fn: Callable[[], object], *, graph: bool | None = None, warmup_ms: int = 25,
                  rep_ms: int = 100) -> float:
    """Median seconds of one call of `fn` (launch included).

    graph=None decides by length: a call whose do_bench time is under GRAPH_BELOW_S is
    re-timed by CUDA graph replay (if it can be captured) and the smaller time kept. Short
    kernels launched from Python are host-bound under do_bench (tens of us of launch cost),
    so without this every implementation would measure its launcher, not its kernel.
    do_bench clears the L2 between calls; graph replay does not, so pass a `rotating` fn when
    inputs are small. Exceptions from fn (compile errors, launch failures) propagate: the
    tuner records them.
    """
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    fn()  # compile and load outside the timed region
    torch.cuda.synchronize()
    if graph is True:
        return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3
    t = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3
    if graph is None and t < GRAPH_BELOW_S:
        try:
            t = min(t, do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3)
        except Exception:  # not capturable (a host sync, a library that allocates): keep do_bench's time
            torch.cuda.synchronize()
    return t


def measure_candidate(candidate) -> float:
    """The tuner's default measurer: time the candidate's prepared `run`."""
    if candidate.run is None:
        raise ValueError(f"candidate {candidate.backend} has no run callable to measure")
    return time_callable(candidate.run)
