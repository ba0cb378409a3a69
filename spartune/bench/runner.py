"""Runs benchmark problems (suites.Spec) and returns the results as one JSON-able document
(schema: report.py).

With CUDA (`run_timing`): the matrix rate and DRAM bandwidth are measured first, in the same
run (tune.device.calibrate); then per problem a weight of the pattern (uniform random mask, or a
real weight pruned by sparsify_weight), random normal inputs, and every implementation timed
side by side with tune.measure.time_callable (median of do_bench; CUDA-graph replay, with the
L2 evicted before each call, under 150 us; several input sets rotated when they would fit in L2): ours (spartune.linear through
the tuner; its first call tunes), cuBLAS dense on the pruned weight, cuSPARSE CSR and BSR
(torch.sparse), PyTorch's Triton BSR kernel and cuSPARSELt 2:4. Every output is checked
against the dense product (rel err <= 1e-2 in fp16); a baseline that fails records why.

Without CUDA (`run_correctness`): no timing; a correctness-only pass under the Triton
interpreter on scaled-down problems, comparing spartune.linear and our kernel families
(the cost model's best config of each path) with spartune.reference.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass, replace

from . import suites
from .suites import Spec

SCHEMA = "spartune-bench/1"
IMPLS = ("ours", "dense", "cusparse_csr", "cusparse_bsr", "torch_bsr", "cusparselt")
TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 5e-3}
INTERPRETER_DEVICE = "cpu-triton-interpreter"


@dataclass
class Options:
    dtype: str = "float16"
    op: str = "linear"  # "linear": spartune.linear(x (N, K), A); "spmm": spartune.spmm(A, X (K, N))
    mode: str | None = None  # tuner mode (None: spartune.ops' default)
    budget_s: float | None = None  # stop starting problems after this many seconds
    seed: int = 0
    max_problems: int | None = None  # CPU pass default: 12
    rotate: bool = True  # rotate input sets for problems that fit in L2
    baselines: tuple = IMPLS[1:]
    suite: str = ""
    progress: bool = True
    extra: dict = field(default_factory=dict)  # recorded in the document's options


# --- environment ----------------------------------------------------------------------------------

def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def interpreter_active() -> bool:
    """Whether our Triton kernels were built for the interpreter (TRITON_INTERPRET set before
    spartune.kernels was imported)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction

        from ..kernels import spmm_blocked

        return isinstance(spmm_blocked._blocked_spmm_kernel, InterpretedFunction)
    except Exception:  # noqa: BLE001
        return bool(os.environ.get("TRITON_INTERPRET"))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import spartune

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
           "spartune": spartune.__version__}
    for pkg in ("triton", "numpy", "matplotlib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": f"CPU ({platform.processor() or platform.machine()}), no CUDA device", "cuda": False,
                "triton_interpreter": interpreter_active()}
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "cuda": True, "capability": f"sm_{p.major}{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "l2_mib": round(p.L2_cache_size / 2**20, 1),
            "count": torch.cuda.device_count()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Progress:
    """tqdm when it is installed, else a printed counter. `step(msg)` after each problem."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.done, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="problem", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, msg: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {msg}", flush=True)

    def note(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        elif self.enabled:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _short(e: BaseException, limit: int = 160) -> str:
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return text[:limit]


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN when out has a non-finite value."""
    import torch

    out, ref = out.double(), ref.double()
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# --- weights --------------------------------------------------------------------------------------

def _unit_density(units: int, density: float, cv: float, device, gen):
    """Per-unit keep probability: `density`, spread with coefficient of variation `cv`."""
    import torch

    if cv <= 0:
        return torch.full((units,), density, device=device)
    z = torch.randn(units, generator=gen, device=device)
    return (density * (1.0 + cv * z)).clamp(0.0, 1.0)


def _nonzero_normal(shape, dtype, device, gen):
    """Random normal values with no exact zero (a zero would drop out of the pattern)."""
    import torch

    v = torch.randn(shape, generator=gen, device=device).to(dtype)
    return v.masked_fill_(v == 0, 1.0)


