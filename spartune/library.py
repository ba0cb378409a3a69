"""spartune's ops as PyTorch operators (torch.library): what torch.compile traces as one node
with no graph break, CUDA graphs capture, and autograd differentiates.

An operator takes tensors and plain values only, so a sparse weight travels as its tensors
(`A.tensor_list()`) and its spec (`A.spec`, a string). The implementation finds the format
object that owns memory at those addresses, so the tuned choices and layouts cached on it serve
every call, including from a compiled graph that hands over aliases of the module's buffers;
tensors it has never seen are wrapped in a (validated) format once.

The public functions choose the route: a plain eager call (nothing to differentiate, not
traced) goes straight to `ops`, the least host time; a traced call, or one autograd records,
goes through the operator. The tuned choice is made by the operator's implementation at run
time, outside any traced region; under a CUDA-graph capture it must already be made (a warm-up
call does it, as torch.compile's "reduce-overhead" mode makes one).
"""
from __future__ import annotations

import collections
import functools
import json
import weakref
from typing import Optional

import torch
from torch import Tensor

from . import ops
from .dispatch import cast_bias, cast_copy, outside_graph_pools
from .backends import direct_launches
from .epilogue import apply_epilogue, apply_prologue, check_activation
from .formats import CSR, BlockSparse, SparseFormat, transposed
from .formats.stack import stacked

# --- from tensors back to their format -------------------------------------------------------------
_by_address: "weakref.WeakValueDictionary[tuple, SparseFormat]" = weakref.WeakValueDictionary()
_rebuilt: collections.deque = collections.deque(maxlen=64)  # keeps formats made from unseen tensors alive


def bind(A: SparseFormat) -> SparseFormat:
    """Make `A` the format the operators find for its tensors (its tuned choices, its memos)."""
    _by_address[_address(A.spec, A.tensor_list())] = A
    return A


def _address(spec: str, tensors) -> tuple:
    return (spec, *(t.data_ptr() for t in tensors))


def format_of(tensors: list[Tensor], spec: str) -> SparseFormat:
    """The live format whose tensors sit at these addresses with these shapes, or a new one (an
    entry whose format's tensors have moved since, e.g. `param.data = ...`, is not a match)."""
    A = _by_address.get(_address(spec, tensors))
    if A is not None and all(a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype
                                         and a.stride() == b.stride()) for a, b in zip(A.tensor_list(), tensors)):
        return A
    A = SparseFormat.from_spec(spec, tensors)
    _rebuilt.append(A)
    return bind(A)


@functools.lru_cache(maxsize=None)
def _shape(spec: str) -> tuple[int, int]:
    return tuple(json.loads(spec)["shape"])


# --- the operators ---------------------------------------------------------------------------------
# Defined with torch.library.Library rather than torch.library.custom_op: the same operator for
# torch.compile, about 13 µs of host time per call above its implementation instead of about 19
# (measured on the CPU machine; 6.5 of the 13 are the autograd kernel's).
_LIB = torch.library.Library("spartune", "DEF")


def _operator(schema: str):
    """Define spartune::<schema> with the decorated function as its implementation on every
    device; returns the operator."""
    def define(impl):
        name = schema.split("(")[0]
        _LIB.define(schema)
        _LIB.impl(name, impl, "CompositeExplicitAutograd")
        return getattr(torch.ops.spartune, name).default
    return define


def _fake(op):
    """Register the decorated function as op's fake (meta) implementation: shapes for tracing."""
    return lambda fn: torch.library.register_fake(op, fn, lib=_LIB)


def _autograd(op, backward, setup_context):
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=_LIB)


_LINEAR_ARGS = ("(Tensor x, Tensor[] weight, str spec, Tensor? bias, str? activation, Tensor? residual, float scale, "
                "ScalarType? out_dtype) -> Tensor")


