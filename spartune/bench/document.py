"""A run's options and the document every run fills (its schema: report.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..reference import TOLERANCE
from .baselines import IMPLS
from .environment import device_info, now, versions

SCHEMA = "spartune-bench/1"


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


def base_document(kind: str, options: Options, specs) -> dict:
    return {
        "schema": SCHEMA,
        "kind": kind,
        "suite": options.suite,
        "date": now(),
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


def interrupted(doc: dict, rest, progress) -> None:
    """Ctrl-C: keep what ran; the report is still written."""
    doc["interrupted"] = True
    for spec in rest:
        doc["skipped"].append({"problem": spec.name, "pattern": spec.pattern, "density": spec.density, "N": spec.N,
                               "reason": "interrupted"})
    progress.note(f"interrupted: {len(rest)} problems left out; writing what ran")