def random_weight(pattern: str, M: int, K: int, density: float, *, dtype, device, gen, row_cv: float = 0.0):
    """(dense weight with zeros, format): a uniform random mask of the pattern (each unit, a
    row / block-row / group of V rows, keeps entries with its own probability when row_cv > 0)
    over random normal values."""
    import torch

    from ..formats import CSR, NM, BlockSparse, ShuffledBlock
    from ..formats._base import ceil_div
    from ..prune import parse_pattern, sparsify_weight

    p = parse_pattern(pattern)
    w = _nonzero_normal((M, K), dtype, device, gen)
    if p.kind == "vnm":  # magnitude pruning of i.i.d. values keeps a uniform random V:N:M pattern
        A = sparsify_weight(w, p)
        return A.to_dense(), A
    if p.kind == "csr":
        mask = torch.rand(M, K, generator=gen, device=device) < _unit_density(M, density, row_cv, device, gen)[:, None]
        make = CSR.from_dense
    elif p.kind == "block":
        br, bc = ceil_div(M, p.bm), ceil_div(K, p.bk)
        keep = torch.rand(br, bc, generator=gen, device=device) < _unit_density(br, density, row_cv, device, gen)[:, None]
        mask = keep.repeat_interleave(p.bm, 0).repeat_interleave(p.bk, 1)[:M, :K]
        make = lambda t: BlockSparse.from_dense(t, (p.bm, p.bk))  # noqa: E731
    elif p.kind == "shfl":
        groups = ceil_div(M, p.bm)
        keep = torch.rand(groups, K, generator=gen, device=device) < _unit_density(groups, density, row_cv, device, gen)[:, None]
        perm = torch.randperm(M, generator=gen, device=device)
        mask = torch.empty(M, K, dtype=torch.bool, device=device)
        mask[perm] = keep.repeat_interleave(p.bm, 0)[:M]  # slot i of the grouping is row perm[i]
        perm32 = perm.to(torch.int32)
        make = lambda t: ShuffledBlock.from_dense(t, p.bm, perm32)  # noqa: E731
    elif p.kind == "nm":
        groups = ceil_div(K, p.m)
        scores = torch.rand(M, groups, p.m, generator=gen, device=device)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(2, torch.topk(scores, p.n, 2).indices, True)
        mask = keep.reshape(M, groups * p.m)[:, :K]
        make = lambda t: NM.from_dense(t, p.n, p.m)  # noqa: E731
    else:  # pragma: no cover - parse_pattern knows no other kind
        raise ValueError(f"unknown pattern kind {p.kind!r}")
    w = w.masked_fill_(~mask, 0)
    return w, make(w)


_REAL_CACHE: dict = {}


def make_weight(spec: Spec, *, dtype, device, gen):
    """(dense weight, format) for a problem: random, or the real weight (cut to spec's shape
    when the problem was scaled down) pruned by sparsify_weight."""
    if spec.weight is None:
        return random_weight(spec.pattern, spec.M, spec.K, spec.density, dtype=dtype, device=device, gen=gen,
                             row_cv=spec.row_cv)
    from ..prune import sparsify_weight

    if spec.weight not in _REAL_CACHE:
        _REAL_CACHE[spec.weight] = suites.load_real_weight(spec.weight)
    w = _REAL_CACHE[spec.weight][: spec.M, : spec.K].to(device=device, dtype=dtype)
    fixed = suites.fixed_density(spec.pattern)
    A = sparsify_weight(w, spec.pattern, None if fixed is not None else 1.0 - spec.density)
    return A.to_dense(), A


def revalued(A, gen):
    """The same pattern with new random values (stored zeros, e.g. block padding, kept)."""
    import torch

    v = A.values
    return A.with_values(torch.where(v != 0, _nonzero_normal(v.shape, v.dtype, v.device, gen), torch.zeros((), dtype=v.dtype, device=v.device)))


