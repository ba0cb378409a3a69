"""cuSPARSELt 2:4 on the sparse tensor cores, called at its best.

The weight is compressed once (`torch._cslt_compress`, cached per format object) and is the
first operand: `torch._cslt_sparse_mm(Wc, x^T)` computes W @ x^T, shape (M, N), which is y^T;
it is read as y through a transposed view, never transposed by a copy.

torch's wrapper sets cuSPARSELt's plan up on every eager call (11008x4096x2048: 0.46x of
dense eager, 1.30x replayed from a CUDA graph; shared/ANCHORS.md), so each call replays a CUDA
graph captured per (weight, N, algorithm, bias fused): x is copied into the graph's static input
(zero rows pad N to a multiple of 8, which cuSPARSELt needs), the graph runs, and its static
output is handed out as a transposed view, without a copy, when no caller still holds it (a
small pool of graphs per problem, like an allocator's: a graph whose output is still viewed by
a caller is not replayed; past MAX_GRAPHS held, the call is eager). When `out` is a
transposed view (spmm), the output is copied into it (a contiguous copy). Inside the caller's
own graph capture (a graph cannot be replayed there) the call is eager: the outer graph
captures its plan anyway. Eager calls outside a capture are never used: 11008x4096, N = 2048
measured 549 us eager against 230 through the graph.

Algorithms: 0 ("cusparselt") and the one `torch._cslt_sparse_mm_search` picks for the problem
("cusparselt_search"; it declines when that is 0). Others have crashed the process with an
illegal instruction, so no other id is ever tried. cuSPARSELt fails at N = 1 ("operation not
supported"): N below MIN_N raises a clear error before cuSPARSELt is called, which the tuner
records and skips.
"""
from __future__ import annotations

import threading

import torch

from . import _common
from .dense import dense_weight

MIN_N = 8     # fewer tokens: cuSPARSELt refuses the problem ("operation not supported")
PAD_N = 8     # N must be a multiple of 8: padded with zero rows in the graph's static input
MAX_GRAPHS = 8  # graphs (static outputs) per (weight, N, algorithm, bias); past them, eager calls


class CusparseltUnsupported(RuntimeError):
    """cuSPARSELt cannot run this problem (recorded by the tuner as a failed candidate)."""


def compressed(A) -> torch.Tensor:
    """A's weight compressed for cuSPARSELt (values and metadata), once per format object."""
    return _common.cached(A, "cslt_compressed", lambda: torch._cslt_compress(dense_weight(A, keep=False).contiguous()))


