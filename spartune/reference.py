"""Ground truth: every op in plain dense torch, float64 inside. Kernel tests compare with these."""
from __future__ import annotations

import torch

from .epilogue import apply_epilogue, apply_prologue
from .formats import SparseFormat

# ||out - ref|| / ||ref|| a result may show against these references: fp16/bf16 storage with fp32
# accumulation, and fp32 inputs on the tensor cores as tf32 (DESIGN.md, "Testing").
TOLERANCE = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 1e-2}


def tolerance(dtype) -> float:
    """The tolerance of a dtype given as torch.float16, 'torch.float16' or 'float16'."""
    return TOLERANCE[str(dtype).removeprefix("torch.")]


def checkable(truth: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where a result in `dtype` can be held to `truth`: finite truths at most half the dtype's
    largest value. A NaN or inf in the user's input (or an output past fp16's range) leaves no
    right answer there, and kernels that skip the pruned zeros spread a NaN to fewer outputs
    than dense does (0 x NaN is never computed)."""
    limit = torch.finfo(dtype).max / 2 if dtype.is_floating_point else float("inf")
    return truth.isfinite() & (truth.abs() <= limit)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN when out has a non-finite value (so that it
    passes no tolerance: an output element never written holds the NaN it was poisoned with)."""
    out, ref = out.double(), ref.double()
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def spmm(A: SparseFormat, X: torch.Tensor) -> torch.Tensor:
    """A @ X, float64."""
    return A.to_dense().double() @ X.double()


def linear(x, A: SparseFormat, bias=None, activation=None, residual=None, scale: float = 1.0,
           prologue=None) -> torch.Tensor:
    """act(scale * x' @ A^T + bias) + residual for x of shape (..., K), float64; x' = x, or for
    prologue = (x_bias, act') act'(x + x_bias) rounded to x's dtype (as a producer stores it)."""
    if prologue is not None:
        x = apply_prologue(x, *prologue)
    acc = x.double() @ A.to_dense().double().T
    return apply_epilogue(
        acc,
        None if bias is None else bias.double(),
        activation,
        None if residual is None else residual.double(),
        scale,
    )


def sddmm(a: torch.Tensor, b: torch.Tensor, pattern: SparseFormat, scale: float = 1.0) -> torch.Tensor:
    """scale * (a @ b^T) where `pattern` stores an entry, 0 elsewhere; dense float64 (M, N)."""
    return (a.double() @ b.double().T) * scale * pattern.mask().to(a.device)


def sparse_softmax(A: SparseFormat, scale: float = 1.0) -> torch.Tensor:
    """Row-wise softmax over the stored entries of A (0 elsewhere; an empty row stays 0)."""
    mask = A.mask()
    logits = (A.to_dense().double() * scale).masked_fill(~mask, float("-inf"))
    out = torch.softmax(logits, dim=1)
    nan_in = logits.isnan().any(dim=1, keepdim=True)  # a NaN value: its row has no answer (NaN, as torch)
    return torch.where(nan_in, out, torch.nan_to_num(out, nan=0.0)).masked_fill(~mask, 0.0)
