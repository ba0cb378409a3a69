"""The fused epilogue: y = act(scale * acc + bias) + residual, then a cast.

Kernels implement it as constexpr switches; this module names the activations once and gives
their float64 meaning, which the reference ops and the tests share.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {
    None: lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        names = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"activation must be one of {names}; got {activation!r}")


def apply_epilogue(acc: torch.Tensor, bias=None, activation=None, residual=None, scale: float = 1.0) -> torch.Tensor:
    check_activation(activation)
    y = acc * scale
    if bias is not None:
        y = y + bias.to(y.dtype)
    y = ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual.to(y.dtype)
    return y
