"""How each implementation of a timing row is called: ours (spartune's public op) and the
library baselines, built from spartune.backends' conversions (the tuner's own library
candidates convert the weight the same way)."""
from __future__ import annotations

IMPLS = ("ours", "dense", "cusparse_csr", "cusparse_bsr", "torch_bsr", "cusparselt")


class NotApplicable(Exception):
    """This baseline does not apply to the problem (left out of the row, shown as '-')."""


def prepare(impl: str, s: dict, pattern: str, op: str):
    """A zero-argument callable running `impl` on input set `s` ({w, A, x, xt}), and how to
    turn its output into (N, M). `op` "linear": x (N, K) @ w^T; "spmm": w @ xt (K, N)."""
    from ..backends import cusparse, cusparselt, torch_triton
    from ..prune import parse_pattern

    p = parse_pattern(pattern)
    w, A, x, xt = s["w"], s["A"], s["x"], s["xt"]
    if impl == "ours":
        import spartune

        if op == "spmm":
            return (lambda: spartune.spmm(A, xt)), _mn
        return (lambda: spartune.linear(x, A)), _nm
    if impl == "dense":
        return _cublas_layout(w, x, xt, op)
    if impl == "cusparse_csr":
        ws = cusparse.to_csr(w)
        return (lambda: ws @ xt), _mn
    if impl in ("cusparse_bsr", "torch_bsr"):
        if p.kind != "block":
            raise NotApplicable("block patterns only")
        ws = cusparse.to_bsr(w, (p.bm, p.bk))
        if impl == "cusparse_bsr":
            return (lambda: ws @ xt), _mn
        mm = torch_triton.bsr_dense_mm(ws)
        return (lambda: mm(xt)), _mn
    if impl == "cusparselt":
        if (p.kind, p.n, p.m) != ("nm", 2, 4):
            raise NotApplicable("2:4 patterns only")
        return _cusparselt_best(cusparselt, A, x, xt, op)
    raise ValueError(f"unknown implementation {impl!r}")


def _cublas_layout(w, x, xt, op):
    """A dense-style weight (cuBLAS's, or cuSPARSELt's 2:4) in the op's own layout, as a user
    would call it: F.linear(x, w) or torch.mm(w, xt)."""
    import torch
    import torch.nn.functional as F

    if op == "spmm":
        return (lambda: torch.mm(w, xt)), _mn
    return (lambda: F.linear(x, w)), _nm


def _cusparselt_best(cusparselt, A, x, xt, op):
    """cuSPARSELt at its best (compressed weight first, y^T read without the copy the library
    route makes for F.linear's layout, its plan replayed from a graph where that is faster), with the faster of
    algorithm 0 and the one its search picks."""
    import torch

    from ..tune.measure import time_callable

    if op == "spmm":
        x, out = xt.T, torch.empty(A.shape[0], xt.shape[1], dtype=xt.dtype, device=xt.device).T
    else:
        out = torch.empty(x.shape[0], A.shape[0], dtype=x.dtype, device=x.device)
    runs = [lambda: cusparselt.cusparselt_linear(A, x, out, transposed_ok=True)]
    try:
        cusparselt.cusparselt_search_linear(A, x, out, transposed_ok=True)  # declines when the search picks algorithm 0
        runs.append(lambda: cusparselt.cusparselt_search_linear(A, x, out, transposed_ok=True))
    except cusparselt.CusparseltUnsupported as e:
        if "picked algorithm 0" not in str(e):
            raise
    fn = runs[0] if len(runs) == 1 else min(runs, key=time_callable)
    return fn, _nm  # (N, M) in both layouts: out is Y.T for spmm


def _nm(y):
    return y


def _mn(y):
    return y.T
