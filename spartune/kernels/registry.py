"""The one list of kernel families: which op and formats each serves, where its code lives and
whether it can run on a device. Dispatch, the benchmarks, the tuner evaluation and the model fit
all read it; a new family, Triton or CUDA, is one module plus one line in FAMILIES.

A family module provides (the tuner cannot tell a Triton family from a CUDA one):
- `Config`: a frozen dataclass of its tunable parameters (stored in the tuning DB as fields);
- `space(problem) -> list[Config]`: the valid configs for a Problem (tune/problem.py);
- `features(problem, config) -> KernelFeatures`: what the cost model reads;
- `launch(...)`, with the arguments of its op (`LAUNCH`);
- optionally `available(device) -> bool` (default: on CUDA, or anywhere under Triton's
  interpreter; a CUDA family says False without a GPU or NVRTC, and its module must import
  on any machine)
  and `release_unused(A, configs)` (drop per-weight layouts no chosen config reads) and
  `keeps_copy(config)` (it runs on a copy larger than the format: the lean policy's), and for a
  CUDA family `instances(problem, config)` (the cuda.Instance its launch loads: the tuner
  compiles those of the configs it will time at once, in parallel) and `bind(...)` (linear:
  launch's arguments, giving run(x, out, bias, residual) that launches on tensors laid out
  alike: dispatch binds a tuned call once per layout, so its host time is the launch's).
The module is imported on first use, so listing a family costs nothing until it runs.
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from ..formats import CSR, NM, VNM, BlockSparse, ShuffledBlock, SparseFormat
from ..tune.problem import KernelFeatures, Problem

# How each op calls a family's launch (dispatch binds the call's tensors this way).
LAUNCH = {
    "linear": "launch(A, x (N, K), out (N, M), config, *, bias, activation, residual, scale[, prologue]) -> out",
    "sddmm": "launch(a (M, D), b (N, D), pattern, config, *, scale) -> values",
    "softmax": "launch(A, config, *, scale) -> values",
}


class FamilyModule(Protocol):
    """What a family's module must define (optional hooks: `available`, `release_unused`)."""

    Config: type

    def space(self, problem: Problem) -> list: ...

    def features(self, problem: Problem, config: Any) -> KernelFeatures: ...

    launch: Callable[..., Any]


@dataclass(frozen=True)
class Family:
    name: str  # the backend's name in the tuner and the tuning DB
    op: str  # "linear" (spmm runs on it too), "sddmm", "softmax"
    formats: tuple[type[SparseFormat], ...]
    module_name: str
    language: str = "triton"  # "triton" | "cuda"
    # linear: launch takes prologue=(x_bias, activation) and applies it to x's tiles as they
    # load; for the others dispatch runs the prologue as a pass of its own first
    prologue: bool = False

    def __post_init__(self):
        if self.op not in LAUNCH:
            raise ValueError(f"family {self.name}: op must be one of {tuple(LAUNCH)}, got {self.op!r}")

    @functools.cached_property
    def module(self) -> FamilyModule:
        return importlib.import_module(self.module_name)

    @property
    def Config(self) -> type:  # noqa: N802 (the family's Config class)
        return self.module.Config

    def space(self, problem: Problem) -> list:
        return self.module.space(problem)

    def features(self, problem: Problem, config) -> KernelFeatures:
        return self.module.features(problem, config)

    @property
    def launch(self) -> Callable[..., Any]:
        return self.module.launch

    @property
    def bind(self) -> Callable[..., Any] | None:
        return getattr(self.module, "bind", None)

    def instances(self, problem: Problem, config) -> list:
        """The compiled kernels `config` needs (CUDA families), or []."""
        hook = getattr(self.module, "instances", None)
        return list(hook(problem, config)) if hook else []

    def serves(self, A) -> bool:
        return isinstance(A, self.formats)

    def available(self, device: torch.device) -> bool:
        """Whether the family can run on `device` in this process."""
        hook = getattr(self.module, "available", None)
        if hook is not None:
            return bool(hook(device))
        return device.type == "cuda" or bool(os.environ.get("TRITON_INTERPRET"))

    def release_unused(self, A, configs) -> None:
        hook = getattr(self.module, "release_unused", None)
        if hook is not None:
            hook(A, configs)

    def keeps_copy(self, config) -> bool:
        """Whether `config` runs on a copy of the weight larger than its format (which the lean
        memory policy leaves out)."""
        hook = getattr(self.module, "keeps_copy", None)
        return bool(hook(config)) if hook is not None else False

    def config_from_fields(self, fields: dict):
        """The stored config (a DB row's fields) as this family's Config; TypeError when its
        fields no longer match."""
        return self.Config(**fields)


FAMILIES: tuple[Family, ...] = (
    Family("blocked", "linear", (BlockSparse, ShuffledBlock), "spartune.kernels.spmm_blocked", prologue=True),
    Family("csr", "linear", (CSR,), "spartune.kernels.spmm_csr"),
    Family("csr_smem", "linear", (CSR,), "spartune.kernels.spmm_csr_smem", language="cuda"),
    Family("nm", "linear", (NM, VNM), "spartune.kernels.spmm_nm", language="cuda"),
    Family("sddmm", "sddmm", (CSR, BlockSparse), "spartune.kernels.sddmm"),
    Family("softmax", "softmax", (CSR, BlockSparse), "spartune.kernels.sparse_softmax"),
)
_BY_NAME = {f.name: f for f in FAMILIES}
if len(_BY_NAME) != len(FAMILIES):  # pragma: no cover - a listing mistake
    raise RuntimeError("two kernel families share a name")


def by_name(name: str) -> Family | None:
    """The family a tuner backend name refers to; None for library backends (dense, ...)."""
    return _BY_NAME.get(name)


@functools.cache
def _for(op: str, fmt: type) -> tuple[Family, ...]:
    return tuple(f for f in FAMILIES if f.op == op and issubclass(fmt, f.formats))


def families(op: str, A) -> tuple[Family, ...]:
    """The families of `op` that serve A's format (maybe none: the libraries then run it)."""
    return _for(op, type(A))


def served_formats(op: str) -> tuple[type[SparseFormat], ...]:
    """Every format some family of `op` serves."""
    return tuple(dict.fromkeys(t for f in FAMILIES if f.op == op for t in f.formats))
