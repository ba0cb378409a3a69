// Probe (session 25, off main): ways to stage x[n0 : n0 + 8, k0 : k0 + KS] (fp16) into shared memory
// as rows of 8 tokens, timed per CTA by globaltimer, with or without the weight stream's first loads
// in flight. MODE 0: csr_smem's loads through registers + stmatrix.trans; 1: cp.async of raw rows into
// a padded scratch + ldmatrix / stmatrix.trans; 2: one bulk copy (TMA) per token row + the same
// transpose; 3: 2 with each row multicast over a cluster of CL CTAs. ROTATE: each CTA starts at another
// column (spreads the same lines' requests over L2 slices).
#define SPARTUNE_BF16 0
#include "wgmma_sp.cuh"

#ifndef CL
#define CL 1
#endif
#if MODE == 3
#define PROBE_CLUSTER __cluster_dims__(CL, 1, 1)
#else
#define PROBE_CLUSTER
#endif
constexpr int NT = 8, THREADS = WARPS * 32, PS = KS + 8;
constexpr int RP = KS * 2 + 16;  // raw row pitch in bytes

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

extern "C" __global__ void PROBE_CLUSTER __launch_bounds__(THREADS, 1) stage_probe(
    const unsigned short* __restrict__ x, long long cta_stride, const uint4* __restrict__ stream,
    long long stream_per_cta, unsigned long long* times, uint4* dump, unsigned* sink, long long sxn) {
  extern __shared__ uint4 xs[];  // PS rows of 8 tokens, then the raw scratch (MODE >= 1)
  __shared__ unsigned long long bar;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const unsigned long long t0 = gtime();
  uint4 a = make_uint4(0, 0, 0, 0), b = a, c = a;
  if (stream) {
    const uint4* sp = stream + blockIdx.x * stream_per_cta + tid;
    a = load_stream(sp);
    b = load_stream(sp + THREADS);
    c = load_stream(sp + 2 * THREADS);
  }
  const unsigned short* xc = x + (MODE == 3 ? blockIdx.x / CL : blockIdx.x) * cta_stride;
  const int rot = ROTATE ? (blockIdx.x * 37) % (KS / 32) : 0;  // in units of 32 columns
  constexpr int UNITS = KS / 32;
#if MODE == 0
  constexpr int PER_WARP = (UNITS + WARPS - 1) / WARPS;
  constexpr int BATCH = PER_WARP < 8 ? PER_WARP : 8;
  const int r = lane / 4, q = lane % 4, i = lane / 8, p = lane % 8;
  const int col = 8 * (p / 2) + 2 * i + p % 2;
  for (int u0 = warp; u0 < UNITS; u0 += WARPS * BATCH) {
    uint4 v[BATCH];
#pragma unroll
    for (int bb = 0; bb < BATCH; ++bb) {
      const int u = (u0 + bb * WARPS + rot) % UNITS;
      v[bb] = u0 + bb * WARPS < UNITS ? *reinterpret_cast<const uint4*>(xc + r * sxn + u * 32 + 8 * q)
                                      : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int bb = 0; bb < BATCH; ++bb) {
      if (u0 + bb * WARPS >= UNITS) break;
      const int u = (u0 + bb * WARPS + rot) % UNITS;
      const unsigned addr = spartune::smem_addr(xs + u * 32 + col);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                   :: "r"(addr), "r"(v[bb].x), "r"(v[bb].y), "r"(v[bb].z), "r"(v[bb].w) : "memory");
    }
  }
#else
  char* raw = reinterpret_cast<char*>(xs + PS);
#if MODE == 1
  constexpr int CHUNKS = NT * KS / 8;
  for (int ch = tid; ch < CHUNKS; ch += THREADS) {
    const int tok = ch / (KS / 8), kc = (ch % (KS / 8) + rot * 4) % (KS / 8);
    spartune::cp_async16(raw + tok * RP + kc * 16, xc + tok * sxn + kc * 8);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
#else
  if (tid == 0) {
    spartune::mbar_init(&bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#if MODE == 3
  spartune::cluster_sync();
#endif
  if (tid == 0) {
    spartune::mbar_arrive_expect_tx(&bar, NT * KS * 2);
#if MODE == 2
    for (int tok = 0; tok < NT; ++tok) spartune::bulk_copy(raw + tok * RP, xc + tok * sxn, KS * 2, &bar);
#else
    for (int tok = spartune::cluster_rank(); tok < NT; tok += CL)
      spartune::bulk_copy_multicast(raw + tok * RP, xc + tok * sxn, KS * 2, &bar, (1u << CL) - 1);
#endif
  }
  spartune::mbar_wait(&bar, 0);
#endif
  // transpose: unit u = 8 tokens x 32 columns; ldmatrix rows = tokens, stmatrix.trans rows = columns
  for (int u = warp; u < UNITS; u += WARPS) {
    const unsigned src = spartune::smem_addr(raw + (lane % 8) * RP + (u * 32 + 8 * (lane / 8)) * 2);
    unsigned r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(src) : "memory");
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(spartune::smem_addr(xs + u * 32 + lane)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
  }
#endif
  __syncthreads();
  const unsigned long long t1 = gtime();
  const uint4 s = xs[(tid * 7) % KS];
  const unsigned v = a.x ^ b.y ^ c.z ^ s.x ^ s.w;
  if (v == 0x9e3779b9u) sink[0] = v;
  if (blockIdx.x == 0)
    for (int k = tid; k < KS; k += THREADS) dump[k] = xs[k];
  if (tid == 0) {
    times[2 * blockIdx.x] = t0;
    times[2 * blockIdx.x + 1] = t1;
  }
#if MODE == 3
  spartune::cluster_sync();
#endif
}
