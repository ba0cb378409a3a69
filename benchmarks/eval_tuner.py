"""Evaluation of the autotuner (issue 5, "Evaluation" and "Must show"), on the GPU.

    python benchmarks/eval_tuner.py [--quick] [--problems N] [--budget-s S] [--out DIR] [--suite nm]

Needs the package importable (`pip install -e .`, or PYTHONPATH=$PWD as scripts/gpu.sh sets).

1. Calibrates the device (tune.device.calibrate), then (a) times the tuning of one new problem in
   fast mode end to end through spartune.linear (compiles included, fresh Triton cache, fresh
   in-memory tuner) and (b) the host overhead of a DB hit: spartune.linear on a tuned weight vs
   the chosen kernel's launch called directly, and the first call on a new weight object whose
   problem is in a TuningDB.
2. A suite of `linear` problems (fp16; block:64x64, block:32x32, shfl:64 with x in the spmm
   layout x = X.T, csr; six shapes, densities 0.5 .. 0.05, N from 1 to 4096) with uniform
   random masks made on the GPU (`--suite nm`: 2:4 and V:N:M, 4 patterns x 3 Llama shapes x
   N = 1, 16, 2048, magnitude-pruned random weights: issue 14's family). For each: every candidate that dispatch would build (our
   family's whole space with its cost-model features, plus the dense library backend) is
   measured once (exhaustive) with spartune.tune.measure.time_callable and short timings, next
   to its predicted time from the calibrated DeviceSpec. Kernels are compiled ahead by a pool
   of processes (their specialisations are collected by a dry run with Triton's jit cache
   hook), so the main process mostly loads them from Triton's cache. Problems are added until
   the time budget runs out.
3. tuner.evaluate() on those records: model and fast modes (picked / exhaustive best, median
   and p90, within 5% / 15%), best in the model's top k, per-problem Spearman rho, fraction of
   the space that fast mode measures; fast pick vs dense per problem (and re-measured).

Writes DIR/eval_tuner.json (summary, per problem) and DIR/eval_tuner_records.json (every
measurement with its features), DIR = --out, else $OUT, else ./out. The table is printed last.
`--dry-run` runs the pipeline on the CPU with fake timings (checks the script, not the tuner).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FORMATS = ("block:64x64", "block:32x32", "shfl:64", "csr")
SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008), (3072, 768), (768, 3072), (1024, 1024))
DENSITIES = (0.5, 0.2, 0.1, 0.05)
NS = (1, 16, 128, 2048, 4096)
SLOW_FACTOR, SLOW_S = 3.0, 30e-6  # a candidate this much slower than the best so far gets one quick timing
SHORT_S, SHORT_REP_MS = 20e-6, 2  # one warm call under SHORT_S: time_callable with a short rep (graph replay)
# --suite nm (issue 14): the sparse-tensor-core family on the Llama shapes, decode and prefill
NM_PATTERNS = ("2:4", "64:2:8", "128:2:8", "64:2:16")
NM_SHAPES = ((11008, 4096), (4096, 11008), (13824, 5120))
NM_NS = (1, 16, 2048)
MUST = {"fast_within_5": 0.90, "fast_fraction_measured": 0.10, "model_within_15": 0.75, "dense_slowdown": 1.03,
        "overhead_us": 15.0}


@dataclass(frozen=True)
class Spec:
    fmt: str
    m: int
    k: int
    density: float
    n: int

    @property
    def spmm_layout(self) -> bool:
        """Shfl-BW is benchmarked as spmm would call it: x = X.T of a (K, N) X, out = Y.T."""
        return self.fmt.startswith("shfl")

    @property
    def name(self) -> str:
        return f"{self.fmt} {self.m}x{self.k} d={self.density:g} n={self.n}" + (" (X.T)" if self.spmm_layout else "")


def build_suite(kind: str = "mixed") -> list[Spec]:
    """mixed: 64 problems: 3 (shape, density) pairs per (format, N), one more per format at N = 16;
    shapes and densities cycle through a shuffled list so each appears about equally often.
    nm: 36 problems, every N:M / V:N:M pattern at every Llama shape and N (density: the kept
    fraction). Ordered so that any prefix is itself a spread over formats and N."""
    if kind == "nm":
        from spartune.prune.patterns import parse_pattern

        pairs = [(n, p) for n in NM_NS for p in NM_PATTERNS]
        return [Spec(p, *NM_SHAPES[(i + r) % len(NM_SHAPES)], parse_pattern(p).fixed_density, n)
                for r in range(len(NM_SHAPES)) for i, (n, p) in enumerate(pairs)]
    combos = [(s, d) for s in SHAPES for d in DENSITIES]
    random.Random(0).shuffle(combos)
    pairs = [(f, n) for n in NS for f in FORMATS]
    suite, i = [], 0
    for _ in range(3):
        for f, n in pairs:
            (m, k), d = combos[i % len(combos)]
            suite.append(Spec(f, m, k, d, n))
            i += 1
    for f in FORMATS:
        (m, k), d = combos[i % len(combos)]
        suite.append(Spec(f, m, k, d, 16))
        i += 1
    return suite


# --- problems on the device ---------------------------------------------------------------------
def make_format(fmt: str, m: int, k: int, density: float, gen, device, dtype):
    """A uniform random pattern of `fmt` at `density` (of blocks, Shfl-BW columns or entries),
    built as a masked dense weight on the device then converted (no pruning pass); N:M and V:N:M,
    whose density the pattern fixes, by magnitude pruning of random values."""
    import torch

    import spartune as st

    def values():
        return torch.randn(m, k, generator=gen, device=device, dtype=dtype)

    zero = torch.zeros((), dtype=dtype, device=device)
    if fmt.startswith("block:"):
        bm, bk = (int(v) for v in fmt.split(":")[1].split("x"))
        keep = torch.rand(-(-m // bm), -(-k // bk), generator=gen, device=device) < density
        mask = keep.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]
        return st.BlockSparse.from_dense(torch.where(mask, values(), zero), (bm, bk))
    if fmt.startswith("shfl:"):
        v = int(fmt.split(":")[1])
        keep = torch.rand(-(-m // v), k, generator=gen, device=device) < density  # per group of V slots
        slots = torch.where(keep.repeat_interleave(v, 0)[:m], values(), zero)
        perm = torch.randperm(m, generator=gen, device=device)
        w = torch.empty_like(slots)
        w[perm] = slots  # slot r of group g is row perm[g * V + r]
        return st.ShuffledBlock.from_dense(w, v, perm=perm.to(torch.int32))
    if fmt == "csr":
        mask = torch.rand(m, k, generator=gen, device=device) < density
        return st.CSR.from_dense(torch.where(mask, values(), zero))
    from spartune.prune import sparsify_weight
    from spartune.prune.patterns import parse_pattern

    if parse_pattern(fmt).fixed_density is not None:  # N:M or V:N:M: magnitude-pruned random values
        return sparsify_weight(values(), fmt)
    raise ValueError(f"unknown format {fmt!r}")


@dataclass
class Built:
    spec: Spec
    A: object
    x: object
    out: object
    problem: object
    cands: list
    preds: list
    feats: list  # KernelFeatures as dicts (None for library backends)
    errors: dict  # candidate index -> error while building (features)
    futures: list = dataclasses.field(default_factory=list)


def build_problem(spec: Spec, seed: int, device, device_name: str, tuner, dtype=None) -> Built:
    """The weight, x and out of one problem and its candidates, as dispatch builds them (our
    kernel families from the registry; of the library backends, cuBLAS dense)."""
    import torch

    from spartune import dispatch
    from spartune.tune.problem import Epilogue, Problem

    dtype = dtype or torch.float16
    gen = torch.Generator(device=device).manual_seed(seed)
    A = make_format(spec.fmt, spec.m, spec.k, spec.density, gen, device, dtype)
    if spec.spmm_layout:
        x = torch.randn(spec.k, spec.n, generator=gen, device=device, dtype=dtype).T
        out = torch.empty(spec.m, spec.n, device=device, dtype=dtype).T
    else:
        x = torch.randn(spec.n, spec.k, generator=gen, device=device, dtype=dtype)
        out = torch.empty(spec.n, spec.m, device=device, dtype=dtype)
    dname = str(dtype).removeprefix("torch.")
    layout = "spmm" if spec.spmm_layout else "linear"
    problem = Problem("linear", A.signature, spec.m, spec.k, spec.n, dname, A.stats(), Epilogue(), device_name, layout)
    ours, library = dispatch.linear_runs(A, x, out)
    cands = dispatch.candidates(problem, ours, {"dense": library["dense"]}, device=tuner.device)
    feats = [dataclasses.asdict(c.features) if c.features is not None else None for c in cands]
    preds, errors = [], {}
    for c in cands:
        try:
            preds.append(float(tuner.predicted(c, dname)))
        except Exception as e:
            preds.append(math.inf)
            errors[len(preds) - 1] = f"predict: {type(e).__name__}: {e}"
    return Built(spec, A, x, out, problem, cands, preds, feats, errors)


# --- compiling ahead in a process pool -------------------------------------------------------------
def _worker_init():
    """Import once per worker (the pool is started early, while the main process calibrates)."""
    import torch  # noqa: F401
    import triton  # noqa: F401

    from spartune.kernels import registry

    for family in registry.FAMILIES:
        family.module  # noqa: B018  (imports it)


def _worker_compile(module: str, name: str, spec: str) -> float:
    """Compile one kernel specialisation into Triton's cache (shared with the main process)."""
    import importlib

    t = time.perf_counter()
    getattr(importlib.import_module(module), name).preload(spec)
    return time.perf_counter() - t


