"""Benchmark reports: an aligned plain-text table, the JSON document, a PNG plot.

The JSON document (schema "spartune-bench/1"), as document.py starts it and timing.py or
correctness.py fill it:

    schema        "spartune-bench/1"
    kind          "timing" (a GPU run) | "correctness" (no CUDA: Triton interpreter, no times)
    suite         suite name ("" for user shapes)
    date          ISO 8601, UTC
    device        {name, cuda, capability, sms, memory_gib, l2_mib, count} (CPU: {name, cuda: false, triton_interpreter})
    versions      {python, torch, cuda, triton, numpy, matplotlib, spartune, kernels}
    rates         {matrix_flops, dram_bw, fma_flops, l2_bw (per second), source, dtype}, measured at the
                  start of the same run; null in a correctness run
    options       {dtype, op, mode, budget_s, seed, rotate, ...}
    tolerance     the rel err an output must stay under (1e-2 for fp16/bf16)
    implementations  the implementation keys of a timing run, in column order:
                  ours, dense, cusparse_csr, cusparse_bsr, torch_bsr, cusparselt
    problems      how many problems were asked for
    rows          one per problem run (below)
    skipped       [{problem, reason, ...}] (time budget)
    wall_s        seconds the run took
    notes         (optional) [str]

A timing row:
    problem, M, K, N, pattern, density (asked), achieved_density, nnz, items_cv, weights ("random" | "real:<tensor>")
    times         {impl: seconds | null}: null = it failed (reason in notes); absent = not applicable
    notes         {impl: "n/a: <why>" | "wrong result: ..."}
    rel_err       {impl: ||out - ref|| / ||ref|| against the dense product}
    speedup       {impl: dense seconds / impl seconds}
    floor_s, floor_cuda_core_s   DESIGN.md's floor on the tensor cores / the CUDA cores
    frac_floor    floor / ours (the CUDA-core floor when the picked kernel runs on the CUDA cores: floor_unit)
    picked        {backend, config (fields), label, tuner_seconds} | null
    tune_s        seconds of ours' first call (tuning, compiles included); sets (input sets rotated)
    ok            ours ran and its output matched
    error         (only when the problem itself could not be built)

A correctness row: problem, M, K, N (scaled down), pattern, density, weights,
    checks {key: {rel_err, ok} | {error, ok: false}} with keys "ours" (spartune.linear; adds picked)
    and "kernel:<family>[/<path>]" (the cost model's best config of that path; adds config), ok
    (every check that ran passed), failed (a check failed or spartune.linear raised).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

LABELS = {
    "ours": "spartune",
    "dense": "cuBLAS dense",
    "cusparse_csr": "cuSPARSE CSR",
    "cusparse_bsr": "cuSPARSE BSR",
    "torch_bsr": "torch BSR (Triton)",
    "cusparselt": "cuSPARSELt 2:4",
}
REQUIRED_KEYS = ("schema", "kind", "suite", "date", "device", "versions", "rates", "options", "implementations",
                 "rows", "skipped", "wall_s")
TIMING_ROW_KEYS = ("problem", "M", "K", "N", "pattern", "density", "times", "notes", "speedup", "ok")
CORRECTNESS_ROW_KEYS = ("problem", "M", "K", "N", "pattern", "density", "checks", "ok")


def validate(doc: dict) -> list[str]:
    """What is missing or malformed in a document (empty when it follows the schema)."""
    problems = [f"missing key {k!r}" for k in REQUIRED_KEYS if k not in doc]
    if doc.get("kind") not in ("timing", "correctness"):
        problems.append(f"kind must be 'timing' or 'correctness', got {doc.get('kind')!r}")
    row_keys = TIMING_ROW_KEYS if doc.get("kind") == "timing" else CORRECTNESS_ROW_KEYS
    for i, row in enumerate(doc.get("rows", [])):
        if "error" in row:
            continue
        problems += [f"row {i}: missing key {k!r}" for k in row_keys if k not in row]
    return problems


# --- formatting ----------------------------------------------------------------------------------------

def _us(seconds) -> str:
    if seconds is None:
        return "n/a"
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def _percent(x) -> str:
    if not x:
        return "n/a"
    return f"{100 * x:.0f}%" if x >= 0.095 else f"{100 * x:.2g}%"


def _align(header: list[str], rows: list[list[str]], left: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def impl_columns(doc: dict) -> list[str]:
    """Implementations that ran (or were tried) on at least one row, in the document's order."""
    seen = {k for r in doc.get("rows", []) for k in r.get("times", {})}
    order = doc.get("implementations") or list(LABELS)
    return [k for k in order if k in seen or k in ("ours", "dense")]


