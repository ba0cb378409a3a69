"""The search: what gets measured in each mode, failures and wrong results, the DB and memo
paths, and the evaluation helper."""
import dataclasses
import math
import warnings
from dataclasses import dataclass

import pytest

from spartune.formats import FormatStats
from spartune.tune.db import TuningDB
from spartune.tune.device import H100
from spartune.tune.measure import RotationUnfit
from spartune.tune.model import dense_gemm_seconds
from spartune.tune.problem import KernelFeatures, Problem
from spartune.tune.tuner import TIES_EXTRA, Candidate, Choice, Tuner, config_json, evaluate, fast_count, fast_selection

VERSIONS = {"torch": "2.13.0", "cuda": "13.0", "triton": "3.6.0", "spartune": "0.1.0"}
STATS = FormatStats(rows=4096, cols=4096, nnz=419430, density=0.1, unit_rows=64, units=64, items_mean=6.4,
                    items_cv=0.2, items_max=9, empty_units=0, item_cols=64)


@dataclass(frozen=True)
class Cfg:
    bn: int
    stages: int = 3


def problem(n=2048, m=4096):
    return Problem("linear", "block:64x64", m, 4096, n, "float16", STATS, device="H100 sm_90")


class FakeMeasurer:
    """Seconds per candidate from a table; an Exception in the table is raised."""

    def __init__(self, times):
        self.times, self.calls, self.bounds = times, [], []

    def __call__(self, c, bound=None):
        self.calls.append((c.backend, c.config))
        self.bounds.append(bound)
        t = self.times[(c.backend, c.config)]
        if isinstance(t, Exception):
            raise t
        return t


def space(n=20, measured=None, checks=None):
    """n blocked candidates, predicted 1..n us (the model's order is the index), plus dense,
    predicted slowest. `measured` maps index -> seconds (default: predicted * 1.1)."""
    measured = measured or {}
    checks = checks or {}
    cands, times = [], {}
    for i in range(n):
        cfg = Cfg(bn=16 * (i + 1))
        cands.append(Candidate("blocked", cfg, predicted=(i + 1) * 1e-6, check=checks.get(i)))
        times[("blocked", cfg)] = measured.get(i, (i + 1) * 1.1e-6)
    cands.append(Candidate("dense", None, predicted=1e-3, library=True, check=checks.get("dense")))
    times[("dense", None)] = measured.get("dense", 50e-6)
    return cands, FakeMeasurer(times)


def tuner(measurer, mode="fast", top_k=4, db=None):
    return Tuner(db, H100, measurer=measurer, mode=mode, top_k=top_k)


def test_fast_measures_the_top_k_and_dense_only():
    cands, m = space(measured={2: 0.5e-6})  # the model's third choice is in fact the fastest
    choice = tuner(m).pick(problem(), cands)
    assert (choice.backend, choice.config, choice.measured) == ("blocked", Cfg(bn=48), 0.5e-6)
    assert choice.predicted == pytest.approx(3e-6)
    assert sorted(m.calls, key=str) == sorted([("blocked", Cfg(bn=16 * (i + 1))) for i in range(4)] + [("dense", None)], key=str)


def test_fast_measures_more_of_a_large_space():
    # max(top_k, top_frac x candidates): 100 + dense at 6% -> the model's best 6, then dense
    cands, m = space(n=100, measured={5: 0.5e-6, 6: 0.4e-6})
    choice = Tuner(None, H100, measurer=m, top_k=4, top_frac=0.06).pick(problem(), cands)
    assert choice.config == Cfg(bn=16 * 6) and len(m.calls) == 6 + 1
    cands, m = space(n=100)
    Tuner(None, H100, measurer=m, top_k=4, top_frac=0.0).pick(problem(), cands)
    assert len(m.calls) == 4 + 1  # top_frac 0: exactly top_k
    assert fast_count(20) == fast_count(45) == 4 and fast_count(221) == 13
    with pytest.raises(ValueError, match="top_frac"):
        Tuner(None, H100, measurer=m, top_frac=1.5)


def test_fast_measures_the_models_ties_with_its_last_too():
    """Candidates the model predicts within TIE of the last of the top k are measured as well (at
    most TIES_EXTRA of them): the fastest here is predicted 0.2% behind the fourth."""
    cands, m = space(measured={5: 0.5e-6})
    for i, predicted in ((4, 4.004e-6), (5, 4.008e-6), (6, 4.012e-6)):
        cands[i] = Candidate("blocked", cands[i].config, predicted=predicted)
    choice = tuner(m).pick(problem(), cands)
    assert choice.config == Cfg(bn=16 * 6) and len(m.calls) == 4 + TIES_EXTRA + 1
    assert ("blocked", Cfg(bn=16 * 7)) not in m.calls  # a third tie: past TIES_EXTRA
    cands, m = space(measured={4: 0.5e-6})  # the fifth predicted 25% behind the fourth: not a tie
    assert tuner(m).pick(problem(), cands).config != Cfg(bn=16 * 5) and len(m.calls) == 4 + 1


