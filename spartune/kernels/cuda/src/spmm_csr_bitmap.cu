// Unstructured SpMM for few tokens on the tensor cores, A's fragments decoded in registers from
// bitmap tiles (SpInfer's idea), linear layout with the fused epilogue:
//   out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// csr_tc expanded each tile densely through shared memory (10x its bytes at 90%: LOG, "csr_tc
// v1b"); here each lane builds its own mma.m16n8k16 A fragment: a 16 x 16 tile is four 8 x 8
// sub-tiles in fragment order (a0a1, a2a3, a4a5, a6a7), and lane l holds the pair of columns
// (2 (l % 4), + 1) of row l / 4 in each. Bit l of a sub-tile's 32-bit map says that pair holds a
// nonzero; the nonempty pairs' words (both halves, a zero where one is missing) lie in lane
// order, so lane l's word is the sub-tile's start + the popcount of the map below bit l: a tile
// costs ~30 instructions at any density and NT / 8 mma.
// Records (kernels/_bitmap_tiles.py), 8 words a tile: the four maps, then the four sub-tiles'
// first words (indices into `words`).
// A CTA owns WARPS row tiles of 16 (grid x), one slice of K of 32 * KP columns (grid y) and NT
// tokens (grid z); x's slice is staged once in shared memory (cp.async) for its warps, and each
// warp copies its row tile's records and words for the slice into its own part of shared memory
// first (cp.async, under x's staging; in segments of pairs of tiles whose words fit VW), so the
// decode waits on shared memory, not on a DRAM round trip per pair (v1). With more than one
// slice, fp32 partials go to `ws` and the last CTA of a row block (an arrival counter, left at
// zero again) sums them in slice order and applies the epilogue.
//   SPARTUNE_BF16  0: fp16 weight and x, 1: bf16
//   NT             tokens per CTA: 8, 16 or 32
//   WARPS          warps (row tiles) per CTA
//   KP             pairs of 16-column tiles per slice
//   RPW            row tiles each warp takes in turn (the next one's copy in flight under this one's)
//   VW             words each warp's buffer holds (a pair's 256 at most fit)
#include "epilogue.cuh"

#if !defined(SPARTUNE_BF16) || !defined(NT) || !defined(WARPS) || !defined(KP) || !defined(VW) || !defined(RPW)
#error "spmm_csr_bitmap.cu needs SPARTUNE_BF16, NT, WARPS, KP, VW and RPW"
#endif

constexpr int KS = 32 * KP;  // columns of K per slice
constexpr int XP = KS + 8;   // halves per staged token row (16-byte pad: ldmatrix without conflicts)
constexpr int NB = NT / 8;   // n8 blocks of tokens
constexpr int THREADS = WARPS * 32;
constexpr int REC_BYTES = KP * 64;             // a warp's records of one slice
constexpr int BUF_BYTES = REC_BYTES + VW * 4;   // and its words
constexpr int WARP_BYTES = BUF_BYTES * (RPW > 1 ? 2 : 1);  // one buffer, or two taking turns
constexpr int RB = WARPS * RPW;                  // row tiles per CTA
static_assert(NT == 8 || NT == 16 || NT == 32, "NT must be 8, 16 or 32");
static_assert(VW % 4 == 0 && VW >= 260, "VW must hold a pair of dense tiles and its alignment");

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

// A tile's record: its four maps and its sub-tiles' first words.
struct Tile {
  uint4 maps, starts;
};

__device__ __forceinline__ Tile load_tile(const uint4* rec) { return Tile{rec[0], rec[1]}; }

// This lane's A fragment of a tile; words: the warp's staged words, the first at index wa of the
// weight's; bit = 1 << lane, below = bit - 1.
__device__ __forceinline__ void decode(const Tile& t, const unsigned* words, int wa, unsigned (&a)[4], unsigned bit,
                                       unsigned below) {
  const unsigned maps[4] = {t.maps.x, t.maps.y, t.maps.z, t.maps.w};
  const unsigned starts[4] = {t.starts.x, t.starts.y, t.starts.z, t.starts.w};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const unsigned i = starts[s] - wa + __popc(maps[s] & below);
    a[s] = maps[s] & bit ? words[i] : 0u;
  }
}

