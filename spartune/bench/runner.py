"""Runs benchmark problems (suites.Spec) and returns the results as one JSON-able document
(schema: report.py): timing with CUDA (timing.py), else a correctness-only pass under the
Triton interpreter (correctness.py). The `spartune bench` command's entry."""
from __future__ import annotations

from .baselines import IMPLS
from .correctness import run_correctness
from .document import Options
from .environment import cuda_available
from .suites import Spec
from .timing import run_timing

__all__ = ["IMPLS", "Options", "run"]


def run(specs: list[Spec], options: Options | None = None, checkpoint=None) -> dict:
    """Timing with CUDA, else the correctness-only pass."""
    options = options or Options()
    if cuda_available():
        return run_timing(specs, options, checkpoint)
    return run_correctness(specs, options, checkpoint)