class Precompiler:
    """Collects the kernel specialisations a set of launches would compile (dry run: Triton's
    jit_cache_hook skips the compile and the launch) and compiles them in worker processes. CUDA
    candidates compile through their `prepare` (NVRTC, in threads: it runs without the GIL): their
    launches are not Triton's, so a dry run would compile them inline in the main process (248 s of
    a 273 s run on the H200, session 37)."""

    def __init__(self, jobs: int):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)
        self.threads = cf.ThreadPoolExecutor(min(jobs, 8), thread_name_prefix="eval-nvrtc")
        self.seen: dict[tuple, object] = {}
        self.stats = {"jobs": jobs, "submitted": 0, "compiled": 0, "failed": 0, "compile_s": 0.0, "errors": [],
                      "collect_s": 0.0, "wait_s": 0.0, "cuda_prepares": 0}
        for _ in range(jobs):  # start the workers (imports) now
            self.pool.submit(time.sleep, 0)

    def collect(self, cands) -> list:
        """Futures of the compiles that the candidates need."""
        from triton import knobs

        t0 = time.perf_counter()
        found = []
        futures = [self.threads.submit(c.prepare) for c in cands if c.prepare is not None]
        self.stats["cuda_prepares"] += len(futures)
        runs = [c.run for c in cands if c.prepare is None]

        def hook(*, fn, compile, **_):
            jf = fn.jit_function
            found.append((jf.fn.__module__, jf.fn.__qualname__, compile["specialization_data"]))
            return True  # skip compiling and launching

        saved = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = hook
        try:
            for run in runs:
                try:
                    run()
                except Exception:
                    pass  # it fails again, and is recorded, when measured
        finally:
            knobs.runtime.jit_cache_hook = saved
        for item in found:
            fut = self.seen.get(item)
            if fut is None and not self.stats.get("broken"):
                try:
                    fut = self.pool.submit(_worker_compile, *item)
                except Exception as e:  # a broken pool: the main process compiles from now on
                    self.stats["broken"] = f"{type(e).__name__}: {e}"
                    break
                self.seen[item] = fut
                fut.add_done_callback(self._done)
                self.stats["submitted"] += 1
            if fut is not None:
                futures.append(fut)
        self.stats["collect_s"] += time.perf_counter() - t0
        return futures

    def _done(self, fut):
        try:
            self.stats["compile_s"] += fut.result()
            self.stats["compiled"] += 1
        except Exception as e:
            self.stats["failed"] += 1
            if len(self.stats["errors"]) < 5:
                self.stats["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")

    def wait(self, futures, timeout: float):
        import concurrent.futures as cf

        t0 = time.perf_counter()
        if futures:
            cf.wait(futures, timeout=timeout)
        self.stats["wait_s"] += time.perf_counter() - t0

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.threads.shutdown(wait=False, cancel_futures=True)