def header_line(doc: dict) -> str:
    dev = doc.get("device", {})
    parts = [dev.get("name", "?")]
    if dev.get("capability"):
        parts[0] += f" ({dev['capability']})"
    v = doc.get("versions", {})
    parts.append(f"torch {v.get('torch', '?')}, triton {v.get('triton', '?')}, spartune {v.get('spartune', '?')}")
    opts = doc.get("options", {})
    parts.append(f"{opts.get('dtype', '?')}, op {opts.get('op', 'linear')}, tuner {opts.get('mode') or 'default'}")
    r = doc.get("rates")
    if r:
        parts.append(f"matrix {r['matrix_flops'] / 1e12:.0f} TFLOP/s, DRAM {r['dram_bw'] / 1e12:.2f} TB/s")
    parts.append(str(doc.get("date", ""))[:10])
    return "; ".join(parts)


def format_table(doc: dict) -> str:
    """The whole report as text: a header line, the aligned table, footnotes."""
    if doc.get("kind") == "correctness":
        return format_correctness(doc)
    impls = impl_columns(doc)
    baselines = [k for k in impls if k not in ("ours", "dense")]
    header = ["problem", "shape MxKxN", "pattern", "density", "ours us", "dense us",
              *[f"{LABELS.get(k, k)} us" for k in baselines], "x dense", "floor", "picked"]
    rows, failures, reasons = [], 0, {}
    for r in doc.get("rows", []):
        shape = f"{r['M']}x{r['K']}x{r['N']}"
        if r.get("error"):
            rows.append([r["problem"], shape, r["pattern"], f"{r['density']:g}", "error", *[""] * (len(header) - 6),
                         r["error"][:40]])
            failures += 1
            continue
        times, notes, errs = r.get("times", {}), r.get("notes", {}), r.get("rel_err", {})
        tol = doc.get("tolerance", 1e-2)

        def cell(k):
            if k not in times:
                return "-"
            if k in notes:
                reasons.setdefault((k, notes[k]), 0)
                reasons[(k, notes[k])] += 1
            text = _us(times[k])
            if times[k] is not None and not (errs.get(k, 0.0) <= tol):
                text += "!"
            return text

        ours, dense = times.get("ours"), times.get("dense")
        if not r.get("ok"):
            failures += 1
        rows.append([
            r["problem"], shape, r["pattern"], f"{r['density']:g}", cell("ours"), cell("dense"),
            *[cell(k) for k in baselines],
            f"{dense / ours:.2f}" if ours and dense else "n/a",
            _percent(r.get("frac_floor")),
            (r.get("picked") or {}).get("label", "?") if ours else "",
        ])
    out = [header_line(doc), "", _align(header, rows, left={0, 1, 2, len(header) - 1})]
    foot = ["", "us: median microseconds per call; x dense: cuBLAS dense time / ours; floor: DESIGN.md's floor / ours; "
                "'-': not applicable; '!': output differs from the dense product"]
    for (k, note), count in sorted(reasons.items()):
        foot.append(f"  {LABELS.get(k, k)} ({count} row{'s' if count > 1 else ''}): {note}")
    if doc.get("skipped"):
        foot.append(f"{len(doc['skipped'])} problems not run: {doc['skipped'][0]['reason']}")
    if failures:
        foot.append(f"{failures} problem(s) where ours failed or gave a wrong result")
    return "\n".join(out + foot)