def test_ties_are_finite_kernels():
    """An unrunnable config (predicted inf) is no tie of another, and a library, measured anyway,
    takes no tie's place."""
    inf = math.inf
    assert fast_selection([1, 2, 3, inf, inf, inf], list(range(6)), top_k=4, top_frac=0) == [0, 1, 2, 3]
    preds = [1, 2, 3, 4, 4.001, 4.002, 4.003]
    assert fast_selection(preds, list(range(7)), top_k=4, top_frac=0, library=lambda i: i in (4, 5)) == [0, 1, 2, 3, 6]


def test_dense_is_always_measured_and_wins_when_fastest():
    cands, m = space(measured={"dense": 0.1e-6})
    choice = tuner(m, top_k=1).pick(problem(), cands)
    assert choice.backend == "dense" and choice.config is None and choice.measured == 0.1e-6
    assert ("dense", None) in m.calls and len(m.calls) == 2


def test_exhaustive_measures_everything():
    cands, m = space(measured={17: 0.2e-6})
    choice = tuner(m, mode="exhaustive").pick(problem(), cands)
    assert len(m.calls) == len(cands) and choice.config == Cfg(bn=16 * 18)


def test_later_candidates_get_a_bound_of_slower_times_the_best_so_far():
    """The measurer may stop a candidate at one call past the bound: it has lost anyway (unless
    it was timed 4x past its prediction: then once more, under the same bound)."""
    cands, m = space(measured={0: 4e-6, 1: 2e-6, 2: 30e-6})
    tuner(m).pick(problem(), cands)
    # the top 4, then dense; then the third again (30 us against 3 predicted)
    assert m.bounds == [None, 3 * 4e-6, 3 * 2e-6, 3 * 2e-6, 3 * 2e-6, 3 * 2e-6]
    cands, m = space(measured={0: 4e-6, 1: 2e-6, 2: 30e-6})
    tuner(m, mode="exhaustive").pick(problem(), cands)
    assert m.bounds == [None] * len(cands)  # exhaustive data is timed in full, once


def test_the_measured_candidates_are_prepared_first_and_at_once():
    """prepare (compiling a CUDA config) runs for the candidates fast mode times, in threads,
    before any is timed; a failing prepare is left for the measurement to record."""
    import threading

    started = threading.Barrier(3, timeout=5)  # three prepares must be in flight together
    prepared, met = [], []

    def prepare(i):
        def fn():
            if i < 3:
                started.wait()  # (a broken barrier raises, and the prepare is not recorded)
                met.append(i)
            prepared.append(i)
            if i == 3:
                raise RuntimeError("compile error")
        return fn

    cands, m = space()
    cands = [dataclasses.replace(c, prepare=prepare(i)) for i, c in enumerate(cands)]

    def measurer(c, bound):
        assert sorted(prepared) == [0, 1, 2, 3, 20]  # every prepare has run before any timing
        return m(c, bound)

    tuner(measurer).pick(problem(), cands)
    assert sorted(met) == [0, 1, 2] and len(m.calls) == 5


def test_a_candidate_timed_far_past_its_prediction_is_timed_again():
    """A transient (another process on the GPU) made one timing of the best candidate 12x its real
    time: timed past 4x its prediction, it is timed once more after the rest, and wins; a candidate
    that is slow twice, or slow within 4x of its prediction, is timed once."""
    cands, m = space(measured={0: 3e-6, 1: 30e-6, 2: 13e-6, 3: 4e-6})  # predicted 1, 2, 3 and 4 us
    firsts = {Cfg(bn=32): 30e-6, Cfg(bn=48): 13e-6}
    seconds = {Cfg(bn=32): 1.5e-6, Cfg(bn=48): 20e-6}

    def measurer(c, bound):
        m(c, bound)
        if c.config in firsts:
            return firsts.pop(c.config)
        return seconds.get(c.config, m.times[(c.backend, c.config)])

    choice = tuner(measurer).pick(problem(), cands)
    assert (choice.config, choice.measured) == (Cfg(bn=32), 1.5e-6)
    counts = {cfg: [c for _, c in m.calls].count(cfg) for cfg in (Cfg(bn=16), Cfg(bn=32), Cfg(bn=48), Cfg(bn=64))}
    assert counts == {Cfg(bn=16): 1, Cfg(bn=32): 2, Cfg(bn=48): 2, Cfg(bn=64): 1}
    # predicted past 3x the best measured: a slow timing there cannot be what hides the winner
    cands, m = space(measured={0: 1e-6, 3: 40e-6})  # the fourth: predicted 4 us, timed 40
    tuner(m).pick(problem(), cands)
    assert [c for _, c in m.calls].count(Cfg(bn=64)) == 1


