"""The public ops: their signatures and input checks (a clear error before any kernel runs);
everything after the checks is dispatch.py's.

Hot path of a tuned call: one dict lookup for the weight's dispatch state, the checks, one for
the call's launcher, and the launch.
"""
from __future__ import annotations

import torch

from . import dispatch
from .dispatch import get_tuner, memory_policy, set_memory_policy, set_mode  # noqa: F401  (the tuner of this process)
from .epilogue import check_activation
from .formats import CSR, BlockSparse, SparseFormat
from .reference import TOLERANCE
from .tune.problem import fp16_reduction_allowed

# float64 runs torch's dense product (references, gradcheck); the others run the tuned kernels
_DTYPES = (*(getattr(torch, name) for name in TOLERANCE), torch.float64)


# --- input checks ------------------------------------------------------------------------------
def _format_check(op: str, name: str = "A"):
    def check(A):
        if not isinstance(A, SparseFormat):
            raise TypeError(f"{op}: {name} must be a spartune format (CSR, BlockSparse, ...), got {type(A).__name__}")
        if A.dtype not in _DTYPES:
            raise TypeError(f"{op}: {name} must hold float16, bfloat16, float32 or float64 values, got {A.dtype} (use .with_values)")
    return check


_CHECKS = {op: _format_check(op) for op in ("linear", "spmm", "prepare")}


def check_format(op: str, A) -> None:
    """A is a spartune format in a dtype the ops take: the first check of either route."""
    _CHECKS[op](A)


# whether any torch.autocast region is on: one C call, so a call outside autocast pays ~0.1 us
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_AUTOCAST_DEVICES = ("cuda", "cpu", "xpu", "mps")  # (torch.is_autocast_enabled raises on others: meta)


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype torch.autocast runs a linear layer in for x, or None outside autocast (float64
    and non-float inputs are left as they are, as autocast leaves them)."""
    device = x.device.type
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or device not in _AUTOCAST_DEVICES \
            or not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


def check_tensor(name, t, *, dtype=None, device=None, dim=None, last=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if dtype is not None and t.dtype != dtype:
        hint = " (torch.autocast does not cast the format given to spartune.linear: convert it, " \
            "A.to(x.dtype), or use SparseLinear, which follows autocast)" if autocast_dtype(t) is not None else ""
        raise TypeError(f"{name} has dtype {t.dtype} but the weight is {dtype}: convert one of them{hint}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the weight is on {device}: move one of them (A.to(device))")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if last is not None and (t.dim() == 0 or t.shape[-1] != last):
        raise ValueError(f"{name} must have last dimension {last}, got shape {tuple(t.shape)}")


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    return float(scale)


def _epilogue_dtypes(dtype) -> tuple:
    """What outputs and epilogue operands may be: the kernels read and write no float64 unless
    the weight is float64."""
    return _DTYPES if dtype == torch.float64 else _DTYPES[:-1]


def check_out_dtype(out_dtype, dtype):
    allowed = _epilogue_dtypes(dtype)
    if out_dtype is not None and out_dtype not in allowed:
        raise TypeError(f"out_dtype must be one of {list(allowed)} for a {dtype} weight, got {out_dtype}")


def _check_epilogue_dtype(name, t, dtype):
    allowed = _epilogue_dtypes(dtype)
    if t.dtype not in allowed:
        raise TypeError(f"{name} must be one of {list(allowed)} for a {dtype} weight, got {t.dtype}")


def check_prologue(input_bias, input_activation, K: int, device, dtype) -> tuple:
    """(input_bias at unit stride, input_activation) once both are checked: the prologue."""
    if input_bias is None:
        raise ValueError("input_activation needs input_bias (the prologue is act(x + input_bias))")
    check_tensor("input_bias", input_bias, device=device, dim=1, last=K)
    _check_epilogue_dtype("input_bias", input_bias, dtype)
    check_activation(input_activation)
    return input_bias if input_bias.stride(0) == 1 else input_bias.contiguous(), input_activation


def check_linear_args(x, dtype, device, M: int, K: int, bias, activation, residual, scale, out_dtype,
                      input_bias=None, input_activation=None) -> tuple:
    """linear's checks past x's own, for both routes (eager and the operator's, where autograd
    records or torch.compile traces): (bias at unit stride, scale as a float, the prologue or None)."""
    if bias is not None:
        check_tensor("bias", bias, device=device, dim=1, last=M)
        _check_epilogue_dtype("bias", bias, dtype)
        if bias.stride(0) != 1:  # the epilogues read bias[m] at unit stride: a copy, the user's is kept
            bias = bias.contiguous()
    if residual is not None:
        check_tensor("residual", residual, device=device)
        _check_epilogue_dtype("residual", residual, dtype)
        if residual.shape[:-1] != x.shape[:-1] or residual.shape[-1] != M:
            raise ValueError(f"residual must have shape {(*x.shape[:-1], M)}, got {tuple(residual.shape)}")
    if activation is not None:
        check_activation(activation)
    if out_dtype is not None:
        check_out_dtype(out_dtype, dtype)
    if scale != 1.0 or type(scale) is not float:
        scale = check_scale(scale)
    prologue = None if input_bias is None and input_activation is None else \
        check_prologue(input_bias, input_activation, K, device, dtype)
    return bias, scale, prologue


def check_pattern(op: str, name: str, A) -> None:
    """sddmm's and sparse_softmax's sparsity pattern, for both routes."""
    if not isinstance(A, (CSR, BlockSparse)):
        raise TypeError(f"{op}: {name} must be CSR or BlockSparse, got {type(A).__name__}")


def check_spmm(A, X, out_dtype) -> None:
    """spmm's X and out_dtype, for both routes."""
    M, K = A.shape
    check_tensor("X", X, dtype=A.dtype, device=A.device, dim=2)
    if X.shape[0] != K:
        raise ValueError(f"X must have {K} rows (A is {M}x{K}), got shape {tuple(X.shape)}")
    check_out_dtype(out_dtype, A.dtype)