# --- timing ---------------------------------------------------------------------------------------------
def time_candidate(run, best: float, warmup_ms: int, rep_ms: int) -> dict:
    """One candidate: a first call (compile or cache load), a quick estimate, then
    measure.time_callable unless the candidate is clearly out of the race."""
    import torch

    from spartune.tune.measure import time_callable

    row = {"seconds": None, "how": None, "error": None, "first_call_s": None}
    try:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)  # keep the GPU busy (~1 ms) while the host enqueues: GPU time only
        start.record()
        run()
        end.record()
        end.synchronize()
        quick = start.elapsed_time(end) * 1e-3  # one warm call, host launch cost hidden by the sleep
        if quick > SLOW_S and quick > SLOW_FACTOR * best:
            row.update(seconds=quick, how="quick")
        elif quick < SHORT_S:
            # short: time_callable re-times it by CUDA-graph replay with the L2 evicted before each
            # call (measure.cold_replay: rounds of ~1 ms), so a short rep is still many calls
            row.update(seconds=float(time_callable(run, warmup_ms=1, rep_ms=SHORT_REP_MS)), how="graph")
        else:
            row.update(seconds=float(time_callable(run, warmup_ms=warmup_ms, rep_ms=rep_ms)), how="bench")
        if not (row["seconds"] > 0 and math.isfinite(row["seconds"])):
            row.update(seconds=None, error=f"bad time {row['seconds']!r}")
    except Exception as e:  # compile error, launch failure: recorded, as the tuner does
        row.update(seconds=None, error=f"{type(e).__name__}: {str(e)[:300]}")
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    return row


def fake_timer(pred: float, rng: random.Random) -> dict:
    """--dry-run: the prediction with log-normal noise."""
    t = pred * math.exp(rng.gauss(0, 0.3)) if math.isfinite(pred) else 1e-3 * (1 + rng.random())
    return {"seconds": t, "how": "fake", "error": None, "first_call_s": 0.0}


def _json_float(v):
    return v if v is None or math.isfinite(v) else None


def config_dict(cfg):
    return None if cfg is None else dataclasses.asdict(cfg)