def test_a_stored_choice_with_a_transients_mark_is_tuned_once_more(tmp_path):
    """A transient that outlasts the re-time (the best candidate slow both times) stores dense; the
    next process doubts that entry (a candidate the model had far faster measured past 4x its
    prediction), tunes again and stores the sparse winner; from then on the DB answers alone. A
    choice without that mark, or one tuned twice already, is served without a measurement."""
    db = TuningDB(tmp_path / "t.sqlite", VERSIONS)
    cands, m = space(n=4, measured={i: 40e-6 for i in range(4)})  # predicted 1-4 us, dense 50 us
    assert tuner(m, db=db).pick(problem(), cands).config == Cfg(bn=16)  # 40 us, still under dense
    cands, m = space(n=4, measured={i: 80e-6 for i in range(4)})
    first = tuner(m, db=db).pick(problem(n=16), cands)
    assert first.backend == "dense"
    cands, healthy = space(n=4)
    again = tuner(healthy, db=db).pick(problem(n=16), cands)
    assert again.backend == "blocked" and healthy.calls
    cands, later = space(n=4, measured={i: 80e-6 for i in range(4)})
    assert tuner(later, db=db).pick(problem(n=16), cands, rebuild=lambda b, c: Cfg(**c["fields"])).backend == "blocked"
    assert later.calls == []  # tuned twice: the DB answers
    # a choice whose tuning shows no transient is served from the DB at once
    cands, m = space(n=4, measured={0: 3e-6})
    tuner(m, db=db).pick(problem(n=32), cands)
    cands, m2 = space(n=4)
    tuner(m2, db=db).pick(problem(n=32), cands, rebuild=lambda b, c: Cfg(**c["fields"]))
    assert m2.calls == []
    # the first tuning above timed every candidate at 10-40x its prediction: doubted too, once
    cands, m3 = space(n=4)
    assert tuner(m3, db=db).pick(problem(), cands, rebuild=lambda b, c: Cfg(**c["fields"])).measured == 1.1e-6
    assert m3.calls


def test_only_fast_entries_are_doubted_and_only_by_fast_tuners(tmp_path):
    """Exhaustive timings are never re-timed (a miss there is the model's), and a model-mode tuner
    has nothing better to store: both serve the stored choice. A doubted re-tune in which nothing
    runs keeps the stored choice."""
    def marked(mode):
        db = TuningDB(tmp_path / f"{mode}.sqlite", VERSIONS)
        cands, m = space(n=4, measured={i: 80e-6 for i in range(4)})
        assert tuner(m, mode=mode, db=db).pick(problem(), cands).backend == "dense"
        return db

    rebuild = lambda b, c: None if c is None else Cfg(**c["fields"])  # noqa: E731
    db = marked("exhaustive")
    cands, m = space(n=4)
    assert tuner(m, db=db).pick(problem(), cands, rebuild=rebuild).backend == "dense" and m.calls == []
    db = marked("fast")
    cands, m = space(n=4)
    assert tuner(m, mode="model", db=db).pick(problem(), cands, rebuild=rebuild).backend == "dense"
    assert m.calls == [] and db.tunings(db.key(problem())) == 1
    cands, m = space(n=4, measured={i: RuntimeError("broken") for i in range(4)} | {"dense": RuntimeError("x")})
    assert tuner(m, db=db).pick(problem(), cands, rebuild=rebuild).backend == "dense"  # re-tuned, failed
    assert m.calls


def test_a_one_argument_measurer_still_works():
    cands, m = space(measured={2: 0.5e-6})
    choice = tuner(lambda c: m(c)).pick(problem(), cands)
    assert choice.config == Cfg(bn=48) and m.bounds == [None] * 5


def test_the_default_measurer_is_brief_in_fast_mode_only():
    assert Tuner(None, H100).measurer.keywords == {"brief": True}
    assert Tuner(None, H100, mode="exhaustive").measurer.keywords == {"brief": False}


def test_the_finalists_of_long_calls_are_ranked_in_turns(tmp_path):
    """Long calls run at the power cap: the fastest few within 15% of the best are timed again in
    turns, and that order decides; the DB keeps the turns' times scaled so that the fastest
    finalist keeps its separate time."""
    cands, m = space(measured={0: 1.00e-3, 1: 1.05e-3, 2: 1.10e-3, 3: 1.30e-3, "dense": 1.5e-3})
    asked = []

    def in_turns(cs):
        asked.append([c.config for c in cs])
        return [{16: 1.25e-3, 32: 1.0e-3, 48: 1.2e-3}[c.config.bn] for c in cs]

    db = TuningDB(tmp_path / "t.sqlite", VERSIONS)
    choice = Tuner(db, H100, measurer=m, top_k=4, in_turns=in_turns).pick(problem(), cands)
    assert asked == [[Cfg(bn=16), Cfg(bn=32), Cfg(bn=48)]]  # bn=64 is past 15%, dense too
    assert choice.config == Cfg(bn=32) and choice.measured == pytest.approx(1.0e-3)
    stored = {r["config"]["fields"]["bn"]: r["seconds"] for r in db.results() if r["config"]}
    assert stored[16] == pytest.approx(1.25e-3) and stored[64] == 1.30e-3


def test_times_in_turns_are_scaled_to_the_separate_ones():
    """The board is hotter in turns: every finalist's time there may be longer than any separate
    one, and a candidate outside the finalists must not win by that alone."""
    cands, m = space(measured={0: 1.00e-3, 1: 1.02e-3, 2: 1.05e-3, 3: 1.12e-3, "dense": 2e-3})
    in_turns = lambda cs: [{16: 1.26e-3, 32: 1.20e-3, 48: 1.23e-3}[c.config.bn] for c in cs]  # noqa: E731
    choice = Tuner(None, H100, measurer=m, top_k=4, in_turns=in_turns).pick(problem(), cands)
    assert choice.config == Cfg(bn=32) and choice.measured == pytest.approx(1.00e-3)


