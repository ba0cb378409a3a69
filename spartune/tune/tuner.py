"""pick(problem, candidates) -> Choice: the tuned (backend, config) for one problem.

In-memory hit → at once; DB hit → the stored config rebuilt by the caller (or found among the
candidates), cached; miss → rank every
candidate by the cost model, measure a few (mode "fast": the model's top k, k growing with the
size of the space (`fast_count`), plus every library backend; "exhaustive": all; "model": none), check the winner's output once (a failing or
crashing candidate is recorded and never picked; the next one is tried), store everything,
return. The tuner knows kernels only through Candidate: a backend name, a config dataclass,
the cost-model features (or a predicted time) and callables that run and check it.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .db import TuningDB, canonical
from .device import DeviceSpec, calibrate, device_name
from .measure import GRAPH_BELOW_S, RotationUnfit
from .model import predict
from .problem import KernelFeatures, Problem

MODES = ("model", "fast", "exhaustive")
_STRENGTH = {m: i for i, m in enumerate(MODES)}  # a stored choice serves modes up to its own

# Fast mode measures the model's best max(TOP_K, TOP_FRAC x candidates): large spaces hold many
# configs the model cannot tell apart (program order, TMA, stage counts at decode), so a fixed k
# covers them worse than small ones. Offline on the H100 exhaustive run (benchmarks/LOG.md,
# "tuner refit 2"): 6% of the space, at least 4, measures ~8% of all candidates.
TOP_K = 4
TOP_FRAC = 0.06
# A candidate slower than SLOWER x the best measured so far cannot win: one call past that bound
# ends its timing. A library whose floor (the time it cannot beat) is past the best measured is
# not run at all (cuSPARSE on a 2:4 weight at prefill: ~0.3 s a call).
SLOWER = 3.0
# Calls of GRAPH_BELOW_S and more: the fastest FINALISTS measured, within FINAL_MARGIN of the best,
# are timed again in turns (measure.interleaved) and ranked by that. Why: long GEMMs run the H100
# at its power cap, where the clock follows the board's recent load, so candidates timed one after
# the other differ by up to ~15% for that alone; one config that measured 3% faster alone ran 25%
# slower than another in turns (70B up, N = 8192; benchmarks/LOG.md, session 17).
FINALISTS, FINAL_MARGIN = 3, 1.15
# Short calls: where our best and dense measured within ROTATE_MARGIN of each other, the two are
# timed again on copies of the weight called in turn (measure.rotated_replay: how a model's layers
# find their weights) and ranked by that. Why: the measurer's eviction write leaves dirty lines
# whose write-back a bandwidth-bound call (cuBLAS at decode) pays and a latency-bound one hardly
# does, so it flatters our decode kernels against dense by up to ~25% (LOG, sessions 34 and 43: a
# CSR pick 21% faster by it ran 3% slower than dense on rotating copies, qkv 80% N = 16).
ROTATE_MARGIN = 1.3
# Fast mode: a candidate timed past RETIME_ABOVE x its prediction, where the prediction was within
# SLOWER of the best measured, is timed once more after the rest: a transient on the GPU once timed
# 2:4 decode candidates at 5x their prediction and 12x their real time, and dense was stored for
# good (13B up, N = 1; benchmarks/LOG.md, session 18). (Exhaustive data, which the model is fitted
# on, keeps every first timing.)
RETIME_ABOVE = 4.0
# A stored choice is doubted, and the problem tuned once more, when its tuning timed another
# candidate past RETIME_ABOVE x its prediction though the model had it DOUBT_MARGIN x faster than
# what was stored: a transient that outlasted the re-time would otherwise stay in the DB until the
# software changes. A problem is re-tuned so once: the second tuning's choice stands (where the DB
# cannot be written, once per process).
DOUBT_MARGIN = 1.5


def _far_past_prediction(seconds: float, predicted: float) -> bool:
    """A transient's mark on one timing (RETIME_ABOVE)."""
    return seconds > RETIME_ABOVE * predicted