# --- what the tuner picked --------------------------------------------------------------------------

def find_choice(A, n: int, dtype: str):
    """The tuner's Choice for linear(x with n rows, A) made in this process, or None."""
    try:
        from .. import ops
        from ..tune.problem import Epilogue, Problem

        key = Problem("linear", A.signature, A.shape[0], A.shape[1], n, dtype, A.stats(), Epilogue(),
                      ops._device_name(A.device)).key()
        return ops.get_tuner().cached(key)
    except Exception:  # noqa: BLE001  (ops' internals moved: the pick is only reported)
        return None


_ABBREV = {"num_warps": "w", "num_stages": "st", "block_m": "bm", "block_n": "bn", "block_k": "bk", "group": "g",
           "group_m": "g", "split_k": "sk"}


def choice_dict(choice) -> dict | None:
    if choice is None:
        return None
    cfg = asdict(choice.config) if is_dataclass(choice.config) else None
    parts = []
    for k, v in (cfg or {}).items():
        if isinstance(v, bool):
            if v:
                parts.append(k)
        else:
            parts.append(f"{_ABBREV.get(k, k)}={v}")
    label = choice.backend + (f" {' '.join(parts)}" if parts else "")
    return {"backend": choice.backend, "config": cfg, "label": label, "tuner_seconds": choice.measured}


# --- rates ---------------------------------------------------------------------------------------

def measure_rates(dtype: str):
    """(DeviceSpec for the floor, rates dict): everything calibrate() measures now, on this
    GPU; a direct GEMM + copy measurement if the calibration kernels fail."""
    from ..tune.device import DeviceSpec, calibrate, device_name

    try:
        spec, source = calibrate(), "spartune.tune.device.calibrate"
    except Exception as e:  # noqa: BLE001
        import torch

        from ..tune.measure import time_callable

        n = 8192
        dt = getattr(torch, dtype)
        a, b = (torch.randn(n, n, device="cuda").to(dt) for _ in range(2))
        mma = 2.0 * n**3 / time_callable(lambda: a @ b)

        src = torch.randn(2**27, device="cuda")
        dst = torch.empty_like(src)
        bw = 2.0 * src.numel() * 4 / time_callable(lambda: dst.copy_(src))

        p = torch.cuda.get_device_properties(0)
        field_ = {"float16": "mma_fp16", "bfloat16": "mma_bf16", "float32": "mma_tf32"}[dtype]
        spec = replace(DeviceSpec.h100(), name=device_name(), sms=p.multi_processor_count, l2_bytes=p.L2_cache_size,
                       dram_bw=bw, **{field_: mma})
        source = f"direct GEMM and copy (calibrate failed: {_short(e)}); FMA rate not measured"
    rates = {"matrix_flops": spec.matrix_rate(dtype), "dram_bw": spec.dram_bw, "fma_flops": spec.fma,
             "l2_bw": spec.l2_bw, "source": source, "dtype": dtype}
    return spec, rates


def floor_of(A, n: int, dtype: str, spec) -> tuple[float, float]:
    """(tensor-core floor, CUDA-core floor) in seconds (DESIGN.md: max(flops / rate, bytes / bw))."""
    from .floors import floor_seconds
    from ..tune.problem import Problem

    prob = Problem("linear", A.signature, A.shape[0], A.shape[1], n, dtype, A.stats())
    return floor_seconds(prob, spec), floor_seconds(prob, spec, cuda_cores=True)


# --- the implementations ----------------------------------------------------------------------------

class NotApplicable(Exception):
    """This baseline does not apply to the problem (left out of the row, shown as '-')."""


