"""Timing on the GPU: the matrix rate and DRAM bandwidth are measured first, in the same run
(tune.device.calibrate); then per problem a weight of the pattern (weights.py), random normal
inputs, and every implementation (baselines.py) timed side by side with
tune.measure.time_callable (median of do_bench; CUDA-graph replay, with the L2 evicted before
each call, under 150 us; several input sets rotated when they would fit in L2). Ours
(spartune.linear through the tuner) is called once first: that call tunes. Every output is
checked against the dense product; a baseline that fails records why.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from ..dispatch import find_choice
from ..reference import TOLERANCE, rel_err
from .baselines import IMPLS, NotApplicable, prepare
from .document import Options, base_document, interrupted
from .picks import choice_dict
from .progress import Progress, short
from .suites import Spec
from .weights import make_weight, revalued


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
        source = f"direct GEMM and copy (calibrate failed: {short(e)}); FMA rate not measured"
    rates = {"matrix_flops": spec.matrix_rate(dtype), "dram_bw": spec.dram_bw, "fma_flops": spec.fma,
             "l2_bw": spec.l2_bw, "source": source, "dtype": dtype}
    return spec, rates


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
    doc["options"]["memory"] = ops.memory_policy()
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
                interrupted(doc, specs[i:], progress)
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

    from ..tune.problem import Problem
    from .floors import compulsory_bytes, floor_seconds

    row = {"problem": spec.name, "M": spec.M, "K": spec.K, "N": spec.N, "pattern": spec.pattern,
           "density": spec.density, "weights": f"real:{spec.weight}" if spec.weight else "random",
           "times": {}, "notes": {}, "rel_err": {}, "speedup": {}, "ok": False}
    sets = []
    try:
        w, A = make_weight(spec, dtype=dtype, device=device, gen=gen)
        s = A.stats()
        row.update(achieved_density=s.density, nnz=s.nnz, items_cv=s.items_cv)
        problem = Problem("linear", A.signature, spec.M, spec.K, spec.N, options.dtype, s)
        # DESIGN.md's floor, on the tensor cores and on the CUDA cores
        floor_tc, floor_cc = floor_seconds(problem, spec_dev), floor_seconds(problem, spec_dev, cuda_cores=True)
        row.update(floor_s=floor_tc, floor_cuda_core_s=floor_cc)
        n_sets = _n_sets(spec, compulsory_bytes(problem), w.element_size(), l2, options.rotate)
        for j in range(n_sets):
            Aj = A if j == 0 else revalued(A, gen)
            wj = w if j == 0 else Aj.to_dense()
            x = torch.randn(spec.N, spec.K, generator=gen, device=device).to(dtype)
            sets.append({"w": wj, "A": Aj, "x": x, "xt": x.T.contiguous()})
        row["sets"] = n_sets
        ref = sets[0]["x"].float() @ sets[0]["w"].float().T
    except Exception as e:  # noqa: BLE001
        row["error"] = f"could not build the problem: {short(e)}"
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
        row["picked"] = choice_dict(find_choice(sets[0]["A"], spec.N, options.dtype, options.op))
    except Exception as e:  # noqa: BLE001
        row["tune_s"] = time.perf_counter() - t0
        row["times"]["ours"], row["notes"]["ours"] = None, f"n/a: {short(e)}"
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


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _time_impl(impl, sets, pattern, op, ref, tol, time_callable, rotating, device="cuda"):
    """(seconds or None, note or None, rel err or None); NotApplicable propagates."""
    import torch

    try:
        calls = [prepare(impl, s, pattern, op) for s in sets]
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
        return None, f"n/a: {short(e)}", None


def _n_sets(spec: Spec, sparse_bytes: float, elt: int, l2: int, rotate: bool) -> int:
    """Input sets to rotate: enough that a graph replay never finds its inputs in L2, for
    problems small enough to be timed by graph replay at all."""
    from ..tune.measure import sets_to_rotate

    dense_bytes = (spec.M * spec.K + spec.N * (spec.K + spec.M)) * elt
    if not rotate or dense_bytes > 8 * l2:
        return 1
    return sets_to_rotate(sparse_bytes, l2, most=8)