def fast_count(n_candidates: int, top_k: int = TOP_K, top_frac: float = TOP_FRAC) -> int:
    """How many of the model's best candidates fast mode measures at least (library backends come
    on top, and up to TIES_EXTRA ties of the last: fast_selection)."""
    return max(top_k, math.floor(top_frac * n_candidates))


# Fast mode also measures up to TIES_EXTRA candidates predicted within TIE of the last of its
# count: the model cannot tell those apart (13B up 2:4 at N = 1: six configs within 1.3%, the
# exhaustive best, 1-2% faster than the rest and alone past 1.6x, fifth where four were measured;
# benchmarks/LOG.md, session 34). Offline on run 9's exhaustive records: within 2% of the best
# 0.859 -> 0.875 of the problems, measuring 7.5% -> 8.6% of the candidates.
TIE, TIES_EXTRA = 0.005, 2


def fast_selection(preds: list[float], order: list[int], top_k: int = TOP_K, top_frac: float = TOP_FRAC,
                   library=lambda i: False) -> list[int]:
    """The candidates (indices into preds, `order` their ranking by it) that fast mode measures
    besides the libraries: the model's best fast_count, and the next non-library ones (library(i)
    False; the libraries are measured anyway) tied with the last of them."""
    k = fast_count(len(order), top_k, top_frac)
    chosen = list(order[:k])
    if 0 < k < len(order) and math.isfinite(last := preds[order[k - 1]]):
        rest = [i for i in order[k:] if not library(i)][:TIES_EXTRA]
        chosen += [i for i in rest if preds[i] <= last * (1 + TIE)]
    return chosen


def fast_measured(preds: list[float], order: list[int], top_k: int = TOP_K, top_frac: float = TOP_FRAC,
                  library=lambda i: False) -> list[int]:
    """Everything fast mode measures: fast_selection's candidates, then every library (library(i)
    True) in the model's order. The Tuner, `evaluate` and the benchmarks' rescoring share it."""
    chosen = fast_selection(preds, order, top_k, top_frac, library)
    taken = set(chosen)
    return chosen + [i for i in order if library(i) and i not in taken]


@dataclass(frozen=True, eq=False)
class Candidate:
    """One (backend, config) that could run the problem.

    features: what the cost model reads; library backends without them (cuSPARSE, ...) give
    `predicted` seconds instead (dense can use model.dense_gemm_seconds). run: launches it on
    prepared inputs (what the measurer times). check: runs it on fresh inputs and returns
    whether the output matches the reference. library: a backend that is not ours (dense
    cuBLAS, cuSPARSE, cuSPARSELt): measured in fast mode, so spartune never loses to it, unless
    its `floor` (seconds no call of it can beat, e.g. its bytes at DRAM bandwidth; or a
    function of the best seconds measured so far per backend, e.g. a fraction of another
    library's) is already slower than a candidate measured.
    """

    backend: str
    config: Any = None  # a frozen dataclass, or None for a backend without parameters
    features: KernelFeatures | None = None
    predicted: float | None = None
    run: Callable[[], object] | None = None
    check: Callable[[], bool] | None = None
    library: bool = False
    # how the measurer times run: None lets it choose (graph replay for short calls); False as
    # called, for a backend that replays graphs of its own (a capture would time it without them)
    graph: bool | None = None
    floor: float | Callable[[dict], float | None] | None = None
    # work before timing that may run beside other candidates' (compiling its kernel): the tuner
    # runs those of the candidates it will measure at once, in threads
    prepare: Callable[[], object] | None = None
    # seconds per call timed on copies of the weight called in turn (see ROTATE_MARGIN), or None
    rotated: Callable[[], float] | None = None

    def __post_init__(self):
        if self.features is None and self.predicted is None:
            raise ValueError(f"candidate {self.backend}: give features (for the cost model) or predicted seconds")
        if self.config is not None and not (dataclasses.is_dataclass(self.config) and not isinstance(self.config, type)):
            raise TypeError(f"candidate {self.backend}: config must be a dataclass instance or None, got {type(self.config).__name__}")