def _prepare(impl: str, s: dict, pattern: str, op: str):
    """A zero-argument callable running `impl` on input set `s` ({w, A, x, xt}), and how to
    turn its output into (N, M)."""
    import torch
    import torch.nn.functional as F

    from ..prune import parse_pattern

    p = parse_pattern(pattern)
    w, A, x, xt = s["w"], s["A"], s["x"], s["xt"]
    nm = lambda y: y  # noqa: E731
    mn = lambda y: y.T  # noqa: E731
    if impl == "ours":
        import spartune

        if op == "spmm":
            return (lambda: spartune.spmm(A, xt)), mn
        return (lambda: spartune.linear(x, A)), nm
    if impl == "dense":
        if op == "spmm":
            return (lambda: torch.mm(w, xt)), mn
        return (lambda: F.linear(x, w)), nm
    if impl == "cusparse_csr":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Sparse CSR tensor support is in beta state"
            ws = w.to_sparse_csr()
        return (lambda: ws @ xt), mn
    if impl in ("cusparse_bsr", "torch_bsr"):
        if p.kind != "block":
            raise NotApplicable("block patterns only")
        if w.shape[0] % p.bm or w.shape[1] % p.bk:
            raise RuntimeError(f"needs M, K multiples of the block {p.bm}x{p.bk}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ws = w.to_sparse_bsr((p.bm, p.bk))
        if impl == "cusparse_bsr":
            return (lambda: ws @ xt), mn
        from torch.sparse._triton_ops import bsr_dense_mm

        def run():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "non-optimal triton kernel parameters"
                return bsr_dense_mm(ws, xt)

        return run, mn
    if impl == "cusparselt":
        if (p.kind, p.n, p.m) != ("nm", 2, 4):
            raise NotApplicable("2:4 patterns only")
        from torch.sparse import to_sparse_semi_structured

        ws = to_sparse_semi_structured(w)
        if op == "spmm":
            return (lambda: torch.mm(ws, xt)), mn
        return (lambda: F.linear(x, ws)), nm
    raise ValueError(f"unknown implementation {impl!r}")


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _time_impl(impl, sets, pattern, op, ref, tol, time_callable, rotating, device="cuda"):
    """(seconds or None, note or None, rel err or None); NotApplicable propagates."""
    import torch

    try:
        calls = [_prepare(impl, s, pattern, op) for s in sets]
        fn0, as_nm = calls[0]
        err = rel_err(as_nm(fn0()), ref)
        for fn, _ in calls[1:]:  # every set warmed (ours: each weight's dispatch resolved) before timing
            fn()
        _sync(device)
        fns = [c for c, _ in calls]
        seconds = time_callable(rotating(lambda f: f(), [(f,) for f in fns]) if len(fns) > 1 else fns[0])
        note = None if err <= tol else f"wrong result: rel err {err:.1e} > {tol:g}"
        return seconds, note, err
    except NotApplicable:
        raise
    except Exception as e:  # noqa: BLE001  (a baseline that fails is recorded, never fatal)
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        with contextlib.suppress(Exception):
            _sync(device)
        return None, f"n/a: {_short(e)}", None


def _n_sets(spec: Spec, sparse_bytes: float, elt: int, l2: int, rotate: bool) -> int:
    """Input sets to rotate: enough that a graph replay never finds its inputs in L2, for
    problems small enough to be timed by graph replay at all."""
    from ..tune.measure import sets_to_rotate

    dense_bytes = (spec.M * spec.K + spec.N * (spec.K + spec.M)) * elt
    if not rotate or dense_bytes > 8 * l2:
        return 1
    return sets_to_rotate(sparse_bytes, l2, most=8)


# --- timing on the GPU ---------------------------------------------------------------------------------

def base_document(kind: str, options: Options, specs) -> dict:
    return {
        "schema": SCHEMA,
        "kind": kind,
        "suite": options.suite,
        "date": _now(),
        "device": device_info(),
        "versions": versions(),
        "rates": None,
        "options": {"dtype": options.dtype, "op": options.op, "mode": options.mode, "budget_s": options.budget_s,
                    "seed": options.seed, "rotate": options.rotate, **options.extra},
        "tolerance": TOLERANCE[options.dtype],
        "implementations": list(IMPLS) if kind == "timing" else [],
        "problems": len(specs),
        "rows": [],
        "skipped": [],
        "wall_s": 0.0,
    }


def run(specs: list[Spec], options: Options | None = None, checkpoint=None) -> dict:
    """Timing with CUDA, else the correctness-only pass."""
    options = options or Options()
    if cuda_available():
        return run_timing(specs, options, checkpoint)
    return run_correctness(specs, options, checkpoint)


def run_timing(specs: list[Spec], options: Options, checkpoint=None, *, device: str = "cuda", timer=None,
               rates=None) -> dict:
    """Time every problem side by side. `device`, `timer` (fn -> seconds) and `rates`
    ((DeviceSpec, rates dict)) are for tests, which run this on the CPU with a fake timer."""
    import torch

    from .. import ops
    from ..tune.measure import rotating, time_callable

    time_callable = timer or time_callable
    t_start = time.time()
    doc = base_document("timing", options, specs)
    doc["implementations"] = ["ours", "dense", *[b for b in IMPLS[2:] if b in options.baselines]]
    dtype = getattr(torch, options.dtype)
    tol = TOLERANCE[options.dtype]
    if rates is None:
        print(f"{doc['device']['name']} ({doc['device'].get('capability')}): measuring the matrix rate and DRAM "
              "bandwidth...", flush=True)
        rates = measure_rates(options.dtype)
    spec_dev, doc["rates"] = rates
    r = doc["rates"]
    print(f"  matrix {r['matrix_flops'] / 1e12:.0f} TFLOP/s ({options.dtype}), DRAM {r['dram_bw'] / 1e12:.2f} TB/s, "
          f"FMA {r['fma_flops'] / 1e12:.1f} TFLOP/s", flush=True)
    if device == "cuda" and r["source"].startswith("spartune.tune.device.calibrate"):
        _seed_calibration(spec_dev)
    if options.mode:
        ops.set_mode(options.mode)
    ops.get_tuner()  # its DB and calibration load now, not inside the first problem's tuning
    doc["options"]["mode"] = ops.get_tuner().mode
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else spec_dev.l2_bytes
    gen = torch.Generator(device=device).manual_seed(options.seed)
    progress = Progress(len(specs), f"bench {options.suite or ''}".strip(), options.progress)
    try:
        for i, spec in enumerate(specs):
            if options.budget_s is not None and time.time() - t_start > options.budget_s:
                for rest in specs[i:]:
                    doc["skipped"].append({"problem": rest.name, "pattern": rest.pattern, "density": rest.density,
                                           "N": rest.N, "reason": f"time budget of {options.budget_s:g} s reached"})
                progress.note(f"time budget reached: {len(specs) - i} problems left out")
                break
            try:
                row = _time_problem(spec, options, dtype, tol, spec_dev, l2, gen, time_callable, rotating, device)
            except KeyboardInterrupt:
                _interrupted(doc, specs[i:], progress)
                break
            doc["rows"].append(row)
            doc["wall_s"] = time.time() - t_start
            if checkpoint is not None:
                checkpoint(doc)
            progress.step(_row_line(row))
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        progress.close()
    doc["wall_s"] = time.time() - t_start
    return doc


def _interrupted(doc: dict, rest, progress) -> None:
    """Ctrl-C: keep what ran; the report is still written."""
    doc["interrupted"] = True
    for spec in rest:
        doc["skipped"].append({"problem": spec.name, "pattern": spec.pattern, "density": spec.density, "N": spec.N,
                               "reason": "interrupted"})
    progress.note(f"interrupted: {len(rest)} problems left out; writing what ran")


def _seed_calibration(spec) -> None:
    """The calibration just measured also serves the tuner when it has none for this device
    (it would otherwise measure the same numbers again at its first use)."""
    try:
        from ..tune.db import TuningDB

        with TuningDB() as db:
            if db.get_calibration(spec.name) is None:
                db.set_calibration(spec.name, spec)
    except Exception:  # noqa: BLE001  (only saves time)
        pass


def _row_line(row: dict) -> str:
    head = f"{row['problem']} N={row['N']} {row['pattern']} d={row['density']:g}"
    if row.get("error"):
        return f"{head}: FAILED {row['error']}"
    ours, dense = row["times"].get("ours"), row["times"].get("dense")
    if ours is None:
        return f"{head}: ours n/a ({row['notes'].get('ours')})"
    sp = f", {dense / ours:.2f}x dense" if dense else ""
    ff = f", {100 * row['frac_floor']:.0f}% of floor" if row.get("frac_floor") else ""
    bad = "" if row["ok"] else "  WRONG RESULT"
    return f"{head}: ours {ours * 1e6:.1f} us{sp}{ff} [{(row.get('picked') or {}).get('label', '?')}]{bad}"


def _time_problem(spec, options, dtype, tol, spec_dev, l2, gen, time_callable, rotating, device) -> dict:
    import torch

    row = {"problem": spec.name, "M": spec.M, "K": spec.K, "N": spec.N, "pattern": spec.pattern,
           "density": spec.density, "weights": f"real:{spec.weight}" if spec.weight else "random",
           "times": {}, "notes": {}, "rel_err": {}, "speedup": {}, "ok": False}
    sets = []
    try:
        w, A = make_weight(spec, dtype=dtype, device=device, gen=gen)
        s = A.stats()
        row.update(achieved_density=s.density, nnz=s.nnz, items_cv=s.items_cv)
        floor_tc, floor_cc = floor_of(A, spec.N, options.dtype, spec_dev)
        row.update(floor_s=floor_tc, floor_cuda_core_s=floor_cc)
        from .floors import compulsory_bytes
        from ..tune.problem import Problem

        sparse_bytes = compulsory_bytes(Problem("linear", A.signature, spec.M, spec.K, spec.N, options.dtype, s))
        n_sets = _n_sets(spec, sparse_bytes, w.element_size(), l2, options.rotate)
        for j in range(n_sets):
            Aj = A if j == 0 else revalued(A, gen)
            wj = w if j == 0 else Aj.to_dense()
            x = torch.randn(spec.N, spec.K, generator=gen, device=device).to(dtype)
            sets.append({"w": wj, "A": Aj, "x": x, "xt": x.T.contiguous()})
        row["sets"] = n_sets
        ref = sets[0]["x"].float() @ sets[0]["w"].float().T
    except Exception as e:  # noqa: BLE001
        row["error"] = f"could not build the problem: {_short(e)}"
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        return row

    # ours: the first call tunes (timed as tune_s), then every implementation is timed alike
    import spartune

    t0 = time.perf_counter()
    try:
        if options.op == "spmm":
            spartune.spmm(sets[0]["A"], sets[0]["xt"])
        else:
            spartune.linear(sets[0]["x"], sets[0]["A"])
        _sync(device)
        row["tune_s"] = time.perf_counter() - t0
        row["picked"] = choice_dict(find_choice(sets[0]["A"], spec.N, options.dtype))
    except Exception as e:  # noqa: BLE001
        row["tune_s"] = time.perf_counter() - t0
        row["times"]["ours"], row["notes"]["ours"] = None, f"n/a: {_short(e)}"
    for impl in ("ours", "dense", *[b for b in options.baselines if b not in ("ours", "dense")]):
        if impl in row["times"]:  # ours failed on its first call
            continue
        try:
            seconds, note, err = _time_impl(impl, sets, spec.pattern, options.op, ref, tol, time_callable, rotating,
                                            device)
        except NotApplicable:
            continue
        row["times"][impl] = seconds
        if note:
            row["notes"][impl] = note
        if err is not None:
            row["rel_err"][impl] = err
    ours, dense = row["times"].get("ours"), row["times"].get("dense")
    row["ok"] = ours is not None and row["rel_err"].get("ours", float("nan")) <= tol
    if dense:
        row["speedup"] = {k: dense / v for k, v in row["times"].items() if v}
    if ours:
        path = ((row.get("picked") or {}).get("config") or {}).get("path")
        cuda_core = path in ("row", "row_t", "ell")  # CSR's Sputnik paths: CUDA cores
        row["floor_unit"] = "cuda-core" if cuda_core else "tensor-core"
        row["frac_floor"] = (floor_cc if cuda_core else floor_tc) / ours
    del sets, ref
    return row


# --- correctness only (no CUDA) -------------------------------------------------------------------------

def run_correctness(specs: list[Spec], options: Options, checkpoint=None) -> dict:
    import torch

    t_start = time.time()
    doc = base_document("correctness", options, specs)
    dtype_name = options.dtype
    if dtype_name == "bfloat16":
        doc["notes"] = ["the Triton interpreter computes bfloat16 dots wrongly: the CPU pass checks float16 "
                        "(bfloat16 is checked on the GPU)"]
        dtype_name = "float16"
    doc["options"]["dtype"] = dtype_name
    doc["tolerance"] = tol = TOLERANCE[dtype_name]
    dtype = getattr(torch, dtype_name)
    interp = interpreter_active()
    doc["device"]["triton_interpreter"] = interp
    if not interp:
        doc.setdefault("notes", []).append(
            "TRITON_INTERPRET was not set before spartune's kernels were imported: they cannot run on the CPU "
            "(run through the `spartune` command, or set TRITON_INTERPRET=1); only torch paths were checked")
    tiny = suites._dedupe([suites.scaled_down(s, dense_enough=True) for s in specs])
    limit = options.max_problems if options.max_problems is not None else 12
    chosen = suites.spread(tiny, limit)
    doc["problems"] = len(chosen)
    doc["scaled_from"] = len(specs)
    gen = torch.Generator().manual_seed(options.seed)
    progress = Progress(len(chosen), "check", options.progress)
    try:
        for spec in chosen:
            if options.budget_s is not None and time.time() - t_start > options.budget_s:
                doc["skipped"].append({"problem": spec.name, "reason": f"time budget of {options.budget_s:g} s reached"})
                continue
            try:
                row = _check_problem(spec, dtype, dtype_name, tol, gen, interp)
            except KeyboardInterrupt:
                _interrupted(doc, chosen[len(doc["rows"]):], progress)
                break
            doc["rows"].append(row)
            doc["wall_s"] = time.time() - t_start
            if checkpoint is not None:
                checkpoint(doc)
            status = "ok" if row["ok"] else ("FAILED" if row["failed"] else "not checked")
            progress.step(f"{row['problem']} {row['M']}x{row['K']} N={row['N']} {row['pattern']} "
                          f"d={row['density']:g}: {status}")
    finally:
        progress.close()
    doc["wall_s"] = time.time() - t_start
    return doc


def _check_problem(spec, dtype, dtype_name, tol, gen, interp) -> dict:
    import torch

    from .. import reference

    row = {"problem": spec.name, "M": spec.M, "K": spec.K, "N": spec.N, "pattern": spec.pattern,
           "density": spec.density, "weights": f"real:{spec.weight}" if spec.weight else "random",
           "checks": {}, "ok": False, "failed": False}
    try:
        w, A = make_weight(spec, dtype=dtype, device="cpu", gen=gen)
        x = torch.randn(spec.N, spec.K, generator=gen).to(dtype)
        ref = reference.linear(x, A)
        row["achieved_density"] = A.stats().density
    except Exception as e:  # noqa: BLE001
        row["error"] = f"could not build the problem: {_short(e)}"
        row["failed"] = True
        return row
    checks = row["checks"]
    try:
        import spartune

        y = spartune.linear(x, A)
        err = rel_err(y, ref)
        checks["ours"] = {"rel_err": err, "ok": err <= tol, "picked": choice_dict(find_choice(A, spec.N, dtype_name))}
    except Exception as e:  # noqa: BLE001
        checks["ours"] = {"error": _short(e), "ok": False}
    if interp:
        for key, label, run_kernel in _kernel_runs(A, spec.N, dtype_name):
            out = torch.full((spec.N, spec.M), float("nan"), dtype=dtype)
            try:
                run_kernel(x, out)
                err = rel_err(out, ref)  # NaN where an output element was never written
                checks[key] = {"rel_err": err, "ok": err <= tol, "config": label}
            except Exception as e:  # noqa: BLE001
                checks[key] = {"error": _short(e), "ok": False, "config": label}
    ran = [c for c in checks.values() if "rel_err" in c]
    row["failed"] = any(not c["ok"] for c in ran) or ("ours" in checks and "error" in checks["ours"])
    row["ok"] = bool(ran) and not row["failed"]
    return row


def _kernel_runs(A, n: int, dtype: str):
    """(key, config label, run(x, out)) for the cost model's best config of each path of A's
    kernel family; key is 'kernel:<family>' or 'kernel:<family>/<path>'."""
    from ..formats import CSR, BlockSparse, ShuffledBlock
    from ..kernels import spmm_blocked, spmm_csr
    from ..tune.device import DeviceSpec
    from ..tune.model import predict
    from ..tune.problem import Problem

    family = {BlockSparse: ("blocked", spmm_blocked), ShuffledBlock: ("blocked", spmm_blocked),
              CSR: ("csr", spmm_csr)}.get(type(A))
    if family is None:
        return []
    name, mod = family
    problem = Problem("linear", A.signature, A.shape[0], A.shape[1], n, dtype, A.stats(), device=INTERPRETER_DEVICE)
    spec = DeviceSpec.h100()
    configs = [c for c in mod.space(problem) if not getattr(c, "tma", False)]
    best = {}
    for c in sorted(configs, key=lambda c: predict(mod.features(problem, c), spec, dtype)):
        best.setdefault(getattr(c, "path", name), c)
    runs = []
    for path, cfg in best.items():
        key = f"kernel:{name}" if path == name else f"kernel:{name}/{path}"
        runs.append((key, choice_dict(_Pick(name, cfg))["label"], lambda x, out, cfg=cfg: mod.launch(A, x, out, cfg)))
    return runs


@dataclass
class _Pick:
    backend: str
    config: object
    measured: float | None = None


# --- pre-tuning -----------------------------------------------------------------------------------------

def tune(specs: list[Spec], options: Options) -> list[dict]:
    """Tune spartune.linear for every problem into the tuning DB (CUDA only): builds the
    weight, calls ops.prepare (or linear once on random inputs)."""
    import torch

    from .. import ops

    if options.mode:
        ops.set_mode(options.mode)
    dtype = getattr(torch, options.dtype)
    gen = torch.Generator(device="cuda").manual_seed(options.seed)
    out = []
    progress = Progress(len(specs), "tune", options.progress)
    try:
        for spec in specs:
            row = {"problem": spec.name, "M": spec.M, "K": spec.K, "N": spec.N, "pattern": spec.pattern,
                   "density": spec.density}
            t0 = time.perf_counter()
            try:
                _, A = make_weight(spec, dtype=dtype, device="cuda", gen=gen)
                ops.prepare(A, spec.N)
                torch.cuda.synchronize()
                row["picked"] = choice_dict(find_choice(A, spec.N, options.dtype))
            except Exception as e:  # noqa: BLE001
                row["error"] = _short(e)
            row["seconds"] = time.perf_counter() - t0
            out.append(row)
            pick = row.get("picked") or {}
            msg = row.get("error") or f"{pick.get('label', '?')}" + (
                f" ({pick['tuner_seconds'] * 1e6:.1f} us)" if pick.get("tuner_seconds") else "")
            progress.step(f"{spec.name} N={spec.N} {spec.pattern} d={spec.density:g}: {msg} [{row['seconds']:.1f} s]")
            torch.cuda.empty_cache()
    finally:
        progress.close()
    return out
