"""x (N, K) -> x^T (K, n_pad), tokens contiguous and padded with zeros: the layout in which a
V:N:M weight's kept columns are whole rows (spmm_nm's wgmma gather). torch's strided copy reads
one side uncoalesced (~0.3 TB/s measured at Llama sizes); square tiles read and write whole
lines on both sides (~2-2.7 TB/s). A decode-sized x goes through torch's copy instead (one launch,
two where N is not a multiple of 8 and the padding is zeroed first): a few us of host time where
the Triton launch cost ~40 (64:2:8 at N = 8 ran eager calls at 2x dense's wall time for it: LOG,
session 29), and its GPU time there is a few us either way."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LaunchCache, arg_key, launch_cached

BLOCK = 64
TORCH_COPY_MAX = 1 << 20  # elements of x (2 MB in 16 bits): ~7 us at the strided copy's ~0.3 TB/s
_launches = LaunchCache()


@triton.jit
def _transpose_kernel(x_ptr, out_ptr, N, K, n_pad, sxn, sxk, BLOCK: tl.constexpr):
    pk, pn = tl.program_id(0), tl.program_id(1)
    k = (pk * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # 64-bit: a strided x may span > 2^31 elements
    n = (pn * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    tile = tl.load(x_ptr + n[:, None] * sxn + k[None, :] * sxk, mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
    tl.store(out_ptr + k[:, None] * n_pad + n[None, :], tl.trans(tile), mask=(k[:, None] < K) & (n[None, :] < n_pad))


def tokens_major(x: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """x^T as a new (K, N rounded up to `multiple`) tensor, the padding tokens zero."""
    N, K = x.shape
    n_pad = -(-N // multiple) * multiple
    if N * K <= TORCH_COPY_MAX:
        out = (torch.empty if n_pad == N else torch.zeros)(K, n_pad, device=x.device, dtype=x.dtype)
        out[:, :N].copy_(x.t())
        return out
    out = torch.empty(K, n_pad, device=x.device, dtype=x.dtype)
    if K and n_pad:
        grid = (triton.cdiv(K, BLOCK), triton.cdiv(n_pad, BLOCK))
        args = (x, out, N, K, n_pad, x.stride(0), x.stride(1))
        launch_cached(_launches, arg_key(args), _transpose_kernel, grid, args, lambda: dict(BLOCK=BLOCK))
    return out