@dataclass(frozen=True)
class Choice:
    backend: str
    config: Any
    predicted: float | None
    measured: float | None  # None when chosen by the model alone


def config_json(config) -> dict | None:
    """How a config is stored: its class name and fields (JSON-able)."""
    if config is None:
        return None
    return {"type": type(config).__name__, "fields": dataclasses.asdict(config)}


class Tuner:
    """Picks and remembers the fastest candidate per problem.

    measurer(candidate[, bound]) -> seconds; the default times candidate.run with
    measure.time_callable (GPU only), briefly in fast mode and in full in exhaustive mode (its
    runs are the model's data). A measurer that takes `bound` gets, in fast mode, a time past
    which the candidate has lost, so it may stop at a first estimate above it (else None); a
    one-argument measurer is called as before. db=None keeps choices in memory only.
    Fast mode measures fast_measured's: the model's best fast_count(len(candidates), top_k,
    top_frac) (top_frac=0: top_k), the few it predicts within TIE of the last of those, and the
    libraries. in_turns(candidates) -> seconds each, timed in turns: the finalists of long calls
    are ranked by it (default: measure.in_turns with the default measurer, none with a custom one).
    rotate: whether our best and dense, measured within ROTATE_MARGIN of each other in a short
    call, are ranked by their `rotated` timings (default: with the default measurer only).
    """

    def __init__(self, db: TuningDB | None, device_spec: DeviceSpec, measurer: Callable[..., float] | None = None,
                 mode: str = "fast", top_k: int = TOP_K, top_frac: float = TOP_FRAC,
                 in_turns: Callable[[Sequence[Candidate]], Sequence[float]] | None = None,
                 rotate: bool | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        if not 0.0 <= top_frac <= 1.0:
            raise ValueError(f"top_frac must be between 0 and 1, got {top_frac}")
        self.rotate = measurer is None if rotate is None else bool(rotate)
        if measurer is None:
            from . import measure

            measurer = functools.partial(measure.measure_candidate, brief=mode == "fast")
            in_turns = in_turns or functools.partial(measure.in_turns, brief=mode == "fast")
        self.in_turns = in_turns
        self.db, self.device, self.measurer, self.mode, self.top_k = db, device_spec, measurer, mode, top_k
        self._bounded = _takes_bound(measurer)
        self.top_frac = top_frac
        self._memo: dict[tuple, Choice] = {}

    def cached(self, key: tuple) -> Choice | None:
        """The in-memory choice for a precomputed problem.key(), or None: the dispatch's hot path."""
        return self._memo.get(key)

    def pick(self, problem: Problem, candidates: Sequence[Candidate] | Callable[[], Sequence[Candidate]],
             key: tuple | None = None, rebuild: Callable[[str, dict | None], Any] | None = None,
             stale: Any = None, checkable: Callable[[], bool] | None = None) -> Choice:
        """The choice for `problem`. `candidates` may be a callable, built only on a miss;
        `key` is problem.key() when the caller has it precomputed. `rebuild(backend, stored
        config)` turns a DB hit into the config to run, or returns `stale` when today's space no
        longer holds it: a hit then costs no candidate (no config space, no features).
        `checkable()`: whether the candidates' checks can judge anything on this input, asked
        before a tuning measures (never on a hit); False raises CheckInconclusive."""
        if key is None:
            key = problem.key()
        choice = self._memo.get(key)
        if choice is None:
            cands = functools.cache(lambda: list(candidates() if callable(candidates) else candidates))
            stored = self._stored(problem)
            if stored is not None and self._doubtful(problem, stored):
                try:
                    choice = self._tune(problem, cands(), checkable=checkable)
                except (RuntimeError, CheckInconclusive):  # nothing ran (or could be checked): the stored choice stands
                    choice = None
            if choice is None and stored is not None and rebuild is not None:
                config = rebuild(stored["backend"], stored["config"])
                if config is not stale:
                    choice = Choice(stored["backend"], config, stored["predicted"], stored["seconds"])
            if choice is None:
                choice = self._tune(problem, cands(), stored, checkable)
            self._memo[key] = choice
        return choice

    def _stored(self, problem: Problem) -> dict | None:
        """The DB's best entry for the problem when it was tuned in this mode or a stronger one."""
        if self.db is None:
            return None
        if not problem.device:
            raise ValueError("problem.device is empty: set it (tune.device.device_name()) so that DB entries never cross devices")
        stored = self.db.get_best(self.db.key(problem))
        if stored is not None and _STRENGTH.get(stored["mode"], -1) >= _STRENGTH[self.mode]:
            return stored
        return None

    def _doubtful(self, problem: Problem, stored: dict) -> bool:
        """Whether the stored choice's one tuning shows a transient's mark (DOUBT_MARGIN). Fast
        mode's entries only: exhaustive timings are never re-timed, so a miss there is the
        model's error, and a model-mode tuner has no timing to replace one with."""
        if self.mode != "fast" or stored["mode"] != "fast" or stored["seconds"] is None:
            return False
        key = self.db.key(problem)
        if self.db.tunings(key) != 1:  # tuned again already (an imported table counts as one tuning)
            return False
        rows = self.db.results(key)
        chosen = (stored["backend"], canonical(stored["config"]))
        return any(r["seconds"] is not None and r["predicted"] is not None
                   and (r["backend"], canonical(r["config"])) != chosen
                   and r["predicted"] * DOUBT_MARGIN < stored["seconds"]
                   and _far_past_prediction(r["seconds"], r["predicted"]) for r in rows)

    def predicted(self, candidate: Candidate, dtype) -> float:
        if candidate.predicted is not None:
            return float(candidate.predicted)
        return predict(candidate.features, self.device, dtype)

    # --- a miss ----------------------------------------------------------------------------------
    def _tune(self, problem: Problem, cands: list[Candidate], stored: dict | None = None,
              checkable: Callable[[], bool] | None = None) -> Choice:
        if not cands:
            raise ValueError(f"no candidates for {problem.op} {problem.fmt} ({problem.m}x{problem.k}, n={problem.n})")
        configs = [config_json(c.config) for c in cands]
        db_key = self.db.key(problem) if self.db is not None else None
        if stored is not None:  # a DB hit the caller could not rebuild: find it among the candidates
            wanted = canonical(stored["config"])
            for c, cfg in zip(cands, configs):
                if c.backend == stored["backend"] and canonical(cfg) == wanted:
                    return Choice(c.backend, c.config, stored["predicted"], stored["seconds"])
            # the stored config is no longer in the space: tune again
        if checkable is not None and not checkable():  # before anything is measured or recorded
            raise CheckInconclusive(f"{problem.op} {problem.fmt}: no output of this input can be checked")

        preds = [self.predicted(c, problem.dtype) for c in cands]
        order = sorted(range(len(cands)), key=lambda i: preds[i])
        if self.mode == "model":
            to_measure = []
        elif self.mode == "fast":
            to_measure = fast_measured(preds, order, self.top_k, self.top_frac, lambda i: cands[i].library)
        else:
            to_measure = order
        _prepare([cands[i] for i in to_measure])
        rows, best_s, seen, cut = {}, math.inf, {}, []  # seen: the best seconds per backend so far
        for i in to_measure:
            bound = SLOWER * best_s if self.mode == "fast" and math.isfinite(best_s) else None
            c = cands[i]
            floor = c.floor(seen) if callable(c.floor) else c.floor
            if self.mode == "fast" and c.library and floor is not None and floor > best_s:
                rows[i] = {"backend": c.backend, "config": configs[i], "predicted": preds[i], "seconds": None,
                           "error": f"not run: its floor {floor:.3g} s is past the best measured {best_s:.3g} s"}
                cut.append(i)
                continue
            rows[i] = self._measure(c, configs[i], preds[i], bound)
            seconds = rows[i]["seconds"]
            if seconds is not None:
                best_s = min(best_s, seconds)
                seen[c.backend] = min(seconds, seen.get(c.backend, math.inf))
                if bound is not None and seconds > bound:
                    cut.append(i)

        for i in list(rows):
            seconds = rows[i]["seconds"]
            if self.mode != "fast" or seconds is None or not _far_past_prediction(seconds, preds[i]) \
                    or not preds[i] < SLOWER * best_s:
                continue
            bound = SLOWER * best_s
            again = self._measure(cands[i], configs[i], preds[i], bound)["seconds"]
            if again is not None and again < seconds:
                rows[i]["seconds"] = again
                best_s = min(best_s, again)
                if i in cut and again <= bound:
                    cut.remove(i)  # a whole timing now, not one cut short

        self._finalists_in_turns(cands, rows)
        self._dense_margin_rotated(cands, rows)

        def rank():  # fastest measured first; with no measurements, the model's order
            return sorted((i for i in rows if rows[i]["seconds"] is not None), key=lambda i: rows[i]["seconds"]) \
                if to_measure else order

        passed: dict[int, bool] = {}  # each candidate's check runs once

        def first_passing(ranked):
            for i in ranked:
                if i not in passed:
                    passed[i] = self._passes(cands[i], i, configs[i], preds[i], rows)
                if passed[i]:
                    return i
            return None

        ranked = rank()
        chosen = first_passing(ranked)
        if chosen != (ranked[0] if ranked else None) and cut:
            # the fastest failed its check: what was skipped or cut short against it is timed in
            # full before a slower candidate is stored as the best
            for i in cut:
                rows[i] = self._measure(cands[i], configs[i], preds[i])
            chosen = first_passing(rank())
        best = None
        if chosen is not None:
            best = {"backend": cands[chosen].backend, "config": configs[chosen], "predicted": preds[chosen],
                    "seconds": rows[chosen]["seconds"] if chosen in rows else None, "mode": self.mode}
        if db_key is not None:
            self.db.record(db_key, list(rows.values()), best)
        if best is None:
            errors = "; ".join(f"{r['backend']}: {r['error']}" for r in rows.values())
            raise RuntimeError(f"no candidate ran correctly for {problem.op} {problem.fmt} "
                               f"({problem.m}x{problem.k}, n={problem.n}): {errors or 'none was measured'}")
        c = cands[chosen]
        return Choice(c.backend, c.config, best["predicted"], best["seconds"])

    def _finalists_in_turns(self, cands: list[Candidate], rows: dict) -> None:
        """Long calls: the fastest few measured, within FINAL_MARGIN of the best, timed again in
        turns, which reorders them; their rows then hold the turns' times scaled so that the
        fastest keeps its separate time (the board's state in turns moves every time alike, and
        the rest were timed separately: one scale for all). The separate times stand if that fails."""
        timed = sorted((i for i in rows if rows[i]["seconds"] is not None), key=lambda i: rows[i]["seconds"])
        if self.in_turns is None or len(timed) < 2 or rows[timed[0]]["seconds"] < GRAPH_BELOW_S:
            return
        best = rows[timed[0]]["seconds"]
        finalists = [i for i in timed[:FINALISTS] if rows[i]["seconds"] <= FINAL_MARGIN * best]
        if len(finalists) < 2:
            return
        try:
            seconds = [float(t) for t in self.in_turns([cands[i] for i in finalists])]
        except Exception:  # noqa: BLE001 (a candidate that ran alone and fails in turns: keep the first times)
            return
        _timed_again(rows, finalists, seconds, best)

    def _dense_margin_rotated(self, cands: list[Candidate], rows: dict) -> None:
        """Short calls where our best and dense, the faster of them the fastest measured, came
        within ROTATE_MARGIN of each other: both timed again on rotating copies of the weight, and
        their rows rescaled so that the faster there keeps the faster's first time (the winner
        stays the fastest measured; the other is stored at its rotated share of that). The first
        times stand if either has no rotated timing, if the weight is unfit for rotation (too
        small: too many copies; or too little free memory), silently, or if the timing fails (a
        copy, a capture), with a warning."""
        timed = [i for i in rows if rows[i]["seconds"] is not None]
        ours = [i for i in timed if not cands[i].library]
        dense = [i for i in timed if cands[i].backend == "dense"]
        if not self.rotate or not ours or not dense:
            return
        pair = (min(ours, key=lambda i: rows[i]["seconds"]), dense[0])
        fast, slow = sorted(rows[i]["seconds"] for i in pair)
        if fast >= GRAPH_BELOW_S or slow > ROTATE_MARGIN * fast or any(cands[i].rotated is None for i in pair) \
                or fast > min(rows[i]["seconds"] for i in timed):  # another library won: nothing to decide
            return
        try:
            seconds = [float(cands[i].rotated()) for i in pair]
        except RotationUnfit:  # a small weight (over dispatch.ROTATED_COPIES copies), or too little memory
            return
        except RuntimeError as e:  # a copy or a capture failed: the first times stand
            _warn_once(f"spartune: the rotated timing of {cands[pair[0]].backend} against dense failed "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                       "the tuner ranks them by their first timings")
            return
        _timed_again(rows, pair, seconds, fast)

    def _measure(self, c: Candidate, cfg, predicted: float, bound: float | None = None) -> dict:
        row = {"backend": c.backend, "config": cfg, "predicted": predicted, "seconds": None, "error": None}
        try:
            seconds = float(self.measurer(c, bound) if self._bounded else self.measurer(c))
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError(f"measurer returned {seconds!r} seconds")
            row["seconds"] = seconds
        except Exception as e:  # a compile error or launch failure: recorded, never picked
            row["error"] = f"{type(e).__name__}: {e}"
        return row

    def _passes(self, c: Candidate, i: int, cfg, predicted: float, rows: dict) -> bool:
        """Run the candidate's check once; a failure is recorded against it."""
        if c.check is None:
            return True
        try:
            ok, error = bool(c.check()), "wrong result: output does not match the reference"
        except Exception as e:
            ok, error = False, f"check raised {type(e).__name__}: {e}"
        if not ok:
            row = rows.setdefault(i, {"backend": c.backend, "config": cfg, "predicted": predicted})
            row.update(seconds=None, error=error)
        return ok


def _timed_again(rows: dict, indices, seconds: list[float], first: float) -> None:
    """Rows `indices` take `seconds` (timed again another way: in turns, rotated), scaled so that
    the fastest there keeps `first` (the fastest of their first times): the other way orders them,
    while the rest, timed once, stay comparable. Nothing changes unless every time is valid."""
    if len(seconds) == len(indices) and all(t > 0 and math.isfinite(t) for t in seconds):
        scale = first / min(seconds)
        for i, t in zip(indices, seconds):
            rows[i]["seconds"] = t * scale


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    import warnings

    key = message.split("(")[0]
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class CheckInconclusive(Exception):
    """The candidates' checks cannot judge anything on this input (pick's `checkable`): the tuner
    stops before measuring or recording, and the caller decides (dispatch tunes on stand-ins)."""


def _takes_bound(measurer) -> bool:
    """Whether the measurer accepts a second argument (the bound)."""
    try:
        params = inspect.signature(measurer).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _prepare(cands: Sequence[Candidate]) -> None:
    """The candidates' `prepare` calls, in parallel threads; a failure shows when it is measured."""
    from concurrent.futures import ThreadPoolExecutor

    calls = [c.prepare for c in cands if c.prepare is not None]

    def call(fn):
        try:
            fn()
        except Exception:  # noqa: BLE001 (its measurement raises it again and records it)
            pass

    if len(calls) <= 1:
        for fn in calls:
            call(fn)
        return
    with ThreadPoolExecutor(min(len(calls), 8), thread_name_prefix="spartune-prepare") as pool:
        list(pool.map(call, calls))


def load_or_calibrate(db: TuningDB | None, device_index: int = 0) -> DeviceSpec:
    """The device's stored calibration, or a fresh one (a few seconds, once per device) that
    is then stored. CUDA only."""
    name = device_name(device_index)
    spec = db.get_calibration(name) if db is not None else None
    if spec is None:
        spec = calibrate(device_index)
        if db is not None:
            db.set_calibration(name, spec)
    return spec


# --- evaluation ----------------------------------------------------------------------------------

def evaluate(records: Iterable[dict], top_k: int = TOP_K, library_backends: Iterable[str] = ("dense",),
             top_frac: float = TOP_FRAC) -> dict:
    """How the model and fast modes would have done, from exhaustive measurements.

    records: rows with 'problem' (any hashable key), 'backend', 'seconds' (None = failed) and
    'predicted' (e.g. TuningDB.results()). Per problem, model mode picks the best-predicted
    candidate that ran; fast mode measures what fast_measured gives (the fast_count best
    predicted, their ties and the library backends), as Tuner does, and picks the fastest of those
    (top_frac=0: exactly top_k). Ratios are picked time / exhaustive best (1.0 is perfect).
    'best_in_top_k' counts the exhaustive best among the model's top_k (not the scaled count).
    """
    library = set(library_backends)
    groups = defaultdict(list)
    for r in records:
        groups[r["problem"]].append(r)
    model, fast, in_top, rhos = [], [], [], []
    measured = total = 0
    for rows in groups.values():
        valid = [r for r in rows if r["seconds"] is not None]
        if not valid:
            continue
        best = min(r["seconds"] for r in valid)
        order = sorted(rows, key=_pred)
        model.append(next(r["seconds"] for r in order if r["seconds"] is not None) / best)
        chosen = [order[i] for i in fast_measured([_pred(r) for r in order], list(range(len(order))), top_k,
                                                   top_frac, lambda i: order[i]["backend"] in library)]
        ran = [r["seconds"] for r in chosen if r["seconds"] is not None]
        fast.append(min(ran) / best if ran else math.inf)
        measured += len(chosen)
        total += len(rows)
        in_top.append(any(r["seconds"] == best for r in order[:top_k]))
        ranked = [r for r in valid if math.isfinite(_pred(r))]
        if len(ranked) >= 3:
            rho = _spearman([_pred(r) for r in ranked], [r["seconds"] for r in ranked])
            if rho is not None:
                rhos.append(rho)
    if not model:
        raise ValueError("no problem has a successful measurement")

    def summary(ratios):
        x = np.asarray(ratios, dtype=float)
        return {"ratio_median": float(np.median(x)), "ratio_p90": float(np.quantile(x, 0.9, method="higher")),
                "within_5": float(np.mean(x <= 1.05)), "within_15": float(np.mean(x <= 1.15))}

    return {
        "problems": len(model),
        "top_k": top_k,
        "top_frac": top_frac,
        "model": summary(model),
        "fast": {**summary(fast), "fraction_measured": measured / total},
        "best_in_top_k": float(np.mean(in_top)),
        "spearman_median": float(np.median(rhos)) if rhos else None,
        "spearman_mean": float(np.mean(rhos)) if rhos else None,
    }


def _pred(r: dict) -> float:
    p = r.get("predicted")
    return math.inf if p is None else p


def _ranks(x) -> np.ndarray:
    """Ranks from 0, ties given their mean rank."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for value in np.unique(x):
        tie = x == value
        ranks[tie] = ranks[tie].mean()
    return ranks


def _spearman(a, b) -> float | None:
    """Spearman's rank correlation; None when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])
