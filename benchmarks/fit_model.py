"""Re-score the cost model on recorded exhaustive measurements (no GPU needed).

    python benchmarks/fit_model.py [--data DIR] [--top-k 4] [--top-frac 0.06] [--split blocks|parity]
                                   [--per-problem] [--grid]

Needs the package importable (`pip install -e .`, or PYTHONPATH=$PWD from the repository root).

Loads DIR/eval_tuner_records.json and DIR/eval_tuner.json (benchmarks/eval_tuner.py's output;
default benchmarks/data/h100-2026-11-22-run6, see its README.md), rebuilds every problem,
recomputes each candidate's features with its family's CURRENT features() (the stored ones go
stale when a features() changes; how many differ is printed) and its prediction with the
CURRENT model.predict / model.dense_gemm_seconds on the device spec calibrated in that run, then
prints tuner.evaluate()'s metrics: model mode (picked / best, within 15%), fast mode (the
model's fast_measured set, dense included, within 5%), best in the model's top k, Spearman
rho per problem. These are offline numbers on recorded times, not a new GPU run.

Two views, because of how runs timed candidates:
  timed    only rows timed by measure.time_callable (`how` bench/graph), problems with >= 2.
  recorded every row as stored, including `quick` rows: a candidate already 3x slower than the
           best so far timed by ONE call. In run6 (and later) that call is GPU time only (the
           host enqueues behind a GPU sleep), so `--quick-rows gpu` (default there) counts them
           as timed; in the first run (commit 03b2126, benchmarks/data/, `--quick-rows host`) they
           include the host launch (45-300 us) and measure Python, not the GPU.
Both on the two halves of the suite (fit constants on `train`, judge on `test`) and on all.
`--grid` scans the fitted constants (module constants of model.py and the kernels' features(),
DeviceSpec latencies), scores each on the train half only and shows the same rows on test.
`--split blocks` (default): problem i is train when (i // 4) is even; the suite cycles the four
formats with period 4, so both halves hold every format and every N. `--split parity` (i even)
would put block:64x64 + shfl in one half and block:32x32 + csr in the other.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

from spartune.formats import FormatStats
from spartune.kernels import registry
from spartune.tune import model
from spartune.tune.device import DeviceSpec
from spartune.tune.model import dense_gemm_seconds, predict
from spartune.tune.problem import Epilogue, KernelFeatures, Problem
from spartune.tune.tuner import TOP_FRAC, TOP_K, evaluate, fast_measured

TIMED = ("bench", "graph")
DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "h100-2026-11-22-run6"


def load(data: Path):
    summary = json.loads((data / "eval_tuner.json").read_text())
    records = json.loads((data / "eval_tuner_records.json").read_text())
    # model constants (mem_latency_s) take this version's value, as when the tuner loads a stored calibration
    spec = DeviceSpec.from_json(json.dumps(summary["device_spec"]))
    problems = {}
    for p in summary["problems"]:
        if "spec" not in p:
            continue
        s = p["spec"]
        layout = "spmm" if s["fmt"].startswith("shfl") else "linear"  # eval_tuner's Spec.spmm_layout
        problems[p["id"]] = Problem("linear", p["fmt"], s["m"], s["k"], s["n"], "float16", FormatStats(**p["stats"]),
                                    Epilogue(), summary.get("device", ""), layout)
    return summary, records, spec, problems


def family(backend: str):
    """The kernel family's module of a recorded backend; None for a library backend (dense)."""
    f = registry.by_name(backend)
    return f.module if f else None


def rescore(records, spec: DeviceSpec, problems: dict, copy: bool, warm: bool) -> tuple[list[dict], int]:
    """Records with 'predicted' recomputed by the current features() and model; also returns
    how many stored features differed from the recomputed ones. `copy`: the recorded dense
    backend copied its result into `out` (true of runs before commit fe55e6a). `warm`: the
    run's graph replays found the L2 as the previous call left it (runs 6 and 7; see
    warm_replays)."""
    out, stale, failed = [], 0, {}
    with replays_warm(warm):
        for r in records:
            row, differs = _rescored(r, spec, problems[r["problem"]], copy, failed)
            out.append(row)
            stale += differs
    for backend, error in failed.items():
        print(f"warning: {backend}: features() failed on stored configs, stored features used ({error})")
    return out, stale


def warm_replays(summary: dict) -> bool:
    """Whether a recorded run replayed short calls without evicting the L2 (runs 6 and 7 did;
    eval_tuner.py records 'replay_evicts_l2' since)."""
    return not summary.get("replay_evicts_l2", False)


