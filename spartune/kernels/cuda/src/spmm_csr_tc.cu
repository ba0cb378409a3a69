// Unstructured (CSR) SpMM for few tokens on the tensor cores ("load as sparse, compute as dense"),
// linear layout with the fused epilogue:  out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// On CUDA cores each nonzero costs ~20 instructions per 8 tokens (csr_smem; benchmarks/LOG.md,
// "csr_smem v5"); here a warp expands a 16 x 64 tile of A from its words (kernels/_tile_words.py:
// one 32-bit word per lane and round, position << 16 | value) into a zeroed tile in shared memory,
// and 4 x NT / 8 mma.m16n8k16 multiply it by x, whatever the tile's density: ~60 instructions a
// tile at 32 tokens against ~400 on CUDA cores at 90%.
// A CTA owns one slice of K (KT tiles of 64; grid y) for NT tokens (grid z) and WARPS x RPW row
// tiles of 16 (grid x): its x slice is staged once (cp.async, rows of tokens as x lies) and each
// warp runs its RPW row tiles over the slice's K tiles, the x fragments of a K tile loaded once
// for all of them. A row tile's words in one slice are one contiguous run: each warp copies its
// runs into shared memory by cp.async first, all at once (one round trip, under x's staging),
// so no tile waits on DRAM. With more than one slice, fp32 partials go to `ws` and the last CTA of a row
// block (an arrival counter, left at zero again) sums them in slice order and applies the epilogue.
//   SPARTUNE_BF16  0: fp16 weight and x, 1: bf16
//   NT             tokens per CTA: 8, 16 or 32
//   WARPS          warps per CTA
//   KT             K tiles of 64 per slice
//   RPW            row tiles of 16 per warp
#include "epilogue.cuh"

#if !defined(SPARTUNE_BF16) || !defined(NT) || !defined(WARPS) || !defined(KT) || !defined(RPW)
#error "spmm_csr_tc.cu needs SPARTUNE_BF16, NT, WARPS, KT and RPW"
#endif

constexpr int KS = 64 * KT;            // columns of K per slice
constexpr int XP = KS + 8;             // halves per staged token row (16-byte pad: ldmatrix without conflicts)
constexpr int TP = 72;                 // halves per row of an expanded tile (the same pad)
constexpr int TILE = 16 * TP + 8;      // halves of an expanded tile, + the slot padding words write
constexpr int TRASH_SLOT = 16 * TP;
constexpr int NB = NT / 8;             // n8 blocks of tokens
constexpr int RB = WARPS * RPW;        // row tiles per CTA
constexpr int THREADS = WARPS * 32;
static_assert(NT == 8 || NT == 16 || NT == 32, "NT must be 8, 16 or 32");
static_assert(KT >= 1 && KT <= 32, "KT must be in 1..32 (a lane holds each K tile's start)");
static_assert(TILE * 2 % 16 == 0, "an expanded tile is whole 16-byte vectors");

#if SPARTUNE_BF16
#define SPARTUNE_MMA_TYPES "f32.bf16.bf16.f32"
#else
#define SPARTUNE_MMA_TYPES "f32.f16.f16.f32"
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row)));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col." SPARTUNE_MMA_TYPES
               " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared memory, the bytes past `bytes` zero-filled
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes)
               : "memory");
}

