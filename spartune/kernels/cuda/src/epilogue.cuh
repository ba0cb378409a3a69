// The fused epilogue of the linear-layout SpMM templates (the Triton families' kernels/_epilogue.py
// in CUDA): out = act(scale * acc + bias) + residual, each tensor in its own dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// activation codes of kernels/_epilogue.py: 0 none, 1 relu, 2 gelu, 3 gelu_tanh, 4 silu
__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);
    case 2: return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    case 3: {
      const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      return v / (1.f + __expf(-2.f * inner));
    }
    case 4: return v / (1.f + __expf(-v));
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
    float v = activate(acc * scale + bias_m, act);
    if (residual) v += load_as_float(residual, (long long)n * srn + (long long)m * srm, res_code);
    store_from_float(out, (long long)n * son + (long long)m * som, out_code, v);
  }
};

}  // namespace spartune
