// csr_mma, warp-specialised (experiment, session 32): the tiles and the split of spmm_csr_mma.cu,
// with no CTA barrier per unit. Warp 0 copies each unit's words (one bulk copy) and x's 64 columns
// (cp.async) into a ring of STAGES stages (full / empty mbarriers); FILL_W warps scatter a unit's
// words into one of three dense tiles (dense_full / dense_free mbarriers); MMA_W warps multiply the
// dense tile by x (ldmatrix + mma.m16n8k16) and zero the rows they read.
//   SPARTUNE_BF16, BR, NT, STAGES, FILL_W, MMA_W, SPARTUNE_ACT
#include "epilogue.cuh"
#include "wgmma_sp.cuh"  // mbarriers, bulk copies

#if !defined(BR) || !defined(NT) || !defined(STAGES) || !defined(FILL_W) || !defined(MMA_W)
#error "spmm_csr_mma_ws.cu needs BR, NT, STAGES, FILL_W and MMA_W"
#endif

constexpr int TK = 64;
constexpr int PITCH = TK + 8;
constexpr int THREADS = 32 * (1 + FILL_W + MMA_W);
constexpr int WM = BR / 16 / MMA_W;
constexpr int WN = NT / 8;
constexpr int DENSE_BYTES = BR * PITCH * 2;
constexpr int X_BYTES = NT * PITCH * 2;
static_assert(BR % 16 == 0 && BR <= 1024 && WM >= 1 && WM * 16 * MMA_W == BR, "MMA_W warps tile BR rows");
static_assert(NT % 8 == 0 && STAGES >= 2, "NT a multiple of 8, two stages at least");

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

