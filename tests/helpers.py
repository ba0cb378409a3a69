"""Shared test helpers: random sparse weights with the structure of each pattern."""
import torch

import spartune as st


def random_mask(rows, cols, density, gen=None):
    return torch.rand(rows, cols, generator=gen) < density


def random_weight(rows, cols, density, dtype=torch.float32, gen=None):
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    return torch.where(random_mask(rows, cols, density, gen), w, torch.zeros((), dtype=dtype))


def block_weight(rows, cols, bm, bk, density, dtype=torch.float32, gen=None):
    br, bc = -(-rows // bm), -(-cols // bk)
    keep = (torch.rand(br, bc, generator=gen) < density).repeat_interleave(bm, 0).repeat_interleave(bk, 1)
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    return torch.where(keep[:rows, :cols], w, torch.zeros((), dtype=dtype))


def pattern_weight(pattern, rows, cols, sparsity=0.8, dtype=torch.float32, gen=None):
    """A dense weight that holds `pattern` exactly, and its format."""
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    p = st.parse_pattern(pattern)
    fmt = st.sparsify_weight(w, p, None if p.fixed_density else sparsity)
    return fmt.to_dense(), fmt


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