def measure_problem(b: Built, pid: str, args, dry: bool, rng: random.Random) -> tuple[list, dict]:
    """Every candidate once: dense first, then ours in predicted order (so the best so far is
    small early and hopeless candidates are cut short)."""
    from spartune.tune.tuner import evaluate

    t0 = time.perf_counter()
    order = [len(b.cands) - 1] + sorted(range(len(b.cands) - 1), key=lambda i: b.preds[i])
    rows = [None] * len(b.cands)
    best = math.inf
    for i in order:
        c = b.cands[i]
        r = fake_timer(b.preds[i], rng) if dry else time_candidate(c.run, best, args.warmup_ms, args.rep_ms)
        if r["error"] is None and i in b.errors:
            r["note"] = b.errors[i]
        if r["seconds"] is not None:
            best = min(best, r["seconds"])
        rows[i] = {"problem": pid, "backend": c.backend, "config": config_dict(c.config), "predicted": b.preds[i],
                   **r, "features": b.feats[i]}
    one = evaluate(rows, top_k=args.top_k, library_backends=("dense",)) if best < math.inf else None
    info = summarize_problem(b, pid, rows, args.top_k)
    info["eval"] = one
    info["measure_s"] = time.perf_counter() - t0
    info["first_calls_s"] = sum(r["first_call_s"] or 0.0 for r in rows)  # compiles / cache loads in this process
    info["timed"] = {h: sum(r["how"] == h for r in rows) for h in ("bench", "graph", "quick", "fake")}
    return rows, info


def _order(rows):
    return sorted(range(len(rows)), key=lambda i: math.inf if rows[i]["predicted"] is None else rows[i]["predicted"])


def picks(rows, top_k: int) -> dict:
    """Indices picked by each mode, as evaluate() defines them."""
    from spartune.tune.tuner import fast_measured

    order = _order(rows)
    ok = [i for i in range(len(rows)) if rows[i]["seconds"] is not None]
    if not ok:
        return {}
    best = min(ok, key=lambda i: rows[i]["seconds"])
    model = next(i for i in order if rows[i]["seconds"] is not None)
    preds = [math.inf if r["predicted"] is None else r["predicted"] for r in rows]
    fast_set = fast_measured(preds, order, top_k, library=lambda i: rows[i]["backend"] == "dense")  # the Tuner's rule
    fast_ok = [i for i in fast_set if rows[i]["seconds"] is not None]
    fast = min(fast_ok, key=lambda i: rows[i]["seconds"]) if fast_ok else None
    dense = next((i for i in range(len(rows)) if rows[i]["backend"] == "dense"), None)
    rank = order.index(best)
    return {"best": best, "model": model, "fast": fast, "dense": dense, "best_model_rank": rank, "fast_set": fast_set}


def summarize_problem(b: Built, pid: str, rows, top_k: int) -> dict:
    p = picks(rows, top_k)
    s = b.problem.stats
    info = {"id": pid, "name": b.spec.name, "spec": dataclasses.asdict(b.spec), "fmt": b.problem.fmt,
            "stats": dataclasses.asdict(s), "candidates": len(rows),
            "failed": sum(r["seconds"] is None for r in rows), "quick_timed": sum(r["how"] == "quick" for r in rows)}
    if not p:
        return info

    def desc(i):
        if i is None:
            return None
        r = rows[i]
        return {"backend": r["backend"], "config": r["config"], "seconds": r["seconds"], "predicted": _json_float(r["predicted"])}

    best_t = rows[p["best"]]["seconds"]
    dense_t = rows[p["dense"]]["seconds"] if p["dense"] is not None else None
    fast_t = rows[p["fast"]]["seconds"] if p["fast"] is not None else None
    info.update(best=desc(p["best"]), model=desc(p["model"]), fast=desc(p["fast"]), dense_seconds=dense_t,
                model_ratio=rows[p["model"]]["seconds"] / best_t, fast_ratio=(fast_t / best_t) if fast_t else None,
                fast_vs_dense=(fast_t / dense_t) if fast_t and dense_t else None,
                speedup_vs_dense=(dense_t / best_t) if dense_t else None, best_model_rank=p["best_model_rank"])
    return info


def confirm_vs_dense(b: Built, rows, info, args) -> None:
    """Re-time the fast pick and dense, alternating, twice each: the dispatch-vs-dense check on
    fresh measurements (the exhaustive ones are single and noisy)."""
    from spartune.tune.measure import time_callable

    p = picks(rows, args.top_k)
    if not p or p["fast"] is None or p["dense"] is None or rows[p["dense"]]["seconds"] is None:
        return
    if p["fast"] == p["dense"]:
        info["confirm"] = {"pick_s": None, "dense_s": None, "ratio": 1.0}
        return
    pick_run, dense_run = b.cands[p["fast"]].run, b.cands[p["dense"]].run
    try:
        tp, td = [], []
        for _ in range(2):
            tp.append(time_callable(pick_run, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms))
            td.append(time_callable(dense_run, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms))
        info["confirm"] = {"pick_s": min(tp), "dense_s": min(td), "ratio": min(tp) / min(td)}
    except Exception as e:
        info["confirm"] = {"error": f"{type(e).__name__}: {e}"}


