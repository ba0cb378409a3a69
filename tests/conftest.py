"""The CPU suite runs kernels under Triton's interpreter with no GPU visible, on any machine, so
the README's `python -m pytest -q` means the same on a laptop, in CI and on a GPU machine (there a
visible GPU would give the suite a measuring tuner, a cache directory and skips meant for the
GPU). The GPU tests (tests/gpu, marked `gpu`) run compiled only when SPARTUNE_GPU_TESTS=1 asks for
them (scripts/gpu.sh exports it and selects `-m gpu`); they are skipped otherwise.

The choice is made here, when the root conftest is imported, before torch: Triton reads
TRITON_INTERPRET when a kernel is defined, and a subdirectory's conftest named on the command line
imports spartune before any pytest hook runs (LOG, session 32)."""
import os

ASKED = os.environ.get("SPARTUNE_GPU_TESTS") == "1"
if not ASKED:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # (read when torch first asks for the GPUs)

import torch  # noqa: E402

GPU_TESTS = ASKED and torch.cuda.is_available()
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
    skip = pytest.mark.skip(reason="needs a CUDA GPU and SPARTUNE_GPU_TESTS=1 (on the GPU machine: "
                                   "scripts/gpu.sh, or SPARTUNE_GPU_TESTS=1 python -m pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
