"""SparseConv2d and SparseConv1d: a pointwise (kernel size 1) convolution with a sparse weight, run
as one SpMM over the positions of a channels-last tensor. Pointwise convolutions hold almost all
of MobileNet-style networks' weights (and 1-D ones the position-wise layers of speech and
sequence models); depthwise and spatial convolutions stay dense. Fold batch norm first
(torch.nn.utils.fusion.fuse_conv_bn_eval): its scale and shift become the weight and bias that
the kernels' fused epilogue applies, with the activation."""
from __future__ import annotations

import torch
from torch import nn

from ..formats import SparseFormat
from ..kernels._epilogue import ACTIVATION_CODES
from ..prune import sparsify_weight
from .linear import SparseLinear, kernel_layout


def is_pointwise(conv: nn.Module) -> bool:
    """A 1-D or 2-D convolution of kernel size 1 without stride, padding, dilation or groups: a
    matrix product over positions."""
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d)):
        return False
    ones = (1,) * (conv.weight.dim() - 2)
    return (conv.kernel_size == ones and conv.stride == ones and conv.dilation == ones and conv.groups == 1
            and conv.padding in (tuple(0 for _ in ones), "valid") and conv.padding_mode == "zeros")


class _SparsePointwise(nn.Module):
    """y = act(conv(x, W) + b), kernel size 1, with W (out_channels, in_channels) in a sparse format.

    Takes (B, C, *positions) and returns (B, out_channels, *positions) laid out channels last; a
    channels-last input is read in place (positions x channels is then a view), another is copied
    once. The weight lives in a SparseLinear (`self.linear`): state_dict, autograd, `.to()` and
    torch.compile behave as they do there.
    """

    DIMS = 0  # positions' dimensions (1: Conv1d, 2: Conv2d)
    CONV = nn.Module  # the convolution it replaces

    def __init__(self, weight: SparseFormat, bias: torch.Tensor | None = None, *, activation: str | None = None,
                 requires_grad: bool = False):
        super().__init__()
        if activation not in ACTIVATION_CODES:
            raise ValueError(f"activation must be one of {list(ACTIVATION_CODES)}, got {activation!r}")
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
        if not isinstance(conv, cls.CONV) or not is_pointwise(conv):
            raise ValueError(f"{cls.__name__} takes a pointwise {cls.CONV.__name__} (kernel size 1, stride 1, no "
                             f"padding, dilation or groups), got {conv}")
        w = conv.weight.detach().reshape(conv.out_channels, conv.in_channels)
        fmt, report = sparsify_weight(w, pattern, sparsity, return_report=True)
        layer = cls(kernel_layout(fmt), None if conv.bias is None else conv.bias.detach(), activation=activation,
                    requires_grad=conv.weight.requires_grad)
        return (layer, report) if return_report else layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        return y.view(b, *positions, self.out_channels).permute(0, d + 1, *range(1, d + 1))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={(1,) * self.DIMS}, "
                f"activation={self.activation}")


class SparseConv2d(_SparsePointwise):
    """A pointwise (1x1) nn.Conv2d with a sparse weight: (B, C, H, W) -> (B, out_channels, H, W),
    channels-last."""

    DIMS, CONV = 2, nn.Conv2d


class SparseConv1d(_SparsePointwise):
    """A pointwise (kernel size 1) nn.Conv1d with a sparse weight: (B, C, L) -> (B, out_channels, L),
    a view of a (B, L, out_channels) tensor."""

    DIMS, CONV = 1, nn.Conv1d


def sparse_pointwise_class(conv: nn.Module) -> type[_SparsePointwise]:
    """The sparse layer that replaces a pointwise convolution."""
    return SparseConv1d if isinstance(conv, nn.Conv1d) else SparseConv2d
