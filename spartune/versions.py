"""The software a measurement depends on: recorded in every benchmark document and, in part,
in every tuning-DB key. A leaf module (it imports nothing of spartune), so any layer may read it."""
from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def software_versions() -> dict:
    """Versions of python, torch, CUDA, triton, numpy and spartune, and the kernels' digest (read
    once per process)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
           "spartune": __version__, "kernels": kernel_sources()}
    for pkg in ("triton", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "none"
    return out


@functools.cache
def kernel_sources() -> str:
    """A digest of the kernels', backends' and formats' sources (formats/ lays out what a kernel
    reads). A tuned choice was timed against one build of them, so any change re-tunes: the release
    number alone stayed 0.1.0 through twenty kernel versions in development, and a stored choice
    never saw the configs added since."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for d in ("kernels", "backends", "formats") for p in (root / d).rglob("*")
                       if p.suffix in (".py", ".cu", ".cuh")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
