"""Without CUDA: no timing, a correctness-only pass under the Triton interpreter on
scaled-down problems, comparing spartune.linear and every kernel family of the weight's
format (the cost model's best config of each path) with spartune.reference."""
from __future__ import annotations

import time

from ..dispatch import find_choice
from ..reference import TOLERANCE, rel_err
from . import suites
from .document import Options, base_document, interrupted
from .environment import interpreter_active, interpreter_problem
from .picks import choice_dict, label
from .progress import Progress, short
from .suites import Spec
from .weights import make_weight


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
    if options.mode not in (None, "model"):
        doc.setdefault("notes", []).append(f"without a GPU the tuner ranks by its cost model only (--mode "
                                           f"{options.mode} measures on a GPU)")
    doc["options"]["mode"] = "model"
    doc["tolerance"] = tol = TOLERANCE[dtype_name]
    dtype = getattr(torch, dtype_name)
    interp = interpreter_active()
    doc["device"]["triton_interpreter"] = interp
    problem = interpreter_problem()
    if interp and problem:
        doc.setdefault("notes", []).append(f"{problem}; only torch paths were checked")
        interp = False
    elif not interp:
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
                row = _check_problem(spec, dtype, dtype_name, tol, gen, interp, options.op)
            except KeyboardInterrupt:
                interrupted(doc, chosen[len(doc["rows"]):], progress)
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


def _check_problem(spec, dtype, dtype_name, tol, gen, interp, op="linear") -> dict:
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
        row["error"] = f"could not build the problem: {short(e)}"
        row["failed"] = True
        return row
    checks = row["checks"]
    try:
        import spartune

        y = spartune.spmm(A, x.T.contiguous()).T if op == "spmm" else spartune.linear(x, A)
        err = rel_err(y, ref)
        checks["ours"] = {"rel_err": err, "ok": err <= tol, "picked": choice_dict(find_choice(A, spec.N, dtype_name))}
    except Exception as e:  # noqa: BLE001
        checks["ours"] = {"error": short(e), "ok": False}
    if interp:
        for key, config_label, run_kernel in kernel_runs(A, spec.N, dtype_name):
            out = torch.full((spec.N, spec.M), float("nan"), dtype=dtype)
            try:
                run_kernel(x, out)
                err = rel_err(out, ref)  # NaN where an output element was never written
                checks[key] = {"rel_err": err, "ok": err <= tol, "config": config_label}
            except Exception as e:  # noqa: BLE001
                checks[key] = {"error": short(e), "ok": False, "config": config_label}
    ran = [c for c in checks.values() if "rel_err" in c]
    row["failed"] = any(not c["ok"] for c in ran) or ("ours" in checks and "error" in checks["ours"])
    row["ok"] = bool(ran) and not row["failed"]
    return row


def kernel_runs(A, n: int, dtype: str):
    """(key, config label, run(x, out)) for the cost model's best config of each path of every
    linear kernel family serving A's format (the registry's); key is 'kernel:<family>' or
    'kernel:<family>/<path>'. TMA configs are left out: the interpreter cannot run them."""
    from ..kernels import registry
    from ..tune.device import INTERPRETER_DEVICE, DeviceSpec
    from ..tune.model import predict
    from ..tune.problem import Problem

    problem = Problem("linear", A.signature, A.shape[0], A.shape[1], n, dtype, A.stats(), device=INTERPRETER_DEVICE)
    spec = DeviceSpec.h100()
    runs = []
    for family in registry.families("linear", A):
        if not family.available(A.device):
            continue
        configs = [c for c in family.space(problem) if not getattr(c, "tma", False)]
        best = {}
        for c in sorted(configs, key=lambda c: predict(family.features(problem, c), spec, dtype)):
            best.setdefault(getattr(c, "path", family.name), c)
        for path, cfg in best.items():
            key = f"kernel:{family.name}" if path == family.name else f"kernel:{family.name}/{path}"
            runs.append((key, label(family.name, cfg),
                         lambda x, out, cfg=cfg, launch=family.launch: launch(A, x, out, cfg)))
    return runs
