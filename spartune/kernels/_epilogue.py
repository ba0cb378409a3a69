"""The fused epilogue in Triton, shared by every kernel family: act(scale * acc + bias) + residual;
and the input prologue, act(x + x_bias[k]) applied to x's tiles as they are loaded.

The activation codes follow ACTIVATION_CODES; each switch is a constexpr, so a kernel without
bias, residual or prologue compiles without their loads.
"""
import triton
import triton.language as tl

ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


@triton.jit
def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2, to ~1e-6 relative (Numerical Recipes' erfcc: fractional
    error < 1.2e-7), branch-free. Why not libdevice's erf: in an SpMM whose output is most of
    its bytes (BERT ffn1, 4096 x 3072 at 90%), exact GELU through erf doubled the kernel (13.7 ->
    26.5 us, benchmarks/LOG.md): both of erf's branches run in a warp of mixed inputs."""
    a = tl.abs(x) * 0.7071067811865476
    t = tl.fdiv(1.0, 1.0 + 0.5 * a, ieee_rounding=False)
    p = 0.17087277 * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    half_erfc = 0.5 * t * tl.exp(p - a * a)
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def activation(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = x * _normal_cdf(x)
    elif ACT == 3:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * tl.sigmoid(2.0 * inner)  # 0.5 * (1 + tanh(u)) == sigmoid(2u)
    elif ACT == 4:
        x = x * tl.sigmoid(x)
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
