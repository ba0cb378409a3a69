// 2:4 SpMM on the sparse tensor cores (mma.sp m16n8k32), linear layout with the fused epilogue:
//   out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// A CTA owns BM rows of A x BN tokens; its warps split the rows in 16-row slices and the tokens
// in 8-token slices. K is walked in chunks of KSTEPS x 32: the chunk's x tile is staged in
// shared memory (ldmatrix gives mma.sp's B fragment directly), A's fragments come from global
// memory in register order (sparse_mma.py: one 16-byte and one 4-byte load per lane), the next
// chunk's A fragments prefetched into registers while this chunk multiplies.
//   SPARTUNE_BF16  0: fp16 operands, 1: bf16
//   BM, BN, WARPS, KSTEPS  tile rows, tile tokens, warps per CTA, 32-wide K steps per chunk
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma_sp.cuh"

#if !defined(SPARTUNE_BF16) || !defined(BM) || !defined(BN) || !defined(WARPS) || !defined(KSTEPS)
#error "spmm_nm.cu needs SPARTUNE_BF16, BM, BN, WARPS and KSTEPS"
#endif

constexpr int MT = BM / 16;                            // 16-row slices per CTA
constexpr int NT = BN / 8;                             // 8-token slices per CTA
constexpr int WARPS_M = WARPS < MT ? WARPS : MT;
constexpr int WARPS_N = WARPS / WARPS_M;
constexpr int WM = MT / WARPS_M;                       // row slices per warp
constexpr int WN = NT / WARPS_N;                       // token slices per warp
constexpr int KC = 32 * KSTEPS;                        // K per chunk
constexpr int XS_STRIDE = KC + 8;                      // halves per staged token row (+16 B: no bank conflicts)
static_assert(BM % 16 == 0 && BN % 8 == 0, "BM must be a multiple of 16 and BN of 8");
static_assert(WARPS_M * WARPS_N == WARPS && MT % WARPS_M == 0 && NT % WARPS_N == 0, "warps must tile the CTA");

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

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// a_values: (Mt, Kt, 32, 8) halves as uint4 per lane; a_meta: (Mt, Kt, 32) words (sparse_mma.py).
// x: (N, K) at strides (sxn, sxk); x_vec: 1 when sxk == 1, sxn % 8 == 0 and x is 16-byte
// aligned (chunks then move as 16-byte vectors). bias (M,) / residual (N, M) may be null.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    spmm_nm(const uint4* __restrict__ a_values, const unsigned* __restrict__ a_meta,
            const unsigned short* __restrict__ x, void* __restrict__ out, const void* __restrict__ bias,
            const void* __restrict__ residual, int M, int K, int N, int Mt, int Kt, int sxn, int sxk, int x_vec,
            int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
  __shared__ __align__(16) unsigned short xs[BN * XS_STRIDE];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  const int mt0 = blockIdx.x * MT + warp_m * WM;  // this warp's first 16-row slice
  const int n_cta = blockIdx.y * BN;

  float acc[WM][WN][4];
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  uint4 av[WM][KSTEPS];
  unsigned am[WM][KSTEPS];
  auto load_a = [&](int chunk) {
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        const int mt = mt0 + i, kt = chunk * KSTEPS + s;
        if (mt < Mt && kt < Kt) {
          const long long at = ((long long)mt * Kt + kt) * 32 + lane;
          av[i][s] = a_values[at];
          am[i][s] = a_meta[at];
        } else {
          av[i][s] = make_uint4(0u, 0u, 0u, 0u);
          am[i][s] = 0x44444444u;  // positions (0, 1) in every group: valid, values zero
        }
      }
  };

  const int chunks = (Kt + KSTEPS - 1) / KSTEPS;
  load_a(0);
  for (int c = 0; c < chunks; ++c) {
    const int k0 = c * KC;
    // stage x[n_cta : n_cta + BN, k0 : k0 + KC] in shared memory, zeros outside x
    if (x_vec && k0 + KC <= K) {
      constexpr int VECS = BN * KC / 8;
      for (int v = tid; v < VECS; v += WARPS * 32) {
        const int n = v / (KC / 8), kk = (v % (KC / 8)) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (n_cta + n < N) val = *reinterpret_cast<const uint4*>(x + (long long)(n_cta + n) * sxn + k0 + kk);
        *reinterpret_cast<uint4*>(xs + n * XS_STRIDE + kk) = val;
      }
    } else {
      for (int e = tid; e < BN * KC; e += WARPS * 32) {
        const int n = e % BN, kk = e / BN;  // tokens fastest: coalesced when x's tokens are contiguous
        unsigned short val = 0;
        if (n_cta + n < N && k0 + kk < K) val = x[(long long)(n_cta + n) * sxn + (long long)(k0 + kk) * sxk];
        xs[n * XS_STRIDE + kk] = val;
      }
    }
    __syncthreads();

    uint4 cur_v[WM][KSTEPS];
    unsigned cur_m[WM][KSTEPS];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) cur_v[i][s] = av[i][s], cur_m[i][s] = am[i][s];
    if (c + 1 < chunks) load_a(c + 1);  // in flight while this chunk multiplies

#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
      if (c * KSTEPS + s >= Kt) break;
#pragma unroll
      for (int j = 0; j < WN; ++j) {
        // B fragment of token slice j: reg r = token g, k = 8r + 2t, +1 (ldmatrix's layout)
        const int row = (warp_n * WN + j) * 8 + (lane & 7);
        unsigned b[4];
        ldmatrix_x4(b, xs + row * XS_STRIDE + s * 32 + (lane >> 3) * 8);
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          const unsigned a[4] = {cur_v[i][s].x, cur_v[i][s].y, cur_v[i][s].z, cur_v[i][s].w};
          spartune::mma_sp_m16n8k32<SPARTUNE_BF16 != 0>(acc[i][j], a, b, cur_m[i][s]);
        }
      }
    }
    __syncthreads();
  }

  // epilogue: lane (g, t) holds rows g, g + 8 of each slice at tokens 2t, 2t + 1
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = (mt0 + i) * 16 + g + 8 * h;
      if (m >= M) continue;
      const float b_m = bias ? load_as_float(bias, m, bias_code) : 0.f;
#pragma unroll
      for (int j = 0; j < WN; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int n = n_cta + (warp_n * WN + j) * 8 + 2 * t + e;
          if (n >= N) continue;
          float v = activate(acc[i][j][2 * h + e] * scale + b_m, act);
          if (residual) v += load_as_float(residual, (long long)n * srn + (long long)m * srm, res_code);
          store_from_float(out, (long long)n * son + (long long)m * som, out_code, v);
        }
    }
}