@contextlib.contextmanager
def replays_warm(warm: bool):
    """Predict as the recorded run's measurer timed (model.REPLAY_WARM), restored on exit."""
    saved = model.REPLAY_WARM
    model.REPLAY_WARM = warm
    try:
        yield
    finally:
        model.REPLAY_WARM = saved


def _rescored(r: dict, spec: DeviceSpec, p: Problem, copy, failed: dict) -> tuple[dict, bool]:
    mod = family(r["backend"])
    if mod is None:  # the dense library backend; in runs before fe55e6a it always copied into `out`
        return {**r, "predicted": dense_gemm_seconds(p.m, p.k, p.n, p.dtype, spec, layout=p.layout, out_copy=copy)}, False
    try:
        f = mod.features(p, mod.Config(**r["config"]))
    except Exception as e:  # the family's Config or features() moved on: keep the stored features
        f = KernelFeatures(**r["features"])
        failed[r["backend"]] = f"{type(e).__name__}: {e}"
    differs = r.get("features") is not None and dataclasses.asdict(f) != r["features"]
    return {**r, "predicted": predict(f, spec, p.dtype)}, differs


def halves(problems: dict, split: str) -> dict:
    idx = {pid: int(pid.lstrip("p")) for pid in problems}
    train = {pid for pid, i in idx.items() if (i % 2 == 0 if split == "parity" else (i // 4) % 2 == 0)}
    return {"train": train, "test": set(problems) - train, "all": set(problems)}


def timed_only(rows: list[dict]) -> list[dict]:
    """Rows timed on the GPU (TIMED: set by --quick-rows), problems with at least two of them."""
    kept = [r for r in rows if r.get("how") in TIMED and r["seconds"] is not None]
    count = collections.Counter(r["problem"] for r in kept)
    return [r for r in kept if count[r["problem"]] >= 2]


def picks(rows: list[dict], top_k: int, top_frac: float = 0.0) -> dict:
    """Per problem, as evaluate() picks: model mode (ratio, pick GPU-timed) and fast mode (ratio,
    every row it measured GPU-timed)."""
    groups = collections.defaultdict(list)
    for r in rows:
        groups[r["problem"]].append(r)
    out = {}
    for pid, rs in groups.items():
        ok = [r for r in rs if r["seconds"] is not None]
        if not ok:
            continue
        best = min(r["seconds"] for r in ok)
        order = sorted(rs, key=lambda r: math.inf if r["predicted"] is None else r["predicted"])
        picked = fast_measured([math.inf if r["predicted"] is None else r["predicted"] for r in order],
                               list(range(len(order))), top_k, top_frac, lambda i: order[i]["backend"] == "dense")
        chosen = [order[i] for i in picked if order[i]["seconds"] is not None]
        pick = next(r for r in order if r["seconds"] is not None)
        fast = min(r["seconds"] for r in chosen) if chosen else math.inf
        out[pid] = ((pick["seconds"] / best, pick.get("how") in TIMED),
                    (fast / best, all(r.get("how") in TIMED for r in chosen)))
    return out


def line(name: str, ev: dict) -> str:
    m, f = ev["model"], ev["fast"]
    rho = ev["spearman_median"]
    return (f"{name:<16} n={ev['problems']:>2}  model <=15%: {m['within_15']:.2f} (median {m['ratio_median']:.2f}, "
            f"p90 {m['ratio_p90']:.2f})  fast <=5%: {f['within_5']:.2f} (p90 {f['ratio_p90']:.3f}, measured "
            f"{f['fraction_measured']:.3f})  best in top-{ev['top_k']}: {ev['best_in_top_k']:.2f}  "
            f"rho median {'-' if rho is None else f'{rho:.2f}'}")


def _errors(rows: list[dict], problems: dict) -> dict:
    """log(predicted / measured) on GPU-timed rows, by format: dense, and our five fastest per problem."""
    by = collections.defaultdict(list)
    groups = collections.defaultdict(list)
    for r in timed_only(rows):
        groups[r["problem"]].append(r)
    for pid, rs in groups.items():
        fmt = problems[pid].fmt.split(":")[0]
        by["dense"] += [math.log(r["predicted"] / r["seconds"]) for r in rs if r["backend"] == "dense"]
        ours = sorted((r for r in rs if r["backend"] != "dense"), key=lambda r: r["seconds"])[:5]
        by[fmt] += [math.log(r["predicted"] / r["seconds"]) for r in ours if math.isfinite(r["predicted"])]
    return by


def accuracy(rows: list[dict], problems: dict) -> str:
    return "  ".join(f"{k} {math.exp(np.median(np.abs(v))):.2f}x (bias {math.exp(np.median(v)):.2f})"
                     for k, v in sorted(_errors(rows, problems).items()))


def median_error(rows: list[dict], problems: dict) -> float:
    """Median |log(predicted / measured)| over dense and our five fastest per problem (GPU-timed)."""
    return float(np.median(np.abs(np.concatenate([v for v in _errors(rows, problems).values()]))))


# The constants --grid scans: (module or "spec", name, values). The first value is not special;
# the current one is marked in the output.
def _grid_axes():
    from spartune.kernels import spmm_blocked
    from spartune.tune import model

    return [
        ("spec", "mem_latency_s", (0.8e-6, 1.0e-6, 1.2e-6)),
        ("spec", "l2_latency_s", (0.3e-6, 0.35e-6, 0.45e-6)),
        (model, "L2_KEEP", ((0.4, 0.8), (0.5, 0.85), (0.5, 1.0))),
        (model, "OVERLAP_LOSS", (0.15, 0.3, 0.5)),
        (spmm_blocked, "TMA_EXTRA_TRIP", (0.25, 0.5)),
        (model, "WRITEBACK_SHARE", (0.0, 0.5, 1.0)),
    ]


def grid(records, spec: DeviceSpec, problems: dict, sets: dict, top_k: int, top_frac: float, copy,
         limit: int = 12, *, warm: bool) -> None:
    """Score every combination of the fitted constants on the train half (recorded view, the
    tuner's fast-mode rule); the same rows on test are shown, never used to choose."""
    axes = _grid_axes()
    saved = {(id(m), n): getattr(m, n) for m, n, _ in axes if m != "spec"}
    current = tuple(getattr(spec, n) if m == "spec" else getattr(m, n) for m, n, _ in axes)
    rows_out = []
    try:
        for values in itertools.product(*(v for _, _, v in axes)):
            s = spec
            for (m, n, _), v in zip(axes, values):
                if m == "spec":
                    s = dataclasses.replace(s, **{n: v})
                else:
                    setattr(m, n, v)
            new, _ = rescore(records, s, problems, copy, warm)
            res = {}
            for half in ("train", "test"):
                sub = [r for r in new if r["problem"] in sets[half]]
                ev = evaluate(sub, top_k=top_k, top_frac=top_frac, library_backends=("dense",))
                res[half] = (ev["model"]["within_15"], ev["fast"]["within_5"], ev["best_in_top_k"],
                             median_error(sub, problems))
            rows_out.append((values, res))
    finally:
        for m, n, _ in axes:
            if m != "spec":
                setattr(m, n, saved[(id(m), n)])
    # train score: model-mode and fast-mode hit rates and top-k, then the smaller median error
    rows_out.sort(key=lambda x: (-(x[1]["train"][0] + x[1]["train"][1] + x[1]["train"][2]), x[1]["train"][3]))
    print(f"\n== grid ({len(rows_out)} combinations) on the train half; sorted by train model15 + fast5 + top-k, "
          "then median error; * = current ==")
    print(" | ".join(n for _, n, _ in axes) + " | train model15 fast5 topk err | test model15 fast5 topk err")
    for values, res in rows_out[:limit]:
        tr, te = res["train"], res["test"]
        mark = "*" if values == current else " "
        print(f"{mark} {' '.join(str(v) for v in values)} | {tr[0]:.2f} {tr[1]:.2f} {tr[2]:.2f} {tr[3]:.3f} | "
              f"{te[0]:.2f} {te[1]:.2f} {te[2]:.2f} {te[3]:.3f}")
    cur = next((r for r in rows_out if r[0] == current), None)
    if cur is not None:
        print(f"current: rank {rows_out.index(cur) + 1} of {len(rows_out)} on train")


def main(argv=None) -> int:
    global TIMED
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--top-k", type=int, default=TOP_K)
    ap.add_argument("--top-frac", type=float, default=TOP_FRAC,
                    help="fast mode measures max(top-k, top-frac x candidates), as the Tuner (0: exactly top-k)")
    ap.add_argument("--split", choices=("blocks", "parity"), default="blocks")
    ap.add_argument("--per-problem", action="store_true", help="one line per problem (recorded view)")
    ap.add_argument("--grid", action="store_true", help="scan the fitted constants on the train half")
    ap.add_argument("--dense-copy", choices=("always", "auto"), default="auto",
                    help="the recorded dense backend copied its result into out: always (runs before commit "
                         "fe55e6a: the first run, at commit 03b2126 in benchmarks/data/) or only into a "
                         "transposed out (auto, the default: run6 and later, where F.linear on x = X.T returns "
                         "a transposed result)")
    ap.add_argument("--quick-rows", choices=("host", "gpu"), default="gpu",
                    help="how the run timed `quick` rows: host-bound (the first run) or GPU time only "
                         "(gpu, the default: run6 and later, counted as timed)")
    args = ap.parse_args(argv)

    data = Path(args.data).resolve()
    copy = True if args.dense_copy == "always" else None
    if args.quick_rows == "gpu":
        TIMED = ("bench", "graph", "quick")
    summary, records, spec, problems = load(data)
    records = [r for r in records if r["problem"] in problems]
    new, stale = rescore(records, spec, problems, copy, warm_replays(summary))
    sets = halves(problems, args.split)
    fast = dict(top_k=args.top_k, top_frac=args.top_frac)
    print(f"{len(problems)} problems, {len(records)} candidates ({sum(r.get('how') in TIMED for r in records)} "
          f"GPU-timed, {sum(r.get('how') == 'quick' for r in records)} quick); device {spec.name}; "
          f"stored features stale for {stale} candidates (recomputed); fast mode: max({args.top_k}, "
          f"{args.top_frac} x candidates)")
    for label, rows in (("stored predictions (the run's model)", records), ("current model", new)):
        print(f"\n== {label} ==")
        views = (("timed", timed_only(rows)), ("recorded", rows)) if "quick" not in TIMED else (("recorded", rows),)
        for view, rs in views:
            for half in ("train", "test", "all"):
                sub = [r for r in rs if r["problem"] in sets[half]]
                if any(r["seconds"] is not None for r in sub):
                    print(line(f"{view} {half}", evaluate(sub, **fast, library_backends=("dense",))))
        got = picks(rows, **fast)
        if "quick" not in TIMED:
            undecided = sorted(pid for pid, ((ratio, timed), _) in got.items() if ratio > 1.15 and not timed)
            print(f"recorded: model-mode losses on a quick-timed pick (undecidable): {len(undecided)} {' '.join(undecided)}")
            undecided = sorted(pid for pid, (_, (ratio, timed)) in got.items() if ratio > 1.05 and not timed)
            print(f"recorded: fast-mode losses with quick-timed rows among those measured (undecidable): "
                  f"{len(undecided)} {' '.join(undecided)}")
        print("model-mode losses (>15%): " + " ".join(f"{pid}:{m[0]:.2f}" for pid, (m, _) in sorted(got.items())
                                                      if m[0] > 1.15))
        print("fast-mode losses (>5%):   " + " ".join(f"{pid}:{f[0]:.2f}" for pid, (_, f) in sorted(got.items())
                                                      if f[0] > 1.05))
        ev_t = timed_only(rows)
        tops = {k: evaluate(ev_t, top_k=k, top_frac=0.0)["best_in_top_k"] for k in (1, 2, 4, 6, 8, 12)}
        print("timed: best in top-k " + " ".join(f"k={k}:{v:.2f}" for k, v in tops.items()))
        by_fmt = collections.defaultdict(lambda: [0, 0])
        for pid, ((ratio, _), _) in picks(ev_t, 1).items():
            g = by_fmt[problems[pid].fmt]
            g[0] += 1
            g[1] += ratio <= 1.15
        print("timed: model <=15% by format: " + ", ".join(f"{f} {g[1]}/{g[0]}" for f, g in sorted(by_fmt.items())))
        print("timed: prediction error (median factor): " + accuracy(rows, problems))

    if args.grid:
        grid(records, spec, problems, sets, args.top_k, args.top_frac, copy, warm=warm_replays(summary))
    if args.per_problem:
        print("\n== per problem, current model ==")
        groups = collections.defaultdict(list)
        for r in new:
            if r["seconds"] is not None:
                groups[r["problem"]].append(r)
        for pid in sorted(groups, key=lambda p: int(p.lstrip("p"))):
            rs, p = groups[pid], problems[pid]
            best = min(rs, key=lambda r: r["seconds"])
            order = sorted(rs, key=lambda r: r["predicted"])
            pick = order[0]
            half = "train" if pid in sets["train"] else "test"
            print(f"{pid} {half:<5} {p.fmt:<11} {p.m}x{p.k} n={p.n:<4} d={p.stats.density:.2f}  {len(rs):>3} ran  "
                  f"best {best['backend']} {best['seconds'] * 1e6:.1f}us (pred {best['predicted'] * 1e6:.1f})  "
                  f"pick {pick['backend']} {pick['seconds'] * 1e6:.1f}us (pred {pick['predicted'] * 1e6:.1f})  "
                  f"best's rank {order.index(best)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