def check_sddmm(a, b, pattern) -> None:
    """sddmm's operands, for both routes."""
    check_pattern("sddmm", "pattern", pattern)
    M, N = pattern.shape
    check_tensor("a", a, device=pattern.device, dim=2)
    if a.dtype not in _DTYPES:
        raise TypeError(f"a must be float16, bfloat16, float32 or float64, got {a.dtype}")
    check_tensor("b", b, device=pattern.device, dim=2)
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a is {a.dtype}: convert one of them")
    if a.shape[0] != M or b.shape[0] != N or a.shape[1] != b.shape[1]:
        raise ValueError(f"sddmm needs a (M={M}, D) and b (N={N}, D); got {tuple(a.shape)} and {tuple(b.shape)}")


# --- public ops ---------------------------------------------------------------------------------
def linear(x, A, bias=None, activation=None, residual=None, *, scale: float = 1.0, out_dtype=None,
           input_bias=None, input_activation=None):
    """act(scale * x @ A^T + bias) + residual, for x of shape (..., K): torch's F.linear layout.

    fp16/bf16 inputs accumulate in fp32; fp32 inputs run on the tensor cores as tf32.
    With `input_bias` (K,), x is first taken as input_activation(x + input_bias), in x's dtype:
    the bias and activation of x's producer (a convolution), applied as x loads where the
    tuned kernel can (x itself is not changed).
    A 2-D x whose tokens are contiguous (x = X.T of a (K, N) matrix) gives an out of the same
    layout (Y.T of an (M, N) one), as elementwise ops keep theirs: consecutive layers then stay in
    that layout, which Shfl-BW weights need to run at block-sparse speed.
    """
    st = dispatch.state(A, _CHECKS["linear"])
    dtype, device, M, K = st.meta
    if type(x) is not torch.Tensor or x.dim() == 0 or x.shape[-1] != K or x.dtype != dtype or x.device != device \
            or x.layout != torch.strided:
        check_tensor("x", x, dtype=dtype, device=device, last=K)  # raises the precise error
    prologue = None
    if residual is not None or activation is not None or out_dtype is not None or scale != 1.0 \
            or type(scale) is not float or input_bias is not None or input_activation is not None or not (
                bias is None or isinstance(bias, torch.Tensor) and bias.dtype == dtype and bias.device == device
                and bias.shape == (M,) and bias.layout == torch.strided and bias.stride(0) == 1):
        # (the common calls, no epilogue or a bias as the kernels read it, pass by: the host's hot path)
        bias, scale, prologue = check_linear_args(x, dtype, device, M, K, bias, activation, residual, scale,
                                                  out_dtype, input_bias, input_activation)
    flat = x.dim() == 2
    x2 = x if flat else x.reshape(-1, K)  # a view whenever the leading dims allow one
    n = x2.shape[0]
    if flat and n > 1 and x2.stride(0) == 1 and x2.stride(1) != 1:
        # x = X.T of a (K, N) matrix: out keeps that layout (Y.T of an (M, N) one), so the layout
        # passes on to the next layer; Shfl-BW's kernels need it to gather whole rows and store
        # the permuted rows whole
        out = torch.empty((M, n), dtype=out_dtype or dtype, device=device).T
    else:
        out = torch.empty((n, M), dtype=out_dtype or dtype, device=device)
    res2 = residual if residual is None or flat else residual.reshape(-1, M)
    key = (x2.shape[0], dtype, out.dtype, bias is not None, activation, residual is not None, scale != 1.0,
           x2.stride(1) == 1, out.stride(1) == 1, None if prologue is None else (prologue[0].dtype, input_activation),
           fp16_reduction_allowed(dtype))
    launch = st.launchers.get(key) or dispatch.tune_linear(A, st, key, x2, out, bias, activation, res2, scale,
                                                           prologue)
    got = launch(A, x2, out, bias, activation, res2, scale, prologue)
    if got is not out and out.stride(0) == 1 and got.stride() != out.stride():  # a library's own row-major result
        got = out.copy_(got)
    return got if flat else got.reshape(*x.shape[:-1], M)