def test_short_calls_and_failed_turns_keep_the_separate_timings():
    asked = []

    def in_turns(cs):
        asked.append(len(cs))
        raise RuntimeError("a finalist failed in turns")

    cands, m = space(measured={2: 0.5e-6})  # microseconds: no turns
    assert Tuner(None, H100, measurer=m, in_turns=in_turns).pick(problem(), cands).config == Cfg(bn=48)
    assert asked == []
    cands, m = space(measured={0: 1.0e-3, 1: 1.01e-3, 2: 2e-3, 3: 2e-3, "dense": 2e-3})
    choice = Tuner(None, H100, measurer=m, in_turns=in_turns).pick(problem(), cands)
    assert asked == [2] and choice.config == Cfg(bn=16) and choice.measured == 1.0e-3
    # a custom measurer without in_turns: none
    assert Tuner(None, H100, measurer=m).in_turns is None and Tuner(None, H100).in_turns is not None


def rotated_space(ours_s, dense_s, ours_rot, dense_rot, runner_up_s=None):
    """Our best (bn=16), a runner-up and dense, with rotated timings (a number, an Exception,
    or None for none); `calls` records which were timed so."""
    calls = []

    def timer(name, t):
        def rotated():
            calls.append(name)
            if isinstance(t, Exception):
                raise t
            return t
        return None if t is None else rotated

    cands = [Candidate("blocked", Cfg(bn=16), predicted=1e-6, rotated=timer("ours", ours_rot)),
             Candidate("blocked", Cfg(bn=32), predicted=2e-6, rotated=timer("runner-up", 1.0)),
             Candidate("dense", None, predicted=1e-3, library=True, rotated=timer("dense", dense_rot))]
    m = FakeMeasurer({("blocked", Cfg(bn=16)): ours_s, ("blocked", Cfg(bn=32)): runner_up_s or 2 * ours_s,
                      ("dense", None): dense_s})
    return cands, m, calls


def test_our_best_and_dense_at_a_margin_are_ranked_rotated(tmp_path):
    """Decode: the eviction write flatters latency-bound kernels against dense (LOG, session 42),
    so our best and dense within ROTATE_MARGIN are timed on rotating weight copies and ranked
    by that; the winner keeps the faster first time, so nothing timed only once can beat it
    unless it measured faster than both."""
    cands, m, calls = rotated_space(120e-6, 126e-6, ours_rot=121.4e-6, dense_rot=119.0e-6, runner_up_s=121e-6)
    db = TuningDB(tmp_path / "t.sqlite", VERSIONS)
    choice = Tuner(db, H100, measurer=m, rotate=True).pick(problem(n=32), cands)
    assert sorted(calls) == ["dense", "ours"]
    assert (choice.backend, choice.measured) == ("dense", pytest.approx(120e-6))
    stored = {(r["backend"], (r["config"] or {}).get("fields", {}).get("bn")): r["seconds"] for r in db.results()}
    assert stored[("blocked", 16)] == pytest.approx(121.4e-6 * 120 / 119.0) and stored[("blocked", 32)] == 121e-6
    # rotation confirms ours: ours is kept, at its first time
    cands, m, calls = rotated_space(120e-6, 126e-6, ours_rot=110e-6, dense_rot=119.0e-6)
    choice = Tuner(None, H100, measurer=m, rotate=True).pick(problem(n=32), cands)
    assert (choice.backend, choice.config, choice.measured) == ("blocked", Cfg(bn=16), pytest.approx(120e-6))


def test_rotation_only_at_a_margin_of_a_short_call_and_never_fatal():
    def pick(ours_s, dense_s, ours_rot=100e-6, dense_rot=90e-6, rotate=True):
        cands, m, calls = rotated_space(ours_s, dense_s, ours_rot, dense_rot)
        return Tuner(None, H100, measurer=m, rotate=rotate).pick(problem(n=32), cands), calls

    choice, calls = pick(50e-6, 100e-6)  # dense 2x slower: past the margin
    assert calls == [] and choice.config == Cfg(bn=16)
    choice, calls = pick(100e-6, 50e-6)  # ours 2x slower
    assert calls == [] and choice.backend == "dense"
    choice, calls = pick(200e-6, 210e-6)  # a long call: in turns instead, not rotated
    assert calls == []
    choice, calls = pick(100e-6, 105e-6, rotate=False)
    assert calls == [] and choice.config == Cfg(bn=16)
    choice, calls = pick(100e-6, 105e-6, dense_rot=None)  # dense without a rotated timing
    assert calls == [] and choice.config == Cfg(bn=16)
    with pytest.warns(RuntimeWarning, match="rotated timing"):
        choice, calls = pick(100e-6, 105e-6, dense_rot=RuntimeError("out of memory for the copies"))
    assert choice.config == Cfg(bn=16) and choice.measured == 100e-6  # the first times stand
    with warnings.catch_warnings():  # a weight too small (or memory too short) to rotate: no warning
        warnings.simplefilter("error")
        choice, calls = pick(100e-6, 105e-6, dense_rot=RotationUnfit("rotation needs 417 weights"))
    assert choice.config == Cfg(bn=16) and choice.measured == 100e-6
    choice, calls = pick(105e-6, 100e-6, ours_rot=90e-6, dense_rot=95e-6)  # dense first, rotation reverses it
    assert sorted(calls) == ["dense", "ours"] and choice.config == Cfg(bn=16) and choice.measured == pytest.approx(100e-6)
    # another library faster than both: the pair decides nothing, and nothing is rotated
    cands, m, calls = rotated_space(100e-6, 105e-6, 90e-6, 80e-6)
    cands.append(Candidate("cusparselt", None, predicted=1e-3, library=True))
    m.times[("cusparselt", None)] = 50e-6
    choice = Tuner(None, H100, measurer=m, rotate=True).pick(problem(n=32), cands)
    assert calls == [] and choice.backend == "cusparselt"
    # the default: only with the default measurer (rotated timings run on the GPU)
    assert Tuner(None, H100, measurer=lambda c: 1.0).rotate is False and Tuner(None, H100).rotate is True


