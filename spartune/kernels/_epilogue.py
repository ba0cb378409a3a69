"""The fused epilogue in Triton, shared by every kernel family: act(scale * acc + bias) + residual;
and the input prologue, act(x + x_bias[k]) applied to x's tiles as they are loaded.

The activation codes follow ACTIVATION_CODES; each switch is a constexpr, so a kernel without
bias, residual or prologue compiles without their loads.
"""
import triton
import triton.language as tl

from ._common import INTERPRETED

ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


# Compiled for the GPU, exp2 and 1/x are one MUFU instruction each (ex2/rcp.approx.ftz: ~2 ulp);
# Triton's own add range checks and scaling around them. The interpreter has no inline asm.
_MUFU = tl.constexpr(not INTERPRETED)


@triton.jit
def _mufu(x, INSTRUCTION: tl.constexpr):
    return tl.inline_asm_elementwise(INSTRUCTION, "=r,r", [x.to(tl.float32)], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _exp2(x):
    if _MUFU:
        return _mufu(x, "ex2.approx.ftz.f32 $0, $1;")
    else:
        return tl.exp2(x)


@triton.jit
def _rcp(x):
    if _MUFU:
        return _mufu(x, "rcp.approx.ftz.f32 $0, $1;")
    else:
        return 1.0 / x


@triton.jit
def _sigmoid(v):
    return _rcp(1.0 + _exp2(v * -1.4426950408889634))


@triton.jit
def _normal_cdf(x):
    """Phi(x), branch-free, to ~5e-6 relative in fp32, tails included (where GELU's output is
    tiny and only a relative error shows): erfc(a) = t P(t) exp(-a^2), t = 1 / (1 + p a), the
    form of Abramowitz-Stegun 7.1.26 with p and a degree-6 P fitted here for relative error on
    [0, 9.5] (7.1.26's own 5 terms are 4% off in the tail). GELU takes 18 SASS instructions an
    element, against 33 with Numerical Recipes' erfcc used before: in an SpMM whose output is
    most of its bytes (BERT ffn1, 4096 x 3072 at 90%) the epilogue's arithmetic is what GELU
    costs (benchmarks/LOG.md)."""
    t = _rcp(1.0 + 0.30759145 * tl.abs(x))  # p / sqrt(2), p = 0.435
    q = -0.07587019354104996 * t + 0.19190911948680878  # 0.5 P(t) / t, Horner
    q = q * t + 0.005056789610534906
    q = q * t + 0.1374269723892212
    q = q * t + 0.11849741637706757
    q = q * t + 0.12297805398702621
    half_erfc = q * t * _exp2(x * (x * -0.7213475204444817))  # exp(-x^2 / 2)
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def activation(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = x * _normal_cdf(x)
    elif ACT == 3:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * _sigmoid(2.0 * inner)  # 0.5 * (1 + tanh(u)) == sigmoid(2u)
    elif ACT == 4:
        x = x * _sigmoid(x)
    return x


@triton.jit
def prologue(xt, x_bias_ptr, k, k_ok, ACT: tl.constexpr):
    """act(x + x_bias[k]) for a tile of x (`k` broadcasts against it), back in x's dtype for the
    tensor cores. Every activation maps 0 to 0, so the zeros masked in past K stay zero."""
    b = tl.load(x_bias_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    return activation(xt.to(tl.float32) + b, ACT).to(xt.dtype)


@triton.jit
def epilogue(acc, feat, feat_mask, res_off, mask, scale, bias_ptr, res_ptr,
             HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    """act(scale * acc + bias[feat]) + residual[res_off], in fp32, for a tile of any orientation.

    `feat` indexes output features, shaped to broadcast against acc ((1, B) or (B, 1));
    `res_off` and `mask` are full 2-D offsets into the residual and the valid elements.
    """
    acc = acc * scale
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + feat, mask=feat_mask, other=0.0).to(tl.float32)
    acc = activation(acc, ACT)
    if HAS_RES:
        acc = acc + tl.load(res_ptr + res_off, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def epilogue_store(acc, feat, feat_ok, toks, tok_ok, out_ptr, stride_on, stride_om, res_ptr, stride_rn, stride_rm,
                   scale, bias_ptr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    """Finish a (features, tokens) accumulator tile into out (tokens, features): the epilogue,
    the cast and the masked store at any strides (out may be a transposed view)."""
    mask = feat_ok[:, None] & tok_ok[None, :]
    y = epilogue(acc, feat[:, None], feat_ok[:, None], toks[None, :] * stride_rn + feat[:, None] * stride_rm, mask,
                 scale, bias_ptr, res_ptr, HAS_BIAS, ACT, HAS_RES)
    tl.store(out_ptr + toks[None, :] * stride_on + feat[:, None] * stride_om, y.to(out_ptr.dtype.element_ty), mask=mask)
