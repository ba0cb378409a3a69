"""SpMM with an unstructured CSR weight, in PyTorch's linear layout: out = act(scale * x @ A^T + bias) + residual.

Five paths, chosen by `Config.path` (the tuner decides, never this package). The kernels live
by algorithm: row.py (row, row_t, ell), dense.py, expand.py; configs.py holds Config, the config
space and the cost-model features; this file dispatches a launch on `config.path`.

* ``"row"`` (row.py) — Sputnik on CUDA cores. A program owns `block_m` sparse rows, taken in
  `A.row_order` (longest first: heavy rows start early and the rows of one program have
  similar lengths), and a strip of `block_n` tokens. It walks the rows' nonzeros `block_k`
  at a time: one vector load of column indices (int16) and values, a (rows, tokens, nonzeros)
  gather of x, a multiply-reduce. Every nonzero is read once per token strip, so for decode
  (N <= 32: one strip) the kernel streams the values and indices once. Its weakness is the
  gather of x: nnz x N elements through L1/L2, hopeless for prefill. In the linear layout the
  tokens of one column of x are K apart, so every (nonzero, token) pair is its own scalar load
  (~14 SASS instructions per pair); with tokens adjacent (spmm's X^T) the row path runs
  ``"row_t"``'s kernel instead.

* ``"row_t"`` (row.py) — the row path on a token-contiguous copy of x made first (one extra
  copy kernel of N x K elements: cheap for decode). The copy is stored in strips of `block_n`
  tokens, each (K + 1, block_n) with a zero row at K, and the kernel orders its tile (rows,
  nonzeros, tokens), so every nonzero's strip of x (block_n contiguous elements) is unmasked
  vector loads: ~4 SASS instructions per (nonzero, token) on sm_90 (benchmarks/LOG.md, CSR
  decode; at decode the gather is bound by the L1, one cache line per nonzero).

* ``"ell"`` (row.py) — decode: the row and row_t kernels on a banded ELL copy of A
  (kernels/_ell.py): rows sorted longest first, padded to their band's width, so a program
  computes where its rows are from a band table passed as arguments instead of loading row
  pointers first. At decode the kernel is a few dependent round trips long, and that one was
  ~1.5 us of 7.3 at N = 1 (benchmarks/LOG.md). Costs a second copy of the weight, ~2-4%
  padded, dropped when no config chosen for the weight runs on it (`release_unused`).

* ``"expand"`` (expand.py) — prefill: a first kernel expands A (bitmap + values, as the dense
  path does) into a dense (M, K rounded up to 128) workspace once per call, then a dense Triton
  GEMM with the fused epilogue. Each element is expanded once instead of once per token tile,
  at the price of a transient M x K workspace and its DRAM round trip.

* ``"dense"`` (dense.py) — "load as sparse, compute as dense" (Flash-LLM) on tensor cores. A
  program owns `block_m` rows x `block_n` tokens and walks K in chunks of `block_k`. The rows'
  nonzeros of a chunk are expanded into a dense (block_m, block_k) tile in registers from a
  per-row bitmap (bit j of word w of row r is set when column 32w+j is stored; built once per
  CSR object and memoised on it): the position of element (r, j) in `values` is the row's
  running offset plus popc of the word's bits up to j, so the expansion is a masked gather of
  the values that are really there, and `tl.dot` multiplies the tile with the x chunk, loaded
  once and shared by all block_m rows. The gather of chunk i+1 is issued before the dot of
  chunk i. DRAM traffic of the weight: values + 1 bit per element (no column indices).
  Expansion costs ~14 SASS instructions per dense element of the tile (sm_90), amortised over
  block_n tokens: at block_n = 256 that is below the MMA time of the chunk, so prefill runs
  near dense speed; decode (one token tile) is bound by it. `split_k` > 1 splits K over
  programs (decode: enough programs in flight); partial sums meet in an fp32 workspace and the
  last program of a tile applies the epilogue.

Every output element is written: a row without nonzeros gets act(bias) + residual.
"""
from __future__ import annotations

import torch

from ...formats import CSR
from .._bitmap import csr_bitmap, drop_csr_bitmap
from .._ell import drop_banded_ell
from .._epilogue import ACTIVATION_CODES
from .configs import PATHS, Config, features, space
from .dense import launch_dense
from .expand import launch_expand
from .row import launch_row


def launch(A: CSR, x: torch.Tensor, out: torch.Tensor, config: Config, *, bias=None, activation=None,
           residual=None, scale: float = 1.0) -> torch.Tensor:
    """out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual; strides of x, out, residual free."""
    M, K = A.shape
    N = x.shape[0]
    if M == 0 or N == 0:
        return out
    act = ACTIVATION_CODES[activation]
    has_bias, has_res = bias is not None, residual is not None
    bias_t = bias if has_bias else out
    res_t = residual if has_res else out
    srn, srm = (residual.stride(0), residual.stride(1)) if has_res else (0, 0)
    epi = dict(bias_t=bias_t, res_t=res_t, srn=srn, srm=srm, scale=float(scale),
               has_bias=has_bias, act=act, has_res=has_res)
    if config.path in ("row", "row_t", "ell"):
        launch_row(A, x, out, config, **epi)
    elif config.path == "dense":
        launch_dense(A, x, out, config, **epi)
    elif config.path == "expand":
        launch_expand(A, x, out, config, **epi)
    else:
        raise ValueError(f"unknown path {config.path!r}; expected one of {PATHS}")
    return out


def release_unused(A: CSR, configs) -> None:
    """The tuner's measurements of the ell path build A's banded ELL copy, a second copy of the
    weight, and those of the dense and expand paths its bitmap (4 bytes per 16 dense elements):
    each dropped unless one of the configs chosen for A (`configs`: this family's, and sddmm's on
    the same pattern, whose dense path reads the bitmap too) runs on it."""
    from ..sddmm import Config as SddmmConfig

    if not any(isinstance(c, Config) and c.path == "ell" for c in configs):
        drop_banded_ell(A)
    if not any(isinstance(c, (Config, SddmmConfig)) and c.path in ("dense", "expand") for c in configs):
        drop_csr_bitmap(A)


__all__ = ["Config", "PATHS", "csr_bitmap", "features", "launch", "release_unused", "space"]