def test_a_failed_winner_brings_back_what_was_skipped_against_it():
    """The fastest fails its check: a library skipped for its floor, or cut short at the bound,
    is timed in full and may win."""
    lib = Candidate("cusparse", None, predicted=4e-3, library=True, floor=1.5e-6)
    cands, m = space(measured={0: 1e-6}, checks={0: lambda: False})
    m.times[("cusparse", None)] = 1.2e-6  # (its floor was wrong: it beats the others)
    choice = tuner(m).pick(problem(), [*cands, lib])
    assert choice.backend == "cusparse" and m.calls.count(("cusparse", None)) == 1


def test_a_library_whose_floor_is_past_the_best_is_not_run(tmp_path):
    """cuSPARSE on a 2:4 weight at prefill costs ~0.3 s a call and never wins: its floor says so
    before it runs. A floor below the best measured is run as before; exhaustive runs it all."""
    db = TuningDB(tmp_path / "t.db", versions=VERSIONS)
    slow = Candidate("cusparse", None, predicted=4e-3, library=True, floor=10e-6)
    near = Candidate("cusparselt", None, predicted=4e-3, library=True, floor=1e-6)
    cands, m = space()
    m.times[("cusparse", None)] = 1e-3
    m.times[("cusparselt", None)] = 2e-6
    tuner(m, db=db).pick(problem(), [*cands, slow, near])
    assert ("cusparse", None) not in m.calls and ("cusparselt", None) in m.calls
    rows = {r["backend"]: r for r in db.results()}
    assert rows["cusparse"]["seconds"] is None and "floor" in rows["cusparse"]["error"]
    cands, m = space()
    m.times[("cusparse", None)], m.times[("cusparselt", None)] = 1e-3, 2e-6
    tuner(m, mode="exhaustive").pick(problem(), [*cands, slow, near])
    assert ("cusparse", None) in m.calls


def test_a_floor_may_follow_what_was_measured():
    """cuSPARSELt's search pick is at best ~0.75x algorithm 0: once algorithm 0 has lost by more
    than that, the search (0.5-0.9 s) is not run."""
    alg0 = Candidate("cusparselt", None, predicted=4e-3, library=True)
    search = Candidate("cusparselt_search", None, predicted=4e-3, library=True,
                       floor=lambda seen: 0.75 * seen["cusparselt"] if "cusparselt" in seen else None)
    for alg0_s, searched in ((2.2e-6, True), (3e-6, False)):  # the best of ours: 1.65e-6
        cands, m = space(measured={0: 1.65e-6})
        m.times[("cusparselt", None)], m.times[("cusparselt_search", None)] = alg0_s, 1.7e-6
        tuner(m).pick(problem(), [*cands, alg0, search])
        assert (("cusparselt_search", None) in m.calls) == searched


def test_cusparse_floor_from_its_csr():
    """Its bytes at decode, its flops at prefill; unknown for other libraries and whole blocks."""
    from spartune import dispatch

    stats = FormatStats(rows=11008, cols=4096, nnz=11008 * 2048, density=0.5, unit_rows=16, units=688,
                        items_mean=1.0, items_cv=0.0, items_max=1, empty_units=0, item_cols=1)
    decode = Problem("linear", "2:4", 11008, 4096, 16, "float16", stats)
    prefill = Problem("linear", "2:4", 11008, 4096, 2048, "float16", stats)
    assert dispatch._library_floor(decode, "cusparse", H100) == pytest.approx(
        (6 * 11008 * 2048 + 2 * 16 * (4096 + 11008)) / (1.25 * H100.dram_bw))
    assert dispatch._library_floor(prefill, "cusparse", H100) == pytest.approx(2 * 11008 * 2048 * 2048 / (2 * H100.fma))
    search = dispatch._library_floor(decode, "cusparselt_search", H100)
    assert search({}) is None and search({"cusparselt": 40e-6}) == pytest.approx(dispatch.CSLT_SEARCH_GAIN * 40e-6)
    assert dispatch._library_floor(decode, "dense", H100) is None
    assert dispatch._library_floor(Problem("linear", "block:64x64", 4096, 4096, 16, "float16", STATS), "cusparse", H100) is None


def test_model_mode_measures_nothing():
    cands, m = space()
    choice = tuner(m, mode="model").pick(problem(), cands)
    assert m.calls == [] and choice == Choice("blocked", Cfg(bn=16), 1e-6, None)


