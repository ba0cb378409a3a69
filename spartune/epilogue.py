"""The fused epilogue, y = act(scale * acc + bias) + residual then a cast, and the input
prologue, x -> act(x + x_bias) along K: what the producer of x (a convolution's bias and ReLU)
would otherwise write back in a pass of its own (MobileNet's depthwise side).

Kernels implement both as constexpr switches; this module names the activations once and gives
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


def apply_prologue(x: torch.Tensor, x_bias, activation) -> torch.Tensor:
    """act(x + x_bias) with x_bias along x's last dimension, in x's dtype (rounded once, as the
    producer's pass would store it)."""
    check_activation(activation)
    wide = torch.promote_types(x.dtype, torch.float32)
    return ACTIVATIONS[activation](x.to(wide) + x_bias.to(wide)).to(x.dtype)
