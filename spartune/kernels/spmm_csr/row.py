"""The row paths' kernels (Sputnik on CUDA cores): "row", "row_t" and "ell" (the same kernels on
the banded ELL copy), the transpose-pad kernel that makes row_t's token-contiguous copy of x,
and how to launch them. Why each exists: the package docstring (spmm_csr/__init__.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import CSR
from .._common import arg_key, launch_cache, launch_cached, row_chunk, scratch, swizzled_rows
from .._ell import ELL_BANDS, ELL_GRANULE, banded_ell, banded_rows
from .._epilogue import epilogue_store


@triton.jit
def _program_rows(block, order_ptr, crow_ptr, M, bands, R: tl.constexpr, NB: tl.constexpr):
    """The row paths' rows of one program: indices, which are real, where each starts, its
    length and the longest. NB > 0: from the banded ELL table (no load but the row indices);
    NB == 0: from CSR's row order and pointers."""
    if NB > 0:
        rows, rvalid, start, length, longest = banded_rows(block, order_ptr, M, bands, R, NB)
    else:
        rows, rvalid, start, length = swizzled_rows(block, order_ptr, crow_ptr, M, R)
        longest = tl.max(length, axis=0)
    return rows, rvalid, start, length, longest


@triton.jit
def _spmm_row_kernel(
    crow_ptr, col_ptr, val_ptr, order_ptr, x_ptr, out_ptr, bias_ptr, res_ptr,
    M, N,
    stride_xn, stride_xk, stride_on, stride_om, stride_rn, stride_rm,
    scale, bands,
    R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, NB: tl.constexpr, SENTINEL: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
):
    """NB > 0: col/val/order are a banded ELL copy (kernels/_ell.py) of NB bands whose padding
    entries hold column SENTINEL; NB == 0: plain CSR (bands unused)."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, rvalid, start, length, longest = _program_rows(pid_r, order_ptr, crow_ptr, M, bands, R, NB)
    toks = pid_n * BN + tl.arange(0, BN)
    tvalid = toks < N
    x_tok = x_ptr + toks[None, :, None] * stride_xn  # (1, BN, 1)
    # products are summed per lane and reduced once at the end: no shuffles in the loop
    acc3 = tl.zeros((R, BN, BNNZ), dtype=tl.float32)
    for s in range(0, longest, BNNZ):
        m, off = row_chunk(s, start, length, BNNZ)  # (R, BNNZ)
        c = tl.load(col_ptr + off, mask=m, other=0).to(tl.int32)
        v = tl.load(val_ptr + off, mask=m, other=0.0).to(tl.float32)
        if NB > 0:
            m = m & (c != SENTINEL)
        xv = tl.load(x_tok + c[:, None, :] * stride_xk, mask=m[:, None, :] & tvalid[None, :, None], other=0.0)
        acc3 += xv.to(tl.float32) * v[:, None, :]
    acc = tl.sum(acc3, axis=2)
    epilogue_store(acc, rows, rvalid, toks, tvalid, out_ptr, stride_on, stride_om, res_ptr, stride_rn, stride_rm,
                   scale, bias_ptr, HAS_BIAS, ACT, HAS_RES)


@triton.jit
def _spmm_rowt_kernel(
    crow_ptr, col_ptr, val_ptr, order_ptr, x_ptr, out_ptr, bias_ptr, res_ptr,
    M, N,
    stride_xn, stride_xk, stride_xs, stride_on, stride_om, stride_rn, stride_rm,
    scale, bands,
    R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr, PAD_K: tl.constexpr,
    NB: tl.constexpr, SENTINEL: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
):
    """The row path for x with its tokens adjacent (stride_xn == 1: spmm's X^T, or row_t's copy).

    The tile is (rows, nonzeros, tokens) with the tokens last, so each nonzero's strip of x is
    contiguous vector loads (the (rows, tokens, nonzeros) order of _spmm_row_kernel
    makes the nonzeros the fast axis and every (nonzero, token) pair a scalar load).
    PAD_K > 0: x is row_t's copy, token strips of BN stored one after the other (stride_xs), each
    (K + 1, BN) with zero tokens past N and a zero row at column PAD_K, where padding lanes point:
    the gather needs no mask, and a program's x footprint is its own strip.
    NB > 0: the banded ELL copy, as in _spmm_row_kernel (with PAD_K == SENTINEL its padding
    entries point at the zero row)."""
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, rvalid, start, length, longest = _program_rows(pid_r, order_ptr, crow_ptr, M, bands, R, NB)
    toks = pid_n * BN + tl.arange(0, BN)
    tvalid = toks < N
    x_tok = x_ptr + pid_n * stride_xs + tl.arange(0, BN)[None, None, :] * stride_xn  # (1, 1, BN)
    acc3 = tl.zeros((R, BNNZ, BN), dtype=tl.float32)
    for s in range(0, longest, BNNZ):
        m, off = row_chunk(s, start, length, BNNZ)  # (R, BNNZ)
        v = tl.load(val_ptr + off, mask=m, other=0.0).to(tl.float32)
        if PAD_K > 0:
            c = tl.load(col_ptr + off, mask=m, other=PAD_K).to(tl.int32)
            xv = tl.load(x_tok + c[:, :, None] * stride_xk)
        else:
            c = tl.load(col_ptr + off, mask=m, other=0).to(tl.int32)
            if NB > 0:
                m = m & (c != SENTINEL)
            xv = tl.load(x_tok + c[:, :, None] * stride_xk, mask=m[:, :, None] & tvalid[None, None, :], other=0.0)
        acc3 += xv.to(tl.float32) * v[:, :, None]
    acc = tl.sum(acc3, axis=1)  # (R, BN)
    epilogue_store(acc, rows, rvalid, toks, tvalid, out_ptr, stride_on, stride_om, res_ptr, stride_rn, stride_rm,
                   scale, bias_ptr, HAS_BIAS, ACT, HAS_RES)


@triton.jit
def _transpose_pad_kernel(x_ptr, xt_ptr, N, K, stride_xn, stride_xk,
                          BT: tl.constexpr, BK: tl.constexpr):
    """row_t's token-contiguous copy of x: strip s (tokens s*BT ...) is xt[s] (K + 1, BT) =
    [x[strip]^T; 0], tokens past N zero. Grid (K chunks, strips)."""
    ks = tl.program_id(0) * BK + tl.arange(0, BK)
    s = tl.program_id(1)
    tj = tl.arange(0, BT)
    ts = s * BT + tj
    v = tl.load(x_ptr + ts[:, None] * stride_xn + ks[None, :] * stride_xk,
                mask=(ts < N)[:, None] & (ks < K)[None, :], other=0.0)
    tl.store(xt_ptr + s.to(tl.int64) * (K + 1) * BT + ks[:, None] * BT + tj[None, :], tl.trans(v),
             mask=(ks <= K)[:, None])


_ROWT_WS: dict = {}  # row_t's transposed, padded copy of x (scratch(), at least 64 K elements)


def launch_row(A: CSR, x: torch.Tensor, out: torch.Tensor, config, *, bias_t, res_t, srn, srm, scale,
               has_bias, act, has_res) -> None:
    """Paths "row", "row_t" and "ell": the row kernel, or the row_t kernel where x's tokens are
    adjacent (spmm's X^T) or copied so (row_t and ell with the linear layout). Launched through
    launch_cached: at decode, Triton's own launch costs more host time than the kernel runs."""
    M, K = A.shape
    N = x.shape[0]
    grid = (triton.cdiv(M, config.block_m), triton.cdiv(N, config.block_n))
    if config.path == "ell":  # the same kernels on the banded ELL copy: no row-pointer load
        if ELL_GRANULE % config.block_m:
            raise ValueError(f"ell path: block_m must divide {ELL_GRANULE} (a program's rows share a "
                             f"band), got {config.block_m}")
        E = banded_ell(A)
        col, val, order, bands, nb, sentinel = E.cols, E.values, E.rows, E.bands, ELL_BANDS, K
    else:
        col, val, order, bands, nb, sentinel = A.col, A.values, A.row_order, (0,), 0, 0
    cache = launch_cache(A, "_csr_row_launches")
    fixed = (config, has_bias, act, has_res)  # with A's shape, what fixes the constexprs

    def launch(kernel, args, **own):
        launch_cached(cache, (fixed, own.get("PAD_K"), arg_key(args)), kernel, grid, args, lambda: dict(
            own, R=config.block_m, BNNZ=config.block_k, NB=nb, SENTINEL=sentinel, HAS_BIAS=has_bias, ACT=act,
            HAS_RES=has_res, num_warps=config.num_warps, num_stages=config.num_stages))

    if config.path in ("row_t", "ell") and x.stride(0) != 1 and N > 1:
        # strips of (K + 1, block_n) with the tokens adjacent, a zero row at K and zero tokens
        # past N: the gather becomes unmasked vector loads from the program's own strip
        bn = config.block_n
        xt = scratch(_ROWT_WS, x.device, x.dtype, grid[1] * (K + 1) * bn, minimum=1 << 16)
        pad_args = (x, xt, N, K, x.stride(0), x.stride(1))
        launch_cached(cache, ("pad", bn, arg_key(pad_args)), _transpose_pad_kernel, (triton.cdiv(K + 1, 64), grid[1]),
                      pad_args, lambda: dict(BT=bn, BK=64, num_warps=4))
        launch(_spmm_rowt_kernel, (A.crow, col, val, order, xt, out, bias_t, res_t, M, N, 1, bn, (K + 1) * bn,
                                   out.stride(0), out.stride(1), srn, srm, scale, bands), BN=bn, PAD_K=K)
    elif x.stride(0) == 1 and N > 1:
        launch(_spmm_rowt_kernel, (A.crow, col, val, order, x, out, bias_t, res_t, M, N, x.stride(0), x.stride(1),
                                   config.block_n * x.stride(0), out.stride(0), out.stride(1), srn, srm, scale, bands),
               BN=config.block_n, PAD_K=0)
    else:
        launch(_spmm_row_kernel, (A.crow, col, val, order, x, out, bias_t, res_t, M, N, x.stride(0), x.stride(1),
                                  out.stride(0), out.stride(1), srn, srm, scale, bands), BN=config.block_n)
