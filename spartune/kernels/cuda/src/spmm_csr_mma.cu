// Unstructured (CSR) SpMM for 8-32 tokens on the tensor cores, "load as sparse, compute as dense"
// (Flash-LLM), linear layout with the fused epilogue: out (N, M) = act(scale * x (N, K) @ A^T + bias)
// + residual.
// The weight streams once as tiles of BR rows x 64 columns (kernels/_tiled_csr.py: each nonzero a
// 32-bit word, position in the tile << 16 | value bits, a tile's words one 16-byte aligned run).
// Units are tiles in (row tile, K tile) order; CTA c takes units bounds[c] .. bounds[c + 1] - 1,
// cut by the host so that every CTA streams about the same bytes (stream-K: a CTA's run may end or
// start inside a row tile). Per unit, a ring of STAGES shared-memory stages receives the tile's
// words and x's 64 columns for NT tokens by cp.async; then, one CTA barrier a unit:
//   - every thread scatters its share of the next unit's words into a zeroed dense tile
//     (three dense tiles rotate: scattered, multiplied, zeroed again),
//   - every warp multiplies this unit's dense tile (ldmatrix) by x (ldmatrix) with mma.m16n8k16
//     into fp32 accumulators: its WM 16-row slices x WN 8-token slices,
//   - every thread zeroes its share of the previous unit's dense tile.
// A row tile that one CTA covers whole is stored through the epilogue; else each of its CTAs
// leaves its fp32 partial in its own slot of `ws` and the last to arrive (an arrival counter, left
// at zero again) sums the slots in CTA order (deterministic) and applies the epilogue.
//   SPARTUNE_BF16  0: fp16 weight and x, 1: bf16
//   BR             rows per tile (a multiple of 16, at most 1024)
//   NT             tokens per CTA: 8, 16 or 32 (more tokens: grid y)
//   WARPS, WARPS_N warps per CTA, of them splitting the tokens
//   STAGES         the ring's stages (>= 3)
//   SPARTUNE_ACT   the epilogue's activation code (epilogue.cuh), fixed per instance
#include "epilogue.cuh"

#if !defined(SPARTUNE_BF16) || !defined(BR) || !defined(NT) || !defined(WARPS) || !defined(STAGES)
#error "spmm_csr_mma.cu needs SPARTUNE_BF16, BR, NT, WARPS and STAGES"
#endif
#ifndef WARPS_N
#define WARPS_N 1
#endif
#ifndef ROLES
#define ROLES 0  // 1: the first half of the warps multiply, the second half scatter and zero
#endif
#ifndef ABLATE
#define ABLATE 0  // probes only (wrong results): 1 no scatter or zeroing, 2 no multiply, 4 no x copies,
                  // 8 no word copies, 16 no flush, 32 no flush (sums kept alive)
#endif

constexpr int TK = 64;                         // columns per tile
constexpr int PITCH = TK + 8;                  // halves per shared row: 144 bytes, 8 rows on 8 bank groups
constexpr int THREADS = 32 * WARPS;
constexpr int MMA_WARPS = ROLES ? WARPS / 2 : WARPS;  // the warps that multiply
constexpr int FILL_LO = ROLES ? MMA_WARPS * 32 : 0;      // the threads that scatter and zero: FILL_LO ..
constexpr int FILL_THREADS = THREADS - FILL_LO;
constexpr int WARPS_M = MMA_WARPS / WARPS_N;
constexpr int WM = BR / 16 / WARPS_M;          // 16-row slices per warp
constexpr int WN = NT / 8 / WARPS_N;           // 8-token slices per warp
constexpr int DENSE_BYTES = BR * PITCH * 2;    // one dense tile
constexpr int X_BYTES = NT * PITCH * 2;        // one stage's x: NT rows of 64 columns
static_assert(BR % 16 == 0 && BR <= 1024, "BR: a multiple of 16, at most 1024 (positions in 16 bits)");
static_assert(NT % 8 == 0 && MMA_WARPS % WARPS_N == 0, "NT a multiple of 8, WARPS_N dividing WARPS");
static_assert(WM >= 1 && WM * 16 * WARPS_M == BR && WN >= 1 && WN * 8 * WARPS_N == NT, "warps must tile BR x NT");
static_assert(STAGES >= 3, "the ring needs 3 stages: one landing, one scattered, one multiplied");

