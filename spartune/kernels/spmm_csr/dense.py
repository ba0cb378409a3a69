"""The "dense" path's kernel ("load as sparse, compute as dense", Flash-LLM, on tensor cores),
its split-K workspace and how to launch it. Why it exists: the package docstring
(spmm_csr/__init__.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import CSR
from .._bitmap import HW_POPC, csr_bitmap, expand_chunk
from .._common import arg_key, arrival_counters, dot_precision, grouped_order, grown, launch_cache, launch_cached
from .._epilogue import epilogue


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


_WORKSPACES: dict = {}


def _split_workspace(device: torch.device, numel: int, locks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed fp32 workspace, one per device, and the tile counters (arrival_counters). The
    kernel leaves both at zero, so one allocation serves every later call, CUDA-graph replays
    included (make the first call before capturing)."""
    ws = grown(_WORKSPACES, device, numel,
               lambda n: torch.zeros(max(n, 1 << 16), dtype=torch.float32, device=device))
    return ws, arrival_counters(device, locks)


def launch_dense(A: CSR, x: torch.Tensor, out: torch.Tensor, config, *, bias_t, res_t, srn, srm, scale,
                 has_bias, act, has_res) -> None:
    """Path "dense": one launch; with split_k > 1 the programs of a tile meet in _WORKSPACES."""
    M, K = A.shape
    N = x.shape[0]
    bits, woff = csr_bitmap(A)
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
    split = config.split_k
    ws, locks = _split_workspace(out.device, N * M, tiles) if split > 1 else (out, A.crow)
    args = (A.crow, bits, woff, A.values, x, out, bias_t, res_t, ws, locks, M, N, K, bits.shape[1],
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), srn, srm, scale)
    precision = dot_precision(x.dtype)
    key = (config, has_bias, act, has_res, precision, arg_key(args))
    launch_cached(launch_cache(A, "_csr_dense_launches"), key, _spmm_dense_kernel, (tiles, split), args, lambda: dict(
        BM=config.block_m, BN=config.block_n, BK=config.block_k, GROUP_M=config.group_m, SPLIT=split,
        HAS_BIAS=has_bias, ACT=act, HAS_RES=has_res, PRECISION=precision, HW=HW_POPC,
        num_warps=config.num_warps, num_stages=config.num_stages))
