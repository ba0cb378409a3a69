"""SpMM with an unstructured CSR weight, in PyTorch's linear layout: out = act(scale * x @ A^T + bias) + residual.

Three paths, chosen by `Config.path` (the tuner decides, never this file):

* ``"row"`` — Sputnik on CUDA cores. A program owns `block_m` sparse rows, taken in
  `A.row_order` (longest first: heavy rows start early and the rows of one program have
  similar lengths), and a strip of `block_n` tokens. It walks the rows' nonzeros `block_k`
  at a time: one vector load of column indices (int16) and values, a (rows, tokens, nonzeros)
  gather of x, a multiply-reduce. Every nonzero is read once per token strip, so for decode
  (N <= 32: one strip) the kernel streams the values and indices once. Its weakness is the
  gather of x: nnz x N elements through L1/L2, hopeless for prefill. In the linear layout the
  tokens of one column of x are K apart, so every (nonzero, token) pair is its own scalar load
  (~14 SASS instructions per pair); with tokens adjacent (spmm's X^T, or ``"row_t"``) they are
  16-byte vector loads and a pair costs ~4.5 instructions.

* ``"row_t"`` — the row path on a token-contiguous copy of x made first (one extra copy
  kernel of N x K elements: cheap for decode, where it makes the row path ~3x cheaper).

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
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..formats import CSR
from ..tune.problem import KernelFeatures, Problem
from ._epilogue import ACTIVATION_CODES, epilogue

PATHS = ("row", "row_t", "dense")
_ELEM = {"float16": 2, "bfloat16": 2, "float32": 4}
# ALU work of the dense path's expansion per dense element of a tile, in flop-equivalents
# (2 per instruction, as an FMA counts 2): ~14 SASS instructions per element on sm_90 (bit test,
# popc, add, 64-bit address, predicated gather, store to shared memory for the MMA).
EXPAND_FLOPS_PER_ELEMENT = 28.0


@dataclass(frozen=True)
class Config:
    path: str  # "row" | "row_t" (row on a token-contiguous copy of x) | "dense"
    block_m: int  # row: sparse rows per program; dense: rows of the output tile
    block_n: int  # tokens per program
    block_k: int  # row: nonzeros per step of a row; dense: K chunk (multiple of 32)
    num_warps: int = 4
    num_stages: int = 2
    group_m: int = 8  # dense: program swizzle so programs running together share x chunks
    split_k: int = 1  # dense: programs sharing one tile along K (decode: enough programs in flight)


# ---------------------------------------------------------------------------------------------
# the bitmap the dense path expands from (shared with SDDMM)
# ---------------------------------------------------------------------------------------------
_BITMAP_KEY = "_spartune_csr_bitmap"


def csr_bitmap(A: CSR) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits, word_offsets), each int32 (rows, ceil(cols / 32)).

    bits[r, w] bit j is set when A stores (r, 32w + j); word_offsets[r, w] is the index in
    A.values of the first nonzero of row r at or after column 32w. Built with a few torch ops
    on first use and memoised on the (immutable) format object, so a call costs nothing.
    """
    cached = A.__dict__.get(_BITMAP_KEY)
    if cached is not None:
        return cached
    rows, cols = A.shape
    kw = max(1, -(-cols // 32))
    dev = A.crow.device
    nnz = A.col.numel()
    lengths = (A.crow[1:] - A.crow[:-1]).long()
    r = torch.repeat_interleave(torch.arange(rows, device=dev), lengths, output_size=nnz)
    c = A.col.long()
    word = r * kw + (c >> 5)
    bits64 = torch.zeros(rows * kw, dtype=torch.int64, device=dev)
    bits64.index_add_(0, word, torch.ones_like(c) << (c & 31))  # distinct bits: sum == or
    bits = torch.where(bits64 >= 2**31, bits64 - 2**32, bits64).to(torch.int32).view(rows, kw)
    counts = torch.zeros(rows * kw, dtype=torch.int64, device=dev)
    counts.index_add_(0, word, torch.ones_like(c))
    counts = counts.view(rows, kw)
    woff = (A.crow[:-1, None].long() + torch.cumsum(counts, 1) - counts).to(torch.int32)
    out = (bits.contiguous(), woff.contiguous())
    object.__setattr__(A, _BITMAP_KEY, out)
    return out


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _spmm_row_kernel(
    crow_ptr, col_ptr, val_ptr, order_ptr, x_ptr, out_ptr, bias_ptr, res_ptr,
    M, N,
    stride_xn, stride_xk, stride_on, stride_om, stride_rn, stride_rm,
    scale,
    R: tl.constexpr, BN: tl.constexpr, BNNZ: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = pid_r * R + tl.arange(0, R)
    rvalid = slot < M
    rows = tl.load(order_ptr + slot, mask=rvalid, other=0)
    start = tl.load(crow_ptr + rows, mask=rvalid, other=0)
    length = tl.load(crow_ptr + rows + 1, mask=rvalid, other=0) - start
    toks = pid_n * BN + tl.arange(0, BN)
    tvalid = toks < N
    x_tok = x_ptr + toks[None, :, None] * stride_xn  # (1, BN, 1)
    # products are summed per lane and reduced once at the end: no shuffles in the loop
    acc3 = tl.zeros((R, BN, BNNZ), dtype=tl.float32)
    longest = tl.max(length, axis=0)
    for s in range(0, longest, BNNZ):
        j = s + tl.arange(0, BNNZ)
        m = j[None, :] < length[:, None]  # (R, BNNZ)
        off = start[:, None] + j[None, :]
        c = tl.load(col_ptr + off, mask=m, other=0).to(tl.int32)
        v = tl.load(val_ptr + off, mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x_tok + c[:, None, :] * stride_xk, mask=m[:, None, :] & tvalid[None, :, None], other=0.0)
        acc3 += xv.to(tl.float32) * v[:, None, :]
    acc = tl.sum(acc3, axis=2)
    omask = rvalid[:, None] & tvalid[None, :]
    acc = epilogue(acc, rows[:, None], rvalid[:, None], toks[None, :] * stride_rn + rows[:, None] * stride_rm,
                   omask, scale, bias_ptr, res_ptr, HAS_BIAS, ACT, HAS_RES)
    tl.store(out_ptr + toks[None, :] * stride_on + rows[:, None] * stride_om,
             acc.to(out_ptr.dtype.element_ty), mask=omask)


# Triton's interpreter (CPU tests) has no popc; it runs the same arithmetic with a SWAR popcount.
HW_POPC = os.environ.get("TRITON_INTERPRET", "0") not in ("1", "true", "True")


@triton.jit
def _popc(x, HW: tl.constexpr):
    """Set bits of each int32."""
    if HW:
        return libdevice.popc(x)
    else:
        x = x - ((x >> 1) & 0x55555555)  # the masks make the arithmetic shifts safe
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return (x * 0x01010101) >> 24


@triton.jit
def _expand_chunk(bits_row, base, k0, KW, rvalid, BM: tl.constexpr, BK: tl.constexpr, HW: tl.constexpr):
    """Where the stored entries of a (BM, BK) chunk starting at column k0 (a multiple of 32) are.

    Returns (bit, idx, count): bit (BM, BK) is True where an entry is stored, idx its index in
    `values` (row offset `base` + entries in earlier words + popc of the word's bits up to the
    element - 1), count (BM,) the entries of the chunk per row. Per element: an and, a popc,
    an add, a bit test (about 14 SASS instructions per element with the gather, vs ~21 with a
    prefix scan, which Triton lowers through shared memory).
    """
    W: tl.constexpr = BK // 32
    wi = k0 // 32 + tl.arange(0, W)
    w = tl.load(bits_row[:, None] + wi[None, :], mask=rvalid[:, None] & (wi < KW)[None, :], other=0)  # (BM, W)
    cnt = _popc(w, HW)
    start = base[:, None] + tl.cumsum(cnt, axis=1) - cnt - 1  # (BM, W): entries before the word, minus one
    b = tl.arange(0, 32)
    w3 = w[:, :, None]
    bit = (w3 & (1 << b)[None, None, :]) != 0
    idx = start[:, :, None] + _popc(w3 & ((2 << b) - 1)[None, None, :], HW)  # (2 << 31) - 1 wraps to all ones
    return tl.reshape(bit, (BM, BK)), tl.reshape(idx, (BM, BK)), tl.sum(cnt, axis=1)


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
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsize
    pid_n = (pid % width) // gsize

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
    bit, pos, cnt = _expand_chunk(bits_row, base, k_lo, KW, rvalid & (k_lo < k_hi), BM, BK, HW)
    a = tl.load(val_ptr + pos, mask=bit, other=0.0)
    base += cnt
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        bit, pos, cnt = _expand_chunk(bits_row, base, k0 + BK, KW, rvalid & (k0 + BK < k_hi), BM, BK, HW)
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


# ---------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------
def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs follow torch's matmul setting (tf32 only when torch allows it)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


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
    if config.path in ("row", "row_t"):
        if config.path == "row_t" and x.stride(0) != 1 and N > 1:
            x = x.t().contiguous().t()  # (N, K) with tokens adjacent: the gather becomes vector loads
        grid = (triton.cdiv(M, config.block_m), triton.cdiv(N, config.block_n))
        _spmm_row_kernel[grid](
            A.crow, A.col, A.values, A.row_order, x, out, bias_t, res_t,
            M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm, scale,
            R=config.block_m, BN=config.block_n, BNNZ=config.block_k,
            HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
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
    else:
        raise ValueError(f"unknown path {config.path!r}; expected one of {PATHS}")
    return out


# ---------------------------------------------------------------------------------------------
# the config space and what each config costs (for the cost model)
# ---------------------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def _smem_dense(dtype: str, bm: int, bn: int, bk: int, stages: int) -> int:
    s = _ELEM.get(dtype, 2)
    return stages * bk * bn * s + bm * bk * s


def space(problem: Problem) -> list[Config]:
    """Valid configs of both paths for this problem (about 15-30)."""
    n = max(1, problem.n)
    out: list[Config] = []
    # --- row path: Sputnik, CUDA cores ---------------------------------------------------------
    # steps longer than the typical row waste lanes; tiles of 1-8K elements keep registers sane
    nnz_cap = max(32, _pow2(int(problem.stats.items_mean)))
    bns = {min(_pow2(n), 32)} | ({8} if n > 8 else set()) | ({64} if n > 64 else set())
    paths = ["row"] + (["row_t"] if 1 < n <= 64 and problem.op != "spmm" else [])
    for path in paths:
        for bn in sorted(bns):
            if path == "row_t" and bn < 16 and n >= 16:
                continue
            picked = 0
            for r, bnnz in ((1, 512), (2, 256), (4, 128), (8, 64), (4, 256), (16, 64), (8, 128),
                            (2, 128), (4, 64), (16, 32), (32, 32), (1, 128)):
                tile = r * bn * bnnz
                if bnnz > nnz_cap or not 1024 <= tile <= 8192 or picked >= (5 if path == "row" else 3):
                    continue
                out.append(Config(path, r, bn, bnnz, num_warps=4 if tile <= 4096 else 8, num_stages=2))
                picked += 1
            if not picked:
                out.append(Config(path, 4, bn, 64, num_warps=4, num_stages=2))
    # --- dense path: tensor cores -----------------------------------------------------------
    if n <= 32:
        # decode: few tiles, so K is split until ~4 programs per SM are in flight
        bn = max(16, _pow2(n))
        for bm, bk, w in ((16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 8), (128, 64, 8)):
            tiles = -(-problem.m // bm) * -(-n // bn)
            chunks = -(-problem.k // bk)
            want = _pow2(-(-528 // max(1, tiles)))
            for split in sorted({1, min(want, max(1, chunks // 2)), min(2 * want, max(1, chunks // 2))}):
                out.append(Config("dense", bm, bn, bk, num_warps=w, num_stages=3, split_k=split))
    else:
        cand = [(64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 32, 8, 3), (128, 128, 64, 8, 3),
                (64, 256, 32, 8, 3), (64, 256, 64, 8, 3), (128, 256, 32, 8, 3), (128, 256, 64, 8, 3),
                (128, 128, 64, 8, 4), (64, 128, 128, 4, 3)]
        for bm, bn, bk, w, st in cand:
            bn = min(bn, max(16, _pow2(n)))
            c = Config("dense", bm, bn, bk, num_warps=w, num_stages=st)
            if c not in out and _smem_dense(problem.dtype, bm, bn, bk, st) <= 200 * 1024:
                out.append(c)
    return out


def features(problem: Problem, config: Config) -> KernelFeatures:
    st = problem.stats
    M, K, N = problem.m, problem.k, max(1, problem.n)
    s = _ELEM.get(problem.dtype, 2)
    idx = 2 if K < 2**15 else 4
    nnz = st.nnz
    epi = problem.epilogue
    epi_bytes = (M * s if epi.bias else 0) + (N * M * s if epi.residual else 0)
    y_bytes = N * M * s
    x_bytes = N * K * s
    if config.path in ("row", "row_t"):
        r, bn, bnnz = config.block_m, config.block_n, config.block_k
        strips = -(-N // bn)
        programs = -(-M // r) * strips
        # x gather: a token-contiguous x (spmm's X^T) moves useful bytes; the linear layout pays
        # about one sector per gathered element when nonzeros are sparse along K
        adjacent = problem.op == "spmm" or config.path == "row_t" or N == 1
        per_elem = s if adjacent else min(32.0, s / max(st.density, 1e-6))
        gather = nnz * strips * bn * per_elem
        copy = 2 * x_bytes if config.path == "row_t" else 0
        stream = nnz * (s + idx) + 12 * M
        steps_max = -(-st.items_max // bnnz)
        # a program runs as long as its longest row; rows are sorted, so about the mean
        steps_mean = max(0.0, math.ceil((st.items_mean * (1 + 0.5 * st.items_cv / max(1, r) ** 0.5)) / bnnz))
        return KernelFeatures(
            programs=programs, tiles=programs, mma_flops=0.0,
            # in flop-equivalents (2 per instruction): ~4.5 SASS instructions per (nonzero, token)
            # with vector loads of x, ~14 without
            fma_flops=2.0 * nnz * strips * bn * (4.5 if adjacent else 14.0),
            dram_bytes=float(stream + x_bytes + y_bytes + epi_bytes + copy),
            l2_bytes=float(stream * strips + gather + y_bytes + epi_bytes + copy),
            steps_max=int(steps_max), steps_mean=float(steps_mean),
            smem_bytes=r * bn * 4, num_warps=config.num_warps, num_stages=config.num_stages,
            regs_per_thread=min(255, max(48, 32 + r * bn * bnnz // (32 * config.num_warps))),
            launches=2 if config.path == "row_t" and N > 1 else 1,
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
        fma_flops=EXPAND_FLOPS_PER_ELEMENT * tm * bm * tk * bk * tn,
        dram_bytes=float(w_bytes + x_bytes + y_bytes + epi_bytes),
        l2_bytes=float(w_bytes * tn + x_bytes * tm + y_bytes + epi_bytes),
        steps_max=steps, steps_mean=float(steps),
        smem_bytes=_smem_dense(problem.dtype, bm, bn, bk, config.num_stages),
        num_warps=config.num_warps, num_stages=config.num_stages, split_k=split,
        reduce_bytes=float(reduce), regs_per_thread=regs,
    )


__all__ = ["Config", "PATHS", "csr_bitmap", "features", "launch", "space"]
