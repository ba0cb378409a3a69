"""SpMM with an unstructured CSR weight, in PyTorch's linear layout: out = act(scale * x @ A^T + bias) + residual.

Five paths, chosen by `Config.path` (the tuner decides, never this file):

* ``"row"`` — Sputnik on CUDA cores. A program owns `block_m` sparse rows, taken in
  `A.row_order` (longest first: heavy rows start early and the rows of one program have
  similar lengths), and a strip of `block_n` tokens. It walks the rows' nonzeros `block_k`
  at a time: one vector load of column indices (int16) and values, a (rows, tokens, nonzeros)
  gather of x, a multiply-reduce. Every nonzero is read once per token strip, so for decode
  (N <= 32: one strip) the kernel streams the values and indices once. Its weakness is the
  gather of x: nnz x N elements through L1/L2, hopeless for prefill. In the linear layout the
  tokens of one column of x are K apart, so every (nonzero, token) pair is its own scalar load
  (~14 SASS instructions per pair); with tokens adjacent (spmm's X^T) the row path runs
  ``"row_t"``'s kernel instead.

* ``"row_t"`` — the row path on a token-contiguous copy of x made first (one extra copy
  kernel of N x K elements: cheap for decode). The copy is stored in strips of `block_n` tokens,
  each (K + 1, block_n) with a zero row at K, and the kernel orders its tile (rows, nonzeros,
  tokens), so every nonzero's strip of x (block_n contiguous elements) is unmasked vector
  loads: ~4 SASS instructions per (nonzero, token) on sm_90 (benchmarks/LOG.md, CSR decode; at
  decode the gather is bound by the L1, one cache line per nonzero). The row path uses the same
  kernel whenever x's tokens are already adjacent (spmm's X^T).

* ``"ell"`` — decode: the row and row_t kernels on a banded ELL copy of A (kernels/_ell.py):
  rows sorted longest first, padded to their band's width, so a program computes where its
  rows are from a band table passed as arguments instead of loading row pointers first. At
  decode the kernel is a few dependent round trips long, and that one was ~1.5 us of 7.3 at
  N = 1 (benchmarks/LOG.md). Costs a second copy of the weight, ~2-4% padded, dropped when
  no config chosen for the weight runs on it (`release_unused`).

* ``"expand"`` — prefill: a first kernel expands A (bitmap + values, as the dense path does) into a
  dense (M, K rounded up to 128) workspace once per call, then a dense Triton GEMM with the fused
  epilogue. Each element is expanded once instead of once per token tile, at the price of a
  transient M x K workspace and its DRAM round trip.

* ``"dense"`` — "load as sparse, compute as dense" (Flash-LLM) on tensor cores. A program owns
  `block_m` rows x `block_n` tokens and walks K in chunks of `block_k`. The rows' nonzeros of a
  chunk are expanded into a dense (block_m, block_k) tile in registers from a per-row bitmap
  (bit j of word w of row r is set when column 32w+j is stored; built once per CSR object and
  memoised on it): the position of element (r, j) in `values` is the row's running offset plus
  popc of the word's bits up to j, so the expansion is a masked gather of the values that are
  really there, and `tl.dot` multiplies the tile with the x chunk, loaded once and shared by
  all block_m rows. The gather of chunk i+1 is issued before the dot of chunk i. DRAM traffic
  of the weight: values + 1 bit per element (no column indices). Expansion costs ~14 SASS
  instructions per dense element of the tile (sm_90), amortised over block_n tokens: at
  block_n = 256 that is below the MMA time of the chunk, so prefill runs near dense speed;
  decode (one token tile) is bound by it. `split_k` > 1 splits K over programs (decode: enough
  programs in flight); partial sums meet in an fp32 workspace and the last program of a tile
  applies the epilogue.

Every output element is written: a row without nonzeros gets act(bias) + residual.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..formats import CSR
from ..tune.problem import INDEX_CHAIN, KernelFeatures, Problem
from ._bitmap import EXPAND_FLOPS_PER_ELEMENT, HW_POPC, csr_bitmap, expand_chunk
from ._ell import ELL_BANDS, ELL_GRANULE, ELL_WIDTH_STEP, banded_ell, banded_rows, drop_banded_ell
from ._common import ELEMENT_BYTES, dot_precision, grouped_order, next_pow2, row_chunk, scratch, swizzled_rows
from ._epilogue import ACTIVATION_CODES, epilogue, epilogue_store

PATHS = ("row", "row_t", "ell", "dense", "expand")


@dataclass(frozen=True)
class Config:
    path: str  # "row" | "row_t" (row on a token-contiguous copy of x) | "ell" | "dense" | "expand"
    block_m: int  # row: sparse rows per program; dense: rows of the output tile
    block_n: int  # tokens per program
    block_k: int  # row: nonzeros per step of a row; dense: K chunk (multiple of 32)
    num_warps: int = 4
    num_stages: int = 2
    group_m: int = 8  # dense: program swizzle so programs running together share x chunks
    split_k: int = 1  # dense: programs sharing one tile along K (decode: enough programs in flight)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
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


@triton.jit
def _spmm_dense_kernel(
    crow_ptr, bits_ptr, woff_ptr, val_ptr, x_ptr, out_ptr, bias_ptr, res_ptr, ws_ptr, lock_ptr,
    M, N, K, KW,
    stride_xn, stride_xk, stride_on, stride_om, stride_rn, stride_rm,
    scale,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, PRECISION: tl.constexpr,
    HW: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    pid_m, pid_n = grouped_order(pid, num_m, num_n, GROUP_M)

    rows = pid_m * BM + tl.arange(0, BM)
    rvalid = rows < M
    bits_row = bits_ptr + rows.to(tl.int64) * KW
    toks = pid_n * BN + tl.arange(0, BN)
    tvalid = toks < N
    kj = tl.arange(0, BK)
    x_tile = x_ptr + toks[None, :] * stride_xn + kj[:, None] * stride_xk  # (BK, BN): x^T chunk
    if SPLIT == 1:
        k_lo = 0
        k_hi = K
        base = tl.load(crow_ptr + rows, mask=rvalid, other=0)
    else:  # this program's share of K starts at a word boundary: its offsets come from the table
        k_per = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
        k_lo = tl.program_id(1) * k_per
        k_hi = tl.minimum(K, k_lo + k_per)
        base = tl.load(woff_ptr + rows.to(tl.int64) * KW + k_lo // 32, mask=rvalid & (k_lo < K), other=0)

    # the values gather of chunk i+1 is issued before the dot of chunk i (its latency hides there)
    bit, pos, cnt = expand_chunk(bits_row, base, k_lo, KW, rvalid & (k_lo < k_hi), BM, BK, HW)
    a = tl.load(val_ptr + pos, mask=bit, other=0.0)
    base += cnt
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        bit, pos, cnt = expand_chunk(bits_row, base, k0 + BK, KW, rvalid & (k0 + BK < k_hi), BM, BK, HW)
        a_next = tl.load(val_ptr + pos, mask=bit, other=0.0)
        base += cnt
        xt = tl.load(x_tile + k0 * stride_xk, mask=((k0 + kj) < K)[:, None] & tvalid[None, :], other=0.0)
        acc = tl.dot(a, xt, acc, input_precision=PRECISION)
        a = a_next

    omask = rvalid[:, None] & tvalid[None, :]
    out_off = toks[None, :] * stride_on + rows[:, None] * stride_om
    res_off = toks[None, :] * stride_rn + rows[:, None] * stride_rm
    if SPLIT == 1:
        acc = epilogue(acc, rows[:, None], rvalid[:, None], res_off, omask, scale, bias_ptr, res_ptr,
                       HAS_BIAS, ACT, HAS_RES)
        tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        # split-K fix-up: partial sums meet in an fp32 workspace; the last program of the tile
        # applies the epilogue, then leaves the workspace and its counter at zero for next time
        ws_off = toks[None, :].to(tl.int64) * M + rows[:, None]
        tl.atomic_add(ws_ptr + ws_off, acc, mask=omask, sem="relaxed")
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.load(ws_ptr + ws_off, mask=omask, other=0.0, cache_modifier=".cg")
            total = epilogue(total, rows[:, None], rvalid[:, None], res_off, omask, scale, bias_ptr, res_ptr,
                             HAS_BIAS, ACT, HAS_RES)
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.store(ws_ptr + ws_off, tl.zeros((BM, BN), dtype=tl.float32), mask=omask)
            tl.atomic_xchg(lock_ptr + pid, 0)


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


_WORKSPACES: dict = {}


def _split_workspace(device: torch.device, numel: int, locks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed fp32 workspace and tile counters for split-K, one pair per device. Kernels leave
    both at zero, so one allocation serves every later call, CUDA-graph replays included (make
    the first call before capturing). Split-K launches on two streams at once must not share a
    device."""
    ws, lk = _WORKSPACES.get(device, (None, None))
    if ws is None or ws.numel() < numel:
        ws = torch.zeros(max(numel, 1 << 16), dtype=torch.float32, device=device)
    if lk is None or lk.numel() < locks:
        lk = torch.zeros(max(locks, 1024), dtype=torch.int32, device=device)
    _WORKSPACES[device] = (ws, lk)
    return ws, lk


