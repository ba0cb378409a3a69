"""The benchmark's weights: random masks of every pattern over nonzero values."""
import pytest
import torch

import spartune as st
from spartune.bench.weights import random_weight, revalued

# --- weights ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,density,kind", [("csr", 0.2, st.CSR), ("block:32x32", 0.25, st.BlockSparse),
                                                  ("shfl:32", 0.3, st.ShuffledBlock), ("2:4", 0.5, st.NM),
                                                  ("32:2:8", 0.25, st.VNM)])
def test_random_weights_hold_their_pattern(pattern, density, kind):
    g = torch.Generator().manual_seed(1)
    w, A = random_weight(pattern, 256, 512, density, dtype=torch.float16, device="cpu", gen=g)
    assert isinstance(A, kind) and torch.equal(A.to_dense(), w)
    assert A.stats().density == pytest.approx(density, rel=0.15)
    assert torch.equal(A.mask(), w != 0)  # every stored entry holds a nonzero value: no zeros to time on
    assert not bool(torch.isnan(w).any())
    other = revalued(A, g)  # same pattern, new values
    assert torch.equal(other.mask(), A.mask()) and not torch.equal(other.values, A.values)


def test_row_spread():
    g = torch.Generator().manual_seed(2)
    _, flat = random_weight("csr", 512, 1024, 0.1, dtype=torch.float32, device="cpu", gen=g)
    _, spread = random_weight("csr", 512, 1024, 0.1, dtype=torch.float32, device="cpu", gen=g, row_cv=0.3)
    assert flat.stats().items_cv < 0.15 < spread.stats().items_cv < 0.45
