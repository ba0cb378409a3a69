// Unstructured SpMM for few tokens on the tensor cores, A's fragments decoded in registers from
// bitmap tiles (SpInfer's idea), linear layout with the fused epilogue:
//   out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// csr_tc expanded each tile densely through shared memory (10x its bytes at 90%: LOG, "csr_tc
// v1b"); here each lane builds its own mma.m16n8k16 A fragment straight from the tile's bitmap:
// a 16 x 16 tile is four 8 x 8 sub-tiles in fragment order (a0a1, a2a3, a4a5, a6a7), and lane l
// owns bits 2l and 2l + 1 of each sub-tile's 64-bit map, so its value sits at the tile's base +
// the sub-tile's offset + the popcount of the bits below 2l. A tile costs ~60 instructions at any
// density and NT / 8 mma; the weight streams as 48-byte tile records and its values, once.
// Records (kernels/_bitmap_tiles.py), 12 words: the low words of sub-tile s's map in word s, the
// high in 4 + s; word 8 the tile's first value; word 9 byte s: the values of sub-tiles before s;
// word 10 byte s: the set bits in the low word of sub-tile s's map.
// A CTA owns WARPS row tiles of 16 (grid x), one slice of K of 32 * KP columns (grid y) and NT
// tokens (grid z); x's slice is staged once in shared memory (cp.async) for its warps, and each
// warp copies its row tile's records and values for the slice into its own part of shared memory
// first (cp.async, under x's staging; in segments of pairs whose values fit VW halves), so the
// decode's loads wait on shared memory, not on a DRAM round trip per pair (v1). With more
// than one slice, fp32 partials go to `ws` and the last CTA of a row block (an arrival counter,
// left at zero again) sums them in slice order and applies the epilogue.
//   SPARTUNE_BF16  0: fp16 weight and x, 1: bf16
//   NT             tokens per CTA: 8, 16 or 32
//   WARPS          warps (row tiles) per CTA
//   KP             pairs of 16-column tiles per slice
//   VW             halves of values each warp's buffer holds (a pair's 512 at most fit)
#include "epilogue.cuh"

#if !defined(SPARTUNE_BF16) || !defined(NT) || !defined(WARPS) || !defined(KP) || !defined(VW)
#error "spmm_csr_bitmap.cu needs SPARTUNE_BF16, NT, WARPS, KP and VW"
#endif

constexpr int KS = 32 * KP;  // columns of K per slice
constexpr int XP = KS + 8;   // halves per staged token row (16-byte pad: ldmatrix without conflicts)
constexpr int NB = NT / 8;   // n8 blocks of tokens
constexpr int THREADS = WARPS * 32;
constexpr int REC_BYTES = KP * 96;             // a warp's records of one slice
constexpr int WARP_BYTES = REC_BYTES + VW * 2;  // and its values
static_assert(NT == 8 || NT == 16 || NT == 32, "NT must be 8, 16 or 32");
static_assert(VW % 8 == 0 && VW >= 520, "VW must hold a pair of dense tiles and its alignment");

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

// A lane's share of a tile record: the words of the four maps that hold its bits (low words for
// lanes 0-15, high for 16-31), then the tile's header.
struct Tile {
  uint4 maps, head;
};

// rec: this lane's map words of the tile (its record + hi); head: 2 - hi past them
__device__ __forceinline__ Tile load_tile(const uint4* rec, int head) {
  return Tile{rec[0], rec[head]};
}

