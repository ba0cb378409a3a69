"""SparseConv2d and SparseConv1d: a pointwise (kernel size 1) convolution with a sparse weight, run
as one SpMM over the positions of a channels-last tensor. Pointwise convolutions hold almost all
of MobileNet-style networks' weights (and 1-D ones the position-wise layers of speech and
sequence models); depthwise and spatial convolutions stay dense. Fold batch norm first
(torch.nn.utils.fusion.fuse_conv_bn_eval): its scale and shift become the weight and bias that
the kernels' fused epilogue applies, with the activation."""
from __future__ import annotations

import torch
from torch import nn

from ..epilogue import check_activation
from ..formats import SparseFormat
from ..prune import sparsify_weight
from .linear import SparseLinear, kernel_layout


def not_pointwise(conv: nn.Module) -> str:
    """Why a convolution is not a matrix product over its positions ("" when it is): a 1-D or 2-D
    convolution of kernel size 1, stride 1, no dilation or groups, and no padding (so its
    padding mode never applies; "same" pads nothing at kernel size 1)."""
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d)):
        return f"not a Conv1d or Conv2d ({type(conv).__name__})"
    ones = (1,) * len(conv.kernel_size)  # (the weight of a lazy convolution has no shape yet)
    for name, value in (("kernel size", conv.kernel_size), ("stride", conv.stride), ("dilation", conv.dilation)):
        if value != ones:
            return f"its {name} is {value}, not 1"
    if conv.groups != 1:
        return f"it is grouped ({conv.groups} groups)"
    if conv.padding not in (tuple(0 for _ in ones), "valid", "same"):
        return f"it pads by {conv.padding}"
    return ""


def is_pointwise(conv: nn.Module) -> bool:
    """A 1-D or 2-D convolution of kernel size 1 without stride, padding, dilation or groups."""
    return not not_pointwise(conv)


class _SparsePointwise(nn.Module):
    """y = act(conv(x, W) + b), kernel size 1, with W (out_channels, in_channels) in a sparse format.

    Takes (B, C, *positions); an input laid out channels last (2-D: torch.channels_last; 1-D: the
    transpose of a (B, L, C) tensor) is read in place (positions x channels is then a view),
    another is copied once. The weight lives in a SparseLinear (`self.linear`): state_dict,
    autograd, `.to()` and torch.compile behave as they do there.
    """

    DIMS = 0  # positions' dimensions (1: Conv1d, 2: Conv2d)
    CONV = nn.Module  # the convolution it replaces

    def __init__(self, weight: SparseFormat, bias: torch.Tensor | None = None, *, activation: str | None = None,
                 requires_grad: bool = False):
        """A pointwise convolution around a sparse (out_channels, in_channels) weight, an optional
        bias and a fused activation (None, "relu", "gelu", "gelu_tanh", "silu");
        `requires_grad` as SparseLinear's (False by default; from_conv follows the convolution)."""
        super().__init__()
        check_activation(activation)
        self.linear = SparseLinear(weight, bias, requires_grad=requires_grad)
        self.activation = activation

    @property
    def weight(self) -> SparseFormat:
        return self.linear.weight

    @property
    def bias(self):
        return self.linear.bias

    @property
    def in_channels(self) -> int:
        return self.linear.in_features

    @property
    def out_channels(self) -> int:
        return self.linear.out_features

    @classmethod
    def from_conv(cls, conv: nn.Module, pattern, sparsity: float | None = None, *, activation: str | None = None,
                  return_report=False):
        """Prune a pointwise convolution's weight by magnitude into `pattern` (see
        sparsify_weight); the layer trains if the convolution's weight did."""
        why = f"not a {cls.CONV.__name__}" if not isinstance(conv, cls.CONV) else not_pointwise(conv)
        if why:
            raise ValueError(f"{cls.__name__} takes a pointwise {cls.CONV.__name__} (kernel size 1, stride 1, no "
                             f"padding, dilation or groups), got {conv}: {why}")
        w = conv.weight.detach().reshape(conv.out_channels, conv.in_channels)
        fmt, report = sparsify_weight(w, pattern, sparsity, return_report=True)
        layer = cls(kernel_layout(fmt), None if conv.bias is None else conv.bias.detach(), activation=activation,
                    requires_grad=conv.weight.requires_grad)
        return (layer, report) if return_report else layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution's output for x of shape (batch, channels, *spatial) or unbatched
        (channels, *spatial); a channels-last x runs as one SpMM over its pixels, no copy."""
        if x.dim() == self.DIMS + 1 and x.shape[0] == self.in_channels:  # unbatched, as the convolution takes it
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if x.dim() != self.DIMS + 2 or x.shape[1] != self.in_channels:
            where = ", ".join(("length",) if self.DIMS == 1 else ("height", "width"))
            raise ValueError(f"{type(self).__name__} expects ({self.in_channels}, {where}) or (batch, "
                             f"{self.in_channels}, {where}), got {tuple(x.shape)}")
        b, c, *positions = x.shape
        d = self.DIMS  # (permutes, which the fusion passes follow, not movedim)
        flat = x.permute(0, *range(2, d + 2), 1).reshape(-1, c)  # a view when x is channels-last
        y = self.linear(flat, activation=self.activation)
        return self._layout(y.view(b, *positions, self.out_channels).permute(0, d + 1, *range(1, d + 1)))

    @staticmethod
    def _layout(y: torch.Tensor) -> torch.Tensor:
        """The output as the layer returns it (SparseConv2d: channels-last, a memory format)."""
        return y

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={(1,) * self.DIMS}, "
                f"activation={self.activation}")


class SparseConv2d(_SparsePointwise):
    """A pointwise (1x1) nn.Conv2d with a sparse weight: (B, C, H, W) -> (B, out_channels, H, W),
    channels-last."""

    DIMS, CONV = 2, nn.Conv2d


class SparseConv1d(_SparsePointwise):
    """A pointwise (kernel size 1) nn.Conv1d with a sparse weight: (B, C, L) -> (B, out_channels, L),
    contiguous as nn.Conv1d's (3-D tensors have no channels-last memory format, and code after a
    Conv1d may `.view` its output): one copy of the output, small beside the product."""

    DIMS, CONV = 1, nn.Conv1d

    @staticmethod
    def _layout(y: torch.Tensor) -> torch.Tensor:
        return y.contiguous()


def sparse_pointwise_class(conv: nn.Module) -> type[_SparsePointwise]:
    """The sparse layer that replaces a pointwise convolution."""
    return SparseConv1d if isinstance(conv, nn.Conv1d) else SparseConv2d
