"""A short tour: prune one weight into every pattern, check each format, run the reference ops."""
from __future__ import annotations

import time

import torch

from .. import reference
from ..prune import sparsify_weight

PATTERNS = [("csr", 0.9), ("block:64", 0.9), ("block:32x64", 0.75), ("shfl:64", 0.9), ("2:4", None), ("64:2:8", None)]


def run_demo(rows: int = 1024, cols: int = 768, tokens: int = 64, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g)
    x = torch.randn(tokens, cols, generator=g)
    results = []
    print(f"weight {rows}x{cols}, x {tokens}x{cols}, float32 on the CPU")
    print(f"{'pattern':<12} {'format':<14} {'sparsity':>8} {'kept L2':>8} {'MB':>7} {'round trip':>10} {'linear err':>10} {'prune s':>7}")
    for pattern, sparsity in PATTERNS:
        t0 = time.perf_counter()
        fmt, report = sparsify_weight(w, pattern, sparsity, return_report=True)
        seconds = time.perf_counter() - t0
        dense = fmt.to_dense()
        exact = torch.equal(type(fmt).from_dense(dense, **_format_args(fmt)).to_dense(), dense)
        y = reference.linear(x, fmt)
        err = ((y - x.double() @ dense.double().T).norm() / y.norm().clamp_min(1e-30)).item()
        row = dict(pattern=pattern, format=type(fmt).__name__, sparsity=report.sparsity, retained=report.retained,
                   mbytes=fmt.nbytes / 1e6, round_trip=exact, linear_err=err, prune_seconds=seconds)
        results.append(row)
        print(f"{pattern:<12} {row['format']:<14} {report.sparsity:>8.3f} {report.retained:>8.3f} {row['mbytes']:>7.2f} "
              f"{'exact' if exact else 'WRONG':>10} {err:>10.1e} {seconds:>7.2f}")
    return results


def _format_args(fmt) -> dict:
    """The arguments that rebuild `fmt`'s layout from its dense matrix."""
    name = type(fmt).__name__
    if name == "BlockSparse":
        return {"block": fmt.block}
    if name == "ShuffledBlock":
        return {"v": fmt.v, "perm": fmt.perm}
    if name == "NM":
        return {"n": fmt.n, "m": fmt.m}
    if name == "VNM":
        return {"v": fmt.v, "m": fmt.m}
    return {}