__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// Arguments as spmm_csr_mma's. Dynamic shared memory: 3 dense tiles, STAGES x (x's NT rows, wcap
// words), the CTA's run starts (max_units + 1), then the mbarriers.
extern "C" __global__ void __launch_bounds__(THREADS) spmm_csr_mma_ws(
    const int4* __restrict__ words, const int* __restrict__ ptr, const int* __restrict__ bounds,
    const int2* __restrict__ row_split, const unsigned short* __restrict__ x, void* __restrict__ out,
    const void* __restrict__ bias, const void* __restrict__ residual, float* __restrict__ ws,
    int* __restrict__ counters, int M, int N, int K, int k_tiles, int row_tiles, int sxn, int wcap, int max_units,
    int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int is_last;
  const int u_begin = bounds[blockIdx.x], units = bounds[blockIdx.x + 1] - u_begin;
  if (units <= 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.y * NT;
  const int stage_bytes = X_BYTES + wcap * 4;
  unsigned char* stages = smem + 3 * DENSE_BYTES;
  int* run_start = reinterpret_cast<int*>(stages + STAGES * stage_bytes);
  unsigned long long* bars =
      reinterpret_cast<unsigned long long*>(smem + ((3 * DENSE_BYTES + STAGES * stage_bytes + 4 * (max_units + 1) + 7) & ~7));
  unsigned long long* full = bars;                 // stage s landed: 32 cp.async arrivals + the bulk copy's
  unsigned long long* empty = bars + STAGES;       // stage s read by every fill and mma thread
  unsigned long long* dense_full = bars + 2 * STAGES;      // dense tile d scattered (fill threads)
  unsigned long long* dense_free = bars + 2 * STAGES + 3;  // dense tile d multiplied and zeroed (mma threads)
  auto dense = [&](int i) { return reinterpret_cast<unsigned short*>(smem + (i % 3) * DENSE_BYTES); };
  auto stage = [&](int i) { return stages + (i % STAGES) * stage_bytes; };

  for (int q = tid; q < 3 * DENSE_BYTES / 16; q += THREADS) reinterpret_cast<int4*>(smem)[q] = make_int4(0, 0, 0, 0);
  for (int q = tid; q <= units; q += THREADS) run_start[q] = ptr[u_begin + q];
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      spartune::mbar_init(&full[s], 33);
      spartune::mbar_init(&empty[s], 32 * (FILL_W + MMA_W));
    }
    for (int d = 0; d < 3; ++d) {
      spartune::mbar_init(&dense_full[d], 32 * FILL_W);
      spartune::mbar_init(&dense_free[d], 32 * MMA_W);
    }
  }
  __syncthreads();

  const spartune::Epilogue epi{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane >> 2, t = lane & 3;

  if (warp == 0) {  // the producer
    for (int i = 0; i < units; ++i) {
      if (i >= STAGES) spartune::mbar_wait(&empty[i % STAGES], (i / STAGES - 1) & 1);
      unsigned char* st = stage(i);
      const int u = u_begin + i, k0 = (u % k_tiles) * TK;
      unsigned short* xs = reinterpret_cast<unsigned short*>(st);
      for (int v = lane; v < NT * (TK / 8); v += 32) {
        const int n = v / (TK / 8), k = k0 + (v % (TK / 8)) * 8;
        const bool in = n0 + n < N && k < K;
        spartune::cp_async16_zfill(xs + n * PITCH + (v % (TK / 8)) * 8, in ? x + (long long)(n0 + n) * sxn + k : x,
                                   in ? min(16, 2 * (K - k)) : 0);
      }
      spartune::cp_async_mbar_arrive(&full[i % STAGES]);
      if (lane == 0) {
        const unsigned bytes = 4u * (run_start[i + 1] - run_start[i]);
        spartune::mbar_arrive_expect_tx(&full[i % STAGES], bytes);
        if (bytes) spartune::bulk_copy(st + X_BYTES, words + run_start[i] / 4, bytes, &full[i % STAGES]);
      }
    }
  } else if (warp <= FILL_W) {  // scatter
    const int f = tid - 32;
    for (int i = 0; i < units; ++i) {
      spartune::mbar_wait(&full[i % STAGES], (i / STAGES) & 1);
      if (i >= 3) spartune::mbar_wait(&dense_free[i % 3], (i / 3 - 1) & 1);
      const int4* w4 = reinterpret_cast<const int4*>(stage(i) + X_BYTES);
      unsigned short* d = dense(i);
      const int n4 = (run_start[i + 1] - run_start[i]) / 4;
      for (int q = f; q < n4; q += 32 * FILL_W) {
        const int4 w = w4[q];
        const unsigned ws4[4] = {static_cast<unsigned>(w.x), static_cast<unsigned>(w.y), static_cast<unsigned>(w.z),
                                 static_cast<unsigned>(w.w)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const unsigned pos = ws4[e] >> 16;
          d[(pos >> 6) * PITCH + (pos & 63)] = static_cast<unsigned short>(ws4[e] & 0xffffu);
        }
      }
      spartune::mbar_arrive(&dense_full[i % 3]);
      spartune::mbar_arrive(&empty[i % STAGES]);
    }
  } else {  // multiply, zero the rows read, settle each row tile
    const int mw = warp - 1 - FILL_W;
    float acc[WM][WN][4];
    auto clear = [&]() {
#pragma unroll
      for (int r = 0; r < WM; ++r)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;
    };
    clear();
    int2 split_next = row_split[u_begin / k_tiles];
    for (int i = 0; i < units; ++i) {
      spartune::mbar_wait(&full[i % STAGES], (i / STAGES) & 1);
      spartune::mbar_wait(&dense_full[i % 3], (i / 3) & 1);
      unsigned short* d = dense(i);
      const unsigned short* xs = reinterpret_cast<const unsigned short*>(stage(i));
      if (run_start[i + 1] > run_start[i]) {
#pragma unroll
        for (int kp = 0; kp < TK / 32; ++kp) {
          unsigned b[WN][4];
#pragma unroll
          for (int j = 0; j < WN; ++j) ldmatrix_x4(b[j], xs + (j * 8 + (lane & 7)) * PITCH + kp * 32 + (lane >> 3) * 8);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < WM; ++r) {
              unsigned a[4];
              const int row = (mw * WM + r) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
              ldmatrix_x4(a, d + row * PITCH + (kp * 2 + h) * 16 + (lane >> 4) * 8);
#pragma unroll
              for (int j = 0; j < WN; ++j) mma_m16n8k16(acc[r][j], a, b[j][2 * h], b[j][2 * h + 1]);
            }
        }
        __syncwarp();  // every lane's reads of the rows before any lane zeroes them
        int4* rows = reinterpret_cast<int4*>(d + mw * WM * 16 * PITCH);
        for (int q = lane; q < WM * 16 * PITCH * 2 / 16; q += 32) rows[q] = make_int4(0, 0, 0, 0);
      }
      spartune::mbar_arrive(&dense_free[i % 3]);
      spartune::mbar_arrive(&empty[i % STAGES]);
      const int u = u_begin + i, rt = u / k_tiles;
      if (i + 1 == units || (u + 1) / k_tiles != rt) {  // row tile rt's sums: stored, or this CTA's partial
        const int2 split = split_next;
        if (rt + 1 < row_tiles) split_next = row_split[rt + 1];
        const int row0 = rt * BR;
        float* mine = ws + ((long long)blockIdx.y * (gridDim.x + row_tiles) + blockIdx.x + rt) * (BR * NT);
#pragma unroll
        for (int r = 0; r < WM; ++r)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int row = (mw * WM + r) * 16 + g + 8 * hh, m = row0 + row;
#pragma unroll
            for (int j = 0; j < WN; ++j) {
              if (split.y > 1) {
                *reinterpret_cast<float2*>(mine + row * NT + j * 8 + 2 * t) =
                    make_float2(acc[r][j][2 * hh], acc[r][j][2 * hh + 1]);
              } else if (m < M) {
                const float b_m = epi.bias_of(m);
#pragma unroll
                for (int e = 0; e < 2; ++e) epi.store(m, n0 + j * 8 + 2 * t + e, acc[r][j][2 * hh + e], b_m);
              }
            }
          }
        clear();
      }
    }
  }

  // the shared row tiles (the run's first and last only): arrival, and the last CTA's sum in CTA order
  const int rts[2] = {u_begin / k_tiles, (u_begin + units - 1) / k_tiles};
  for (int q = 0; q < (rts[1] != rts[0] ? 2 : 1); ++q) {
    const int rt = rts[q];
    const int2 split = row_split[rt];
    if (split.y == 1) continue;
    __syncthreads();  // every thread's partials (and is_last's last read) before the arrival
    int* counter = counters + blockIdx.y * row_tiles + rt;
    if (tid == 0) is_last = arrive_acq_rel(counter) == split.y - 1;
    __syncthreads();
    if (!is_last) continue;
    const long long slot_floats = (long long)BR * NT;
    const int row0 = rt * BR;
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
          part[c][p] = c0 + c < split.y && v < V4 ? __ldcg(first + (long long)(c0 + c) * V4 + v)
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
  }
}
