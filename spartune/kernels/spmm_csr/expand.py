"""The "expand" path's kernels: the expand kernel (A's bitmap and values into a dense,
K-padded workspace, once per call) and the dense GEMM with the fused epilogue that reads it,
and how to launch them. Why it exists: the package docstring (spmm_csr/__init__.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import CSR
from .._bitmap import HW_POPC, csr_bitmap, expand_chunk
from .._common import arg_key, dot_precision, grouped_order, launch_cache, launch_cached, scratch
from .._epilogue import epilogue


@triton.jit
def _expand_kernel(bits_ptr, woff_ptr, val_ptr, w_ptr, M, KP, KW,
                   EM: tl.constexpr, EK: tl.constexpr, HW: tl.constexpr):
    """Writes the dense (EM, EK) tile of A at (rows pid0 * EM, columns pid1 * EK) into w (M, KP):
    the bitmap expansion of the dense path, done once per element instead of once per token tile."""
    rows = tl.program_id(0) * EM + tl.arange(0, EM)
    rvalid = rows < M
    k0 = tl.program_id(1) * EK
    bits_row = bits_ptr + rows.to(tl.int64) * KW
    base = tl.load(woff_ptr + rows.to(tl.int64) * KW + k0 // 32, mask=rvalid & (k0 // 32 < KW), other=0)
    bit, pos, cnt = expand_chunk(bits_row, base, k0, KW, rvalid, EM, EK, HW)
    a = tl.load(val_ptr + pos, mask=bit, other=0.0)
    cols = k0 + tl.arange(0, EK)
    tl.store(w_ptr + rows[:, None].to(tl.int64) * KP + cols[None, :], a.to(w_ptr.dtype.element_ty),
             mask=rvalid[:, None] & (cols < KP)[None, :])


@triton.jit
def _gemm_nt_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, res_ptr,
    M, N, K, KP,
    stride_xn, stride_xk, stride_on, stride_om, stride_rn, stride_rm,
    scale,
    BT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, PRECISION: tl.constexpr,
):
    """out (N, M) = epilogue(x (N, K) @ w (M, KP)^T): both operands K-major, a (BT tokens, BM
    features) tile per program, grouped so programs running together share x and w panels.
    w's columns K..KP are zero (written by _expand_kernel), so only x needs a K mask."""
    pid = tl.program_id(0)
    num_t = tl.cdiv(N, BT)
    num_m = tl.cdiv(M, BM)
    pid_t, pid_m = grouped_order(pid, num_t, num_m, GROUP)
    toks = pid_t * BT + tl.arange(0, BT)
    cols = pid_m * BM + tl.arange(0, BM)
    kk = tl.arange(0, BK)
    # out-of-range tokens / features read a valid row (wrapped) and are never stored: no masks
    xp = x_ptr + (toks % N)[:, None] * stride_xn + kk[None, :] * stride_xk  # (BT, BK)
    wp = w_ptr + (cols % M)[None, :].to(tl.int64) * KP + kk[:, None]  # (BK, BM): w^T chunk
    acc = tl.zeros((BT, BM), dtype=tl.float32)
    for k0 in range(0, KP, BK):
        if EVEN_K:
            a = tl.load(xp)
        else:
            a = tl.load(xp, mask=(k0 + kk < K)[None, :], other=0.0)
        b = tl.load(wp)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        xp += BK * stride_xk
        wp += BK
    tvalid = toks < N
    cvalid = cols < M
    omask = tvalid[:, None] & cvalid[None, :]
    acc = epilogue(acc, cols[None, :], cvalid[None, :], toks[:, None] * stride_rn + cols[None, :] * stride_rm,
                   omask, scale, bias_ptr, res_ptr, HAS_BIAS, ACT, HAS_RES)
    tl.store(out_ptr + toks[:, None] * stride_on + cols[None, :] * stride_om,
             acc.to(out_ptr.dtype.element_ty), mask=omask)


_EXPAND_M, _EXPAND_K = 32, 128  # the expand kernel's tile
_DENSE_WS: dict = {}


def padded_k(K: int) -> int:
    """Row length of the expanded weight: K rounded up to the expand tile (a multiple of every
    block_k of the expand path), so the GEMM reads w without masks."""
    return -(-K // _EXPAND_K) * _EXPAND_K


def launch_expand(A: CSR, x: torch.Tensor, out: torch.Tensor, config, *, bias_t, res_t, srn, srm, scale,
                  has_bias, act, has_res) -> None:
    """Path "expand": the expand kernel into a scratch workspace, then the GEMM."""
    M, K = A.shape
    N = x.shape[0]
    bits, woff = csr_bitmap(A)
    kp = padded_k(K)
    w = scratch(_DENSE_WS, x.device, x.dtype, M * kp)
    cache = launch_cache(A, "_csr_expand_launches")
    args = (bits, woff, A.values, w, M, kp, bits.shape[1])
    launch_cached(cache, ("expand", arg_key(args)), _expand_kernel,
                  (triton.cdiv(M, _EXPAND_M), max(1, kp // _EXPAND_K)), args,
                  lambda: dict(EM=_EXPAND_M, EK=_EXPAND_K, HW=HW_POPC, num_warps=4))
    bt, bm = config.block_n, config.block_m
    args = (x, w, out, bias_t, res_t, M, N, K, kp, x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm,
            scale)
    precision = dot_precision(x.dtype)
    launch_cached(cache, (config, has_bias, act, has_res, precision, arg_key(args)), _gemm_nt_kernel,
                  (triton.cdiv(N, bt) * triton.cdiv(M, bm),), args, lambda: dict(
                      BT=bt, BM=bm, BK=config.block_k, GROUP=config.group_m, EVEN_K=K % config.block_k == 0,
                      HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res, PRECISION=precision,
                      num_warps=config.num_warps, num_stages=config.num_stages))