// This lane's A fragment of a tile: sh = 2 * lane % 32, hi = lane >= 16, below = the mask of the
// bits below its own in its words. Both values at the lane's place are loaded whatever its bits
// (the values carry two halves of padding past the last) and its bits pick what the fragment
// keeps with one byte permutation: selector 0x2222 (none), 0x2210 (first), 0x1022 (second), 0x5410.
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned selector) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// vals: the warp's staged values, the first at index va of the weight's.
__device__ __forceinline__ void decode(const Tile& t, const unsigned short* vals, int va, unsigned (&a)[4], int sh,
                                       bool hi, unsigned below) {
  const unsigned maps[4] = {t.maps.x, t.maps.y, t.maps.z, t.maps.w};
  const unsigned before = t.head.y + (hi ? t.head.z : 0u);  // byte s: values before this lane's word of s
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const unsigned word = maps[s];
    const unsigned i = t.head.x - va + prmt(before, 0u, 0x4440u + s) + __popc(word & below);
    const unsigned u0 = vals[i], u1 = vals[i + 1];
    const unsigned two = (word >> sh) & 3u;
    a[s] = prmt(u0, u1, prmt(0x22102222u, 0x54101022u, two * 0x22u + 0x10u));
  }
}

// records: (row_tiles, k_tiles) tiles of 3 uint4, k_tiles even, then a pair of padding; tile_base: (row_tiles * k_tiles + 1)
// first values, then nnz. x (N, K) at strides (sxn, sxk); x_vec: rows contiguous, sxn a multiple of
// 8 and x 16-byte aligned (cp.async). ws: fp32 partials (token tiles, slices, row_tiles * 16, NT)
// when slices > 1; counters: one per (row block, token tile), zero between calls.
extern "C" __global__ void __launch_bounds__(THREADS) spmm_csr_bitmap(
    const uint4* __restrict__ records, const unsigned short* __restrict__ vals, const int* __restrict__ tile_base,
    const unsigned short* __restrict__ x, void* out, const void* bias, const void* residual, float* __restrict__ ws,
    int* __restrict__ counters, int M, int N, int K, int row_tiles, int k_tiles, int slices, long long sxn,
    long long sxk, int x_vec, int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act,
    float scale) {
  extern __shared__ uint4 smem_v[];
  unsigned short* xs = reinterpret_cast<unsigned short*>(smem_v);  // NT rows of XP halves
  __shared__ int is_last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int s = blockIdx.y, k0 = s * KS, n0 = blockIdx.z * NT;
  const int rt = blockIdx.x * WARPS + warp;
  const int kt0 = s * 2 * KP, pairs = rt < row_tiles ? (min(2 * KP, k_tiles - kt0)) / 2 : 0;

  const long long t0 = static_cast<long long>(rt) * k_tiles + kt0;
  char* wbuf = reinterpret_cast<char*>(xs + NT * XP) + warp * WARP_BYTES;
  uint4* rec_s = reinterpret_cast<uint4*>(wbuf);
  unsigned short* val_s = reinterpret_cast<unsigned short*>(wbuf + REC_BYTES);

  // Copy pairs [p0, p0 + seg) of the warp's row tile into its buffer, seg as many as fit VW halves
  // (values from va, rounded down to 16 bytes); returns seg.
  auto stage = [&](int p0, int& va) {
    va = tile_base[t0 + 2 * p0] & ~7;
    const int end = tile_base[t0 + 2 * min(p0 + lane + 1, pairs)];  // lane j: the end of pair p0 + j
    const int seg = min(max(__popc(__ballot_sync(0xffffffffu, end - va <= VW)), 1), pairs - p0);
    const int vb = __shfl_sync(0xffffffffu, end, seg - 1);
    const uint4* rg = records + (t0 + 2 * p0) * 3;
    for (int v = lane; v < seg * 6; v += 32) cp_async16(rec_s + v, rg + v, 16);
    const uint4* vg = reinterpret_cast<const uint4*>(vals + va);
    for (int v = lane; v < (vb - va + 7) / 8; v += 32) cp_async16(reinterpret_cast<uint4*>(val_s) + v, vg + v, 16);
    return seg;
  };
  int va = 0, seg = pairs > 0 ? stage(0, va) : 0;

  // stage x[n0 : n0 + NT, k0 : k0 + KS] as NT rows of KS halves (zeros past N and K)
  if (x_vec) {
    for (int c = tid; c < NT * (KS / 8); c += THREADS) {
      const int n = c / (KS / 8), k = c % (KS / 8) * 8;
      const bool ok = n0 + n < N && k0 + k < K;
      const int bytes = ok ? min(8, K - k0 - k) * 2 : 0;
      cp_async16(xs + n * XP + k, ok ? x + (n0 + n) * sxn + k0 + k : x, bytes);
    }
  } else {
    for (int i = tid; i < NT * KS; i += THREADS) {
      const int n = i / KS, k = i % KS;
      xs[n * XP + k] = n0 + n < N && k0 + k < K ? x[(n0 + n) * sxn + (k0 + k) * sxk] : static_cast<unsigned short>(0);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();

  const bool hi = lane >= 16;
  const int head = 2 - hi;  // a tile's header, in uint4 past this lane's map words
  const int sh = 2 * lane % 32;
  const unsigned below = (1u << sh) - 1u;
  // ldmatrix.x4 addresses: lane l names row l % 8 of matrix l / 8; x (tokens 8 j .. 8 j + 7, the
  // pair's columns): matrices (tile 0 lo, tile 0 hi, tile 1 lo, tile 1 hi)
  const int mi = lane / 8, mr = lane % 8;
  const unsigned short* b_row = xs + mr * XP + (mi >> 1) * 16 + (mi & 1) * 8;

  float acc[NB][4];
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
  for (int p0 = 0; p0 < pairs;) {  // segments of staged pairs (one, unless the values overflow VW)
    const uint4* rec = rec_s + hi;
    Tile cur[2] = {load_tile(rec, head), load_tile(rec + 3, head)}, nxt[2];
    for (int q = 0; q < seg; ++q) {
      rec += 6;  // (a pair past the segment's last reads stale words, never used)
      nxt[0] = load_tile(rec, head), nxt[1] = load_tile(rec + 3, head);
      unsigned a[2][4];
      decode(cur[0], val_s, va, a[0], sh, hi, below);
      decode(cur[1], val_s, va, a[1], sh, hi, below);
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        unsigned b[4];
        ldmatrix_x4(b, b_row + j * 8 * XP + (p0 + q) * 32);
        mma_16816(acc[j], a[0], b[0], b[1]);
        mma_16816(acc[j], a[1], b[2], b[3]);
      }
      cur[0] = nxt[0], cur[1] = nxt[1];
    }
    p0 += seg;
    if (p0 < pairs) {
      __syncwarp();  // every lane is done with the buffer
      seg = stage(p0, va);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      __syncwarp();
    }
  }

  // C fragment: rows g, g + 8; tokens 2t, 2t + 1 of each n8 block
  const spartune::Epilogue ep{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane / 4, tq = lane % 4;
  const long long tile_rows = static_cast<long long>(row_tiles) * 16;
  const long long base = static_cast<long long>(blockIdx.z) * slices * tile_rows;
  if (rt < row_tiles) {
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
            if (n < N) ep.store(m, n, acc[j][2 * h + e], bias_m);
          }
      } else {
        float* p = ws + (base + s * tile_rows + m) * NT + 2 * tq;
#pragma unroll
        for (int j = 0; j < NB; ++j) *reinterpret_cast<float2*>(p + j * 8) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
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
  for (int o = tid; o < WARPS * 16 * NT; o += THREADS) {
    const int m = blockIdx.x * WARPS * 16 + o / NT, nl = o % NT;
    if (m >= M || n0 + nl >= N) continue;
    const float* p = ws + (base + m) * NT + nl;
    float sum = 0.f;
    for (int s0 = 0; s0 < slices; ++s0) sum += __ldcg(p + s0 * tile_rows * NT);
    ep.store(m, n0 + nl, sum, ep.bias_of(m));
  }
  if (tid == 0) *counter = 0;
}
