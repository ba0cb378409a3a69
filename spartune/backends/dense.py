"""cuBLAS on the decompressed weight: the baseline every op must beat, and the fallback of
sddmm / sparse_softmax (the dense product, then the stored positions gathered)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import reference
from ..formats import CSR, SparseFormat
from . import _common


def dense_weight(A: SparseFormat, keep: bool = True) -> torch.Tensor:
    """The decompressed weight, memoised per values version; float64 (references, gradcheck,
    which perturbs values through `.data` without a version bump) is decompressed every call.
    keep=False: the memo if there is a current one, else made and not kept (another library's
    copy is made from it)."""
    if A.dtype == torch.float64:
        return A.to_dense()
    return _common.cached(A, "dense", lambda: decompress(A), keep=keep)


def decompress(A: SparseFormat) -> torch.Tensor:
    """A.to_dense(), made now: a CSR weight on the GPU in one pass of a kernel (kernels.densify:
    the lean policy pays it on every call where dense wins)."""
    if type(A) is CSR and A.device.type == "cuda":
        from ..kernels.densify import csr_to_dense

        return csr_to_dense(A)
    return A.to_dense()


def dense_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0, keep=True):
    """cuBLAS on the decompressed weight (keep=False: decompressed for this call, never a kept
    copy, which the tuner would then time without the decompression). Returns
    F.linear's own result when that is the whole op (no copy into `out`); the bias rides in
    cuBLAS's epilogue, with a ReLU after it (cuBLASLt's RELU_BIAS epilogue, through
    torch._addmm_activation; its GELU is tanh's on the GPU and exact on the CPU, so GELU stays
    apart), a residual without a bias as the GEMM's C; other epilogues run in place on the
    GEMM's output."""
    w = dense_weight(A) if keep else decompress(A)
    plain = scale == 1.0 and out.dtype == x.dtype
    b = None if bias is None else bias.to(w.dtype)
    if plain and x.dim() == 2 and out.shape[0] > 1 and out.stride(0) == 1 and out.stride(1) != 1:
        # x = X.T and out = Y.T (ops.linear keeps that layout): Y = W X straight into out's memory
        if b is None:
            torch.mm(w, x.T, out=out.T)
        else:
            torch.addmm(b[:, None], w, x.T, out=out.T)
        return _common.activate_and_add_(out, activation, residual)
    if plain and activation is None and residual is None:
        return F.linear(x, w, b)
    if plain and activation is None and b is None and x.dim() == 2 and residual.dtype == x.dtype:
        return torch.addmm(residual, x, w.t(), out=out)
    if plain and activation == "relu" and b is not None and residual is None:
        y = torch._addmm_activation(b, x.reshape(-1, x.shape[-1]), w.t())
        return y.view(*x.shape[:-1], w.shape[0])
    if plain:  # F.linear's own output, finished in place
        return _common.activate_and_add_(F.linear(x, w, b), activation, residual)
    return _common.finish(F.linear(x, w), out, bias, activation, residual, scale)


def transient_dense_linear(A, x, out, **epilogue):
    """dense_linear without a dense copy kept: the weight decompressed on each call into memory
    the caching allocator hands to the next layer's (the lean memory policy's dense)."""
    return dense_linear(A, x, out, keep=False, **epilogue)


def dense_sddmm(a, b, pattern, scale):
    """sddmm as the dense product a @ b^T (fp32), gathered at the pattern's stored positions."""
    wide = torch.promote_types(a.dtype, torch.float32)  # fp32 accumulation, float64 kept
    return pattern.gather((a.to(wide) @ b.to(wide).T) * scale).to(a.dtype)


def dense_softmax(A, scale):
    """sparse_softmax as the dense reference, gathered at A's stored positions."""
    return A.gather(reference.sparse_softmax(A, scale)).to(A.dtype)


def value_order(pattern):
    """Value positions in row-major order of their (row, col), to compare with mask-indexed references."""
    return pattern.stored_positions()[0]
