// Unstructured (CSR) SpMM for few tokens on CUDA cores, x staged in shared memory, linear layout
// with the fused epilogue:  out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// A CTA owns one slice of K (KS columns; grid y) for NT tokens (grid z) and WARPS x GPW groups of R
// rows (grid x: its "row block", warp rows dealt over the matrix by grid_warp_row). Its slice of x
// is copied once into shared memory as NT / 8 planes of PS rows of 8 tokens (KS rows of x, then
// zero rows that padding slots read); every nonzero then costs one 16-byte shared load per lane
// and 8 tokens instead of a gather through L1 (benchmarks/LOG.md, "CSR decode": that gather bound
// the Triton kernels). A warp serves GPW consecutive groups of R
// rows, one after another, NT / TPL lanes ("a team") per row, each lane TPL tokens in fp32: the
// staged slice serves WARPS / KW x GPW x R rows. The rows' nonzeros come from the sliced ELL copy
// (kernels/_sliced_ell.py), where a warp's groups in one slice are one contiguous stream: one
// 16-byte streaming load per lane brings the row's next 4 (column, value) words, three loads stay
// in flight across group boundaries, the copy gives the P rows of a quarter-warp columns distinct
// mod P, and the plane pitch PS puts the team's lanes on the other bank positions.
// With more than one slice, fp32 partials go to `ws`; the last CTA of a row block (an arrival
// counter, left at zero again) sums them in slice order (deterministic) and applies the epilogue.
// Or (CK > 1, sm_90) the slices of a row block form a cluster: each CTA stages only its slice of x,
// keeps its sums in shared memory, and each CTA then sums a share of the rows over the cluster's CTAs
// in slice order through distributed shared memory: no partials in global memory, no counter (up to
// ~10% faster where the tuner picks it; x's L2 copies, which it cuts 4-8x, were not what bound
// N = 16: LOG, csr_smem v7).
//   SPARTUNE_BF16  0: fp16 weight and x, 1: bf16
//   NT             tokens per CTA: 8, 16 or 32
//   TPL            tokens per lane: 8, or 16 (NT >= 16): a word's decoding, its load and its shared
//                  address serve twice the products (issue-bound at N >= 16: LOG, csr_smem v12)
//   WARPS          warps per CTA
//   KS             columns of K per slice
//   GPW            groups of R rows per warp (at most 31)
//   QS             lanes splitting each row's chunks (1, 2, 4): R = 32 / (NT / TPL * QS) rows per
//                  warp; a row's lanes sum their parts by shuffles when its group ends. Fewer
//                  rows per warp: more warps on a short matrix without splitting K further.
//   KW             warps taking turns over the same groups' chunks (warp kw: steps kw, kw + KW,
//                  ...): a short matrix gets many warps per row with K whole in one CTA (no
//                  partials through global memory); the KW sums meet in shared memory in a fixed
//                  order. WARPS / KW warp rows, each of GPW groups, per CTA.
//   CK             CTAs of a cluster: the K slices of one row block (1: no cluster; else exactly the
//                  grid's slices, at most 8)
//   HALF_SUMS      1 (fp16 only): each chunk's products summed in fp16 pairs before the fp32 sums
//   ROWS_COPY      1: the CTA's output rows copied into shared memory at the start, so the epilogue
//                  does not wait on a load at the end of the CTA's life (the host sets it where
//                  they fit: _rows_copied; LOG, session 25)
#include "epilogue.cuh"

#if !defined(SPARTUNE_BF16) || !defined(NT) || !defined(WARPS) || !defined(KS) || !defined(GPW)
#error "spmm_csr_smem.cu needs SPARTUNE_BF16, NT, WARPS, KS and GPW"
#endif
#ifndef QS
#define QS 1
#endif
#ifndef KW
#define KW 1
#endif
#ifndef TPL
#define TPL 8
#endif
#ifndef CK
#define CK 1
#endif
#ifndef HALF_SUMS
#define HALF_SUMS 0
#endif
#ifndef ROWS_COPY
#define ROWS_COPY 0
#endif
#if HALF_SUMS && SPARTUNE_BF16
#error "HALF_SUMS is for fp16 only"
#endif
#if CK > 1
#include "wgmma_sp.cuh"  // cluster barriers, distributed shared memory
#define CSR_CLUSTER __cluster_dims__(1, CK, 1)
#else
#define CSR_CLUSTER
#endif