def test_model_ranks_by_features():
    """Candidates with features are ranked by model.predict: one more tile than the SMs costs
    a wave; the dense candidate gets its time from the dense GEMM model."""

    def feats(tiles):
        return KernelFeatures(programs=tiles, tiles=tiles, mma_flops=tiles * 8 * 2 * 128 * 128 * 64.0, fma_flops=0.0,
                              dram_bytes=tiles * 32e3, l2_bytes=tiles * 8 * 32e3, steps_max=8, steps_mean=8,
                              smem_bytes=150 * 1024, num_warps=8, num_stages=3)

    dense = Candidate("dense", None, predicted=dense_gemm_seconds(4096, 4096, 2048, "float16", H100), library=True)
    cands = [Candidate("blocked", Cfg(133), feats(133)), Candidate("blocked", Cfg(132), feats(132)), dense]
    choice = tuner(FakeMeasurer({}), mode="model").pick(problem(), cands)
    assert choice.config == Cfg(132) and choice.measured is None
    t = Tuner(None, H100, measurer=FakeMeasurer({}), mode="model")
    assert t.predicted(cands[1], "float16") < t.predicted(cands[0], "float16") < t.predicted(dense, "float16")


def test_failures_are_recorded_and_never_picked(tmp_path):
    boom = RuntimeError("CompilationError: out of shared memory")
    cands, m = space(measured={0: boom, 1: 0.3e-6})
    db = TuningDB(tmp_path / "t.sqlite3", versions=VERSIONS)
    choice = tuner(m, db=db).pick(problem(), cands)
    assert choice.config == Cfg(bn=32)
    rows = {r["config"]["fields"]["bn"] if r["config"] else "dense": r for r in db.results()}
    assert rows[16]["seconds"] is None and "out of shared memory" in rows[16]["error"]
    assert rows[32]["seconds"] == 0.3e-6 and rows[32]["error"] is None
    assert len(rows) == 5  # top 4 + dense: every measurement is kept


def test_nonsense_times_count_as_failures():
    cands, m = space(measured={0: float("nan"), 1: 0.0})
    assert tuner(m).pick(problem(), cands).config == Cfg(bn=48)


def test_wrong_results_are_rejected_and_the_next_best_checked(tmp_path):
    checked = []

    def check(i, ok):
        return lambda: checked.append(i) or ok

    def raising():
        checked.append("raise")
        raise ValueError("illegal memory access")

    cands, m = space(measured={0: 0.1e-6, 1: 0.2e-6, 2: 0.3e-6},
                     checks={0: check(0, False), 1: raising, 2: check(2, True), 3: check(3, True)})
    db = TuningDB(tmp_path / "t.sqlite3", versions=VERSIONS)
    choice = tuner(m, db=db).pick(problem(), cands)
    assert choice.config == Cfg(bn=48) and checked == [0, "raise", 2]  # the check runs on the winner only
    rows = {r["config"]["fields"]["bn"]: r for r in db.results() if r["config"]}
    assert rows[16]["seconds"] is None and "wrong result" in rows[16]["error"]
    assert rows[32]["seconds"] is None and "illegal memory access" in rows[32]["error"]
    assert db.get_best(db.key(problem()))["config"] == config_json(Cfg(bn=48))


def test_model_mode_still_checks_its_pick():
    cands, m = space(checks={0: lambda: False})
    assert tuner(m, mode="model").pick(problem(), cands).config == Cfg(bn=32) and m.calls == []


def test_nothing_correct_raises_after_recording(tmp_path):
    cands = [Candidate("blocked", Cfg(16), predicted=1e-6), Candidate("dense", None, predicted=1e-3, library=True)]
    m = FakeMeasurer({("blocked", Cfg(16)): RuntimeError("a"), ("dense", None): RuntimeError("b")})
    db = TuningDB(tmp_path / "t.sqlite3", versions=VERSIONS)
    with pytest.raises(RuntimeError, match="no candidate ran correctly"):
        tuner(m, db=db).pick(problem(), cands)
    assert len(db.results()) == 2 and db.get_best(db.key(problem())) is None


def test_memo_hit_builds_no_candidates():
    cands, m = space()
    t = tuner(m)
    built = []

    def factory():
        built.append(1)
        return cands

    first = t.pick(problem(), factory)
    key = problem().key()
    assert t.pick(problem(), factory, key=key) is first and t.cached(key) is first
    assert t.pick(problem(n=1500), factory) is first  # same N bucket
    assert built == [1] and len(m.calls) == 5


def test_db_hit_in_a_new_process_resolves_the_config(tmp_path):
    path = tmp_path / "t.sqlite3"
    cands, m = space(measured={3: 0.2e-6})
    first = tuner(m, db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)
    cands2, m2 = space()  # fresh objects, as a new process would build them
    again = tuner(m2, db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands2)
    assert m2.calls == [] and again == first and again.config is cands2[3].config


def test_db_entries_from_a_weaker_mode_are_retuned(tmp_path):
    path = tmp_path / "t.sqlite3"
    cands, m = space()
    tuner(m, mode="model", db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)
    tuner(m, mode="fast", db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)
    assert len(m.calls) == 5
    m.calls.clear()
    tuner(m, mode="model", db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)  # fast serves model
    assert m.calls == []


def test_a_stored_config_no_longer_offered_is_retuned(tmp_path):
    path = tmp_path / "t.sqlite3"
    cands, m = space(measured={0: 0.1e-6})
    tuner(m, db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)
    m.calls.clear()
    choice = tuner(m, db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands[1:])
    assert choice.config == Cfg(bn=32) and len(m.calls) == 5


