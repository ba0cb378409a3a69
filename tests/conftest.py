"""The CPU suite runs kernels under Triton's interpreter on any machine, so the README's
`python -m pytest -q` means the same on a laptop, in CI and on a GPU machine. The GPU tests
(tests/gpu, marked `gpu`) run compiled only when SPARTUNE_GPU_TESTS=1 asks for them on a CUDA
machine (scripts/gpu.sh exports it and selects `-m gpu`); they are skipped otherwise.

The choice is made here, when the root conftest is imported: Triton reads TRITON_INTERPRET when a
kernel is defined, and a subdirectory's conftest named on the command line imports spartune
before any pytest hook runs (LOG, session 32)."""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
GPU_TESTS = HAS_CUDA and os.environ.get("SPARTUNE_GPU_TESTS") == "1"
if not GPU_TESTS:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.load_profile("ci")


def pytest_configure(config):
    # one clear error, not hundreds of TypeErrors from the kernels (a GPU image may ship a newer numpy)
    from spartune.bench.environment import interpreter_problem

    problem = None if GPU_TESTS else interpreter_problem()
    if problem:
        raise pytest.UsageError(f"the CPU suite runs under the interpreter: {problem} (the dev extra pins it). "
                                "On a CUDA machine the GPU tests run compiled: "
                                "SPARTUNE_GPU_TESTS=1 python -m pytest -m gpu")


def pytest_collection_modifyitems(config, items):
    if GPU_TESTS:
        return
    reason = ("the GPU tests run compiled: SPARTUNE_GPU_TESTS=1 python -m pytest -m gpu "
              "(scripts/gpu.sh)" if HAS_CUDA
              else "needs a CUDA GPU (scripts/gpu.sh runs these on the GPU machine)")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