constexpr int TEAM = NT / TPL;   // lanes per row and chunk (TPL tokens each)
constexpr int NB = NT / 8;       // planes of 8 tokens in shared memory
constexpr int LP = TPL / 8;      // planes a lane reads (one 16-byte load each)
constexpr int R = 32 / (TEAM * QS);  // rows per warp
constexpr int QLANES = R * TEAM;     // lanes of one K part (lane = q * QLANES + t * TEAM + h)
constexpr int P = 8 / TEAM;      // rows one quarter-warp reads: the copy gives their columns
                                 // distinct residues mod P
// rows per plane: lane h reads planes LP h .. LP h + LP - 1, so LP PS = P (mod 8) puts the team's
// lanes of one row on the bank positions its P rows leave free
constexpr int PS = KS + P + (LP == 2 && P == 4 ? 2 : 0);
constexpr int THREADS = WARPS * 32;
constexpr int DEPTH = 3;  // the stream's 16-byte loads in flight per lane (4-6 measured slower: LOG, session 25)
constexpr int WG = WARPS / KW;   // warp rows: sets of KW warps sharing groups
constexpr int TEAM_ROWS = WG * GPW * R;  // a CTA's rows (teams), padding included
constexpr int ROWS_PER_THREAD = ROWS_COPY ? (TEAM_ROWS + THREADS - 1) / THREADS : 1;
static_assert(NT == 8 || NT == 16 || NT == 32, "NT must be 8, 16 or 32");
static_assert((TPL == 8 || TPL == 16) && NT % TPL == 0, "TPL must be 8, or 16 with NT >= 16");
static_assert((LP * PS) % 8 == P % 8, "the plane pitch must put a team's lanes on free bank positions");
static_assert(GPW >= 1 && GPW <= 31, "GPW must be in 1..31 (a lane holds each group's offset)");
static_assert(QS == 1 || QS == 2 || QS == 4, "QS must be 1, 2 or 4");
static_assert(KS % 32 == 0, "KS must be a multiple of 32");
static_assert(KW >= 1 && WARPS % KW == 0, "KW must divide WARPS");
static_assert(CK >= 1 && CK <= 8, "CK must be in 1..8");

// Rows come longest first, so consecutive warp rows per CTA would give the first CTAs the longest
// groups and end a one-wave launch with them (equal groups measured 2-4% faster: LOG, session 21).
// Warp row wr of CTA b is the grid's warp row wr B + b, its order reversed in every other band of
// B: each CTA holds one long and one short warp row of each pair of bands.
__device__ __forceinline__ int grid_warp_row(int wr) {
  const int B = gridDim.x, b = blockIdx.x;
  return wr * B + (wr & 1 ? B - 1 - b : b);
}

// the grid's team row of the CTA's team row `local` (warp row major, then group, then team)
__device__ __forceinline__ int grid_team_row(int local) {
  constexpr int PER_WARP_ROW = GPW * R;
  return grid_warp_row(local / PER_WARP_ROW) * PER_WARP_ROW + local % PER_WARP_ROW;
}

// the output row of a team row (grid index team_row, CTA index local): `rows` is the CTA's copy
// (ROWS_COPY) or the grid's
__device__ __forceinline__ int row_of(const int* rows, int team_row, int local) {
  return rows[ROWS_COPY ? local : team_row];
}

__device__ __forceinline__ float elt_to_float(unsigned bits) {
#if SPARTUNE_BF16
  return __uint_as_float(bits << 16);
#else
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#endif
}

// two packed 16-bit elements (low: first) as floats
__device__ __forceinline__ float2 pair_to_float2(unsigned v) {
#if SPARTUNE_BF16
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
#else
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
#endif
}

// 8 16-bit elements, the first lowest
__device__ __forceinline__ uint4 pack8(const unsigned short (&e)[8]) {
  return make_uint4(e[0] | (static_cast<unsigned>(e[1]) << 16), e[2] | (static_cast<unsigned>(e[3]) << 16),
                    e[4] | (static_cast<unsigned>(e[5]) << 16), e[6] | (static_cast<unsigned>(e[7]) << 16));
}