// records: (row_tiles, k_tiles) tiles of 2 uint4, k_tiles even, then a pair of padding; tile_base:
// (row_tiles * k_tiles + 1) first words, then their count. x (N, K) at strides (sxn, sxk); x_vec: rows contiguous, sxn a multiple of
// 8 and x 16-byte aligned (cp.async). ws: fp32 partials (token tiles, slices, row_tiles * 16, NT)
// when slices > 1; counters: one per (row block, token tile), zero between calls.
extern "C" __global__ void __launch_bounds__(THREADS) spmm_csr_bitmap(
    const uint4* __restrict__ records, const unsigned* __restrict__ words, const int* __restrict__ tile_base,
    const unsigned short* __restrict__ x, void* out, const void* bias, const void* residual, float* __restrict__ ws,
    int* __restrict__ counters, int M, int N, int K, int row_tiles, int k_tiles, int slices, long long sxn,
    long long sxk, int x_vec, int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act,
    float scale) {
  extern __shared__ uint4 smem_v[];
  unsigned short* xs = reinterpret_cast<unsigned short*>(smem_v);  // NT rows of XP halves
  __shared__ int is_last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int s = blockIdx.y, k0 = s * KS, n0 = blockIdx.z * NT;
  const int kt0 = s * 2 * KP, slice_pairs = min(2 * KP, k_tiles - kt0) / 2;
  char* wbuf = reinterpret_cast<char*>(xs + NT * XP) + warp * WARP_BYTES;

  // Copy pairs [p0, p0 + seg) of row tile rt's slice into buffer b, seg as many as fit VW words
  // (from wa, rounded down to 16 bytes); returns seg.
  auto stage = [&](int rt, int p0, int b, int& wa) {
    const long long t0 = static_cast<long long>(rt) * k_tiles + kt0;
    uint4* rec_s = reinterpret_cast<uint4*>(wbuf + b * BUF_BYTES);
    unsigned* word_s = reinterpret_cast<unsigned*>(wbuf + b * BUF_BYTES + REC_BYTES);
    wa = tile_base[t0 + 2 * p0] & ~3;
    const int end = tile_base[t0 + 2 * min(p0 + lane + 1, slice_pairs)];  // lane j: the end of pair p0 + j
    const int seg = min(max(__popc(__ballot_sync(0xffffffffu, end - wa <= VW)), 1), slice_pairs - p0);
    const int wb = __shfl_sync(0xffffffffu, end, seg - 1);
    const uint4* rg = records + (t0 + 2 * p0) * 2;
    for (int v = lane; v < seg * 4; v += 32) cp_async16(rec_s + v, rg + v, 16);
    const uint4* wg = reinterpret_cast<const uint4*>(words + wa);
    for (int v = lane; v < (wb - wa + 3) / 4; v += 32) cp_async16(reinterpret_cast<uint4*>(word_s) + v, wg + v, 16);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    return seg;
  };
  const int rt0 = blockIdx.x * RB + warp;  // the warp's row tiles: rt0, rt0 + WARPS, ...
  int wa = 0, seg = rt0 < row_tiles && slice_pairs > 0 ? stage(rt0, 0, 0, wa) : 0;

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

  const spartune::Epilogue ep{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane / 4, tq = lane % 4;
  const long long tile_rows = static_cast<long long>(row_tiles) * 16;
  const long long base = static_cast<long long>(blockIdx.z) * slices * tile_rows;
  const unsigned bit = 1u << lane, below = bit - 1u;
  // ldmatrix.x4 addresses: lane l names row l % 8 of matrix l / 8; x (tokens 8 j .. 8 j + 7, the
  // pair's columns): matrices (tile 0 lo, tile 0 hi, tile 1 lo, tile 1 hi)
  const int mi = lane / 8, mr = lane % 8;
  const unsigned short* b_row = xs + mr * XP + (mi >> 1) * 16 + (mi & 1) * 8;

  for (int r = 0; r < RPW; ++r) {
    const int rt = rt0 + r * WARPS, b = r & 1;
    if (rt >= row_tiles || slice_pairs == 0) break;  // (warp-uniform)
    int wa_next = 0, seg_next = 0;
    if (r + 1 < RPW && rt + WARPS < row_tiles) {  // the next row tile's copy, under this one
      seg_next = stage(rt + WARPS, 0, b ^ 1, wa_next);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    __syncwarp();
    const uint4* rec_s = reinterpret_cast<const uint4*>(wbuf + b * BUF_BYTES);
    const unsigned* word_s = reinterpret_cast<const unsigned*>(wbuf + b * BUF_BYTES + REC_BYTES);
    float acc[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    for (int p0 = 0; p0 < slice_pairs;) {  // segments of staged pairs (one, unless the words overflow VW)
      const uint4* rec = rec_s;
      Tile cur[2] = {load_tile(rec), load_tile(rec + 2)}, nxt[2];
      for (int q = 0; q < seg; ++q) {
        rec += 4;  // (a pair past the segment's last reads stale words, never used)
        nxt[0] = load_tile(rec), nxt[1] = load_tile(rec + 2);
        unsigned a[2][4];
        decode(cur[0], word_s, wa, a[0], bit, below);
        decode(cur[1], word_s, wa, a[1], bit, below);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          unsigned bf[4];
          ldmatrix_x4(bf, b_row + j * 8 * XP + (p0 + q) * 32);
          mma_16816(acc[j], a[0], bf[0], bf[1]);
          mma_16816(acc[j], a[1], bf[2], bf[3]);
        }
        cur[0] = nxt[0], cur[1] = nxt[1];
      }
      p0 += seg;
      if (p0 < slice_pairs) {  // the rest of this row tile, in the same buffer
        __syncwarp();  // every lane is done with it
        seg = stage(rt, p0, b, wa);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncwarp();
      }
    }
    // C fragment: rows g, g + 8; tokens 2t, 2t + 1 of each n8 block
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
    seg = seg_next, wa = wa_next;
    __syncwarp();  // every lane is done with buffer b before the next turn refills it
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
