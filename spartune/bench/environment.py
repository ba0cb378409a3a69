"""Where a benchmark runs: the device, whether our kernels run under Triton's interpreter, the
software versions and the time, as every document records them."""
from __future__ import annotations

import datetime
import os
import platform

from ..versions import software_versions


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def interpreter_active() -> bool:
    """Whether our Triton kernels were built for the interpreter (TRITON_INTERPRET set before
    spartune.kernels was imported)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction

        from ..kernels import spmm_blocked

        return isinstance(spmm_blocked._blocked_spmm_kernel, InterpretedFunction)
    except Exception:  # noqa: BLE001
        return bool(os.environ.get("TRITON_INTERPRET"))


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run our kernels here, or None: Triton 3.6's breaks on
    numpy >= 2.3 (every kernel's scalar loads fail), and a GPU image may ship a newer numpy."""
    import numpy
    import triton

    def minor(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())

    if minor(triton.__version__) <= (3, 6) and minor(numpy.__version__) >= (2, 3):
        return (f"Triton {triton.__version__}'s interpreter, which runs our kernels on the CPU, needs numpy < 2.3 "
                f"(found {numpy.__version__}): pip install 'numpy<2.3'")
    return None


def versions() -> dict:
    """software_versions() and matplotlib's (the plots depend on it, no tuning does)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mpl = version("matplotlib")
    except PackageNotFoundError:
        mpl = "not installed"
    return {**software_versions(), "matplotlib": mpl}


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": f"CPU ({platform.processor() or platform.machine()}), no CUDA device", "cuda": False,
                "triton_interpreter": interpreter_active()}
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "cuda": True, "capability": f"sm_{p.major}{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "l2_mib": round(p.L2_cache_size / 2**20, 1),
            "count": torch.cuda.device_count()}


def now() -> str:
    """UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