// the weight is read once: bypass L1, where the staged x does not live but other CTAs' might
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ void fma_word(float (&acc)[TPL], unsigned word, const uint4* xs_lane) {
  const float v = elt_to_float(word & 0xffffu);
  const uint4* xr = xs_lane + (word >> 16);
#pragma unroll
  for (int j = 0; j < LP; ++j) {  // plane j: tokens 8 j .. 8 j + 7, two a 32-bit pair
    const uint4 xv = xr[j * PS];
    const unsigned pairs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = pair_to_float2(pairs[i]);
      acc[8 * j + 2 * i] = fmaf(v, f.x, acc[8 * j + 2 * i]);
      acc[8 * j + 2 * i + 1] = fmaf(v, f.y, acc[8 * j + 2 * i + 1]);
    }
  }
}

#if HALF_SUMS
// fp16 where torch allows reduced-precision reductions: a chunk's 4 products per token are summed
// in fp16 pairs (HFMA2: two products an instruction, no conversions) and added to the fp32 sums
// once per chunk, ~1.3 instructions a product against ~2.4 (LOG, csr_smem session 24)
__device__ __forceinline__ void fma_chunk(float (&acc)[TPL], const uint4& w, const uint4* xs_lane) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  __half2 part[TPL / 2];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const __half2 v = __half2half2(__ushort_as_half(static_cast<unsigned short>(words[u] & 0xffffu)));
    const uint4* xr = xs_lane + (words[u] >> 16);