_EXPAND_M, _EXPAND_K = 32, 128  # the expand kernel's tile
_DENSE_WS: dict = {}


def _padded_k(K: int) -> int:
    """Row length of the expanded weight: K rounded up to the expand tile (a multiple of every
    block_k of the expand path), so the GEMM reads w without masks."""
    return -(-K // _EXPAND_K) * _EXPAND_K


_ROWT_WS: dict = {}  # row_t's transposed, padded copy of x (scratch(), at least 64 K elements)

# ---------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------
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
    scale = float(scale)
    if config.path in ("row", "row_t", "ell"):
        grid = (triton.cdiv(M, config.block_m), triton.cdiv(N, config.block_n))
        if config.path == "ell":  # the same kernels on the banded ELL copy: no row-pointer load
            if ELL_GRANULE % config.block_m:
                raise ValueError(f"ell path: block_m must divide {ELL_GRANULE} (a program's rows share a "
                                 f"band), got {config.block_m}")
            E = banded_ell(A)
            col, val, order, layout = E.cols, E.values, E.rows, dict(bands=E.bands, NB=ELL_BANDS, SENTINEL=K)
        else:
            col, val, order, layout = A.col, A.values, A.row_order, dict(bands=(0,), NB=0, SENTINEL=0)
        common = dict(R=config.block_m, BNNZ=config.block_k, HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res,
                      num_warps=config.num_warps, num_stages=config.num_stages, **layout)
        if config.path in ("row_t", "ell") and x.stride(0) != 1 and N > 1:
            # strips of (K + 1, block_n) with the tokens adjacent, a zero row at K and zero tokens
            # past N: the gather becomes unmasked vector loads from the program's own strip
            bn = config.block_n
            xt = scratch(_ROWT_WS, x.device, x.dtype, grid[1] * (K + 1) * bn, minimum=1 << 16)
            _transpose_pad_kernel[(triton.cdiv(K + 1, 64), grid[1])](
                x, xt, N, K, x.stride(0), x.stride(1), BT=bn, BK=64, num_warps=4)
            _spmm_rowt_kernel[grid](
                A.crow, col, val, order, xt, out, bias_t, res_t,
                M, N, 1, bn, (K + 1) * bn, out.stride(0), out.stride(1), srn, srm, scale,
                BN=bn, PAD_K=K, **common)
        elif x.stride(0) == 1 and N > 1:
            _spmm_rowt_kernel[grid](
                A.crow, col, val, order, x, out, bias_t, res_t,
                M, N, x.stride(0), x.stride(1), config.block_n * x.stride(0), out.stride(0), out.stride(1),
                srn, srm, scale, BN=config.block_n, PAD_K=0, **common)
        else:
            _spmm_row_kernel[grid](
                A.crow, col, val, order, x, out, bias_t, res_t,
                M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm, scale,
                BN=config.block_n, **common)
    elif config.path == "dense":
        bits, woff = csr_bitmap(A)
        tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
        split = config.split_k
        ws, locks = _split_workspace(out.device, N * M, tiles) if split > 1 else (out, A.crow)
        _spmm_dense_kernel[(tiles, split)](
            A.crow, bits, woff, A.values, x, out, bias_t, res_t, ws, locks,
            M, N, K, bits.shape[1],
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm, scale,
            BM=config.block_m, BN=config.block_n, BK=config.block_k, GROUP_M=config.group_m, SPLIT=split,
            HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res, PRECISION=dot_precision(x.dtype), HW=HW_POPC,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
    elif config.path == "expand":
        bits, woff = csr_bitmap(A)
        kp = _padded_k(K)
        w = scratch(_DENSE_WS, x.device, x.dtype, M * kp)
        _expand_kernel[(triton.cdiv(M, _EXPAND_M), max(1, kp // _EXPAND_K))](
            bits, woff, A.values, w, M, kp, bits.shape[1],
            EM=_EXPAND_M, EK=_EXPAND_K, HW=HW_POPC, num_warps=4,
        )
        bt, bm = config.block_n, config.block_m
        _gemm_nt_kernel[(triton.cdiv(N, bt) * triton.cdiv(M, bm),)](
            x, w, out, bias_t, res_t, M, N, K, kp,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm, scale,
            BT=bt, BM=bm, BK=config.block_k, GROUP=config.group_m, EVEN_K=K % config.block_k == 0,
            HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res, PRECISION=dot_precision(x.dtype),
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
    else:
        raise ValueError(f"unknown path {config.path!r}; expected one of {PATHS}")
    return out


def release_unused(A: CSR, configs) -> None:
    """The tuner's measurements of the ell path build A's banded ELL copy, a second copy of the
    weight: dropped unless one of the configs chosen for A (`configs`) runs on it."""
    if not any(c.path == "ell" for c in configs):
        drop_banded_ell(A)


# ---------------------------------------------------------------------------------------------
# the config space and what each config costs (for the cost model)
# ---------------------------------------------------------------------------------------------
# The ell path pads rows within a band; past this spread of row lengths (coefficient of
# variation) bands of 32 rows waste too much to try it
ELL_MAX_CV = 1.0


def ell_padding(st) -> float:
    """Padding entries per row the banded ELL copy is expected to hold: half a width step, and
    about a third of the row-length spread a band of sorted rows covers."""
    return ELL_WIDTH_STEP / 2 + st.items_mean * st.items_cv / 3


def _smem_dense(dtype: str, bm: int, bn: int, bk: int, stages: int) -> int:
    s = ELEMENT_BYTES.get(dtype, 2)
    return stages * bk * bn * s + bm * bk * s


def _tokens_adjacent(problem: Problem) -> bool:
    """x's tokens are contiguous (spmm's X^T): the row path's gather is then vector loads."""
    return problem.layout == "spmm" or problem.op == "spmm"


def space(problem: Problem) -> list[Config]:
    """Valid configs of the five paths for this problem (about 15-40)."""
    n = max(1, problem.n)
    out: list[Config] = []
    # --- row path: Sputnik, CUDA cores ---------------------------------------------------------
    # steps longer than the typical row waste lanes; tiles of 1-8K elements keep registers sane
    nnz_cap = max(32, next_pow2(int(problem.stats.items_mean)))
    bns = {min(next_pow2(n), 32)} | ({8} if n > 8 else set()) | ({16} if n > 16 else set())
    if n > 64:  # prefill: the row path gathers nnz x N elements and cannot win; a few configs
        bns = {64}
    if 1 < n <= 64 and not _tokens_adjacent(problem):
        # row_t: (rows, nonzeros, tokens) tiles of <= 64 fp32 accumulators per thread; all tokens
        # in one strip up to 32 (one pass over the values)
        # (16 < N <= 64 also in 16-token strips: each strip's x copy is a smaller L1 footprint)
        for bn in sorted({min(next_pow2(n), 32)} | ({16} if n > 16 else set()), reverse=True):
            # small programs first: 1-2 warps with 32-64 nonzeros per row in flight measured best
            # (benchmarks/profile_decode.py: qkv N=16, 2x64 on 2 warps 12.5 us vs 4x128 on 4 15.2)
            for r, bnnz, w in ((2, 64, 2), (2, 32, 1), (1, 64, 1), (4, 32, 2), (4, 64, 4), (2, 128, 4),
                               (1, 128, 2), (1, 256, 4))[: 8 if bn == min(next_pow2(n), 32) else 3]:
                if bnnz <= max(64, nnz_cap) and r * bnnz * bn <= 64 * 32 * w:
                    out.append(Config("row_t", r, bn, bnnz, num_warps=w, num_stages=2))
    if n <= 32 and problem.stats.items_cv <= ELL_MAX_CV:
        # --- ell: the row kernels on the banded ELL copy (decode: the row-pointer round trip
        # before the first index load is gone; benchmarks/LOG.md, "CSR decode at N = 1") -------
        if n == 1:  # the row kernel, a whole row per step: (rows, warps)
            step = min(512, max(64, nnz_cap))
            for r, w in ((2, 2), (4, 4), (4, 8), (1, 2), (8, 8)):
                out.append(Config("ell", r, 1, step, num_warps=w, num_stages=2))
        else:  # row_t's kernel (x copied token-contiguous unless it already is)
            bn = min(next_pow2(n), 32)
            for r, bnnz, w in ((2, 64, 2), (2, 32, 1), (1, 64, 1), (4, 32, 2), (4, 64, 4), (1, 128, 2)):
                if bnnz <= max(64, nnz_cap) and r * bnnz * bn <= 64 * 32 * w:
                    out.append(Config("ell", r, bn, bnnz, num_warps=w, num_stages=2))
    for bn in sorted(bns):
        picked = 0
        for r, bnnz in ((1, 512), (2, 256), (4, 128), (8, 64), (4, 256), (16, 64), (8, 128),
                        (2, 128), (4, 64), (16, 32), (32, 32), (1, 128)):
            tile = r * bn * bnnz
            if bnnz > nnz_cap or not 1024 <= tile <= 8192 or picked >= (5 if n <= 64 else 3):
                continue
            out.append(Config("row", r, bn, bnnz, num_warps=4 if tile <= 4096 else 8, num_stages=2))
            picked += 1
        if not picked:
            out.append(Config("row", 4, bn, 64, num_warps=4, num_stages=2))
    # --- dense path: tensor cores -----------------------------------------------------------
    if n <= 32:
        # decode: few tiles, so K is split until ~4 programs per SM are in flight
        bn = max(16, next_pow2(n))
        for bm, bk, w in ((16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 8), (128, 64, 8)):
            tiles = -(-problem.m // bm) * -(-n // bn)
            chunks = -(-problem.k // bk)
            want = next_pow2(-(-528 // max(1, tiles)))
            for split in sorted({1, min(want, max(1, chunks // 2)), min(2 * want, max(1, chunks // 2))}):
                out.append(Config("dense", bm, bn, bk, num_warps=w, num_stages=3, split_k=split))
    else:
        cand = [(64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 32, 8, 3), (128, 128, 64, 8, 3),
                (64, 256, 32, 8, 3), (64, 256, 64, 8, 3), (128, 256, 32, 8, 3), (128, 256, 64, 8, 3),
                (128, 128, 64, 8, 4), (64, 128, 128, 4, 3)]
        for bm, bn, bk, w, st in cand:
            bn = min(bn, max(16, next_pow2(n)))
            c = Config("dense", bm, bn, bk, num_warps=w, num_stages=st)
            if c not in out and _smem_dense(problem.dtype, bm, bn, bk, st) <= 200 * 1024:
                out.append(c)
    # --- expand path: densify once, then a dense tensor-core GEMM (prefill) ---------------------
    if n >= 128:
        s = ELEMENT_BYTES.get(problem.dtype, 2)
        for bm, bt, bk, w, st in ((256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4),
                                  (128, 128, 64, 8, 4), (256, 128, 64, 8, 4), (128, 128, 32, 4, 4)):
            bt = min(bt, max(16, next_pow2(n)))
            if s == 4 and bk > 32:
                bk = 32
            c = Config("expand", bm, bt, bk, num_warps=w, num_stages=st)
            if c not in out and st * (bm + bt) * bk * s <= 200 * 1024:
                out.append(c)
    return out


# The dense path's fused expansion, per element, in units of the standalone expand kernel's
# (fitted on the train half of benchmarks/data/h100-2026-11-22-run6, benchmarks/fit_model.py)
FUSED_EXPAND_COST = 2.5


def features(problem: Problem, config: Config) -> KernelFeatures:
    st = problem.stats
    M, K, N = problem.m, problem.k, max(1, problem.n)
    s = ELEMENT_BYTES.get(problem.dtype, 2)
    idx = 2 if K < 2**15 else 4
    nnz = st.nnz
    epi = problem.epilogue
    epi_bytes = (M * s if epi.bias else 0) + (N * M * s if epi.residual else 0)
    y_bytes = N * M * s
    x_bytes = N * K * s
    if config.path in ("row", "row_t", "ell"):
        r, bn, bnnz = config.block_m, config.block_n, config.block_k
        strips = -(-N // bn)
        programs = -(-M // r) * strips
        ell = config.path == "ell"
        # x gather: a token-contiguous x (spmm's X^T) moves useful bytes; the linear layout pays
        # about one sector per gathered element when nonzeros are sparse along K
        adjacent = _tokens_adjacent(problem) or config.path in ("row_t", "ell") or N == 1
        per_elem = s if adjacent else min(32.0, s / max(st.density, 1e-6))
        gather = nnz * strips * bn * per_elem
        copied = config.path in ("row_t", "ell") and N > 1 and not _tokens_adjacent(problem)
        copy = 2 * x_bytes if copied else 0
        padding = ell_padding(st) if ell else 0.0  # per row; streamed like the nonzeros
        stream = (nnz + M * padding) * (s + idx) + (4 if ell else 12) * M
        # a program runs as long as its longest row; rows are sorted, so about the mean. The
        # row paths load their row pointers before the first index: one dependent round trip
        # more, declared as a share of a step's index -> tile chain (problem.INDEX_CHAIN)
        prologue = 0.0 if ell else 1.0 / INDEX_CHAIN
        steps_max = math.ceil(-(-st.items_max // bnnz) + prologue)
        steps_mean = prologue + max(0.0, math.ceil(
            (st.items_mean * (1 + 0.5 * st.items_cv / max(1, r) ** 0.5) + padding) / bnnz))
        return KernelFeatures(
            programs=programs, tiles=programs, mma_flops=0.0,
            # in flop-equivalents (2 per instruction): ~3.5 SASS instructions per (nonzero, token)
            # with vector loads of x, ~14 without
            fma_flops=2.0 * nnz * strips * bn * (3.5 if adjacent else 14.0),
            dram_bytes=float(stream + x_bytes + y_bytes + epi_bytes + copy),
            l2_bytes=float(stream * strips + gather + y_bytes + epi_bytes + copy),
            steps_max=int(steps_max), steps_mean=float(steps_mean),
            smem_bytes=r * bn * 4, num_warps=config.num_warps, num_stages=config.num_stages,
            regs_per_thread=min(255, max(48, 32 + r * bn * bnnz // (32 * config.num_warps))),
            launches=2 if copied else 1,
        )
    if config.path == "expand":
        bm, bt, bk = config.block_m, config.block_n, config.block_k
        kp = _padded_k(K)
        tm, tn, tk = -(-M // bm), -(-N // bt), -(-kp // bk)
        bitmap = M * (-(-K // 32)) * 4
        dense_w = M * kp * s  # written by the expand kernel, read back by the GEMM
        return KernelFeatures(
            programs=tm * tn, tiles=tm * tn,
            mma_flops=2.0 * tm * bm * tn * bt * tk * bk,
            fma_flops=EXPAND_FLOPS_PER_ELEMENT * M * kp,  # once per element, not per token tile
            dram_bytes=float(nnz * s + bitmap + 2 * dense_w + x_bytes + y_bytes + epi_bytes),
            l2_bytes=float(nnz * s + bitmap + dense_w + dense_w * tn + x_bytes * tm + y_bytes + epi_bytes),
            steps_max=tk, steps_mean=float(tk),
            smem_bytes=config.num_stages * (bm + bt) * bk * s,
            num_warps=config.num_warps, num_stages=config.num_stages,
            regs_per_thread=min(255, 40 + bm * bt // (32 * config.num_warps)), launches=2,
        )
    bm, bn, bk, split = config.block_m, config.block_n, config.block_k, config.split_k
    tm, tn, tk = -(-M // bm), -(-N // bn), -(-K // bk)
    programs = tm * tn * split
    steps = -(-tk // split)
    reduce = 3 * 4 * tm * bm * tn * bn * split if split > 1 else 0  # fp32 atomics + read-back + reset
    threads = 32 * config.num_warps
    regs = min(255, 40 + (bm * bn + 2 * bm * bk) // threads)  # fits ptxas's counts on sm_90 within ~10%
    bitmap = M * (-(-K // 32)) * 4
    w_bytes = nnz * s + bitmap + 4 * M
    return KernelFeatures(
        programs=programs, tiles=programs,  # with split-K every (tile, share of K) is a work item
        mma_flops=2.0 * tm * bm * tn * bn * tk * bk,
        # the expansion runs per token tile inside the GEMM's loop, where it measured about
        # FUSED_EXPAND_COST times the standalone expand kernel's cost per element (run6: the
        # dense path was predicted 2x fast at every N; registers shared with the accumulator)
        fma_flops=FUSED_EXPAND_COST * EXPAND_FLOPS_PER_ELEMENT * tm * bm * tk * bk * tn,
        dram_bytes=float(w_bytes + x_bytes + y_bytes + epi_bytes),
        l2_bytes=float(w_bytes * tn + x_bytes * tm + y_bytes + epi_bytes),
        steps_max=steps, steps_mean=float(steps),
        smem_bytes=_smem_dense(problem.dtype, bm, bn, bk, config.num_stages),
        # the expansion's bitmap -> values chain is prefetched one chunk ahead by hand, whatever
        # num_stages pipelines (x): one step in flight
        num_warps=config.num_warps, num_stages=2, split_k=split,
        reduce_bytes=float(reduce), regs_per_thread=regs,
    )


__all__ = ["Config", "PATHS", "csr_bitmap", "features", "launch", "release_unused", "space"]
