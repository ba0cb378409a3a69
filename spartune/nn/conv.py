"""SparseConv2d: a pointwise (1x1) convolution with a sparse weight, run as one SpMM over the
pixels of a channels-last tensor. Pointwise convolutions hold almost all of MobileNet-style
networks' weights; depthwise and spatial convolutions stay dense. Fold batch norm first
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
    """A 1x1 convolution without stride, padding, dilation or groups: a matrix product over pixels."""
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1) and conv.stride == (1, 1)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding in ((0, 0), "valid")
            and conv.padding_mode == "zeros")


class SparseConv2d(nn.Module):
    """y = act(conv1x1(x, W) + b) with W (out_channels, in_channels) in a sparse format.

    Takes (B, C, H, W) and returns (B, out_channels, H, W) in channels-last memory format; a
    channels-last input is read in place (pixels x channels is then a view), another is copied
    once. The weight lives in a SparseLinear (`self.linear`): state_dict, autograd, `.to()` and
    torch.compile behave as they do there.
    """

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
    def from_conv(cls, conv: nn.Conv2d, pattern, sparsity: float | None = None, *, activation: str | None = None,
                  return_report=False):
        """Prune a pointwise convolution's weight by magnitude into `pattern` (see
        sparsify_weight); the layer trains if the convolution's weight did."""
        if not is_pointwise(conv):
            raise ValueError(f"SparseConv2d takes a pointwise convolution (1x1, stride 1, no padding, dilation or "
                             f"groups), got {conv}")
        fmt, report = sparsify_weight(conv.weight.detach()[:, :, 0, 0], pattern, sparsity, return_report=True)
        layer = cls(kernel_layout(fmt), None if conv.bias is None else conv.bias.detach(), activation=activation,
                    requires_grad=conv.weight.requires_grad)
        return (layer, report) if return_report else layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and x.shape[0] == self.in_channels:  # unbatched, as nn.Conv2d takes it
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"SparseConv2d expects ({self.in_channels}, height, width) or (batch, {self.in_channels}, "
                             f"height, width), got {tuple(x.shape)}")
        b, c, h, w = x.shape
        pixels = x.permute(0, 2, 3, 1).reshape(b * h * w, c)  # a view when x is channels-last
        y = self.linear(pixels, activation=self.activation)
        return y.view(b, h, w, self.out_channels).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size=(1, 1), activation={self.activation}"