def _linear_impl(x: Tensor, weight: list[Tensor], spec: str, bias: Optional[Tensor], activation: Optional[str],
                 residual: Optional[Tensor], scale: float, out_dtype: Optional[torch.dtype]) -> Tensor:
    return _run_linear(x, format_of(weight, spec), bias, activation, residual, scale, out_dtype)


def _run_linear(x, A, bias, activation, residual=None, scale=1.0, out_dtype=None) -> Tensor:
    """An operator's linear on format A."""
    with direct_launches():  # an operator returns memory of its own, never a graph's static output
        y = ops.linear(x, A, bias, activation, residual, scale=scale, out_dtype=out_dtype)
    # The fake promises a contiguous output whatever backend the tuner picks at run time
    # (cuSPARSELt's is a transposed view): compiled graphs assert the strides.
    return y.contiguous()


def _linear_fake(x, weight, spec, bias, activation, residual, scale, out_dtype):
    from . import fusion

    fusion.install()  # traced: torch.compile will want the epilogue fusion pass
    return _output_like(x, *_shape(spec), out_dtype)


# Two operators over one implementation: `linear` differentiable, `linear_nograd` for calls that
# autograd does not record (a model compiled for inference). A Python autograd kernel is on the
# dispatcher's path of every call, recorded or not (its no-grad branch redispatches, boxing the
# arguments again): ~20-30 us of host time a call on the CPU machine (benchmarks/LOG.md, session 28).
_linear = _operator("linear" + _LINEAR_ARGS)(_linear_impl)
_linear_nograd = _operator("linear_nograd" + _LINEAR_ARGS)(_linear_impl)
_fake(_linear)(_linear_fake)
_fake(_linear_nograd)(_linear_fake)


def _output_like(x, rows: int, cols: int, out_dtype):
    """The traced output of x (..., cols) times a (rows, cols) weight."""
    if x.shape[-1] != cols:
        raise ValueError(f"x must have last dimension {cols}, got shape {tuple(x.shape)}")
    return x.new_empty((*x.shape[:-1], rows), dtype=out_dtype or x.dtype)


@_operator("linear_cast" + _LINEAR_ARGS.replace(") ->", ", ScalarType cast) ->"))
def linear_cast(x: Tensor, weight: list[Tensor], spec: str, bias: Optional[Tensor], activation: Optional[str],
                residual: Optional[Tensor], scale: float, out_dtype: Optional[torch.dtype],
                cast: torch.dtype) -> Tensor:
    """linear on the weight's `dispatch.cast_copy` in `cast` (x already in it; the bias's kept
    copy, `dispatch.cast_bias`): torch.autocast's inference in a compiled graph. A cast traced
    into the graph would hand the operator new values every call (a new format, tuned again); the
    copy kept on the format at the weight's own addresses is made once. Its arguments are
    linear's, then `cast`, so the fusion passes treat it as a linear (merged siblings keep the
    cast: linear_stacked's `cast`)."""
    A = format_of(weight, spec)
    return _run_linear(x, cast_copy(A, cast), cast_bias(A, bias, cast), activation, residual, scale, out_dtype)


@_fake(linear_cast)
def _(x, weight, spec, bias, activation, residual, scale, out_dtype, cast):
    return _linear_fake(x, weight, spec, bias, activation, residual, scale, out_dtype or cast)