def _padded(n: int) -> int:
    return -(-n // PAD_N) * PAD_N


def search_alg(A, n: int) -> int:
    """The algorithm id `_cslt_sparse_mm_search` picks for A at n tokens (cached per weight)."""
    per = _common.cached(A, "cslt_search", dict)
    n = _padded(n)
    if n not in per:
        if torch.cuda.is_current_stream_capturing():
            raise CusparseltUnsupported("cuSPARSELt's algorithm search cannot run inside a CUDA graph capture")
        x = torch.randn(n, A.shape[1], dtype=A.dtype, device=A.device)
        with _common.quiet():  # torch 2.11 warns that the private entry point is deprecated
            per[n] = int(torch._cslt_sparse_mm_search(compressed(A), x.t()))
    return per[n]


def _graph(A, n: int, alg: int, with_bias: bool) -> _common.GraphReplay:
    """One captured `_cslt_sparse_mm`: static x (n_pad, K), optional static bias, output (M, n_pad)."""
    wc = compressed(A)
    M, K = A.shape
    x = torch.zeros(_padded(n), K, dtype=A.dtype, device=A.device)
    bias = torch.zeros(M, dtype=A.dtype, device=A.device) if with_bias else None
    return _common.GraphReplay(lambda x, bias: torch._cslt_sparse_mm(wc, x.t(), bias, alg_id=alg), x, bias)


def _check(A, x):
    n = x.shape[0]
    if n < MIN_N:
        raise CusparseltUnsupported(f"cuSPARSELt 2:4 needs at least {MIN_N} tokens (N = {n}): "
                                    "it fails there ('operation not supported')")
    if x.dtype != A.dtype or A.dtype not in (torch.float16, torch.bfloat16):
        raise CusparseltUnsupported(f"cuSPARSELt 2:4 runs fp16/bf16 with x of the weight's dtype, got {x.dtype}")


_thread = threading.local()  # .called: this thread has called cuSPARSELt eagerly (it has a handle)


def _eager(A, x, alg: int, bias):
    """`_cslt_sparse_mm` called directly (its plan set up by torch on every call): (M, N), a
    tensor of its own. x is made K-contiguous and padded to a multiple of PAD_N tokens."""
    n = x.shape[0]
    if x.stride(-1) != 1 or n % PAD_N:
        xp = torch.zeros(_padded(n), x.shape[1], dtype=x.dtype, device=x.device)
        xp[:n].copy_(x)
        x = xp
    y = torch._cslt_sparse_mm(compressed(A), x.t(), bias, alg_id=alg)[:, :n]
    _thread.called = True
    return y


def _product(A, x, alg: int, bias):
    """W @ x^T, shape (M, N) (y^T), with `bias` (or None) added per row: a view of the static
    output of a graph that no caller holds (replayed again only once every view of it is
    dropped), or a tensor of its own (inside a capture or a torch operator, or all MAX_GRAPHS
    outputs held)."""
    if not _common.replays_allowed():
        return _eager(A, x, alg, bias)
    if not getattr(_thread, "called", False):
        # torch makes a thread's cuSPARSELt handle on its first call, which a CUDA graph capture
        # cannot record (it invalidates the capture); a thread that only ever replayed graphs
        # (tuning runs on a worker thread) would make it inside the caller's capture
        _eager(A, x, alg, bias)
    graphs = _common.cached(A, "cslt_graphs", dict)
    pool = graphs.setdefault((_padded(x.shape[0]), alg, bias is not None), [])
    g = next((g for g in pool if g.free()), None)
    if g is None and len(pool) < MAX_GRAPHS:
        g = _graph(A, x.shape[0], alg, bias is not None)
        pool.append(g)
    if g is None:  # every output still held by a caller: never overwrite one
        return _eager(A, x, alg, bias)
    return g(x, bias)[:, : x.shape[0]]


def run(A, x, out, alg: int, *, bias=None, activation=None, residual=None, scale=1.0, transposed_ok=False):
    """y = epilogue(x @ A^T) through cuSPARSELt algorithm `alg`, written into `out` (N, M).
    `transposed_ok`: hand out y^T's transposed view instead (no copy; cuSPARSELt at its best,
    what the benchmarks compare with). The library route writes `out`, so that the tuner's
    measurement includes the copy a row-major y costs (in a model, the next layer or a compiled
    graph wants F.linear's layout). The caller has run `_check`."""
    fuse_bias = bias is not None and scale == 1.0 and bias.dtype == A.dtype
    yt = _product(A, x, alg, bias if fuse_bias else None)  # (M, N), handed out as is
    whole = activation is None and residual is None and scale == 1.0 and (bias is None or fuse_bias) \
        and out.dtype == x.dtype
    if whole:
        if out.stride(0) == 1 and out.stride(1) == out.shape[0]:  # out = Y.T of a contiguous Y
            out.t().copy_(yt)
            return out
        if transposed_ok:
            return yt.t()
        return out.copy_(yt.t())
    return _common.finish(yt.t(), out, None if fuse_bias else bias, activation, residual, scale)


def cusparselt_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0, transposed_ok=False):
    """cuSPARSELt 2:4, algorithm 0, for 2:4 fp16/bf16 weights only."""
    _check(A, x)
    return run(A, x, out, 0, bias=bias, activation=activation, residual=residual, scale=scale,
               transposed_ok=transposed_ok)


def cusparselt_search_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0,
                             transposed_ok=False):
    """cuSPARSELt 2:4 with the algorithm its search picks for this N; declines when that is 0
    (the same as `cusparselt_linear`)."""
    _check(A, x)
    alg = search_alg(A, x.shape[0])
    if alg == 0:
        raise CusparseltUnsupported("cuSPARSELt's search picked algorithm 0: the same as 'cusparselt'")
    return run(A, x, out, alg, bias=bias, activation=activation, residual=residual, scale=scale,
               transposed_ok=transposed_ok)
