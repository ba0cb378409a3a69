"""The end-to-end suite (`spartune bench --suite e2e`): whole models, dense against sparsified,
eager and torch.compile, the way a user runs them.

Workloads: a BERT-base encoder (batch 8 x 512 and 32 x 128), a Llama-7B decoder layer at
prefill 2048 and at decode N = 1 and 8 (static KV cache, every variant replayed from a CUDA
graph captured by hand, as serving engines do), MobileNetV1 at batch 64 (batch norm folded,
channels last). Every pattern at every sparsity where it applies (N:M patterns at their own).

A time is the median over a few repeats of back-to-back calls, so host time counts: it is
what the user waits for. Speedups compare like with like (compiled sparse against compiled
dense). Each row also records weight memory (the state dict's bytes), the first sparse call
(tuning plus kernel compilation, against an empty tuning DB the first time a shape is seen),
and how far the compiled output is from the eager one.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .. import dispatch
from ..nn import resident_bytes, sparsify
from ..tune.measure import capture
from . import bert, models

PATTERNS = ("block:64", "csr", "shfl:64", "2:4", "64:2:8")
SPARSITIES = (0.5, 0.75, 0.9)
QUICK = (("block:64", 0.9),)  # the must-show point of every model

DECODE_CONTEXT = 2048  # tokens already in the KV cache when decoding


@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable[[torch.dtype, str, bool], tuple[nn.Module, Callable[[nn.Module], Callable]]]
    graphed: bool = False  # every variant replayed from a CUDA graph (decode)


def _bert(batch: int, tokens: int):
    def build(dtype, device, tiny):
        c = bert.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256) if tiny \
            else bert.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        b, t = (2, 16) if tiny else (batch, tokens)
        model = bert.BertEncoder(c).to(device, dtype).eval()
        ids = torch.randint(0, c.vocab_size, (b, t), device=device)
        return model, lambda m: (lambda: m(ids))
    return build


def _llama(tokens: int, decode: bool):
    def build(dtype, device, tiny):
        hidden, inter, heads = (64, 160, 4) if tiny else (4096, 11008, 32)
        n, context = (min(tokens, 8), 16) if tiny else (tokens, DECODE_CONTEXT)
        model = models.LlamaDecoderLayer(hidden, inter, heads).to(device, dtype).eval()
        x = torch.randn(1, n, hidden, device=device, dtype=dtype)
        if not decode:
            positions = torch.arange(n, device=device)
            return model, lambda m: (lambda: m(x, positions))
        cache = models.KVCache(1, heads, context + n, hidden // heads, dtype=dtype, device=device)
        cache.k.normal_()
        cache.v.normal_()
        positions = torch.arange(context, context + n, device=device)
        return model, lambda m: (lambda: m(x, positions, cache))
    return build


def _mobilenet(batch: int):
    def build(dtype, device, tiny):
        model = models.mobilenet_v1(num_classes=10 if tiny else 1000, width=0.25 if tiny else 1.0).eval()
        model = models.fold_batch_norms(model).to(device, dtype).to(memory_format=torch.channels_last)
        b, side = (2, 32) if tiny else (batch, 224)
        x = torch.randn(b, 3, side, side, device=device, dtype=dtype).to(memory_format=torch.channels_last)
        return model, lambda m: (lambda: m(x))
    return build


WORKLOADS = (
    Workload("bert-base 8x512", _bert(8, 512)),
    Workload("bert-base 32x128", _bert(32, 128)),
    Workload("llama7b-layer prefill 2048", _llama(2048, decode=False)),
    Workload("llama7b-layer decode N=1", _llama(1, decode=True), graphed=True),
    Workload("llama7b-layer decode N=8", _llama(8, decode=True), graphed=True),
    Workload("mobilenet-v1 batch 64", _mobilenet(64)),
)


def points(patterns=None, sparsities=None, quick: bool = False) -> list[tuple[str, float]]:
    """(pattern, sparsity) pairs: N:M patterns once, at their own sparsity."""
    from ..prune.patterns import parse_pattern

    if quick:
        return list(QUICK)
    bad = [s for s in sparsities or () if not 0.0 < s < 1.0]
    if bad:
        raise ValueError(f"sparsities must lie in (0, 1) (fraction of entries removed), got {bad}")
    out = []
    for p in patterns or PATTERNS:
        fixed = parse_pattern(p).fixed_density
        out += [(p, 1 - fixed)] if fixed is not None else [(p, s) for s in sparsities or SPARSITIES]
    return list(dict.fromkeys(out))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the state dict (what is stored and loaded), each storage counted once."""
    seen = {}
    for t in model.state_dict().values():
        if torch.is_tensor(t):
            seen[(t.device, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device: str, *, target_s: float = 0.15, repeats: int = 5) -> float:
    """Median ms per call over `repeats` runs of back-to-back calls (about target_s each)."""
    fn()
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    calls = max(1, min(200, round(target_s / max(time.perf_counter() - t, 1e-6))))
    samples = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(samples)


def time_in_turns(fns, device: str, *, target_s: float = 0.15, rounds: int = 5) -> list[list[float]]:
    """ms per call of each of `fns`, measured in turns (round r times each once): a host's slow
    phases last seconds, so a sparse model timed minutes after its dense baseline can move by
    ~20% with no change of its own (LOG, sessions 28-29); in turns, each round's ratio holds."""
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            samples[i].append(time_ms(fn, device, target_s=target_s, repeats=1))
    return samples


def captured(fn):
    """fn captured in one CUDA graph (after warm-up calls on the capture stream); its replay."""
    graph, out = capture(fn, warmups=3)
    return lambda: (graph.replay(), out)[1]


def _variants(model, call, workload: Workload, device: str, compile: bool) -> dict[str, Callable]:
    """eager and compiled; with CUDA graphs too: the decode workloads capture both by hand (as
    serving engines do) beside the plain calls, the others add torch.compile's mode="reduce-overhead"."""
    fns = {"eager": call(model)}
    cuda = torch.device(device).type == "cuda"
    if compile:
        torch._dynamo.reset()  # each model compiles afresh (no guard churn across models)
        fns["compile"] = call(torch.compile(model))
        if cuda and not workload.graphed:
            graphed = call(torch.compile(model, mode="reduce-overhead"))
            fns["compile+graphs"] = lambda: (torch.compiler.cudagraph_mark_step_begin(), graphed())[1]
    if workload.graphed and cuda:
        fns = {**fns, **{f"{k}+graph": captured(f) for k, f in fns.items()}}
    return fns


def _relative_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_workload(workload: Workload, pts, *, dtype=torch.float16, device="cuda", compile: bool = True,
                 tiny: bool = False, progress=print, deadline: float = math.inf) -> list[dict]:
    """Rows for one workload: dense, then each (pattern, sparsity), each variant; no sparse
    model starts after `deadline` (time.perf_counter())."""
    torch.manual_seed(0)
    dense, call = workload.build(dtype, device, tiny)
    rows, base = [], {}
    with torch.no_grad():
        for pattern, sparsity in [("dense", 0.0), *pts]:
            if pattern != "dense" and time.perf_counter() > deadline:
                progress(f"time budget spent: {workload.name} {pattern} {sparsity:.0%} and later points not run")
                break
            name = f"{workload.name} (tiny)" if tiny else workload.name  # (a scaled-down model: not its timings)
            row = dict(workload=name, pattern=pattern, sparsity=sparsity, dtype=str(dtype).split(".")[-1])
            try:
                rows += _run_point(dense, call, workload, row, base, device, compile, progress)
            except Exception as e:  # noqa: BLE001 - a model that fails is a result to report, not the end of the run
                if pattern == "dense":
                    raise
                rows.append({**row, "error": f"{type(e).__name__}: {e}"})
                progress(f"{workload.name} {pattern} {sparsity:.0%}: {rows[-1]['error']}")
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _run_point(dense, call, workload, row, base, device, compile, progress) -> list[dict]:
    model = dense
    if row["pattern"] != "dense":
        model = copy.deepcopy(dense)
        t = time.perf_counter()
        reports = sparsify(model, row["pattern"], row["sparsity"])
        row["sparsify_s"] = time.perf_counter() - t
        row["sparse_layers"] = sum(r.pattern is not None for r in reports.values())
        row["layers"] = len(reports)
    t = time.perf_counter()
    eager_out = call(model)()
    _sync(device)
    row["first_call_s"] = time.perf_counter() - t  # sparse: tuning and kernel compilation
    row["weight_bytes"] = weight_bytes(model)
    rows = []
    cuda = torch.device(device).type == "cuda"
    for variant, fn in _variants(model, call, workload, device, compile).items():
        t = time.perf_counter()
        diff = _relative_diff(fn(), eager_out)  # (compiles, captures) before the next call overwrites it
        _sync(device)
        setup_s = time.perf_counter() - t
        target_s = 0.15 if cuda else 0.01
        r = {**row, "variant": variant, "setup_s": setup_s, "diff_vs_eager": diff}
        if row["pattern"] == "dense" or variant not in base:
            r["ms"] = time_ms(fn, device, target_s=target_s, repeats=5 if cuda else 2)
        else:  # in turns with the dense model's same variant: the speedup is the median round's
            dense_ms, ms = time_in_turns([base[variant][3], fn], device, target_s=target_s, rounds=5 if cuda else 2)
            r.update(ms=statistics.median(ms), dense_ms=statistics.median(dense_ms),
                     speedup=statistics.median(d / m for d, m in zip(dense_ms, ms)))
        r["_fn"] = fn
        rows.append(r)
    # after every variant's calls were tuned: what the device holds for the weights, the kernels'
    # layouts and the chosen libraries' copies included (the state_dict counts the canonical tensors)
    resident = resident_bytes(model)
    for r in rows:
        r["resident_bytes"] = resident
        fn = r.pop("_fn")
        if row["pattern"] == "dense":  # (its calls kept: the sparse models' variants are timed in turns with them)
            base[r["variant"]] = (r["ms"], row["weight_bytes"], resident, fn)
        elif r["variant"] in base:
            _, weight, held, _ = base[r["variant"]]
            r.update(memory_ratio=row["weight_bytes"] / weight, resident_ratio=resident / held)
        progress(_line(r))
    return rows


def _line(r: dict) -> str:
    what = "dense" if r["pattern"] == "dense" else f"{r['pattern']} {r['sparsity']:.0%}"
    tail = f" x{r['speedup']:.2f}" if "speedup" in r else ""
    return f"{r['workload']:<28} {what:<14} {r['variant']:<8} {r['ms']:9.3f} ms{tail}"


def run(workloads=WORKLOADS, pts=None, *, dtype=torch.float16, device="cuda", compile: bool = True,
        tiny: bool = False, budget_s: float | None = None, progress=print, checkpoint=None) -> dict:
    """Every workload at every point; a document (rows plus the setting) for table/JSON/plot.
    With budget_s, no model starts after that many seconds."""
    pts = points() if pts is None else pts
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the e2e suite runs float16, bfloat16 or float32 models, got {dtype}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the e2e suite was asked for CUDA but no CUDA device is available")
    doc = dict(kind="e2e", device=torch.cuda.get_device_name() if device == "cuda" else device,
               torch=torch.__version__, dtype=str(dtype).split(".")[-1], compile=compile,
               memory_policy=dispatch.memory_policy(), tiny=tiny, rows=[])
    deadline = time.perf_counter() + (math.inf if budget_s is None else budget_s)
    for w in workloads:
        if time.perf_counter() > deadline:
            progress(f"time budget spent: {w.name} and later workloads not run")
            break
        doc["rows"] += run_workload(w, pts, dtype=dtype, device=device, compile=compile, tiny=tiny, progress=progress,
                                    deadline=deadline)
        if checkpoint:
            checkpoint(doc)
    return doc


def table(doc: dict) -> str:
    """Markdown: one line per workload and sparse model; ms and speedup per variant."""
    rows = [r for r in doc["rows"] if "ms" in r]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    head = ["workload", "pattern", "sparsity"] + [f"{v} ms" for v in variants] + [f"x dense {v}" for v in variants] \
        + ["weight MB", "resident MB", "first call s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple, dict] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["pattern"], r["sparsity"]), {})[r["variant"]] = r
    for (w, p, s), by in groups.items():
        any_row = next(iter(by.values()))
        cells = [w, p, "" if p == "dense" else f"{s:.0%}"]
        cells += [f"{by[v]['ms']:.3f}" if v in by else "" for v in variants]
        cells += [f"{by[v]['speedup']:.2f}" if v in by and "speedup" in by[v] else "" for v in variants]
        cells += [f"{any_row['weight_bytes'] / 1e6:.1f}", f"{any_row['resident_bytes'] / 1e6:.1f}",
                  f"{any_row['first_call_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['pattern']} | {r['sparsity']:.0%} | {r['error']} |")
    if doc.get("memory_policy", "speed") != "speed":  # what "resident MB" and the times were tuned for
        lines.append(f"\nmemory policy: {doc['memory_policy']} (spartune.set_memory_policy)")
    return "\n".join(lines)


def plot(doc: dict, path) -> None:
    """Speedup of the sparse model over the dense one against sparsity, one panel per workload,
    one line per pattern and variant (solid: compiled with CUDA graphs, dash-dot: compiled,
    dashed: eager)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if "speedup" in r]
    names = list(dict.fromkeys(r["workload"] for r in rows))
    if not names:
        return
    cols = min(3, len(names))
    fig, axes = plt.subplots(math.ceil(len(names) / cols), cols, figsize=(4.5 * cols, 3.4 * math.ceil(len(names) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, names):
        for pattern in dict.fromkeys(r["pattern"] for r in rows):
            for variant, style in (("compile+graphs", "-"), ("compile+graph", "-"), ("compile", "-."), ("eager", "--")):
                pts = sorted((100 * r["sparsity"], r["speedup"]) for r in rows
                             if r["workload"] == name and r["pattern"] == pattern and r["variant"] == variant)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=4, label=f"{pattern} {variant}")
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("sparsity %", fontsize=8)
        ax.set_ylabel("speedup over dense", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"{doc['device']}, {doc['dtype']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
