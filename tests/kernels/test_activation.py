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


REFERENCES = {
    "relu": lambda v: max(v, 0.0),
    "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1 + math.exp(-v)) if v > -700 else 0.0,
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
    big = expect.abs() > 1e-6  # below, fp32 rounding of the inputs' tails dominates
    assert not y.isnan().any()
    assert (err[big] / expect[big].abs()).max() < 2e-5
    assert err[~big].max() < 1e-10


@pytest.mark.parametrize("name", list(REFERENCES))
def test_activation_matches_float64(name):
    check_activation(name)


def _constants(code: str) -> list[float]:
    """The numbers of a function's code, comments dropped (1 and 0 are written differently in C)."""
    code = re.sub(r"(#|//).*", "", code)
    return [v for v in map(float, re.findall(r"-?\d+\.\d+(?:e-?\d+)?", code)) if v not in (0.0, 1.0)]


def test_cuda_epilogue_uses_the_same_normal_cdf():
    """The NVRTC families' epilogue (kernels/cuda/src/epilogue.cuh) repeats _normal_cdf in CUDA:
    the GPU tests check each against float64, this keeps the two from drifting apart."""
    from spartune.kernels import _epilogue

    python_side = inspect.getsource(_epilogue._normal_cdf.fn)
    cuh = (Path(_epilogue.__file__).parent / "cuda" / "src" / "epilogue.cuh").read_text()
    cuda_side = cuh[cuh.index("float normal_cdf("):]
    cuda_side = cuda_side[:cuda_side.index("\n}\n")]
    ours = _constants(python_side[python_side.index('"""', python_side.index('"""') + 3):])  # after the docstring
    assert len(ours) == 8 and _constants(cuda_side) == ours
