"""Whole models built from plain torch modules, for the end-to-end benchmarks: no download on the
GPU machine, and every layer something `sparsify()` knows (nn.Linear, pointwise nn.Conv2d).
MobileNetV1 (with batch-norm folding) and a Llama decoder layer with a static KV cache (decode
steps of one shape: CUDA-graph replayable); the BERT encoder is in bert.py."""
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
    if not (width > 0 and num_classes >= 1):
        raise ValueError(f"mobilenet_v1 needs width > 0 and num_classes >= 1, got {width}, {num_classes}")
    c = int(32 * width)
    layers = [_conv_bn_relu(3, c, 3, 2)]
    for out, stride in MOBILENET_V1_BLOCKS:
        out = int(out * width)
        layers += [_conv_bn_relu(c, c, 3, stride, groups=c), _conv_bn_relu(c, out, 1)]
        c = out
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))
    for m in model.modules():  # He init: activations stay O(1) through 27 layers (torch's default
        if isinstance(m, nn.Conv2d):  # shrinks them ~2.5x a layer, to fp16 zeros by the last ones)
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    return model


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


# --- a Llama decoder layer ------------------------------------------------------------------------

FUSED_ATTENTION_MIN_QUERIES = 64  # fewer queries against a cache: two matmuls, not SDPA (see forward)

class KVCache(nn.Module):
    """Static key and value buffers (batch, heads, max_tokens, head_dim): a decode step writes
    its positions and attends over the whole buffer under a mask, so every step has the same
    shapes and can be replayed from one CUDA graph."""

    def __init__(self, batch: int, heads: int, max_tokens: int, head_dim: int, *, dtype=None, device=None):
        super().__init__()
        shape = (batch, heads, max_tokens, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (x: batch, heads, tokens, head_dim), halves rotated as Llama does."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = positions.to(torch.float32)[:, None] * freq[None]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LlamaDecoderLayer(nn.Module):
    """One Llama decoder layer: RMSNorm, attention (rotary positions, SDPA) with the q/k/v/o
    projections, RMSNorm, the SiLU-gated MLP (gate/up/down): seven linear layers for sparsify."""

    def __init__(self, hidden: int = 4096, intermediate: int = 11008, heads: int = 32, *, theta: float = 10000.0,
                 eps: float = 1e-6):
        super().__init__()
        if hidden % heads or (hidden // heads) % 2:
            raise ValueError(f"hidden ({hidden}) must split into {heads} heads of an even size (rotary halves)")
        self.heads, self.theta = heads, theta
        self.input_norm = nn.RMSNorm(hidden, eps=eps)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.post_norm = nn.RMSNorm(hidden, eps=eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x (batch, tokens, hidden) at `positions` (tokens,). Without a cache the tokens attend
        causally among themselves; with one, they are written into it and attend to every
        cached position up to their own."""
        d = self.o_proj.in_features
        if x.dim() != 3 or x.shape[-1] != d:
            raise ValueError(f"x must be (batch, tokens, {d}), got {tuple(x.shape)}")
        b, t, _ = x.shape
        if positions.shape != (t,):
            raise ValueError(f"positions must be ({t},) for {t} tokens, got {tuple(positions.shape)}")
        if cache is not None and cache.k.shape != (b, self.heads, cache.k.shape[2], d // self.heads):
            raise ValueError(f"the cache holds {tuple(cache.k.shape)}, the layer needs ({b}, {self.heads}, "
                             f"tokens, {d // self.heads})")
        h = self.input_norm(x)

        def heads(y):
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q = rotate(heads(self.q_proj(h)), positions, self.theta)
        k = rotate(heads(self.k_proj(h)), positions, self.theta)
        v = heads(self.v_proj(h))
        if cache is None:
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            cache.k.index_copy_(2, positions, k)
            cache.v.index_copy_(2, positions, v)
            keys = torch.arange(cache.k.shape[2], device=x.device)
            if t < FUSED_ATTENTION_MIN_QUERIES:
                # A few queries over a long cache under a mask: SDPA's fused kernels tile 64 queries
                # a head (32 programs for 8 queries: 52 us on the H100 at 2056 cached tokens,
                # compiled) and its math route upcasts the cache to fp32 (~200 us); two batched
                # matmuls in the cache's dtype spread it over the GPU, with the mask and softmax
                # fused between them by torch.compile (19 us; benchmarks/LOG.md).
                scores = (q * q.shape[-1] ** -0.5) @ cache.k.transpose(-1, -2)
                scores = scores.float().masked_fill(keys[None, :] > positions[:, None], float("-inf"))
                a = scores.softmax(-1).to(q.dtype) @ cache.v
            else:
                mask = torch.zeros(t, keys.numel(), dtype=q.dtype, device=x.device)
                mask = mask.masked_fill(keys[None, :] > positions[:, None], float("-inf"))
                a = nn.functional.scaled_dot_product_attention(q, cache.k, cache.v, attn_mask=mask)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.post_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