#pragma unroll
    for (int j = 0; j < LP; ++j) {
      const uint4 xv = xr[j * PS];
      const unsigned pairs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2 x2 = *reinterpret_cast<const __half2*>(&pairs[i]);
        part[4 * j + i] = u == 0 ? __hmul2(v, x2) : __hfma2(v, x2, part[4 * j + i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < TPL / 2; ++i) {
    const float2 f = __half22float2(part[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}
#else
__device__ __forceinline__ void fma_chunk(float (&acc)[TPL], const uint4& w, const uint4* xs_lane) {
  fma_word(acc, w.x, xs_lane);
  fma_word(acc, w.y, xs_lane);
  fma_word(acc, w.z, xs_lane);
  fma_word(acc, w.w, xs_lane);
}

#endif

// words: the sliced ELL's words as 16-byte chunks; offsets (slices * groups + 1) in words;
// rows (groups * R): the row of each team, -1 for none. x (N, K) at strides (sxn, sxk).
// ws: fp32 partials (token tiles, slices, groups * R, NT) when slices > 1; counters: one per
// (row block, token tile), zero between calls.
struct Partials {
  float* ws;
  float* red;  // CK > 1: this slice's sums in shared memory, (TEAM_ROWS, NT)
  long long tile_rows, base;  // groups * R; where this token tile's slices start
  int slice, slices;
};

// A finished group: its rows' out, or their partial sums of this slice.
// `local`: the CTA's team row of it.
__device__ __forceinline__ void finish(const float (&acc)[TPL], int team_row, int local, int h, int n0,
                                       const int* rows, const spartune::Epilogue& ep, const Partials& part) {
  if (CK == 1 && part.slices == 1) {
    const int m = row_of(rows, team_row, local);
    if (m >= 0) {
      const float bias_m = ep.bias_of(m);
#pragma unroll
      for (int i = 0; i < TPL; ++i) ep.store(m, n0 + h * TPL + i, acc[i], bias_m);
    }
    return;
  }
  float* dst = CK > 1 ? part.red + local * NT
                      : part.ws + (part.base + part.slice * part.tile_rows + team_row) * NT;
  float4* p = reinterpret_cast<float4*>(dst + h * TPL);
#pragma unroll
  for (int i = 0; i < TPL / 4; ++i) p[i] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
}

// One element of a finished group (the KW path): out, or this slice's partial sum.
__device__ __forceinline__ void emit(float v, int team_row, int local, int n_local, int n0, const int* rows,
                                     const spartune::Epilogue& ep, const Partials& part) {
  if (CK > 1) {
    part.red[local * NT + n_local] = v;
    return;
  }
  if (part.slices == 1) {
    const int m = row_of(rows, team_row, local);
    if (m >= 0) ep.store(m, n0 + n_local, v, ep.bias_of(m));
    return;
  }
  part.ws[(part.base + part.slice * part.tile_rows + team_row) * NT + n_local] = v;
}

// The slices' sums of the CTA's rows meet: each 4-token vector (v: the CTA's own, its team rows
// first) summed over the slices in slice order (deterministic) and stored through the epilogue,
// by threads first, first + stride, ...; slice(team_row, v, j) reads slice j's part, IN_FLIGHT
// slices' loads at once. Serves split K (partials in global memory) and clusters (peers' shared
// memory) alike.
template <int IN_FLIGHT, class Slice>
__device__ __forceinline__ void sum_slices(int slices, int first, int stride, const int* rows, int groups, int n0,
                                           const spartune::Epilogue& ep, Slice slice) {
  for (int v = first; v < TEAM_ROWS * NT / 4; v += stride) {
    const int team_row = grid_team_row(v / (NT / 4)), n = n0 + v % (NT / 4) * 4;
    if (team_row >= groups * R) break;  // grid_team_row rises with v: the rest lie past the last group
    float4 sum = slice(team_row, v, 0);
    for (int j0 = 1; j0 < slices; j0 += IN_FLIGHT) {
      float4 p[IN_FLIGHT];
#pragma unroll
      for (int j = 0; j < IN_FLIGHT; ++j) {
        if (j0 + j < slices) p[j] = slice(team_row, v, j0 + j);
      }
#pragma unroll
      for (int j = 0; j < IN_FLIGHT; ++j) {
        if (j0 + j < slices) {
          sum.x += p[j].x; sum.y += p[j].y; sum.z += p[j].z; sum.w += p[j].w;
        }
      }
    }
    const int m = row_of(rows, team_row, v / (NT / 4));
    if (m >= 0) {
      const float bias_m = ep.bias_of(m);
      ep.store(m, n, sum.x, bias_m);
      ep.store(m, n + 1, sum.y, bias_m);
      ep.store(m, n + 2, sum.z, bias_m);
      ep.store(m, n + 3, sum.w, bias_m);
    }
  }
}

// x[n0 : n0 + NT, k0 : k0 + KS] into shared memory as planes of KS rows of 8 tokens (zeros past N and K)
// where x's rows are contiguous (Hopper): a warp loads 8 tokens x 32 columns (a unit), a batch of
// units in flight at once, and `stmatrix.trans` writes each 8 x 8 block's columns as 16-byte rows
// of 8 tokens at addresses the lanes give. Wide (rows 16-byte aligned): a lane loads 8 columns of
// one token in one 16-byte load, so register i holds pair i of each lane's 8 columns and the
// lanes' row addresses put each transposed row at its column: a third less staging time than
// 4-byte pairs, whose 16-byte pieces each fetched a 32-byte sector (LOG, session 20: staging was
// 40% of qkv at N = 16). Else 4-byte pairs of columns, register j holding block j.
// With one batch a warp the kernel issues it before it waits for the offsets (LOG, session 25).
constexpr int X_UNITS = KS / 32 * NB;  // (32 columns, 8 tokens) per unit
constexpr int X_PER_WARP = (X_UNITS + WARPS - 1) / WARPS;
constexpr int X_MAX_BATCH = NT == 8 ? 8 : 4;  // more spills under the 64-register cap
constexpr int X_BATCH = X_PER_WARP < X_MAX_BATCH ? X_PER_WARP : X_MAX_BATCH;  // units in flight per warp
using XBatch = unsigned[X_BATCH][4];
constexpr bool X_ONE_BATCH = X_PER_WARP <= X_MAX_BATCH;

// units u0, u0 + WARPS, ... (X_BATCH of them) of x into registers
__device__ __forceinline__ void load_x_batch(XBatch& v, int u0, bool wide, const unsigned short* __restrict__ x,
                                             int N, int K, long long sxn, int n0, int k0, int lane) {
  const int r = lane / 4, q = lane % 4;  // token r; wide: columns 8q .. 8q + 7, else pairs 2q, 2q + 1
#pragma unroll
  for (int b = 0; b < X_BATCH; ++b) {
    const int u = u0 + b * WARPS;
    const int kb = (u / NB) * 32, tb = u % NB;
    const int n = n0 + tb * 8 + r;
    const bool live = u < X_UNITS && n < N;
    if (wide) {
      const int k = k0 + kb + 8 * q;
      const unsigned short* src = x + n * sxn + k;
      uint4 w = make_uint4(0, 0, 0, 0);
      if (live && k + 7 < K) {
        w = *reinterpret_cast<const uint4*>(src);
      } else if (live && k < K) {  // the K tail
        unsigned short e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = k + j < K ? src[j] : static_cast<unsigned short>(0);
        w = pack8(e);
      }
      v[b][0] = w.x; v[b][1] = w.y; v[b][2] = w.z; v[b][3] = w.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = k0 + kb + j * 8 + 2 * q;
        unsigned w = 0;
        if (live) {
          const unsigned short* src = x + n * sxn + k;
          if (k + 1 < K) w = *reinterpret_cast<const unsigned*>(src);
          else if (k < K) w = *src;
        }
        v[b][j] = w;
      }
    }
  }
}

// the batch's units transposed into the planes
__device__ __forceinline__ void store_x_batch(const XBatch& v, int u0, bool wide, uint4* xs, int lane) {
#if __CUDA_ARCH__ >= 900
  // the slice column of the row this lane addresses: row p of matrix i
  const int i = lane / 8, p = lane % 8;
  const int col = wide ? 8 * (p / 2) + 2 * i + p % 2 : lane;
#pragma unroll
  for (int b = 0; b < X_BATCH; ++b) {
    const int u = u0 + b * WARPS;
    if (u >= X_UNITS) break;  // warp-uniform
    const int kb = (u / NB) * 32, tb = u % NB;
    const uint4* row = xs + tb * PS + kb + col;
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(v[b][0]), "r"(v[b][1]), "r"(v[b][2]), "r"(v[b][3]) : "memory");
  }
#else
  __trap();  // the host asks for it on Hopper only
#endif
}

// more than one batch a warp: batch after batch
template <bool WIDE>
__device__ __forceinline__ void stage_x_rows(uint4* xs, const unsigned short* __restrict__ x, int N, int K,
                                             long long sxn, int n0, int k0, int warp, int lane) {
  for (int u0 = warp; u0 < X_UNITS; u0 += WARPS * X_BATCH) {
    XBatch v;
    load_x_batch(v, u0, WIDE, x, N, K, sxn, n0, k0, lane);
    store_x_batch(v, u0, WIDE, xs, lane);
  }
}

// the arrival counter's add, releasing this CTA's writes and acquiring the earlier arrivals'
__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// 1024 threads' worth of registers per SM (64 each; 72-80 for 12, 24, 28 warps): the weight
// stream needs warps in flight
// (ncu, v3: 128 registers left 25% occupancy and the DRAM at 39% of peak)
extern "C" __global__ void CSR_CLUSTER __launch_bounds__(THREADS, 1024 / THREADS) spmm_csr_smem(
    const uint4* __restrict__ words, const int* __restrict__ offsets, const int* __restrict__ rows,
    const unsigned short* __restrict__ x, void* out, const void* bias, const void* residual,
    float* __restrict__ ws, int* __restrict__ counters, int M, int N, int K, int groups, int slices,
    long long sxn, long long sxk, int x_rows, int son, int som, int srn, int srm, int out_code, int bias_code,
    int res_code, int act, float scale) {
  extern __shared__ uint4 xs[];  // NB planes of PS rows of 8 tokens (16 bytes); the KW sums (KW > 1);
                                 // the slice's sums for the cluster (CK > 1); the CTA's output rows
                                 // (ROWS_COPY)
  __shared__ int is_last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q = lane / QLANES;                    // which of the row's chunks: q, q + QS, ...
  const int t = lane % QLANES / TEAM, h = lane % TEAM;  // row of the warp's group, which TPL tokens
  const int s = blockIdx.y, k0 = s * KS, n0 = blockIdx.z * NT;
  const int wg = warp / KW, kw = warp % KW;
  const int g0 = grid_warp_row(wg) * GPW;  // the warp's first group
  const int gn = max(0, min(GPW, groups - g0));  // and how many (maybe none)

  XBatch xv;  // with one batch a warp, x's loads fly while the offsets come (they do not need them)
  if (X_ONE_BATCH && x_rows) load_x_batch(xv, warp, x_rows == 2, x, N, K, sxn, n0, k0, lane);
  int row_regs[ROWS_PER_THREAD];  // and the CTA's output rows (ROWS_COPY)
#pragma unroll
  for (int j = 0; j < ROWS_PER_THREAD; ++j) {
    const int local = tid + j * THREADS;
    row_regs[j] = -1;
    if (ROWS_COPY && local < TEAM_ROWS) {
      const int team_row = grid_team_row(local);
      if (team_row < groups * R) row_regs[j] = rows[team_row];
    }
  }

  // lane i holds where group g0 + i starts (lane gn: where the last one ends), in 16-byte chunks
  // of this warp's stream
  int start = 0;
  if (gn > 0 && lane <= gn) start = offsets[s * groups + g0 + lane] / 4;
  const int base = __shfl_sync(0xffffffffu, start, 0);
  const int total = gn > 0 ? (__shfl_sync(0xffffffffu, start, gn) - base) / (R * QS) : 0;  // steps
  float* sums = reinterpret_cast<float*>(xs + NB * PS);  // KW > 1: [warp][i][lane]
  float* red = sums + (KW > 1 ? WARPS * TPL * 32 : 0);
  int* rows_copy = reinterpret_cast<int*>(red + (CK > 1 ? TEAM_ROWS * NT : 0));
#pragma unroll
  for (int j = 0; j < ROWS_PER_THREAD; ++j) {  // (here: their registers free before the stream's)
    if (ROWS_COPY && tid + j * THREADS < TEAM_ROWS) rows_copy[tid + j * THREADS] = row_regs[j];
  }
  const int* row_map = ROWS_COPY ? rows_copy : rows;  // read through row_of, after the CTA barrier

  const uint4* wp = words + base + q * R + t;
  constexpr int STEP = QS * R;  // 16-byte chunks per step of the warp
  const uint4 zero = make_uint4(0, 0, 0, 0);
  int c = kw;  // this warp's steps: kw, kw + KW, ...; DEPTH loads stay in flight, across groups

  // stage x[n0 : n0 + NT, k0 : k0 + KS] as planes of rows of 8 tokens; zeros past N and K, and in
  // each plane's rows past KS (generic strides: items unrolled two at a time)
  if (x_rows) {  // the host sets it on Hopper only: 2 where x's rows are 16-byte aligned
    if (X_ONE_BATCH) store_x_batch(xv, warp, x_rows == 2, xs, lane);
    else if (x_rows == 2) stage_x_rows<true>(xs, x, N, K, sxn, n0, k0, warp, lane);
    else stage_x_rows<false>(xs, x, N, K, sxn, n0, k0, warp, lane);
    for (int item = tid; item < NB * (PS - KS); item += THREADS) xs[item / (PS - KS) * PS + KS + item % (PS - KS)] = zero;
  } else {
#pragma unroll 2
    for (int item = tid; item < NB * PS; item += THREADS) {
      const int k = item % PS, tb = item / PS;  // consecutive lanes: consecutive 16-byte vectors
      const int kk = k0 + k;
      unsigned short v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int n = n0 + tb * 8 + i;
        v[i] = (k < KS && kk < K && n < N) ? x[n * sxn + kk * sxk] : static_cast<unsigned short>(0);
      }
      xs[item] = pack8(v);
    }
  }
  __syncthreads();
  // the stream's first loads only now: x's lines, which every CTA needs first, then do not queue
  // at the DRAM behind them (LOG, session 38: -1 to -4%)
  uint4 buf[DEPTH];
#pragma unroll
  for (int j = 0; j < DEPTH; ++j) buf[j] = c + j * KW < total ? load_stream(wp + (c + j * KW) * STEP) : zero;

  const spartune::Epilogue ep{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const long long tile_rows = static_cast<long long>(groups) * R;
  const Partials part{ws, red, tile_rows, static_cast<long long>(blockIdx.z) * slices * tile_rows, s, slices};
  float acc[TPL];
#pragma unroll
  for (int i = 0; i < TPL; ++i) acc[i] = 0.f;
  const uint4* xs_lane = xs + h * LP * PS;
  // with KW > 1 every warp runs GPW rounds (the CTA meets in shared memory after each)
  for (int gi = 0; gi < (KW > 1 ? GPW : gn); ++gi) {
    const int end = (__shfl_sync(0xffffffffu, start, min(gi + 1, gn)) - base) / (R * QS);
    // DEPTH steps a round, each register reloaded once its chunk is used (no moves rotating them)
    for (; c + (DEPTH - 1) * KW < end; c += DEPTH * KW) {
#pragma unroll
      for (int j = 0; j < DEPTH; ++j) {
        fma_chunk(acc, buf[j], xs_lane);
        buf[j] = c + (DEPTH + j) * KW < total ? load_stream(wp + (c + (DEPTH + j) * KW) * STEP) : zero;
      }
    }
    for (; c < end; c += KW) {  // the group's last steps, the registers back in order
      const uint4 next = c + DEPTH * KW < total ? load_stream(wp + (c + DEPTH * KW) * STEP) : zero;
      fma_chunk(acc, buf[0], xs_lane);
#pragma unroll
      for (int j = 0; j + 1 < DEPTH; ++j) buf[j] = buf[j + 1];
      buf[DEPTH - 1] = next;
    }
#pragma unroll
    for (int i = 0; i < TPL; ++i) {  // the row's K parts meet in lane q = 0
      if (QS >= 2) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], QLANES);
      if (QS >= 4) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2 * QLANES);
    }
    if (KW == 1) {
      if (q == 0) finish(acc, (g0 + gi) * R + t, (wg * GPW + gi) * R + t, h, n0, row_map, ep, part);
    } else {
#pragma unroll
      for (int i = 0; i < TPL; ++i) sums[(warp * TPL + i) * 32 + lane] = acc[i];
      __syncthreads();
      // each (warp row, lane of q = 0, token) sums its KW warps' parts in order
      for (int o = tid; o < WG * QLANES * TPL; o += THREADS) {
        const int w0 = o / (QLANES * TPL), i = o / QLANES % TPL, l = o % QLANES;
        const int g = grid_warp_row(w0) * GPW + gi;
        if (g >= groups) continue;
        float v = 0.f;
#pragma unroll 8
        for (int j = 0; j < KW; ++j) v += sums[((w0 * KW + j) * TPL + i) * 32 + l];
        emit(v, g * R + l / TEAM, (w0 * GPW + gi) * R + l / TEAM, (l % TEAM) * TPL + i, n0, row_map, ep, part);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TPL; ++i) acc[i] = 0.f;
  }
#if CK > 1
  // the cluster's slices meet: CTA `rank` sums every CK-th vector over the CTAs' shared memory
  if (gridDim.y != CK) __trap();  // the host launches exactly CK slices (a cluster) per row block
  __syncwarp();
  spartune::cluster_sync();  // every slice's sums written (release / acquire)
  const float4* red4 = reinterpret_cast<const float4*>(red);
  sum_slices<CK>(CK, spartune::cluster_rank() * THREADS + tid, CK * THREADS, row_map, groups, n0, ep,
                 [&](int, int v, int j) { return spartune::load_peer_f4(red4 + v, j); });
  __syncwarp();  // (the loop's lanes may have left it apart: the barrier is .aligned)
  spartune::cluster_sync();  // no CTA leaves while a peer may still read its sums
  return;
#endif
  if (slices == 1) return;

  // split K: the last CTA of this row block and token tile sums the slices' partials, every thread.
  // The CTA barrier orders every thread's partials before thread 0's arrival, whose release (gpu
  // scope, cumulative) publishes them and whose acquire sees the other slices' (the pattern of
  // CUTLASS's split-K semaphore: no fence in every thread)
  __syncthreads();
  int* counter = counters + blockIdx.z * gridDim.x + blockIdx.x;
  if (tid == 0) is_last = arrive_acq_rel(counter) == slices - 1;
  __syncthreads();
  if (!is_last) return;
  const float4* ws4 = reinterpret_cast<const float4*>(ws) + part.base * (NT / 4);
  const long long slice_vectors = tile_rows * (NT / 4);
  sum_slices<8>(slices, tid, THREADS, row_map, groups, n0, ep, [&](int team_row, int v, int j) {
    return __ldcg(ws4 + j * slice_vectors + team_row * (NT / 4) + v % (NT / 4));
  });
  if (tid == 0) *counter = 0;
}
