"""Whole models built from plain torch modules, for the end-to-end benchmarks: no download on the
GPU machine, and every layer something `sparsify()` knows (nn.Linear, pointwise nn.Conv2d).
The BERT encoder is in bert.py."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

# MobileNetV1 (Howard et al., 2017): (output channels, stride) of each depthwise-separable block
MOBILENET_V1_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
                       (512, 1), (512, 1), (1024, 2), (1024, 1))


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def mobilenet_v1(num_classes: int = 1000, width: float = 1.0) -> nn.Sequential:
    """MobileNetV1: a 3x3 stem, 13 blocks of depthwise 3x3 + pointwise 1x1 (the pointwise
    convolutions hold ~75% of the weights), average pooling and a classifier."""
    c = int(32 * width)
    layers = [_conv_bn_relu(3, c, 3, 2)]
    for out, stride in MOBILENET_V1_BLOCKS:
        out = int(out * width)
        layers += [_conv_bn_relu(c, c, 3, stride, groups=c), _conv_bn_relu(c, out, 1)]
        c = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def fold_batch_norms(model: nn.Module) -> nn.Module:
    """For inference: every Conv2d followed by a BatchNorm2d in an nn.Sequential becomes one
    convolution with the batch norm folded into its weight and bias (torch's fuse_conv_bn_eval),
    the batch norm an Identity. In place; the model must be in eval mode."""
    if model.training:
        raise ValueError("fold_batch_norms needs a model in eval mode (it folds the running statistics)")
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], nn.Conv2d) and isinstance(seq[i + 1], nn.BatchNorm2d):
                seq[i] = fuse_conv_bn_eval(seq[i], seq[i + 1])
                seq[i + 1] = nn.Identity()
    return model