def test_other_versions_do_not_reuse_choices(tmp_path):
    path = tmp_path / "t.sqlite3"
    cands, m = space()
    tuner(m, db=TuningDB(path, versions=VERSIONS)).pick(problem(), cands)
    tuner(m, db=TuningDB(path, versions={**VERSIONS, "torch": "2.14.0"})).pick(problem(), cands)
    assert len(m.calls) == 10


def test_candidate_and_tuner_arguments_are_checked():
    with pytest.raises(ValueError, match="features"):
        Candidate("cusparse", None)
    with pytest.raises(TypeError, match="dataclass"):
        Candidate("blocked", {"bn": 16}, predicted=1.0)
    with pytest.raises(ValueError, match="mode"):
        Tuner(None, H100, measurer=lambda c, bound: 1.0, mode="quick")
    with pytest.raises(ValueError, match="top_k"):
        Tuner(None, H100, measurer=lambda c, bound: 1.0, top_k=0)
    with pytest.raises(ValueError, match="no candidates"):
        Tuner(None, H100, measurer=lambda c, bound: 1.0).pick(problem(), [])


# --- evaluation ------------------------------------------------------------------------------------

def rec(p, backend, predicted, seconds):
    return {"problem": p, "backend": backend, "predicted": predicted, "seconds": seconds}


FIXTURE = [  # three problems, measured exhaustively
    # A: the model's order is right
    rec("A", "k", 1.0, 10.0), rec("A", "k", 2.0, 11.0), rec("A", "k", 3.0, 12.0), rec("A", "dense", 9.0, 20.0),
    # B: the model's first choice is 10% slow, the best is its third; one candidate failed
    rec("B", "k", 1.0, 11.0), rec("B", "k", 2.0, None), rec("B", "k", 3.0, 10.0), rec("B", "dense", 9.0, 30.0),
    # C: the model ranks backwards; dense is best, predicted last
    rec("C", "k", 1.0, 40.0), rec("C", "k", 2.0, 30.0), rec("C", "k", 3.0, 20.0), rec("C", "dense", 9.0, 10.0),
]


def test_evaluate_on_a_known_fixture():
    ev = evaluate(FIXTURE, top_k=2)
    assert ev["problems"] == 3
    assert ev["model"]["ratio_median"] == pytest.approx(1.1) and ev["model"]["ratio_p90"] == pytest.approx(4.0)
    assert ev["model"]["within_5"] == pytest.approx(1 / 3) and ev["model"]["within_15"] == pytest.approx(2 / 3)
    # fast (top 2 + dense): A 1.0, B 11/10 (the best was third), C 1.0 (dense measured)
    assert ev["fast"]["ratio_median"] == pytest.approx(1.0) and ev["fast"]["ratio_p90"] == pytest.approx(1.1)
    assert ev["fast"]["within_5"] == pytest.approx(2 / 3) and ev["fast"]["within_15"] == 1.0
    assert ev["fast"]["fraction_measured"] == pytest.approx(9 / 12)
    assert ev["best_in_top_k"] == pytest.approx(1 / 3)
    # Spearman per problem: A +1, B (valid 1, 3, dense: times 11, 10, 30) +0.5, C -1
    assert ev["spearman_median"] == pytest.approx(0.5) and ev["spearman_mean"] == pytest.approx(1 / 6)


def test_evaluate_counts_the_ties_fast_mode_measures():
    tied = [rec("T", "k", 1.0, 12.0), rec("T", "k", 2.0, 11.0), rec("T", "k", 2.001, 10.0), rec("T", "k", 3.0, 9.0),
            rec("T", "dense", 9.0, 20.0)]
    ev = evaluate(tied, top_k=2, top_frac=0.0)  # k 2, the 2.001 tie, dense: 4 of 5, the best of them 10 of 9
    assert ev["fast"]["fraction_measured"] == pytest.approx(4 / 5)
    assert ev["fast"]["ratio_median"] == pytest.approx(10 / 9)


def test_evaluate_scores_the_scaled_fast_mode():
    # 4 candidates per problem at top_frac 0.5: k = max(1, 2) = 2, as evaluate(top_k=2)
    scaled, fixed = evaluate(FIXTURE, top_k=1, top_frac=0.5), evaluate(FIXTURE, top_k=2, top_frac=0.0)
    assert scaled["fast"] == fixed["fast"]
    assert scaled["best_in_top_k"] == pytest.approx(1 / 3)  # still the model's top_k (1): only A
    assert evaluate(FIXTURE, top_k=1, top_frac=0.0)["fast"]["fraction_measured"] == pytest.approx(6 / 12)


