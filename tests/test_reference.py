"""The float64 reference ops mean what they say."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from helpers import random_weight


def test_linear_reference_matches_the_formula():
    w = random_weight(20, 30, 0.3)
    A = st.CSR.from_dense(w)
    x, b, r = torch.randn(2, 5, 30), torch.randn(20), torch.randn(2, 5, 20)
    y = ref.linear(x, A, b, "gelu_tanh", r, scale=0.5)
    expect = torch.nn.functional.gelu(0.5 * (x.double() @ w.double().T) + b.double(), approximate="tanh") + r.double()
    assert y.dtype == torch.float64 and torch.allclose(y, expect)
    assert torch.allclose(ref.spmm(A, x[0].T), w.double() @ x[0].T.double())


def test_bad_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.linear(torch.randn(3, 4), st.CSR.from_dense(torch.eye(4)), activation="tanh")


def test_sddmm_and_softmax_references():
    w = random_weight(16, 24, 0.3)
    w[3] = 0  # empty row
    w[5] = 1  # full row
    A = st.CSR.from_dense(w)
    a, b = torch.randn(16, 8), torch.randn(24, 8)
    s = ref.sddmm(a, b, A, scale=0.25)
    assert torch.allclose(s, (a.double() @ b.double().T) * 0.25 * (w != 0))
    p = ref.sparse_softmax(A)
    assert not p.isnan().any()
    assert torch.allclose(p.sum(1)[w.ne(0).any(1)], torch.ones(15, dtype=torch.float64))
    assert p[3].abs().sum() == 0
    assert bool((p[w == 0] == 0).all())