@_operator("linear_prologue(Tensor x, Tensor input_bias, str? input_activation, Tensor[] weight, str spec, Tensor? bias, str? activation, Tensor? residual, float scale, ScalarType? out_dtype, ScalarType? cast=None) -> Tensor")
def _linear_prologue(x: Tensor, input_bias: Tensor, input_activation: Optional[str], weight: list[Tensor], spec: str,
                     bias: Optional[Tensor], activation: Optional[str], residual: Optional[Tensor], scale: float,
                     out_dtype: Optional[torch.dtype], cast: Optional[torch.dtype] = None) -> Tensor:
    """linear on input_activation(x + input_bias): what spartune.fusion writes where x is a
    convolution's output passed through its bias and activation (no autograd: the pass leaves
    graphs that record gradients alone). With `cast`, linear_cast's: the weight's and bias's
    kept copies in that dtype (an fp32 input_bias is read as it is: the kernels take it)."""
    A = format_of(weight, spec)
    if cast is not None:
        A, bias = cast_copy(A, cast), cast_bias(A, bias, cast)
    with direct_launches():
        y = ops.linear(x, A, bias, activation, residual, scale=scale, out_dtype=out_dtype,
                       input_bias=input_bias, input_activation=input_activation)
    return y.contiguous()


@_fake(_linear_prologue)
def _(x, input_bias, input_activation, weight, spec, bias, activation, residual, scale, out_dtype, cast=None):
    return _output_like(x, *_shape(spec), out_dtype or cast)


@_operator("linear_stacked(Tensor x, Tensor[] weight, str[] specs, int[] counts, Tensor[] biases, ScalarType? out_dtype, ScalarType? cast=None) -> Tensor")
def _linear_stacked(x: Tensor, weight: list[Tensor], specs: list[str], counts: list[int], biases: list[Tensor],
                    out_dtype: Optional[torch.dtype], cast: Optional[torch.dtype] = None) -> Tensor:
    """Linears that read the same x as one: the parts (counts[i] tensors of `weight` for specs[i])
    stacked by rows, with their biases (one each, or none), y's columns in their order
    (spartune.fusion writes these calls; formats.stack.stacked keeps the stacked copy). With
    `cast` (linear_cast's siblings under torch.autocast), the parts' copies in that dtype stacked."""
    parts, at = [], 0
    for spec, count in zip(specs, counts):
        part = format_of(weight[at:at + count], spec)
        parts.append(part if cast is None else cast_copy(part, cast))
        at += count
    # not in a CUDA graph's pool: cudagraph trees refuse the untracked tensors a cache keeps there
    A, bias = stacked(parts, biases, build=lambda make: outside_graph_pools(make, x.device))
    if cast is not None:
        bias = cast_bias(A, bias, cast)
    with direct_launches():
        return ops.linear(x, A, bias, out_dtype=out_dtype).contiguous()


@_fake(_linear_stacked)
def _(x, weight, specs, counts, biases, out_dtype, cast=None):
    return _output_like(x, sum(_shape(spec)[0] for spec in specs), _shape(specs[0])[1], out_dtype or cast)


