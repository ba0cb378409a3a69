// The fused epilogue of the linear-layout SpMM templates (the Triton families' kernels/_epilogue.py
// in CUDA): out = act(scale * acc + bias) + residual, each tensor in its own dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// A template compiled with -DSPARTUNE_ACT=<code> applies that activation only: a loop unrolled
// over many accumulators then inlines one activation, not the switch over all of them (which made
// an instance's NVRTC compile take seconds: benchmarks/LOG.md, "First use ... session 14").
#ifdef SPARTUNE_ACT
#define SPARTUNE_ACT_OF(act) (SPARTUNE_ACT)
#else
#define SPARTUNE_ACT_OF(act) (act)
#endif

namespace spartune {

// dtype codes of the epilogue tensors: 0 fp16, 1 bf16, 2 fp32
__device__ __forceinline__ float load_as_float(const void* p, long long i, int code) {
  if (code == 0) return __half2float(reinterpret_cast<const __half*>(p)[i]);
  if (code == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  return reinterpret_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_from_float(void* p, long long i, int code, float v) {
  if (code == 0) reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (code == 1) reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else reinterpret_cast<float*>(p)[i] = v;
}

// Two values as one word of 16-bit halves (code 0 fp16, 1 bf16), a at the lower address.
__device__ __forceinline__ unsigned pack_16bit(float a, float b, int code) {
  if (code == 0) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}

// Half `which` (0: the lower address) of a word of two 16-bit values (code 0 fp16, 1 bf16).
__device__ __forceinline__ float unpack_16bit(unsigned word, int which, int code) {
  const unsigned short h = which ? word >> 16 : word & 0xffffu;
  return code == 0 ? __half2float(__ushort_as_half(h)) : __bfloat162float(__ushort_as_bfloat16(h));
}

// exp2 and 1/x as one MUFU instruction each (~2 ulp): a full-precision division or erff costs
// several times the rest of an elementwise epilogue.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float sigmoid(float v) { return rcp_approx(1.f + exp2_approx(v * -1.4426950408889634f)); }

// Phi(x), branch-free, ~5e-6 relative with the tails: the fitted erfc of kernels/_epilogue.py's
// _normal_cdf (same coefficients; tests/kernels/test_activation.py checks that they agree).
__device__ __forceinline__ float normal_cdf(float x) {
  const float t = rcp_approx(1.f + 0.30759145f * fabsf(x));
  float q = -0.07587019354104996f * t + 0.19190911948680878f;
  q = q * t + 0.005056789610534906f;
  q = q * t + 0.1374269723892212f;
  q = q * t + 0.11849741637706757f;
  q = q * t + 0.12297805398702621f;
  const float half_erfc = q * t * exp2_approx(x * (x * -0.7213475204444817f));
  return x >= 0.f ? 1.f - half_erfc : half_erfc;
}

// activation codes of kernels/_epilogue.py: 0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu
__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);
    case 2: return v * normal_cdf(v);
    case 3: return v * sigmoid(1.5957691216057308f * (v + 0.044715f * v * v * v));  // sigmoid(2u) = (1 + tanh u) / 2
    case 4: return v * sigmoid(v);
    default: return v;
  }
}

// Where the epilogue writes and what it reads besides the accumulators.
struct Epilogue {
  void* out;
  const void* bias;      // (M,) or null
  const void* residual;  // (N, M) or null
  int M, N, son, som, srn, srm, out_code, bias_code, res_code, act;
  float scale;

  // Row m's bias, read once per row by the caller.
  __device__ __forceinline__ float bias_of(int m) const { return bias ? load_as_float(bias, m, bias_code) : 0.f; }

  // out[n, m] from one accumulator of row m (bias_m = bias_of(m)); skips positions outside.
  __device__ __forceinline__ void store(int m, int n, float acc, float bias_m) const {
    if (m >= M || n >= N) return;
    float v = activate(acc * scale + bias_m, SPARTUNE_ACT_OF(act));
    if (residual) v += load_as_float(residual, (long long)n * srn + (long long)m * srm, res_code);
    store_from_float(out, (long long)n * son + (long long)m * som, out_code, v);
  }
};

}  // namespace spartune
