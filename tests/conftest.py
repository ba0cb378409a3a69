"""The CPU suite runs kernels under Triton's interpreter, on any machine; the GPU tests (tests/gpu,
marked `gpu`) run compiled on a CUDA GPU when asked for with `-m gpu` (scripts/gpu.sh), and are
skipped otherwise. So the README's `python -m pytest -q` means the same on a laptop, in CI and on
the GPU machine (where, compiled, the CPU suite's kernels refused its CPU tensors)."""
import os
import re

import pytest
import torch
from hypothesis import settings

HAS_CUDA = torch.cuda.is_available()


def selects_gpu_tests(markexpr: str) -> bool:
    """Whether a `-m` expression asks for the GPU tests (`gpu`, `gpu and not slow`; not `not gpu`)."""
    return re.search(r"(?<!not )\bgpu\b", markexpr or "") is not None


def pytest_configure(config):
    # before collection imports spartune: Triton reads the flag when a kernel is defined
    if not (HAS_CUDA and selects_gpu_tests(config.getoption("markexpr"))):
        os.environ.setdefault("TRITON_INTERPRET", "1")


settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA and selects_gpu_tests(config.getoption("markexpr")):
        return
    reason = ("the GPU tests run compiled: python -m pytest -m gpu (scripts/gpu.sh)" if HAS_CUDA
              else "needs a CUDA GPU (scripts/gpu.sh runs these on the GPU machine)")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