@_operator("spmm(Tensor[] weight, str spec, Tensor X, ScalarType? out_dtype) -> Tensor")
def _spmm(weight: list[Tensor], spec: str, X: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    with direct_launches():
        return ops.spmm(format_of(weight, spec), X, out_dtype=out_dtype).contiguous()  # as the fake says


@_fake(_spmm)
def _(weight, spec, X, out_dtype):
    rows, cols = _shape(spec)
    if X.dim() != 2 or X.shape[0] != cols:
        raise ValueError(f"X must have shape ({cols}, N), got {tuple(X.shape)}")
    return X.new_empty((rows, X.shape[1]), dtype=out_dtype or X.dtype)


@_operator("linear_grad_input(Tensor dy, Tensor[] weight, str spec) -> Tensor")
def _grad_input(dy: Tensor, weight: list[Tensor], spec: str) -> Tensor:
    """dy @ A: linear with A's transpose (a format built once per weight, values refreshed)."""
    A = format_of(weight, spec)
    with direct_launches():
        return ops.linear(dy.to(A.dtype), transposed(A))


@_fake(_grad_input)
def _(dy, weight, spec):
    return dy.new_empty((*dy.shape[:-1], _shape(spec)[1]), dtype=weight[0].dtype)


@_operator("linear_grad_weight(Tensor dy, Tensor x, Tensor[] weight, str spec) -> Tensor")
def _grad_weight(dy: Tensor, x: Tensor, weight: list[Tensor], spec: str) -> Tensor:
    """The gradient of A's values, (dy^T @ x) at A's stored positions only (the pattern stays
    fixed): an SDDMM where a kernel serves the format, else the dense product gathered."""
    A = format_of(weight, spec)
    dy2 = dy.reshape(-1, dy.shape[-1]).to(A.dtype)
    x2 = x.reshape(-1, x.shape[-1]).to(A.dtype)
    if isinstance(A, (CSR, BlockSparse)):
        return ops.sddmm(dy2.T.contiguous(), x2.T.contiguous(), A).values
    wide = torch.promote_types(A.dtype, torch.float32)
    return A.gather(dy2.to(wide).T @ x2.to(wide)).to(A.dtype)


@_fake(_grad_weight)
def _(dy, x, weight, spec):
    return torch.empty_like(weight[0])


def _save_linear(ctx, inputs, output):
    x, weight, spec, bias, activation, residual, scale, out_dtype = inputs
    if activation is not None:
        ctx.mark_non_differentiable(output)  # linear() unfuses the activation when autograd records
    ctx.save_for_backward(x, *weight)
    ctx.spec, ctx.scale = spec, scale


def _linear_backward(ctx, dy):
    x, *weight = ctx.saved_tensors
    need_x, need_w, _, need_bias, _, need_res, _, _ = ctx.needs_input_grad
    dx = dbias = dres = None
    dw = [None] * len(weight)
    if need_x:
        dx = _grad_input(dy, weight, ctx.spec).mul_(ctx.scale).to(x.dtype)
    if need_w[0]:
        dw[0] = _grad_weight(dy, x, weight, ctx.spec).mul_(ctx.scale)
    if need_bias:
        dbias = dy.reshape(-1, dy.shape[-1]).sum(0)
    if need_res:
        dres = dy
    return dx, dw, None, dbias, None, dres, None, None


_autograd(_linear, _linear_backward, setup_context=_save_linear)


def _save_spmm(ctx, inputs, output):
    weight, spec, X, out_dtype = inputs
    ctx.save_for_backward(X, *weight)
    ctx.spec = spec


def _spmm_backward(ctx, dY):
    X, *weight = ctx.saved_tensors
    need_w, _, need_X, _ = ctx.needs_input_grad
    dX = None
    dw = [None] * len(weight)
    if need_w[0]:  # Y^T = X^T A^T: the linear layout's gradients, transposed
        dw[0] = _grad_weight(dY.T, X.T, weight, ctx.spec)
    if need_X:
        dX = _grad_input(dY.T, weight, ctx.spec).T.to(X.dtype)
    return dw, None, dX, None


_autograd(_spmm, _spmm_backward, setup_context=_save_spmm)


@_operator("sddmm(Tensor a, Tensor b, Tensor[] pattern, str spec, float scale) -> Tensor")
def _sddmm(a: Tensor, b: Tensor, pattern: list[Tensor], spec: str, scale: float) -> Tensor:
    return ops.sddmm(a, b, format_of(pattern, spec), scale=scale).values


@_fake(_sddmm)
def _(a, b, pattern, spec, scale):
    return torch.empty_like(pattern[0], dtype=a.dtype)


def _save_sddmm(ctx, inputs, output):
    a, b, pattern, spec, scale = inputs
    ctx.save_for_backward(a, b, *pattern)
    ctx.spec, ctx.scale = spec, scale


def _sddmm_backward(ctx, dvalues):
    """With S the pattern holding dvalues: da = scale S b, db = scale S^T a."""
    a, b, *pattern = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    da = _pattern_product(dvalues, pattern, ctx.spec, b, False).mul_(ctx.scale) if need_a else None
    db = _pattern_product(dvalues, pattern, ctx.spec, a, True).mul_(ctx.scale) if need_b else None
    return da, db, [None] * len(pattern), None, None


@_operator("pattern_product(Tensor values, Tensor[] pattern, str spec, Tensor X, bool transpose) -> Tensor")
def _pattern_product(values: Tensor, pattern: list[Tensor], spec: str, X: Tensor, transpose: bool) -> Tensor:
    """S @ X (or S^T @ X) for S the pattern holding `values`."""
    S = format_of(pattern, spec)._with_values_trusted(values.to(X.dtype))
    with direct_launches():
        return ops.spmm(transposed(S) if transpose else S, X)


@_fake(_pattern_product)
def _(values, pattern, spec, X, transpose):
    rows, cols = _shape(spec)
    return X.new_empty((cols if transpose else rows, X.shape[1]))


_autograd(_sddmm, _sddmm_backward, setup_context=_save_sddmm)


@_operator("sparse_softmax(Tensor[] pattern, str spec, float scale) -> Tensor")
def _sparse_softmax(pattern: list[Tensor], spec: str, scale: float) -> Tensor:
    return ops.sparse_softmax(format_of(pattern, spec), scale=scale).values


@_fake(_sparse_softmax)
def _(pattern, spec, scale):
    return torch.empty_like(pattern[0])


@_operator("sparse_softmax_backward(Tensor P, Tensor dP, Tensor[] pattern, str spec, float scale) -> Tensor")
def _sparse_softmax_backward(P: Tensor, dP: Tensor, pattern: list[Tensor], spec: str, scale: float) -> Tensor:
    """scale * P (dP - sum over the row of P dP), over the stored entries of each row."""
    A = format_of(pattern, spec)
    order, flat = A.stored_positions()
    rows = flat // A.shape[1]
    wide = torch.promote_types(P.dtype, torch.float32)
    p, g = P.reshape(-1)[order].to(wide), dP.reshape(-1)[order].to(wide)
    row_sum = torch.zeros(A.shape[0], dtype=wide, device=P.device).index_add_(0, rows, p * g)
    out = torch.zeros(P.numel(), dtype=P.dtype, device=P.device)
    out[order] = (scale * p * (g - row_sum[rows])).to(P.dtype)
    return out.reshape(P.shape)


@_fake(_sparse_softmax_backward)
def _(P, dP, pattern, spec, scale):
    return torch.empty_like(P)


def _save_softmax(ctx, inputs, output):
    pattern, spec, scale = inputs
    ctx.save_for_backward(output, *pattern)
    ctx.spec, ctx.scale = spec, scale


def _softmax_backward(ctx, dP):
    P, *pattern = ctx.saved_tensors
    dvalues = _sparse_softmax_backward(P, dP, pattern, ctx.spec, ctx.scale)
    return [dvalues] + [None] * (len(pattern) - 1), None, None


_autograd(_sparse_softmax, _softmax_backward, setup_context=_save_softmax)


# --- the public ops --------------------------------------------------------------------------------
def autograd_records(*tensors) -> bool:
    """Whether autograd records a call on these tensors (None and non-tensors pass by)."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def linear(x, A, bias=None, activation=None, residual=None, *, scale: float = 1.0, out_dtype=None,
           input_bias=None, input_activation=None):
    """act(scale * x @ A^T + bias) + residual for x of shape (..., K): torch's F.linear layout.

    x has A's dtype and device. bias: (M,); activation: None, "relu", "gelu", "gelu_tanh" or
    "silu"; residual: exactly x's leading shape by M (no broadcasting); out_dtype: float16,
    bfloat16 or float32 (float64 only for a float64 A), default A's dtype. A 2-D x whose tokens
    are contiguous (x = X.T) gives an out of that layout too where the tuned kernel writes it.
    fp16/bf16 inputs accumulate in fp32; fp32 inputs run on the tensor cores as tf32; float64
    runs torch's dense product. Differentiable in x, A's values, bias and residual (the
    pattern stays fixed), and traceable by torch.compile. With `input_bias`, x is first taken
    as input_activation(x + input_bias) (ops.linear; unfused where autograd records).
    Bad input raises before any kernel runs, on either route.
    """
    grad = autograd_records(x, getattr(A, "values", None), bias, residual, input_bias)
    if not grad and not torch.compiler.is_compiling():
        return ops.linear(x, A, bias, activation, residual, scale=scale, out_dtype=out_dtype, input_bias=input_bias,
                          input_activation=input_activation)
    ops.check_format("linear", A)
    ops.check_tensor("x", x, dtype=A.dtype, device=A.device, last=A.shape[1])
    bias, scale, prologue = ops.check_linear_args(x, A.dtype, A.device, *A.shape, bias, activation, residual, scale,
                                                  out_dtype, input_bias, input_activation)
    if prologue is not None:
        if not grad:
            return _linear_prologue(x, input_bias, input_activation, A.tensor_list(), A.spec, bias, activation,
                                    residual, float(scale), out_dtype)
        x = apply_prologue(x, input_bias, input_activation)
    if not grad:
        return _linear_nograd(x, A.tensor_list(), A.spec, bias, activation, residual, float(scale), out_dtype)
    check_activation(activation)  # autograd differentiates the activation and residual as torch ops
    y = _linear(x, A.tensor_list(), A.spec, bias, None, None, float(scale), None)
    if activation is not None or residual is not None:
        y = apply_epilogue(y, None, activation, residual)
    return y if out_dtype is None else y.to(out_dtype)


def linear_op(x, tensors: list, spec: str, bias=None, activation=None):
    """act(x @ A^T + bias) through the operator, A given as its tensors and spec (SparseLinear's
    route when traced or differentiated: its tensors are what torch.compile lifts as inputs).
    The activation is unfused when autograd records, as in `linear`."""
    if not autograd_records(x, tensors[0], bias):
        return _linear_nograd(x, tensors, spec, bias, activation, None, 1.0, None)
    if activation is None:
        return _linear(x, tensors, spec, bias, None, None, 1.0, None)
    check_activation(activation)
    return apply_epilogue(_linear(x, tensors, spec, bias, None, None, 1.0, None), None, activation, None)


def spmm(A, X, *, out_dtype=None):
    """A @ X for X of shape (K, N). Same kernels as `linear`, on transposed views (no copies);
    differentiable and traceable like it."""
    if not autograd_records(X, getattr(A, "values", None)) and not torch.compiler.is_compiling():
        return ops.spmm(A, X, out_dtype=out_dtype)
    ops.check_format("spmm", A)
    ops.check_spmm(A, X, out_dtype)
    return _spmm(A.tensor_list(), A.spec, X, out_dtype)


def sddmm(a, b, pattern, *, scale: float = 1.0):
    """scale * (a @ b^T) at the stored positions of `pattern` (CSR or BlockSparse), returned as
    the same format with new values (fp32 accumulation, a's dtype); differentiable in a and b,
    traceable."""
    if not autograd_records(a, b) and not torch.compiler.is_compiling():
        return ops.sddmm(a, b, pattern, scale=scale)
    ops.check_sddmm(a, b, pattern)
    return pattern._with_values_trusted(_sddmm(a, b, pattern.tensor_list(), pattern.spec, ops.check_scale(scale)))


def sparse_softmax(A, *, scale: float = 1.0):
    """Row-wise softmax over the stored entries of A (CSR or BlockSparse); an empty row stays
    empty. Returns the same format with the probabilities as values; differentiable in A's
    values, traceable."""
    if not autograd_records(getattr(A, "values", None)) and not torch.compiler.is_compiling():
        return ops.sparse_softmax(A, scale=scale)
    ops.check_pattern("sparse_softmax", "A", A)
    return A._with_values_trusted(_sparse_softmax(A.tensor_list(), A.spec, ops.check_scale(scale)))
