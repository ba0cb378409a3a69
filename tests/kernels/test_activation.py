"""The fused epilogue's activations, elementwise, against float64 references: GELU's
branch-free normal CDF (kernels/_epilogue.py) must stay at fp32 accuracy over the whole range,
tails included, where GELU's output is tiny and only a relative error shows."""
import inspect
import math
import re
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from spartune.kernels._epilogue import ACTIVATION_CODES, activation


@triton.jit
def _apply(x_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, activation(x, ACT), mask=offs < n)


def _times_sigmoid(v, z):
    """v * sigmoid(z) in float64 without 1 + tanh's cancellation in the left tail."""
    return v / (1 + math.exp(-z)) if z > -700 else 0.0


REFERENCES = {  # written so that float64 keeps its relative accuracy in the tails
    "relu": lambda v: max(v, 0.0),
    "gelu": lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2)),
    "gelu_tanh": lambda v: _times_sigmoid(v, 2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)),
    "silu": lambda v: _times_sigmoid(v, v),
}


def check_activation(name, device="cpu"):
    """Also run by tests/gpu/test_blocked_gpu.py, where exp and the division are the GPU's
    approximate instructions."""
    x = torch.cat([torch.linspace(-12, 12, 2001), torch.randn(1000) * 3, torch.tensor([0.0, -0.0, 1e-20, -1e-20])])
    x = x.to(device)
    y = torch.full_like(x, float("nan"))
    _apply[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), ACT=ACTIVATION_CODES[name], BLOCK=256)
    expect = torch.tensor([REFERENCES[name](v) for v in x.double().tolist()], dtype=torch.float64, device=device)
    err = (y.double() - expect).abs()
    big = expect.abs() > 1e-30  # GELU down to x = -11.4; below, outputs near fp32's smallest normals
    assert not y.isnan().any()
    assert (err[big] / expect[big].abs()).max() < 2e-5
    assert err[~big].max() < 1e-30


@pytest.mark.parametrize("name", list(REFERENCES))
def test_activation_matches_float64(name):
    check_activation(name)


def _constants(code: str) -> list[float]:
    """The numbers of a function's code with the sign written before them ("- 1.5" and "-1.5"
    alike), comments dropped; 1 and 0 are left out (C writes them 1.f)."""
    code = re.sub(r"(#|//).*", "", code)
    found = [float(sign.replace(" ", "") + value) for sign, value in re.findall(r"(-?\s*)(\d+\.\d+(?:e-?\d+)?)", code)]
    return [v for v in found if abs(v) not in (0.0, 1.0)]


def _body(source: str, start: str, end: str) -> str:
    body = source[source.index(start):]
    return body[:body.index(end)]


def test_cuda_epilogue_uses_the_same_normal_cdf_and_sigmoid():
    """The NVRTC families' epilogue (kernels/cuda/src/epilogue.cuh) repeats _normal_cdf and
    _sigmoid in CUDA: the GPU tests check each against float64, this keeps them from drifting."""
    from spartune.kernels import _epilogue

    cuh = (Path(_epilogue.__file__).parent / "cuda" / "src" / "epilogue.cuh").read_text()
    cdf = inspect.getsource(_epilogue._normal_cdf.fn)
    cdf = cdf[cdf.index('"""', cdf.index('"""') + 3):]  # after the docstring
    ours = _constants(cdf)
    assert len(ours) == 8 and ours[1] < 0  # the leading coefficient is negative: signs are read
    assert _constants(_body(cuh, "float normal_cdf(", "\n}\n")) == ours
    sigmoid = _constants(inspect.getsource(_epilogue._sigmoid.fn))
    assert sigmoid == [-1.4426950408889634] and _constants(_body(cuh, "float sigmoid(", "\n")) == sigmoid