# --- (a) tuning one new problem, (b) host overhead of a hit ---------------------------------------
def _fresh_tuner(spec_device, db=None, mode="fast"):
    """A new Tuner installed as the process's (ops.set_mode forgets every choice first)."""
    from spartune import dispatch
    from spartune.tune.measure import measure_candidate
    from spartune.tune.tuner import Tuner

    dispatch.set_mode(mode)
    calls = []

    def measurer(c, bound):
        calls.append(c.backend)
        return measure_candidate(c, bound, brief=mode == "fast")

    tuner = Tuner(db, spec_device, measurer=measurer, mode=mode)
    dispatch._tuner = tuner
    return tuner, calls


def tune_one_new_problem(spec: Spec, spec_device, device) -> dict:
    """Wall time of the first spartune.linear call on a problem never seen in this process
    (fast mode, fresh in-memory tuner): candidates, model ranking, compiles, measurements, the
    reference check of the winner."""
    import torch

    import spartune as st

    gen = torch.Generator(device=device).manual_seed(12345)
    A = make_format(spec.fmt, spec.m, spec.k, spec.density, gen, device, torch.float16)
    x = torch.randn(spec.n, spec.k, generator=gen, device=device, dtype=torch.float16)
    A.stats()  # format statistics belong to building the weight, not to tuning
    tuner, calls = _fresh_tuner(spec_device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    st.linear(x, A)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    st.linear(x, A)
    torch.cuda.synchronize()
    again = time.perf_counter() - t1
    choice = next(iter(tuner._memo.values()))
    return {"problem": spec.name, "wall_s": wall, "second_call_s": again, "measured": len(calls),
            "measured_backends": sorted(set(calls)), "chosen": choice.backend, "config": config_dict(choice.config),
            "chosen_seconds": choice.measured}


def host_overhead(spec: Spec, spec_device, device, tmp: Path, calls: int = 1000, rounds: int = 5) -> dict:
    """µs per call of spartune.linear on a tuned weight above calling the chosen kernel's launch
    directly (host time of `calls` back-to-back calls; the GPU time per call is reported to show
    that the GPU is not the bottleneck). Also: the first call on a new weight object whose
    problem is already in a TuningDB (a hit in a new process)."""
    import statistics

    import torch

    import spartune as st
    from spartune import dispatch
    from spartune.tune.db import TuningDB

    gen = torch.Generator(device=device).manual_seed(777)
    A = make_format(spec.fmt, spec.m, spec.k, spec.density, gen, device, torch.float16)
    x = torch.randn(spec.n, spec.k, generator=gen, device=device, dtype=torch.float16)
    db = TuningDB(tmp / "overhead.sqlite3")
    tuner, _ = _fresh_tuner(spec_device, db=db)
    st.linear(x, A)  # tune (fast) and store
    choice = next(iter(tuner._memo.values()))
    out = torch.empty(spec.n, spec.m, device=device, dtype=torch.float16)
    # the chosen backend's launch bound once, as dispatch keeps it (an unbound CUDA launch would
    # bind on every call: ~100 us of host time that is neither the kernel's nor the dispatch's)
    launch = dispatch.launcher(A, choice.backend, choice.config)
    raw = lambda: launch(A, x, out, None, None, None, 1.0)  # noqa: E731
    op = lambda: st.linear(x, A)  # noqa: E731

    def host(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / calls

    def gpu(fn):  # the kernel's own time (graph replay when short), to show the loops are host-bound
        from spartune.tune.measure import time_callable

        return time_callable(fn, warmup_ms=2, rep_ms=5)

    for fn in (op, raw):
        host(fn)  # warm
    t_op, t_raw = [], []
    for _ in range(rounds):
        t_op.append(host(op))
        t_raw.append(host(raw))
    diffs = [a - b for a, b in zip(t_op, t_raw)]
    # a DB hit on a new weight (new process: empty per-weight cache and tuner memo)
    A2 = A.with_values(A.values.clone())
    _fresh_tuner(spec_device, db=TuningDB(tmp / "overhead.sqlite3"))
    torch.cuda.synchronize()
    t = time.perf_counter()
    st.linear(x, A2)
    torch.cuda.synchronize()
    first_hit = time.perf_counter() - t
    db.close()
    return {"problem": spec.name, "chosen": choice.backend, "config": config_dict(choice.config), "calls": calls,
            "linear_us": statistics.median(t_op) * 1e6, "raw_launch_us": statistics.median(t_raw) * 1e6,
            "overhead_us": statistics.median(diffs) * 1e6, "overhead_us_rounds": [d * 1e6 for d in diffs],
            "gpu_us_per_call": gpu(raw) * 1e6, "db_hit_first_call_ms": first_hit * 1e3}


# --- the run -----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="16 problems, shorter timings (a smoke run)")
    p.add_argument("--problems", type=int, default=None, help="the first N problems of the suite (default all 64)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of the whole run (default 190; quick 90)")
    p.add_argument("--out", default=None, help="output folder (default $OUT or ./out)")
    p.add_argument("--warmup-ms", type=int, default=None, help="time_callable warm-up (default 2)")
    p.add_argument("--rep-ms", type=int, default=None, help="time_callable repetitions (default 5; quick 4)")
    p.add_argument("--top-k", type=int, default=None, help="fast mode's k (default: the Tuner's)")
    p.add_argument("--jobs", type=int, default=None, help="compile processes (default CPUs - 2; 0: compile inline)")
    p.add_argument("--lookahead", type=int, default=6, help="problems built and compiling ahead of the one measured")
    p.add_argument("--skip-extras", action="store_true", help="skip (a) tuning wall time and (b) host overhead")
    p.add_argument("--dry-run", action="store_true", help="CPU, fake timings: checks the script's plumbing")
    p.add_argument("--suite", choices=("mixed", "nm"), default="mixed",
                   help="mixed: block, Shfl-BW, CSR (64 problems); nm: 2:4 and V:N:M on the Llama shapes (36)")
    args = p.parse_args(argv)
    args.budget_s = args.budget_s or (90.0 if args.quick else 190.0)
    args.warmup_ms = args.warmup_ms or 2
    args.rep_ms = args.rep_ms or (4 if args.quick else 5)
    if args.problems is None:
        args.problems = 16 if args.quick else (8 if args.dry_run else 64)
    if args.jobs is None:
        args.jobs = 0 if args.dry_run else max(0, min(14, (os.cpu_count() or 2) - 2))
    return args


def main(argv=None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    out_dir = Path(args.out or os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="spartune-eval-"))
    # a cold Triton cache (the tuning wall time includes compiles) shared with the compile
    # workers, and no tuning DB in the user's cache directory
    cache_fresh = "TRITON_CACHE_DIR" not in os.environ
    os.environ.setdefault("TRITON_CACHE_DIR", str(tmp / "triton"))
    os.environ.setdefault("SPARTUNE_CACHE_DIR", str(tmp / "spartune"))

    pre, pre_error = None, None
    if args.jobs > 0:
        try:
            pre = Precompiler(args.jobs)  # the workers import while we calibrate
        except Exception as e:  # compile inline instead
            pre_error = f"{type(e).__name__}: {e}"

    import torch

    import spartune
    from spartune.tune.device import DeviceSpec, calibrate, device_name
    from spartune.tune.tuner import Tuner, evaluate

    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("eval_tuner: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if dry else "cuda")
    if args.top_k is None:
        import inspect

        args.top_k = inspect.signature(Tuner.__init__).parameters["top_k"].default
    result = {"args": vars(args), "versions": {"torch": torch.__version__, "spartune": spartune.__version__},
              "timeline": {}, "triton_cache_fresh": cache_fresh, "precompile_error": pre_error}
    try:
        import triton

        result["versions"]["triton"] = triton.__version__
    except ImportError:
        pass

    t = time.perf_counter()
    if dry:
        spec_device = DeviceSpec.h100()
    else:
        try:
            spec_device = calibrate(0)
        except Exception as e:  # keep going on the stored H100 numbers, and say so
            result["calibrate_error"] = f"{type(e).__name__}: {e}"
            spec_device = DeviceSpec.h100()
    dname = "cpu-dry-run" if dry else device_name(0)
    from spartune.tune.measure import REPLAY_EVICTS_L2

    result.update(device=dname, device_spec=json.loads(spec_device.to_json()), replay_evicts_l2=REPLAY_EVICTS_L2)
    result["timeline"]["calibrate_s"] = time.perf_counter() - t

    if not dry and not args.skip_extras:
        t = time.perf_counter()
        result["tune_new"] = []
        for s in (Spec("block:64x64", 2048, 5632, 0.2, 64),):  # a shape and N bucket the suite does not hold
            try:
                result["tune_new"].append(tune_one_new_problem(s, spec_device, device))
            except Exception as e:
                result["tune_new"].append({"problem": s.name, "error": f"{type(e).__name__}: {e}"})
        result["timeline"]["tune_new_s"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            result["overhead"] = host_overhead(Spec("block:64x64", 1024, 1024, 0.1, 16), spec_device, device, tmp)
        except Exception as e:
            result["overhead"] = {"error": f"{type(e).__name__}: {e}"}
        result["timeline"]["overhead_s"] = time.perf_counter() - t

    # --- the suite --------------------------------------------------------------------------------
    from spartune import ops

    ops.set_mode("fast")  # forget the choices of (a) and (b)
    suite = build_suite(args.suite)[: args.problems]
    tuner = Tuner(None, spec_device, mode="exhaustive")  # predictions only
    rng = random.Random(0)
    deadline = start + args.budget_s - 5.0  # leave time to evaluate and write
    built: dict[int, Built] = {}
    next_build = 0
    records, problems = [], []
    per_candidate = 0.04  # seconds, updated as problems are measured
    t_suite = time.perf_counter()
    stopped = None
    for i, spec in enumerate(suite):
        while next_build < min(len(suite), i + 1 + (args.lookahead if pre else 0)):
            try:
                b = build_problem(suite[next_build], next_build, device, dname, tuner)
                if pre is not None:
                    try:
                        b.futures = pre.collect([c for c in b.cands if not c.library])
                    except Exception as e:  # no precompiling for this one: it compiles when measured
                        pre.stats["collect_error"] = f"{type(e).__name__}: {e}"
                built[next_build] = b
            except Exception as e:
                problems.append({"id": f"p{next_build:02d}", "name": suite[next_build].name,
                                 "error": f"build: {type(e).__name__}: {e}"})
            next_build += 1
        b = built.pop(i, None)
        if b is None:
            continue
        if time.perf_counter() + per_candidate * len(b.cands) > deadline:
            stopped = f"budget: stopped before problem {i} ({spec.name})"
            break
        if pre is not None:
            pre.wait(b.futures, timeout=max(1.0, deadline - time.perf_counter()))
        pid = f"p{i:02d}"
        try:
            rows, info = measure_problem(b, pid, args, dry, rng)
            if not dry:
                confirm_vs_dense(b, rows, info, args)
        except Exception as e:  # unexpected: keep the other problems
            problems.append({"id": pid, "name": spec.name, "error": f"measure: {type(e).__name__}: {e}"})
            continue
        records.extend(rows)
        problems.append(info)
        done_candidates = sum(p.get("candidates", 0) for p in problems if "measure_s" in p)
        per_candidate = (time.perf_counter() - t_suite) / max(1, done_candidates)
        print(f"[{time.perf_counter() - start:6.1f}s] {pid} {b.spec.name}: {info['candidates']} candidates, "
              f"{info['measure_s']:.1f}s, fast {info.get('fast_ratio') or float('nan'):.3f} "
              f"model {info.get('model_ratio') or float('nan'):.3f} vs-dense {info.get('speedup_vs_dense') or 0:.2f}x",
              flush=True)
        del b
    built.clear()
    if pre is not None:
        result["precompile"] = pre.stats
        pre.close()
    result["timeline"]["suite_s"] = time.perf_counter() - t_suite

    # --- evaluation ------------------------------------------------------------------------------------
    measured = [p for p in problems if "measure_s" in p]
    result.update(suite_size=len(suite), problems_done=len(measured), stopped=stopped,
                  candidates=len(records), failures=sum(r["seconds"] is None for r in records))
    ev = None
    if any(r["seconds"] is not None for r in records):
        ev = evaluate(records, top_k=args.top_k, library_backends=("dense",))
        ev["best_in_top"] = {k: evaluate(records, top_k=k, library_backends=("dense",))["best_in_top_k"]
                             for k in (1, 2, 4, 6, 8, 12)}
        ev["fast_fraction_measured_by_k"] = {
            k: evaluate(records, top_k=k, library_backends=("dense",))["fast"]["fraction_measured"] for k in (2, 4, 6, 8)}
        vs = [p["fast_vs_dense"] for p in measured if p.get("fast_vs_dense") is not None]
        conf = [p["confirm"]["ratio"] for p in measured if p.get("confirm", {}).get("ratio") is not None]
        ev["dispatch_vs_dense"] = {"max": max(vs) if vs else None, "confirm_max": max(conf) if conf else None,
                                   "confirm_over_3pct": sum(r > MUST["dense_slowdown"] for r in conf),
                                   "confirmed": len(conf)}
        sp = [p["speedup_vs_dense"] for p in measured if p.get("speedup_vs_dense")]
        ev["best_speedup_vs_dense"] = {"median": sorted(sp)[len(sp) // 2] if sp else None,
                                       "sparse_wins": sum(p["best"]["backend"] != "dense" for p in measured if p.get("best"))}
        by = {}
        for p in measured:
            if p.get("fast_ratio") is None:
                continue
            g = by.setdefault(p["fmt"], {"n": 0, "fast_within_5": 0, "model_within_15": 0})
            g["n"] += 1
            g["fast_within_5"] += p["fast_ratio"] <= 1.05
            g["model_within_15"] += p["model_ratio"] <= 1.15
        ev["by_format"] = by
    result["evaluation"] = ev
    result["must_show"] = must_show(result)
    result["problems"] = problems
    result["timeline"]["total_s"] = time.perf_counter() - start
    for r in records:
        r["predicted"] = _json_float(r["predicted"])
    (out_dir / "eval_tuner_records.json").write_text(json.dumps(records, separators=(",", ":")))
    (out_dir / "eval_tuner.json").write_text(json.dumps(result, indent=1, default=str))
    print_summary(result, out_dir)
    return 0


def must_show(result) -> dict:
    ev = result.get("evaluation")
    checks = {}
    if ev:
        checks["fast within 5% on >= 90%"] = (ev["fast"]["within_5"], ev["fast"]["within_5"] >= MUST["fast_within_5"])
        fm = ev["fast"]["fraction_measured"]
        checks["fast measures <= 10% of the space"] = (fm, fm <= MUST["fast_fraction_measured"])
        checks["model within 15% on >= 75%"] = (ev["model"]["within_15"], ev["model"]["within_15"] >= MUST["model_within_15"])
        d = ev["dispatch_vs_dense"]
        worst = max(v for v in (d["max"], d["confirm_max"], 0.0) if v is not None)
        checks["never > 3% slower than dense"] = (worst, worst <= MUST["dense_slowdown"])
    o = result.get("overhead") or {}
    if "overhead_us" in o:
        checks["DB-hit overhead < 15 us"] = (o["overhead_us"], o["overhead_us"] < MUST["overhead_us"])
    return {k: {"value": v, "pass": ok} for k, (v, ok) in checks.items()}


def print_summary(result, out_dir) -> None:
    ev = result.get("evaluation")
    lines = ["", f"== tuner evaluation on {result['device']} ({out_dir / 'eval_tuner.json'}) =="]
    lines.append(f"problems: {result['problems_done']}/{result['suite_size']} measured"
                 + (f" ({result['stopped']})" if result.get("stopped") else "")
                 + f"; candidates {result['candidates']}, failed {result['failures']}; "
                 f"total {result['timeline'].get('total_s', 0):.0f}s (suite {result['timeline'].get('suite_s', 0):.0f}s)")
    if ev:
        k = ev["top_k"]
        lines.append(f"{'mode':<6} {'median':>7} {'p90':>7} {'<=5%':>6} {'<=15%':>6} {'measured':>9}")
        for mode in ("model", "fast"):
            s = ev[mode]
            frac = f"{s['fraction_measured']:.3f}" if "fraction_measured" in s else "0"
            lines.append(f"{mode:<6} {s['ratio_median']:7.3f} {s['ratio_p90']:7.3f} {s['within_5']:6.2f} {s['within_15']:6.2f} {frac:>9}")
        tops = " ".join(f"k={kk}:{v:.2f}" for kk, v in ev["best_in_top"].items())
        lines.append(f"best in model top-{k}: {ev['best_in_top_k']:.2f}   ({tops})")
        sm = ev["spearman_median"]
        lines.append(f"spearman rho per problem: median {sm if sm is None else round(sm, 3)}, "
                     f"mean {ev['spearman_mean'] if ev['spearman_mean'] is None else round(ev['spearman_mean'], 3)}")
        d = ev["dispatch_vs_dense"]
        lines.append(f"fast pick / dense: max {d['max'] or float('nan'):.3f}; re-measured max "
                     f"{d['confirm_max'] or float('nan'):.3f} ({d['confirm_over_3pct']}/{d['confirmed']} over 1.03)")
        bs = ev["best_speedup_vs_dense"]
        lines.append(f"exhaustive best vs dense: median {bs['median'] or float('nan'):.2f}x; sparse best on "
                     f"{bs['sparse_wins']}/{result['problems_done']}")
        lines.append("by format (fast<=5% / model<=15%): " + ", ".join(
            f"{f} {g['fast_within_5']}/{g['n']} {g['model_within_15']}/{g['n']}" for f, g in ev["by_format"].items()))
    for tn in result.get("tune_new", []):
        if "error" in tn:
            lines.append(f"tune one new problem ({tn['problem']}): ERROR {tn['error'][:120]}")
        else:
            lines.append(f"tune one new problem, fast, compiles included ({tn['problem']}): {tn['wall_s']:.2f}s, "
                         f"{tn['measured']} measured, chose {tn['chosen']}")
    o = result.get("overhead")
    if o:
        if "error" in o:
            lines.append(f"DB-hit host overhead: ERROR {o['error'][:120]}")
        else:
            lines.append(f"DB-hit host overhead ({o['problem']}, {o['chosen']}): {o['overhead_us']:.1f} us/call above the "
                         f"raw launch (linear {o['linear_us']:.1f} us, launch {o['raw_launch_us']:.1f} us, GPU "
                         f"{o['gpu_us_per_call']:.1f} us); first call on a new weight, DB hit: {o['db_hit_first_call_ms']:.1f} ms")
    pc = result.get("precompile")
    if pc:
        lines.append(f"precompile: {pc['compiled']}/{pc['submitted']} kernels in {pc['jobs']} processes "
                     f"({pc['failed']} failed), main waited {pc['wait_s']:.1f}s")
    for name, c in result.get("must_show", {}).items():
        v = c["value"]
        lines.append(f"MUST {'PASS' if c['pass'] else 'FAIL'}  {name}: {v:.3f}" if isinstance(v, float) else f"MUST {name}: {v}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
