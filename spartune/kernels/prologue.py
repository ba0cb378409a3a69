"""The input prologue as a pass of its own: x' = act(x + x_bias) along K, for the kernels that do
not apply it while loading x (dispatch runs this first for them, so every backend serves a call
with a prologue and the tuner weighs the pass in what it measures)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..epilogue import apply_prologue
from ._epilogue import ACTIVATION_CODES, prologue


@triton.jit
def _prologue_kernel(x_ptr, x_bias_ptr, out_ptr, N, K, stride_xn, stride_xk,
                     BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)
    k_ok = offs_k < K
    mask = (offs_n < N)[:, None] & k_ok[None, :]
    xt = tl.load(x_ptr + offs_n[:, None].to(tl.int64) * stride_xn + offs_k[None, :] * stride_xk, mask=mask, other=0.0)
    y = prologue(xt, x_bias_ptr, offs_k[None, :], k_ok[None, :], ACT)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], y, mask=mask)


def apply(x: torch.Tensor, x_bias: torch.Tensor, activation) -> torch.Tensor:
    """act(x + x_bias) for x (N, K) of any strides, as a new contiguous tensor (x is kept)."""
    if x.dtype == torch.float64 or (x.device.type != "cuda" and not os.environ.get("TRITON_INTERPRET")):
        return apply_prologue(x, x_bias, activation)
    n, k = x.shape
    out = torch.empty((n, k), dtype=x.dtype, device=x.device)
    bn, bk = 64, min(128, triton.next_power_of_2(max(k, 16)))
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    if out.numel():
        _prologue_kernel[grid](x, x_bias, out, n, k, x.stride(0), x.stride(1), BN=bn, BK=bk,
                               ACT=ACTIVATION_CODES[activation], num_warps=4)
    return out
