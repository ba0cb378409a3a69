"""The benchmark's implementations on the CPU (fp32: CPU torch.sparse has no fp16 product):
each computes x @ w^T in both op layouts, and says when it does not apply."""
import pytest
import torch

from spartune.bench.baselines import IMPLS, NotApplicable, prepare
from spartune.bench.weights import random_weight


def _set(pattern, M=64, K=96, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, A = random_weight(pattern, M, K, 0.5, dtype=torch.float32, device="cpu", gen=g)
    x = torch.randn(N, K, generator=g)
    return {"w": w, "A": A, "x": x, "xt": x.T.contiguous()}


@pytest.mark.parametrize("op", ["linear", "spmm"])
@pytest.mark.parametrize("impl", ["ours", "dense", "cusparse_csr", "cusparse_bsr"])
def test_implementations_compute_the_product(impl, op):
    s = _set("block:32x32")
    fn, as_nm = prepare(impl, s, "block:32x32", op)
    torch.testing.assert_close(as_nm(fn()), s["x"] @ s["w"].T, rtol=1e-5, atol=1e-5)


def test_what_does_not_apply():
    with pytest.raises(NotApplicable):
        prepare("cusparse_bsr", _set("csr"), "csr", "linear")
    with pytest.raises(NotApplicable):
        prepare("torch_bsr", _set("csr"), "csr", "linear")
    with pytest.raises(NotApplicable):
        prepare("cusparselt", _set("block:32x32"), "block:32x32", "linear")
    with pytest.raises(RuntimeError, match="multiples of the block 32x32"):  # recorded as n/a, not left out
        prepare("cusparse_bsr", _set("block:32x32", M=80), "block:32x32", "linear")
    with pytest.raises(ValueError, match="unknown implementation"):
        prepare("mkl", _set("csr"), "csr", "linear")
    assert IMPLS[:2] == ("ours", "dense")
