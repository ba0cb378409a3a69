// One 2:4 sparse tensor-core tile per warp: D (16x8, f32) = A (16x32, 2:4) x B (32x8). The
// tests use it to check the host-side packing against the hardware; the SpMM families build
// on the same instruction (mma_sp.cuh).
//   SPARTUNE_BF16  0: fp16 operands, 1: bf16
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma_sp.cuh"

#ifndef SPARTUNE_BF16
#error "SPARTUNE_BF16 must be defined (0: fp16, 1: bf16)"
#endif

#if SPARTUNE_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef __half elem_t;
#endif

// a_values: (tiles, 32 lanes, 8 halves) in register order; a_meta: (tiles, 32 lanes);
// b: (tiles, 8, 32), i.e. each B tile column-major (k contiguous); d: (tiles, 16, 8) row-major.
extern "C" __global__ void __launch_bounds__(32) mma_sp_tile(const uint4* __restrict__ a_values,
                                                              const unsigned* __restrict__ a_meta,
                                                              const elem_t* __restrict__ b, float* __restrict__ d,
                                                              int tiles) {
  const int tile = blockIdx.x;
  if (tile >= tiles) return;
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;

  const uint4 av = a_values[tile * 32 + lane];
  const unsigned a[4] = {av.x, av.y, av.z, av.w};
  // B register j holds k = 2t + 8j and 2t + 8j + 1 of column n = g: word t + 4j of that column.
  const unsigned* column = reinterpret_cast<const unsigned*>(b + (size_t)tile * 256 + g * 32);
  unsigned bf[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) bf[j] = column[t + 4 * j];

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  spartune::mma_sp_m16n8k32<SPARTUNE_BF16 != 0>(acc, a, bf, a_meta[tile * 32 + lane]);

  float* out = d + (size_t)tile * 128;
  *reinterpret_cast<float2*>(out + g * 8 + 2 * t) = make_float2(acc[0], acc[1]);
  *reinterpret_cast<float2*>(out + (g + 8) * 8 + 2 * t) = make_float2(acc[2], acc[3]);
}
