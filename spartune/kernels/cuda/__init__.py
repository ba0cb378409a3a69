"""spartune's second kernel language: CUDA C++ templates (src/) compiled at run time by NVRTC
through `cuda.core`, for the hardware Triton cannot reach (sparse tensor cores, hand-staged
shared memory). A CUDA family uses `instance(...)` and `load(...)`, says `available(device)`,
and is otherwise a family like the Triton ones (kernels/registry.py).

Importing this package needs neither a GPU nor cuda.core: they are imported when first used.
"""
from __future__ import annotations

import functools

import torch

from .cache import CubinCache
from .compiler import CudaCompileError, Instance, instance
from .runtime import LoadedKernel, launch, load, precompile, tensor_map_2d, tensor_map_3d

__all__ = ["available", "unavailable_reason", "instance", "Instance", "CudaCompileError", "CubinCache",
           "LoadedKernel", "load", "launch", "precompile", "tensor_map_2d", "tensor_map_3d"]


@functools.cache
def unavailable_reason() -> str | None:
    """Why CUDA templates cannot be compiled and run in this process, or None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import cuda.core  # noqa: F401

        from .compiler import cuda_include_dirs, nvrtc_version

        nvrtc_version()
        cuda_include_dirs()
    except Exception as exc:  # ImportError, a missing NVRTC library or headers, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def available(device=None) -> bool:
    """Whether CUDA templates can run on `device` (default: any CUDA device): False without a
    CUDA device, without cuda.core, or without NVRTC and the CUDA headers."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    return unavailable_reason() is None