def test_evaluate_reads_the_db_after_an_exhaustive_run(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite3", versions=VERSIONS)
    for n in (16, 256, 4096):
        cands, m = space(n=10, measured={5: 0.1e-6} if n == 4096 else None)
        tuner(m, mode="exhaustive", db=db).pick(problem(n=n), cands)
    ev = evaluate(db.results(), top_k=4)
    assert ev["problems"] == 3 and ev["fast"]["fraction_measured"] == pytest.approx(5 / 11)
    assert ev["best_in_top_k"] == pytest.approx(2 / 3)
    assert ev["spearman_median"] == pytest.approx(1.0)
    assert ev["model"]["ratio_p90"] == pytest.approx(1.1e-6 / 0.1e-6)
    assert math.isclose(ev["fast"]["within_5"], 2 / 3)


def test_a_problem_without_device_is_refused_by_a_db_tuner(tmp_path):
    cands, m = space()
    bare = Problem("linear", "block:64x64", 4096, 4096, 16, "float16", STATS)
    with pytest.raises(ValueError, match="device"):
        tuner(m, db=TuningDB(tmp_path / "t.sqlite3", versions=VERSIONS)).pick(bare, cands)
    assert tuner(m).pick(bare, cands).backend == "blocked"  # memory only: nothing can cross devices


# --- measurement helpers (the timing itself needs a GPU) ---------------------------------------------

def test_rotating_cycles_through_input_sets():
    from spartune.tune.measure import rotating, sets_to_rotate

    seen = []
    fn = rotating(lambda a, b: seen.append(a + b), [(1, 2), (10, 20), (100, 200)])
    for _ in range(4):
        fn()
    assert seen == [3, 30, 300, 3]
    assert sets_to_rotate(10e6, 50 * 2**20) == 11  # working set at least twice the L2
    assert sets_to_rotate(1e3, 50 * 2**20) == 16 and sets_to_rotate(1e9, 50 * 2**20) == 1
    with pytest.raises(ValueError):
        rotating(print, [])


def test_calibrate_needs_cuda():
    import torch

    from spartune.tune.device import calibrate

    if torch.cuda.is_available():
        pytest.skip("calibration runs on the GPU machine")
    with pytest.raises(RuntimeError, match="CUDA"):
        calibrate(0)


def test_backends_replaying_their_own_graphs_are_timed_as_called(monkeypatch):
    """cuSPARSELt copies x into a graph of its own and replays it; inside the measurer's capture it
    would run the bare product (~10 us less at decode) and win where its real call loses."""
    from spartune import dispatch
    from spartune.tune import measure

    seen = []
    monkeypatch.setattr(measure, "time_callable", lambda fn, graph=None, **timing: seen.append(graph) or 1e-5)
    problem = Problem("linear", "2:4", 4096, 4096, 16, "float16", STATS)
    library = {"dense": lambda: None, "cusparselt": lambda: None, "cusparselt_search": lambda: None}
    found = {c.backend: c for c in dispatch.candidates(problem, {}, library, device=H100)}
    assert {name: c.graph for name, c in found.items()} == {"dense": None, "cusparselt": False,
                                                          "cusparselt_search": False}
    for name in library:
        measure.measure_candidate(found[name])
    assert seen == [None, False, False]


def test_candidates_carry_a_rotated_timing_for_our_configs_and_dense_only():
    """What a rotated timing reads decides how many weight copies it needs: a config's DRAM bytes
    less x and y, dense's whole weight."""
    import torch

    from spartune import dispatch
    from spartune.formats import CSR

    A = CSR.from_dense(torch.randn(64, 128).masked_fill_(torch.rand(64, 128) < 0.9, 0))
    problem = dispatch.linear_problem(A, 8, "float16")
    ours = {f: (lambda cfg: None) for f in dispatch.registry.families("linear", A)[:1]}
    library = {"dense": lambda: None, "cusparse": lambda: None}
    asked = []
    cands = dispatch.candidates(problem, ours, library, device=H100,
                                rotated=lambda backend, config, nbytes: asked.append((backend, config, nbytes)) or 1.0)
    for c in cands:
        if c.rotated is not None:
            c.rotated()
    ours_asked = [a for a in asked if a[0] != "dense"]
    assert len(ours_asked) == sum(not c.library for c in cands) > 0
    io = 8 * (128 + 64) * 2  # x and y, which every copy shares
    assert all(nbytes == c.features.dram_bytes - io for (_, _, nbytes), c in zip(ours_asked, [c for c in cands if not c.library]))
    assert [a for a in asked if a[0] == "dense"] == [("dense", None, 64 * 128 * 2)]
    assert next(c for c in cands if c.backend == "cusparse").rotated is None
    assert all(c.rotated is None for c in dispatch.candidates(problem, ours, library, device=H100))


def test_a_rotation_that_needs_too_many_copies_or_too_much_memory_refuses_before_copying(monkeypatch):
    """A weight a call reads in 1 MB needs ~100 operands to fill twice a 50 MB L2; a big one whose
    copies would take over half the free memory: both raise before any copy is made."""
    import torch

    from spartune.tune import measure

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"L2_cache_size": 50 << 20}))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (1 << 30, 80 << 30))
    copied = []
    monkeypatch.setattr(measure, "_fresh_copy", lambda op: copied.append(op) or op)
    w = torch.zeros(1 << 19, dtype=torch.float16)  # 1 MiB
    with pytest.raises(measure.RotationUnfit, match="100 weights"):
        measure.rotated_replay(lambda w: None, w, w.numel() * 2, most=32)
    big = torch.zeros(1, dtype=torch.float16)  # (its size is what nbytes says: 600 MB, 2 operands)
    with pytest.raises(measure.RotationUnfit, match="half the free memory"):
        measure.rotated_replay(lambda w: None, big, 600e6, most=32)
    assert copied == []