def spmm(A, X, *, out_dtype=None):
    """A @ X for X of shape (K, N). Same kernels as `linear`, on transposed views (no copies)."""
    st = dispatch.state(A, _CHECKS["spmm"])
    check_spmm(A, X, out_dtype)
    M = st.meta[2]
    Y = torch.empty(M, X.shape[1], dtype=out_dtype or X.dtype, device=X.device)
    x, out = X.T, Y.T
    key = (x.shape[0], x.dtype, out.dtype, False, None, False, False, x.stride(1) == 1, out.stride(1) == 1, None,
           fp16_reduction_allowed(x.dtype))
    launch = st.launchers.get(key) or dispatch.tune_linear(A, st, key, x, out, None, None, None, 1.0)
    got = launch(A, x, out, None, None, None, 1.0)
    if got.data_ptr() != Y.data_ptr():  # a library backend returned its own tensor
        Y.T.copy_(got)
    return Y


def prepare(A, n: int, *, bias: bool = False, activation=None, residual: bool = False, out_dtype=None) -> None:
    """Tune `linear` for this weight at n tokens now (on random inputs), not at the first call."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prepare: n (tokens) must be a positive int, got {n!r}")
    dispatch.state(A, _CHECKS["prepare"])
    M, K = A.shape
    x = torch.randn(n, K, device=A.device).to(A.dtype)
    linear(x, A, torch.randn(M, device=A.device).to(A.dtype) if bias else None, activation,
           torch.randn(n, M, device=A.device).to(A.dtype) if residual else None, out_dtype=out_dtype)


def sddmm(a, b, pattern, *, scale: float = 1.0):
    """scale * (a @ b^T) at the stored positions of `pattern` (CSR or BlockSparse), returned as
    the same format with new values (fp32 accumulation, a's dtype)."""
    scale = check_scale(scale)
    check_sddmm(a, b, pattern)
    return dispatch.sddmm(dispatch.state(pattern, _format_check("sddmm", "pattern")), a, b, pattern, scale)


def sparse_softmax(A, *, scale: float = 1.0):
    """Row-wise softmax over the stored entries of A (CSR or BlockSparse); an empty row stays
    empty. Returns the same format with the probabilities as values."""
    check_pattern("sparse_softmax", "A", A)
    scale = check_scale(scale)
    return dispatch.sparse_softmax(dispatch.state(A, _format_check("sparse_softmax")), A, scale)
