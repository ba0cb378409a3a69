"""CPU runs use Triton's interpreter; GPU tests (tests/gpu, marked `gpu`) are skipped without CUDA."""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu.sh runs these on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
