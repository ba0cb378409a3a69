"""Formats stacked by rows (q/k/v as one SpMM): the stacked matrix is the parts' rows in order,
what cannot stack is refused, and the kept copy follows the parts when they change."""
import pytest
import torch

import spartune as st
from spartune.formats.stack import stack_rows, stackable, stacked
from helpers import block_weight, random_weight


def parts_of(kind, rows, cols=40):
    gen = torch.Generator().manual_seed(sum(rows))
    if kind == "csr":
        return [st.CSR.from_dense(random_weight(r, cols, 0.3, gen=gen)) for r in rows]
    return [st.BlockSparse.from_dense(block_weight(r, cols, 16, 16, 0.5, gen=gen), (16, 16)) for r in rows]


@pytest.mark.parametrize("kind, rows", [("csr", (5, 17, 1)), ("csr", (0, 8)), ("block", (32, 48, 20)),
                                        ("block", (16, 16))])
def test_stacked_rows_are_the_parts_rows(kind, rows):
    parts = parts_of(kind, rows)
    A = stack_rows(parts)
    assert type(A) is type(parts[0]) and A.shape == (sum(rows), 40)
    assert torch.equal(A.to_dense(), torch.cat([p.to_dense() for p in parts]))


def test_what_cannot_stack_is_refused():
    csr, block = parts_of("csr", (8, 8)), parts_of("block", (20, 32))  # block: 20 rows is not whole block rows
    assert not stackable([block[0].spec, block[1].spec]) and stackable([block[1].spec, block[0].spec])
    assert not stackable([csr[0].spec, block[1].spec])
    assert not stackable([csr[0].spec])
    wide = st.CSR.from_dense(random_weight(8, 41, 0.3))
    assert not stackable([csr[0].spec, wide.spec])
    with pytest.raises(ValueError, match="cannot stack"):
        stack_rows(block)
    half = st.CSR.from_dense(random_weight(8, 40, 0.3).half())
    with pytest.raises(ValueError, match="dtype"):
        stack_rows([csr[0], half])


def test_the_kept_copy_follows_the_parts():
    parts = parts_of("csr", (6, 9))
    biases = [torch.randn(6), torch.randn(9)]
    A, b = stacked(parts, biases)
    assert stacked(parts, biases)[0] is A  # kept
    with torch.no_grad():
        parts[1].values.mul_(2)  # an optimizer step, load_state_dict's copy_
        biases[0].add_(1)
    A2, b2 = stacked(parts, biases)
    assert A2 is not A
    assert torch.equal(A2.to_dense(), torch.cat([p.to_dense() for p in parts]))
    assert torch.equal(b2, torch.cat(biases))
    assert stacked(parts)[1] is None