// words, starts: kernels/_tile_words.py; wbuf: rounds of 32 words each warp's runs take at most
// (the host's count). x (N, K) at strides (sxn, sxk); x_vec: rows contiguous,
// sxn a multiple of 8 and x 16-byte aligned (cp.async). ws: fp32 partials (token tiles, slices,
// row_tiles * 16, NT) when slices > 1; counters: one per (row block, token tile), zero between calls.
extern "C" __global__ void __launch_bounds__(THREADS) spmm_csr_tc(
    const unsigned* __restrict__ words, const int* __restrict__ starts, const unsigned short* __restrict__ x,
    void* out, const void* bias, const void* residual, float* __restrict__ ws, int* __restrict__ counters, int M,
    int N, int K, int row_tiles, int k_tiles, int slices, int wbuf, long long sxn, long long sxk, int x_vec, int son, int som,
    int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
  extern __shared__ uint4 smem_v[];
  unsigned short* xs = reinterpret_cast<unsigned short*>(smem_v);  // NT rows of XP halves
  __shared__ int is_last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int s = blockIdx.y, k0 = s * KS, n0 = blockIdx.z * NT;
  unsigned short* tile = xs + NT * XP + warp * TILE;  // this warp's expanded tile, kept zero between uses
  unsigned* wbuf_w = reinterpret_cast<unsigned*>(xs + NT * XP + WARPS * TILE) + warp * wbuf * 32;  // its words

  // the warp's runs of words, row tile r's from round run0[r] of its buffer; lane i of kstart[r]
  // holds where K tile i of the run starts (i < kts), kend[r] where the run ends (global rounds)
  const int rt0 = blockIdx.x * RB + warp;  // the warp's row tiles: rt0, rt0 + WARPS, ...
  const int kts = min(KT, k_tiles - s * KT);  // K tiles in this slice
  int kstart[RPW], kend[RPW], run0[RPW];
  int cursor = 0;
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rt = rt0 + r * WARPS;
    kstart[r] = kend[r] = 0;
    run0[r] = cursor;
    if (rt < row_tiles) {
      const int* st = starts + rt * k_tiles + s * KT;
      kstart[r] = st[min(lane, kts - 1)];
      kend[r] = st[kts];
      const int q0 = __shfl_sync(0xffffffffu, kstart[r], 0);
      const uint4* src = reinterpret_cast<const uint4*>(words + q0 * 32);
      uint4* dst = reinterpret_cast<uint4*>(wbuf_w + cursor * 32);
      for (int v = lane; v < (kend[r] - q0) * 8; v += 32) cp_async16(dst + v, src + v, 16);
      cursor += kend[r] - q0;
    }
  }

  // stage x[n0 : n0 + NT, k0 : k0 + KS] as NT rows of KS halves (zeros past N and K)
  if (x_vec) {
    for (int c = tid; c < NT * (KS / 8); c += THREADS) {
      const int n = c / (KS / 8), k = c % (KS / 8) * 8;
      const bool ok = n0 + n < N && k0 + k < K;
      const int bytes = ok ? min(8, K - k0 - k) * 2 : 0;
      cp_async16(xs + n * XP + k, ok ? x + (n0 + n) * sxn + k0 + k : x, bytes);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  } else {
    for (int i = tid; i < NT * KS; i += THREADS) {
      const int n = i / KS, k = i % KS;
      xs[n * XP + k] = n0 + n < N && k0 + k < K ? x[(n0 + n) * sxn + (k0 + k) * sxk] : static_cast<unsigned short>(0);
    }
  }
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  for (int v = lane; v < TILE / 8; v += 32) reinterpret_cast<uint4*>(tile)[v] = zero4;
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // the words (and x)
  __syncthreads();

  // ldmatrix.x4 addresses: lane l names row l % 8 of matrix l / 8
  const int mi = lane / 8, mr = lane % 8;
  // A (16 x 16 at column 16 kk of the tile): matrices (rows 0-7, 8-15) x (columns 0-7, 8-15)
  const unsigned short* a_row = tile + ((mi & 1) * 8 + mr) * TP + (mi >> 1) * 8;
  // x (tokens 8 j .. 8 j + 7; K steps kk, kk + 1): matrices (kk lo, kk hi, kk + 1 lo, kk + 1 hi)
  const unsigned short* b_row = xs + mr * XP + (mi >> 1) * 16 + (mi & 1) * 8;

  float acc[RPW][NB][4];
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][j][i] = 0.f;
  for (int kt = 0; kt < kts; ++kt) {
    unsigned b[NB][4][2];  // x's fragments of this K tile: n8 block j, K step kk
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int kk = 0; kk < 4; kk += 2) {
        unsigned r[4];
        ldmatrix_x4(r, b_row + j * 8 * XP + kt * 64 + kk * 16);
        b[j][kk][0] = r[0], b[j][kk][1] = r[1], b[j][kk + 1][0] = r[2], b[j][kk + 1][1] = r[3];
      }
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int rt = rt0 + r * WARPS;
      if (rt >= row_tiles) break;  // warp-uniform
      const int first = __shfl_sync(0xffffffffu, kstart[r], 0);
      const int q0 = __shfl_sync(0xffffffffu, kstart[r], kt) - first;
      const int q1 = (kt + 1 < kts ? __shfl_sync(0xffffffffu, kstart[r], kt + 1) : kend[r]) - first;
      if (q1 == q0) continue;  // an empty tile (warp-uniform)
      const unsigned* wq = wbuf_w + run0[r] * 32 + lane;
      for (int q = q0; q < q1; ++q) {  // scatter the tile's words
        const unsigned w = wq[q * 32];
        const unsigned pos = w >> 16;
        tile[(pos >> 6) * TP + (pos & 63)] = static_cast<unsigned short>(w);
      }
      __syncwarp();
      unsigned a[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) ldmatrix_x4(a[kk], a_row + kk * 16);
      __syncwarp();  // (the fragments are in registers: the tile is zeroed under the mma)
      for (int v = lane; v < TILE / 8; v += 32) reinterpret_cast<uint4*>(tile)[v] = zero4;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int j = 0; j < NB; ++j) mma_16816(acc[r][j], a[kk], b[j][kk][0], b[j][kk][1]);
      __syncwarp();
    }
  }

  // finished row tiles: C fragment (row g, g + 8; tokens 2t, 2t + 1 of each n8 block)
  const spartune::Epilogue ep{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane / 4, tq = lane % 4;
  const long long tile_rows = static_cast<long long>(row_tiles) * 16;
  const long long base = static_cast<long long>(blockIdx.z) * slices * tile_rows;
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int rt = rt0 + r * WARPS;
    if (rt >= row_tiles) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = rt * 16 + g + 8 * h;
      if (slices == 1) {
        if (m >= M) continue;
        const float bias_m = ep.bias_of(m);
#pragma unroll
        for (int j = 0; j < NB; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = n0 + j * 8 + 2 * tq + e;
            if (n < N) ep.store(m, n, acc[r][j][2 * h + e], bias_m);
          }
      } else {
        float* p = ws + (base + s * tile_rows + m) * NT + 2 * tq;
#pragma unroll
        for (int j = 0; j < NB; ++j) *reinterpret_cast<float2*>(p + j * 8) = make_float2(acc[r][j][2 * h], acc[r][j][2 * h + 1]);
      }
    }
  }
  if (slices == 1) return;

  // split K: the last CTA of this row block and token tile sums the slices' partials in order
  __threadfence();
  __syncthreads();
  int* counter = counters + blockIdx.z * gridDim.x + blockIdx.x;
  if (tid == 0) is_last = atomicAdd(counter, 1) == slices - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int o = tid; o < RB * 16 * NT; o += THREADS) {
    const int m = blockIdx.x * RB * 16 + o / NT, nl = o % NT;
    if (m >= M || n0 + nl >= N) continue;
    const float* p = ws + (base + m) * NT + nl;
    float sum = 0.f;
    for (int s0 = 0; s0 < slices; ++s0) sum += __ldcg(p + s0 * tile_rows * NT);
    ep.store(m, n0 + nl, sum, ep.bias_of(m));
  }
  if (tid == 0) *counter = 0;
}
