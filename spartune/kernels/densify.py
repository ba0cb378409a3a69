"""A CSR weight decompressed into a dense matrix in one pass: the lean memory policy's dense
product decompresses on every call instead of keeping a dense copy. torch's scatter
(`CSR.to_dense`) widens every row and column index to 64 bits in memory of its own first and
zero-fills apart; here a program per row zero-fills its row and then writes its nonzeros over
it, so the dense bytes are written once and the nonzeros' writes land in lines L2 just took."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats import CSR
from ._common import LaunchCache, align16, launch_cached

BLOCK_K = 2048  # dense columns zeroed per step
BLOCK_NZ = 1024  # nonzeros written per step
NUM_WARPS = 8  # 4 warps: 7B down 90 us, 8: 58 (LOG, session 31)
_launches = LaunchCache()


@triton.jit
def _csr_densify_kernel(crow_ptr, col_ptr, val_ptr, out_ptr, K, BLOCK_K: tl.constexpr, BLOCK_NZ: tl.constexpr):
    row = tl.program_id(0)
    base = out_ptr + row.to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        tl.store(base + k, tl.zeros([BLOCK_K], dtype=out_ptr.dtype.element_ty), mask=k < K)
    tl.debug_barrier()  # the zeros before the nonzeros: other threads of the program write both
    # (64-bit: a step's indices may pass 2^31 near that many nonzeros)
    start, end = tl.load(crow_ptr + row).to(tl.int64), tl.load(crow_ptr + row + 1).to(tl.int64)
    for i0 in range(start, end, BLOCK_NZ):
        i = i0 + tl.arange(0, BLOCK_NZ)
        inside = i < end
        c = tl.load(col_ptr + i, mask=inside, other=0).to(tl.int32)
        tl.store(base + c, tl.load(val_ptr + i, mask=inside), mask=inside)


def csr_to_dense(A: CSR, block_k: int = BLOCK_K, block_nz: int = BLOCK_NZ, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """A as a new dense (rows, cols) tensor, equal to A.to_dense()."""
    rows, cols = A.shape
    out = torch.empty(rows, cols, dtype=A.dtype, device=A.device)
    if rows and cols:
        args = (A.crow, A.col, A.values, out, cols)
        key = (A.dtype, A.col.dtype, align16(A.crow), align16(A.col), align16(A.values), cols % 16 == 0, cols == 1,
               block_k, block_nz, num_warps)
        launch_cached(_launches, key, _csr_densify_kernel, (rows,), args,
                      lambda: dict(BLOCK_K=block_k, BLOCK_NZ=block_nz, num_warps=num_warps))
    return out