__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if SPARTUNE_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the arrival counter's add, releasing this CTA's partials and acquiring the earlier arrivals'
__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// words: the tiles' runs (16-byte aligned); ptr: (tiles + 1) run starts in words; bounds: (grid x
// + 1) units; row_split: per row tile (its first CTA, its CTAs); x: (N, K) rows 16-byte aligned at
// pitch sxn (a multiple of 8); ws: fp32 partials, slot (blockIdx.x + row tile) of BR x NT per
// token tile; counters: one per (token tile, row tile). Dynamic shared memory:
// 3 dense tiles, then STAGES x (x's NT rows, wcap words), then the CTA's run starts (max_units + 1).
extern "C" __global__ void __launch_bounds__(THREADS) spmm_csr_mma(
    const int4* __restrict__ words, const int* __restrict__ ptr, const int* __restrict__ bounds,
    const int2* __restrict__ row_split, const unsigned short* __restrict__ x, void* __restrict__ out,
    const void* __restrict__ bias, const void* __restrict__ residual, float* __restrict__ ws,
    int* __restrict__ counters, int M, int N, int K, int k_tiles, int row_tiles, int sxn, int wcap, int max_units,
    int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int stage_words[STAGES];
  __shared__ int is_last;
  const int u_begin = bounds[blockIdx.x], units = bounds[blockIdx.x + 1] - u_begin;
  if (units <= 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  const int n0 = blockIdx.y * NT;
  const int stage_bytes = X_BYTES + wcap * 4;
  int2 split_next = row_split[u_begin / k_tiles];  // the first row tile's split, read ahead of its flush
  auto dense = [&](int i) { return reinterpret_cast<unsigned short*>(smem + (i % 3) * DENSE_BYTES); };
  auto stage = [&](int i) { return smem + 3 * DENSE_BYTES + (i % STAGES) * stage_bytes; };

  // the three dense tiles start zero
  for (int q = tid; q < 3 * DENSE_BYTES / 16; q += THREADS) reinterpret_cast<int4*>(smem)[q] = make_int4(0, 0, 0, 0);

  // the CTA's run starts, read once into shared memory: read from global memory one issue ahead,
  // each issue waited on an L2 round trip (LOG, csr_mma v1)
  int* run_start = reinterpret_cast<int*>(smem + 3 * DENSE_BYTES + STAGES * stage_bytes);
  for (int q = tid; q <= units; q += THREADS) run_start[q] = ptr[u_begin + q];
  __syncthreads();
  // unit i's copies: its words, x's columns of its K tile for the CTA's tokens
  auto issue = [&](int i) {
    const int p_lo = run_start[i], p_hi = run_start[i + 1];
    unsigned char* st = stage(i);
    const int u = u_begin + i, k0 = (u % k_tiles) * TK;
    unsigned short* xs = reinterpret_cast<unsigned short*>(st);
    for (int v = tid; v < ((ABLATE & 4) ? 0 : NT * (TK / 8)); v += THREADS) {
      const int n = v / (TK / 8), k = k0 + (v % (TK / 8)) * 8;
      const bool in = n0 + n < N && k < K;
      cp_async16(xs + n * PITCH + (v % (TK / 8)) * 8, in ? x + (long long)(n0 + n) * sxn + k : x,
                 in ? min(16, 2 * (K - k)) : 0);
    }
    const int4* src = words + p_lo / 4;
    int4* dst = reinterpret_cast<int4*>(st + X_BYTES);
    for (int q = tid; q < ((ABLATE & 8) ? 0 : (p_hi - p_lo) / 4); q += THREADS) cp_async16(dst + q, src + q, 16);
    if (tid == 0) stage_words[i % STAGES] = p_hi - p_lo;
  };
  // every thread's share of unit i's words into dense tile i
  auto scatter = [&](int i) {
    const int4* w4 = reinterpret_cast<const int4*>(stage(i) + X_BYTES);
    unsigned short* d = dense(i);
    const int n4 = stage_words[i % STAGES] / 4;
    if (tid < FILL_LO) return;
    for (int q = tid - FILL_LO; q < n4; q += FILL_THREADS) {
      const int4 w = w4[q];
      const unsigned ws4[4] = {static_cast<unsigned>(w.x), static_cast<unsigned>(w.y), static_cast<unsigned>(w.z),
                               static_cast<unsigned>(w.w)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const unsigned pos = ws4[e] >> 16;
        d[(pos >> 6) * PITCH + (pos & 63)] = static_cast<unsigned short>(ws4[e] & 0xffffu);
      }
    }
  };

  float acc[WM][WN][4];
  auto clear = [&]() {
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int j = 0; j < WN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  };
  clear();
  auto multiply = [&](int i) {
    const unsigned short* d = dense(i);
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(stage(i));
#pragma unroll
    for (int kp = 0; kp < TK / 32; ++kp) {  // pairs of 16-wide K steps
      unsigned b[WN][4];  // token slice j: (k 0-7, 8-15) of step 2kp, then of step 2kp + 1
#pragma unroll
      for (int j = 0; j < WN; ++j)
        ldmatrix_x4(b[j], xs + ((warp_n * WN + j) * 8 + (lane & 7)) * PITCH + kp * 32 + (lane >> 3) * 8);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < WM; ++r) {
          unsigned a[4];  // rows 0-7 / 8-15 x k 0-7 / 8-15 of the 16 x 16 step
          const int row = (warp_m * WM + r) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(a, d + row * PITCH + (kp * 2 + h) * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int j = 0; j < WN; ++j) mma_m16n8k16(acc[r][j], a, b[j][2 * h], b[j][2 * h + 1]);
        }
    }
  };
  auto zero = [&](int i) {
    int4* d = reinterpret_cast<int4*>(dense(i));
    if (tid < FILL_LO) return;
    for (int q = tid - FILL_LO; q < DENSE_BYTES / 16; q += FILL_THREADS) d[q] = make_int4(0, 0, 0, 0);
  };

  const spartune::Epilogue epi{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane >> 2, t = lane & 3;
  // the row tile rt's sums: stored, or this CTA's partial into its slot and the last CTA's sum
  // row tile rt's sums, once its last unit of this CTA is multiplied: stored, where this CTA owns
  // the row tile; else this CTA's partial into its slot, summed at the end of the CTA (`finish`).
  // Only the first and the last row tile of a CTA's run can be shared.
  int pend_rt[2];
  int2 pend_split[2];
  int pending = 0;
  auto settle = [&](int rt) {
    const int2 split = split_next;  // (first CTA, CTAs)
    if (rt + 1 < row_tiles) split_next = row_split[rt + 1];
    const int row0 = rt * BR;
    if (split.y == 1) {
      if (warp >= MMA_WARPS) return;
#pragma unroll
      for (int r = 0; r < WM; ++r)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int m = row0 + (warp_m * WM + r) * 16 + g + 8 * hh;
          if (m >= M) continue;
          const float b_m = epi.bias_of(m);
#pragma unroll
          for (int j = 0; j < WN; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) epi.store(m, n0 + (warp_n * WN + j) * 8 + 2 * t + e, acc[r][j][2 * hh + e], b_m);
        }
      return;
    }
    float* mine = ws + ((long long)blockIdx.y * (gridDim.x + row_tiles) + blockIdx.x + rt) * (BR * NT);
#pragma unroll
    for (int r = 0; r < (warp < MMA_WARPS ? WM : 0); ++r)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = (warp_m * WM + r) * 16 + g + 8 * hh;
#pragma unroll
        for (int j = 0; j < WN; ++j)
          *reinterpret_cast<float2*>(mine + row * NT + (warp_n * WN + j) * 8 + 2 * t) =
              make_float2(acc[r][j][2 * hh], acc[r][j][2 * hh + 1]);
      }
    pend_rt[pending] = rt;
    pend_split[pending] = split;
    ++pending;
  };
  // a shared row tile's arrival, and the last CTA's sum of the slots. At the end of the CTA only:
  // the arrival's release waits for the CTA's writes, and mid-run it drained the ring's copies too
  // (half of the time at every shape: LOG, csr_mma v2)
  auto finish = [&](int rt, int2 split) {
    const long long slot_floats = (long long)BR * NT;
    const int row0 = rt * BR;
    int* counter = counters + blockIdx.y * row_tiles + rt;
    if (tid == 0) is_last = arrive_acq_rel(counter) == split.y - 1;
    __syncthreads();
    if (!is_last) return;
    // the slots summed in CTA order, 4 tokens a thread and load, every load of 4 slots in flight
    // at once (a load a slot and element, one after another, cost ~18 us of 7B up's 43: LOG, v1)
    const float4* first = reinterpret_cast<const float4*>(
        ws + ((long long)blockIdx.y * (gridDim.x + row_tiles) + split.x + rt) * slot_floats);
    constexpr int V4 = BR * NT / 4, PER = (V4 + THREADS - 1) / THREADS;
    float4 sum[PER];
#pragma unroll
    for (int p = 0; p < PER; ++p) sum[p] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int c0 = 0; c0 < split.y; c0 += 4) {
      float4 part[4][PER];
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int p = 0; p < PER; ++p) {
          const int v = tid + p * THREADS;
          part[c][p] = c0 + c < split.y && v < V4 ? __ldcg(first + (long long)(c0 + c) * (V4) + v)
                                                  : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int p = 0; p < PER; ++p)
          sum[p] = make_float4(sum[p].x + part[c][p].x, sum[p].y + part[c][p].y, sum[p].z + part[c][p].z,
                               sum[p].w + part[c][p].w);
    }
#pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int v = tid + p * THREADS, m = row0 + v * 4 / NT, n = n0 + v * 4 % NT;
      if (v >= V4 || m >= M) continue;
      const float b_m = epi.bias_of(m);
      epi.store(m, n, sum[p].x, b_m);
      epi.store(m, n + 1, sum[p].y, b_m);
      epi.store(m, n + 2, sum[p].z, b_m);
      epi.store(m, n + 3, sum[p].w, b_m);
    }
    if (tid == 0) *counter = 0;
  };

  // the ring: units 0 .. STAGES - 2 in flight, unit 0 scattered before the loop
#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < units) issue(p);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();  // unit 0 landed (every thread's copies); the dense tiles zero
  if (!(ABLATE & 1)) scatter(0);
  for (int i = 0; i < units; ++i) {
    cp_async_wait<STAGES - 3>();  // unit i + 1 landed (this thread's copies) ...
    __syncthreads();              // ... everyone's; unit i scattered; unit i - 1 multiplied and its stage free
    if (i + STAGES - 1 < units) issue(i + STAGES - 1);
    cp_async_commit();
    if (!(ABLATE & 2) && warp < MMA_WARPS && stage_words[i % STAGES] > 0) multiply(i);
    if (!(ABLATE & 1) && i + 1 < units) scatter(i + 1);
    if (!(ABLATE & 1) && i > 0) zero(i - 1);
    const int u = u_begin + i, rt = u / k_tiles;
    if (i + 1 == units || (u + 1) / k_tiles != rt) {
      if (ABLATE & 32) {  // the sums kept alive, nothing stored (a probe of settle's cost)
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < WM; ++r)
#pragma unroll
          for (int j = 0; j < WN; ++j) s += acc[r][j][0] + acc[r][j][1] + acc[r][j][2] + acc[r][j][3];
        if (s == 1.2345e-30f) ws[0] = s;
      } else if (!(ABLATE & 16)) {
        settle(rt);
      }
      clear();
    }
  }
  cp_async_wait<0>();
  if (pending) {
    // the barrier orders every thread's partials before thread 0's arrival, whose release publishes
    // them and whose acquire sees the earlier CTAs' (CUTLASS's split-K semaphore)
    __syncthreads();
    finish(pend_rt[0], pend_split[0]);
    if (pending > 1) {
      __syncthreads();  // (is_last is read again)
      finish(pend_rt[1], pend_split[1]);
    }
  }
}
