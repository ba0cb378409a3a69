"""The host side of src/epilogue.cuh: the trailing kernel arguments every CUDA family with the
fused epilogue passes, and the null pointer an absent bias or residual is passed as."""
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
