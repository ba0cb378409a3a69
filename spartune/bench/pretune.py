"""Pre-tuning (`spartune tune`): the tuner's pick for every problem, stored in the tuning DB
before any model runs, so a deployment starts tuned."""
from __future__ import annotations

import time

from ..dispatch import find_choice
from .document import Options
from .picks import choice_dict
from .progress import Progress, short
from .suites import Spec
from .weights import make_weight


def tune(specs: list[Spec], options: Options, compile_all: bool = False) -> list[dict]:
    """Tune spartune.linear for every problem into the tuning DB (CUDA only): builds the
    weight, calls ops.prepare (or linear once on random inputs). compile_all: first compile
    every config of the CUDA families for it (dispatch.compile_space), not only those timed."""
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
                if compile_all:
                    from ..dispatch import compile_space

                    row["instances"] = compile_space(A, spec.N)
                ops.prepare(A, spec.N)
                torch.cuda.synchronize()
                row["picked"] = choice_dict(find_choice(A, spec.N, options.dtype))
            except Exception as e:  # noqa: BLE001
                row["error"] = short(e)
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
