"""The software a measurement depends on: recorded in every benchmark document and, in part,
in every tuning-DB key. A leaf module (it imports nothing of spartune), so any layer may read it."""
from __future__ import annotations

import functools
import platform

__version__ = "0.1.0"


@functools.cache
def software_versions() -> dict:
    """Versions of python, torch, CUDA, triton, numpy and spartune (read once per process)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
           "spartune": __version__}
    for pkg in ("triton", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "none"
    return out
