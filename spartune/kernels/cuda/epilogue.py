"""The host side of src/epilogue.cuh: the checks of the operands, the trailing kernel arguments
every CUDA family with the fused epilogue passes, and the null pointer an absent bias or residual
is passed as."""
from __future__ import annotations

import numpy as np
import torch

from .._epilogue import ACTIVATION_CODES

DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
NULL = np.uint64(0)  # an absent tensor (a bare 0 would be passed as an int32)


def or_null(t):
    return t if t is not None else NULL


def epilogue_args(out, bias, residual, activation, scale) -> tuple:
    """out's and residual's strides, the dtype codes, the activation and the scale, in the order
    the kernels declare them (son, som, srn, srm, out_code, bias_code, res_code, act, scale)."""
    res = residual
    return (out.stride(0), out.stride(1), res.stride(0) if res is not None else 0,
            res.stride(1) if res is not None else 0, DTYPE_CODES[out.dtype],
            DTYPE_CODES[bias.dtype] if bias is not None else 0, DTYPE_CODES[res.dtype] if res is not None else 0,
            ACTIVATION_CODES[activation], float(scale))


def check_operands(A, x, out, bias, residual) -> None:
    """What a CUDA family's kernel trusts about its operands, checked before anything is built or
    launched: the weight's fp16 / bf16 dtype, x's dtype, the shapes, bias contiguous, one device,
    and the epilogue's dtypes (the ops check the same for users; this guards direct calls)."""
    M, K = A.shape
    dtype, device = A.values.dtype, A.values.device
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"the sparse tensor kernels run fp16 / bf16 weights, got {dtype}")
    if x.dtype != dtype:
        raise TypeError(f"x must be {dtype} like the weight, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != K or out.shape != (x.shape[0], M):
        raise ValueError(f"x must be (N, {K}) and out (N, {M}), got {tuple(x.shape)} and {tuple(out.shape)}")
    if bias is not None and (bias.shape != (M,) or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous ({M},) tensor, got shape {tuple(bias.shape)}")
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"residual must have shape {tuple(out.shape)}, got {tuple(residual.shape)}")
    for name, t in (("x", x), ("out", out), ("bias", bias), ("residual", residual)):
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device}, the weight on {device}")
        if name != "x" and t is not None and t.dtype not in DTYPE_CODES:
            raise TypeError(f"{name} must be fp16, bf16 or fp32, got {t.dtype}")