def format_correctness(doc: dict) -> str:
    header = ["problem", "shape MxKxN", "pattern", "density", "spartune.linear", "picked", "kernels", "status"]
    rows = []
    for r in doc.get("rows", []):
        shape = f"{r['M']}x{r['K']}x{r['N']}"
        if r.get("error"):
            rows.append([r["problem"], shape, r["pattern"], f"{r['density']:g}", "", "", "", f"FAILED: {r['error'][:50]}"])
            continue
        checks = r.get("checks", {})
        ours = checks.get("ours", {})
        ours_cell = f"{ours['rel_err']:.1e}" if "rel_err" in ours else ("n/a" if ours else "-")
        kernel_cells = []
        for label, c in checks.items():
            if label == "ours":
                continue
            name = label.removeprefix("kernel:")
            kernel_cells.append(f"{name} {c['rel_err']:.1e}" if "rel_err" in c else f"{name} n/a")
        status = "ok" if r.get("ok") else ("FAILED" if r.get("failed") else "not checked")
        rows.append([r["problem"], shape, r["pattern"], f"{r['density']:g}", ours_cell,
                     (ours.get("picked") or {}).get("label", ""), "; ".join(kernel_cells) or "-", status])
    lines = [header_line(doc), "correctness only (no CUDA device): Triton interpreter, scaled-down shapes, "
             f"rel err against spartune.reference (tolerance {doc.get('tolerance', 1e-2):g})", "",
             _align(header, rows, left={0, 1, 2, 5, 6, 7})]
    errors = {}
    for r in doc.get("rows", []):
        for label, c in r.get("checks", {}).items():
            if "error" in c:
                errors.setdefault(c["error"], []).append(f"{r['problem']} {label}")
    for err, where in errors.items():
        lines.append(f"  n/a ({len(where)}x, e.g. {where[0]}): {err}")
    for note in doc.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


# --- files ----------------------------------------------------------------------------------------

def _clean(obj):
    """JSON has no NaN or infinity: they become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(doc: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(doc), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def write_table(doc: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_table(doc) + "\n")
    return path


def plot(doc: dict, path) -> Path | None:
    """Speedup over dense against sparsity: one panel per shape (problem and N), one line per
    implementation and pattern (colour: implementation; marker: pattern), dense = 1. None when
    the document has no timings; ImportError when matplotlib is missing."""
    rows = [r for r in doc.get("rows", []) if r.get("speedup")]
    if doc.get("kind") != "timing" or not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels: dict[tuple, list] = {}
    for r in rows:
        panels.setdefault((r["problem"], r["M"], r["K"], r["N"]), []).append(r)
    impls = [k for k in impl_columns(doc) if k != "dense" and any(r["speedup"].get(k) for r in rows)]
    patterns = sorted({r["pattern"] for r in rows})
    colors = {k: c for k, c in zip(LABELS, ("#d62728", "#555555", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"))}
    markers = dict(zip(patterns, "osD^v<>ph*"))
    n = len(panels)
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.3 * nrows + 0.8), squeeze=False)
    lo = min(100 * (1 - r["density"]) for r in rows)
    xlim = (max(0.0, min(lo - 5, 45.0)), 100.0)
    for ax, ((name, m, k, nn), prow) in zip(axes.flat, panels.items()):
        for impl in impls:
            for pat in patterns:
                pts = sorted((100 * (1 - r["density"]), r["speedup"][impl]) for r in prow
                             if r["pattern"] == pat and r["speedup"].get(impl))
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker=markers[pat], color=colors.get(impl, "black"), lw=1.5 if impl == "ours" else 1,
                            ls="-" if impl == "ours" else "--", ms=5)
        ax.axhline(1.0, color=colors["dense"], lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlim(*xlim)
        ax.set_title(f"{name}\n{m}x{k}, N={nn}", fontsize=9)
        ax.set_xlabel("sparsity %", fontsize=8)
        ax.set_ylabel("speedup over cuBLAS dense", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.25)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles = [Line2D([], [], color=colors.get(k, "black"), lw=2, label=LABELS.get(k, k)) for k in impls]
    handles.append(Line2D([], [], color=colors["dense"], ls=":", label="cuBLAS dense (= 1)"))
    handles += [Line2D([], [], color="black", marker=markers[p], ls="", label=p) for p in patterns]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.suptitle(f"{doc.get('suite') or 'custom'}: {header_line(doc)}", fontsize=8, y=0.005, va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1 - 0.6 / (3.3 * nrows + 0.8)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(doc: dict, out_dir, stem: str) -> dict:
    """table (.txt), JSON and plot (.png) under out_dir; {'table', 'json', 'plot'} -> path
    (plot: None when there is nothing to plot; a str saying why when it could not be drawn)."""
    out_dir = Path(out_dir)
    paths = {"table": write_table(doc, out_dir / f"{stem}.txt"), "json": write_json(doc, out_dir / f"{stem}.json")}
    try:
        paths["plot"] = plot(doc, out_dir / f"{stem}.png")
    except ImportError:
        paths["plot"] = "matplotlib is not installed (pip install 'spartune[bench]'): no plot"
    return paths
