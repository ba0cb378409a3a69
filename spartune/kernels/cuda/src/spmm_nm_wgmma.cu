// 2:4 SpMM for prefill on Hopper's sparse warpgroup MMA (wgmma.mma_async.sp m64nNk32, sm_90a),
// linear layout with the fused epilogue: out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// A CTA owns BM rows of A x BN tokens and walks K in stages of 64 (one 128-byte swizzle row of x):
// - warpgroup 0 is the producer: one thread waits for a free stage, then loads the stage's x box
//   with the tensor copy engine (TMA, 128-byte swizzle, zeros past N and K) and A's values and
//   metadata with a 3-D box each (BM / 16 tiles x 2 K steps of the packing that the mma variant
//   reads too: per tile and K step the values as the tensor cores read them, the metadata in the
//   consumers' order), all completing on the stage's `full` mbarrier;
// - warpgroups 1 and 2 are the consumers, BM/2 rows each: each thread reads its metadata word
//   (mma.sp m16n8k32's layout, which wgmma.sp keeps per warp), issues the stage's wgmma.sp with A
//   and B (x) from shared memory, waits, and frees the stage (one arrival per warp).
// The producer gives registers back (setmaxnreg) so that each consumer holds BM/2 x BN f32
// accumulators. 2:4 runs persistent CTAs, one per SM, each looping over tiles: the ring of stages
// runs on across tiles (the producer fills the next tile's first stages during the epilogue), and
// a last, partial round of tiles is split in halves of K (see `segment`). With CLUSTER_M > 1 the CTAs of a cluster own adjacent row blocks of the same
// tokens: each loads 1/CLUSTER_M of the x box and multicasts it to all (x is most of what the
// CTAs read through L2), and each consumer warp frees a stage in every CTA of the cluster.
// V:N:M (GATHER > 0): A is the 2:4 matrix over each V-row block's kept columns, and x comes as
// x^T (K, tokens; row pitch ldx, a multiple of 8): a kept column is one contiguous row of tokens,
// so the whole producer warpgroup gathers a stage's 64 kept columns through col_map with 16-byte
// cp.async (zero-filled past the map and past n_alloc tokens) into wgmma's MN-major 128-byte
// swizzled layout (B transposed), completing on the stage's barrier. GATHER = 2 when a V-row
// block is half the tile (V = BM / 2): each consumer then has its own box of x.
//   SPARTUNE_BF16  0: fp16 operands, 1: bf16
//   BM, BN, STAGES  rows of A (128, 256), tokens (64, 128, 256), shared-memory stages
//   GATHER  0: 2:4 (x by TMA), 1 or 2: V:N:M, boxes of gathered x per stage
//   CLUSTER_M  1, 2 or 4 (2:4): CTAs of a cluster sharing each x box
//   SPARTUNE_ACT  the epilogue's activation code (epilogue.cuh), fixed per instance (default 0)
//   SPARTUNE_RES  1: an instance for calls with a residual (the copy engine loads it where the host
//                 says tma_res; a residual it cannot load, fp32 or misaligned, takes the threads' path
//                 in the same instance); plain calls' instances stay without this code, which cost
//                 their registers (LOG, session 29)
#ifndef SPARTUNE_ACT
#define SPARTUNE_ACT 0
#endif
#ifndef SPARTUNE_RES
#define SPARTUNE_RES 0
#endif
#include "epilogue.cuh"
#include "wgmma_sp.cuh"

#if !defined(SPARTUNE_BF16) || !defined(BM) || !defined(BN) || !defined(STAGES)
#error "spmm_nm_wgmma.cu needs SPARTUNE_BF16, BM, BN and STAGES"
#endif
#ifndef GATHER
#define GATHER 0
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1
#endif

constexpr int KS = 2;                       // 32-wide K steps (one wgmma each) per stage
constexpr int BK = 32 * KS;                 // K per stage: 64 halves, one swizzled row of x
constexpr int T = BM / 16;                  // 16-row tiles per CTA
constexpr int WM = BM / 128;                // m64 sub-tiles per consumer warpgroup
constexpr int ACC = BN / 2;                 // f32 accumulators per thread per m64 sub-tile
constexpr int BOXES = GATHER ? GATHER : 1;  // boxes of x per stage
constexpr int B_STAGE = BN * BK * 2;        // bytes of a stage's x box
constexpr int A_STAGE = KS * T * 32 * 16;   // bytes of a stage's A values (16 per lane and tile)
constexpr int E_STAGE = KS * T * 16 * 4;    // bytes of a stage's metadata (16 words per tile)
constexpr unsigned STAGE_TX = (GATHER ? 0 : B_STAGE) + A_STAGE + E_STAGE;  // bytes that land by TMA
constexpr int PIPE_BYTES = STAGES * (BOXES * B_STAGE + A_STAGE + E_STAGE);
// the gathered (MN-major) box: 8-row K groups of 64 tokens (1024 B) consecutive along K, the
// 64-token atoms BK / 8 groups apart
constexpr unsigned MN_SBO = 1024, MN_LBO = BK / 8 * 1024;
constexpr bool MN_MAJOR = GATHER;  // the gathered boxes are tokens-contiguous (B transposed)
constexpr int CHUNKS = BN / 8;              // 16-byte chunks of a gathered row of tokens
constexpr int TILE_STRIDE = BM + 4;         // floats per token row of the staged output (no bank conflicts)
constexpr int EPI_TOKENS = 4096 / BM < BN ? 4096 / BM : BN;  // output tokens staged at once (~17 KB; spmm_nm._epi_tokens)
constexpr int EPI_BYTES = EPI_TOKENS * TILE_STRIDE * 4;
// 2:4 runs persistent CTAs (a loop over tiles; the producer fills the next tile's stages during
// the epilogue, which then needs shared memory of its own); V:N:M one tile a CTA, its epilogue
// in the stages
constexpr bool PERSISTENT = GATHER == 0;
constexpr int EPI_OFFSET = PERSISTENT ? PIPE_BYTES : 0;
constexpr int SMEM_BYTES = (PERSISTENT ? PIPE_BYTES + EPI_BYTES : (PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES)) +
                           2 * STAGES * 8 + 16 + 1024;  // + barriers (the stages', the residual boxes'), alignment
// tma_out: 16-bit boxes (BM / 64 boxes of EPI_TOKENS x 128 B) in the staged output's place; with a
// residual (SPARTUNE_RES) two buffers, parts alternating: a part's residual boxes land in one while
// the previous part's finished boxes are stored from the other
constexpr int BOX_BYTES = BM / 64 * EPI_TOKENS * 128;
constexpr int BUFFERS = SPARTUNE_RES ? 2 : 1;
static_assert(BUFFERS * BOX_BYTES <= EPI_BYTES, "the buffers of output boxes fit the staged output's place");
static_assert(BM == 128 || BM == 256, "BM must be 128 or 256");
static_assert(BN == 64 || BN == 128 || BN == 256, "BN must be 64, 128 or 256");
static_assert(WM * ACC <= 128, "a consumer holds at most 128 accumulators per thread");
static_assert(GATHER >= 0 && GATHER <= 2, "GATHER: 0 (2:4), 1 or 2 boxes of x per stage");
static_assert(CLUSTER_M == 1 || ((CLUSTER_M == 2 || CLUSTER_M == 4) && !GATHER), "CLUSTER_M: 1, or 2 or 4 for 2:4");
constexpr int BOX_N = BN / CLUSTER_M;  // tokens of the x box each CTA of a cluster loads and multicasts

// CUtensorMap's layout (cuda.h): 128 opaque bytes, 64-byte aligned.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// A's 64 x 16 kept values of one 32-wide K step come from shared memory (a_desc: K-major, no
// swizzle, 8 x 8 core matrices, LBO 128 B along K, SBO 256 B along M; the host packs them so);
// each thread's metadata word from a register.
constexpr unsigned A_LBO = 128, A_SBO = 256, A_BLOCK = 64 * 16 * 2;  // bytes of one (K step, m64) block
template <int R>
__device__ __forceinline__ void wgmma_sp(float (&d)[R], unsigned long long a_desc, unsigned long long b_desc,
                                         unsigned e, int accumulate) {
  constexpr int TB = MN_MAJOR ? 1 : 0;
  if constexpr (R == 32) spartune::wgmma_sp_m64n64k32<TB>(d, a_desc, b_desc, e, accumulate);
  else if constexpr (R == 64) spartune::wgmma_sp_m64n128k32<TB>(d, a_desc, b_desc, e, accumulate);
  else spartune::wgmma_sp_m64n256k32<TB>(d, a_desc, b_desc, e, accumulate);
}

// V:N:M: one stage's copies of this producer thread into the stage's boxes (MN-major, 128-byte
// swizzle), the rows' byte offsets in x^T taken from `held` by shuffles (~0: past the map, zeros
// when CHECK).
template <bool CHECK, int NBOX, int ROWS, int RPW, int RW, int ROWS_STEP, int HELD>
__device__ __forceinline__ void gather_stage(unsigned char* dst, const char* base, const unsigned (&held)[HELD],
                                             int warp, int sub, unsigned swz) {
#pragma unroll
  for (int box = 0; box < NBOX; ++box)
#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
      const int i = box * RW + j * RPW;  // + sub: the same register across the warp
      const unsigned offset = __shfl_sync(0xffffffffu, held[i / 32], i % 32 + sub);
      const int k = warp * RPW + sub + j * ROWS_STEP;
      unsigned char* to = dst + box * B_STAGE + k / 8 * MN_SBO + k % 8 * 128 + ((swz ^ (k % 8)) << 4);
      if (CHECK) {
        const bool ok = offset != ~0u;
        spartune::cp_async16_zfill(to, base + (ok ? offset : 0u), ok ? 16 : 0);
      } else {
        spartune::cp_async16(to, base + offset);
      }
    }
}

// a_map, e_map: the packing's values (tiles, K steps, 512 bytes) and metadata (tiles, K steps, 16
// words), in boxes of (a unit, T tiles, KS K steps) landing as (K step, tile): a K step's m64
// block is 2 KB of 8 x 8 core matrices (kernels/spmm_nm.py `packed`, `a_maps`; tiles past the
// weight land as zeros, their rows never stored);
// x_map: x (N, K) in boxes of BK x BN / CLUSTER_M (2:4). V:N:M: xt (K, ldx) with n_alloc readable
// tokens per row, col_map (row blocks of v_rows, k_stages * BK) int32 with no -1 before stage
// full_stages. bias (M,) / residual (N, M) may be null. ws, counters (2:4, a split tail): each
// CTA's partial sums (BM x BN floats), and per tail tile and cluster rank a counter left at zero.
#if CLUSTER_M > 1
#define SPARTUNE_CLUSTER __cluster_dims__(CLUSTER_M, 1, 1)
#else
#define SPARTUNE_CLUSTER
#endif
extern "C" __global__ void SPARTUNE_CLUSTER __launch_bounds__(384, 1)
    spmm_nm_wgmma(const __grid_constant__ TensorMap x_map, const __grid_constant__ TensorMap out_map,
                  const __grid_constant__ TensorMap res_map, int tma_out, int tma_res,
                  const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap e_map,
                  const unsigned short* __restrict__ xt,
                  const int* __restrict__ col_map, int ldx, int n_alloc, int v_rows, int full_stages,
                  void* __restrict__ out,
                  const void* __restrict__ bias, const void* __restrict__ residual, int M, int N, int k_stages,
                  int row_blocks, int group_m, float* __restrict__ ws, int* __restrict__ counters, int son,
                  int som, int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
  unsigned char* b_tiles = smem;                                            // swizzled x boxes, 1024-aligned
  uint4* a_tiles = reinterpret_cast<uint4*>(b_tiles + STAGES * BOXES * B_STAGE);
  unsigned* e_tiles = reinterpret_cast<unsigned*>(b_tiles + STAGES * (BOXES * B_STAGE + A_STAGE));
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + (SMEM_BYTES - 1024 - 2 * STAGES * 8 - 16));
  unsigned long long* empty = full + STAGES;
  unsigned long long* res_full = empty + STAGES;  // the residual's boxes landed, per buffer

  // Tile order: groups of group_m row blocks, each group's tiles row block fastest, so that the
  // CTAs running at once share x boxes and A panels through L2 (the tuner picks group_m). In units
  // of clusters: a cluster's CTAs take adjacent row blocks of the same tokens (the host pads the
  // row blocks to a multiple of CLUSTER_M); cluster cid takes units cid, cid + clusters, ...
  const int rank = CLUSTER_M > 1 ? (int)spartune::cluster_rank() : 0;
  const int cid = blockIdx.x / CLUSTER_M, clusters = gridDim.x / CLUSTER_M, row_groups = row_blocks / CLUSTER_M;
  const int tiles_n = (N + BN - 1) / BN, per_group = group_m * tiles_n, units = row_groups * tiles_n;
  auto tile_of = [&](int u, int& mb, int& n0) {
    const int first_m = u / per_group * group_m, in_group = u % per_group;
    const int group_size = min(row_groups - first_m, group_m);
    mb = (first_m + in_group % group_size) * CLUSTER_M + rank, n0 = in_group / group_size * BN;
  };
  // Work of a cluster: `whole` units in rounds, then the last, partial round of `tail` units.
  // Where those fill half the clusters or fewer, each is split in two halves of K (even, so that
  // the metadata's register sets alternate as in a whole unit) for clusters 2t and 2t + 1, which
  // add their partial sums through ws. Segment q: unit u's stages k0 .. k1. (V:N:M launches one
  // CTA a tile: no tail.)
  const int whole = units / clusters, tail = units - whole * clusters;
  const bool split = tail && 2 * tail <= clusters && k_stages >= 8;
  const int half = 2 * ((k_stages + 3) / 4);
  auto segment = [&](int q, int& u, int& k0, int& k1) -> bool {
    k0 = 0, k1 = k_stages;
    if (q < whole || (q == whole && !split)) {
      u = cid + q * clusters;
      return u < units;
    }
    if (q > whole || cid >= 2 * tail) return false;
    u = units - tail + cid / 2;
    (cid % 2 ? k0 : k1) = half;
    return true;
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      spartune::mbar_init(&full[s], GATHER ? 129 : 1);  // V:N:M: + each producer thread's cp.async
      spartune::mbar_init(&empty[s], 8 * CLUSTER_M);  // each consumer warp of the cluster frees the stage
    }
    for (int b = 0; b < 2; ++b) spartune::mbar_init(&res_full[b], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if constexpr (CLUSTER_M > 1) spartune::cluster_sync();  // the peers' barriers exist before any copy

  // A's boxes of stage ks of row block mb into ring stage s
  auto copy_a = [&](int mb, int ks, int s) {
    spartune::tma_load_3d(a_tiles + s * (A_STAGE / 16), &a_map, 0, mb * T, ks * KS, &full[s]);
    spartune::tma_load_3d(e_tiles + s * (E_STAGE / 4), &e_map, 0, mb * T, ks * KS, &full[s]);
  };
  if (threadIdx.x < 128) {  // producer warpgroup
#if GATHER
    spartune::setmaxnreg_dec<56>();
    // thread p copies chunk p % CHUNKS (8 tokens) of rows p / CHUNKS + j * ROWS_STEP of each box.
    // A warp's rows (RW per box, RPW per step) have their byte offsets in x^T (column x pitch;
    // ~0 past the map; the host keeps them below 2^32) in the warp's registers, loaded a stage
    // ahead: register h of lane l holds row number (32 h + l) % RW of box (32 h + l) / RW; the
    // copies take them by shuffles. Stages before full_stages have no column past the map, so
    // their copies skip the check (a 64-bit add and the copy); tokens past n_alloc read the last
    // chunk instead, whose products land in columns never stored.
    constexpr int G = 128, RPW = 32 / CHUNKS, ROWS_STEP = G / CHUNKS, ROWS = BK / ROWS_STEP;
    constexpr int RW = ROWS * RPW, HELD = (RW * BOXES + 31) / 32;
    const int p = threadIdx.x;
    const int lane = p % 32, warp = p / 32, chunk = p % CHUNKS, sub = lane / CHUNKS;
    for (int u = cid, it = 0; u < units; u += clusters, it += k_stages) {
    int mb, n0;
    tile_of(u, mb, n0);
    const char* base = reinterpret_cast<const char*>(xt + min(n0 + chunk * 8, n_alloc - 8));
    const unsigned dst0 = chunk / 8 * MN_LBO, swz = chunk % 8;
    const int* held_cols[HELD];
    int next[HELD];
#pragma unroll
    for (int h = 0; h < HELD; ++h) {
      const int i = 32 * h + lane, box = i / RW, r = i % RW;
      held_cols[h] = box < BOXES ? col_map + (size_t)((mb * BM + box * (BM / 2)) / v_rows) * k_stages * BK +
                                       warp * RPW + r % RPW + r / RPW * ROWS_STEP
                                 : nullptr;
      next[h] = held_cols[h] ? __ldg(held_cols[h]) : -1;
    }
    for (int ks = 0; ks < k_stages; ++ks) {
      const int s = (it + ks) % STAGES;
      unsigned held[HELD];
#pragma unroll
      for (int h = 0; h < HELD; ++h) {
        held[h] = next[h] >= 0 ? (unsigned)next[h] * (unsigned)ldx * 2u : ~0u;  // loaded during the previous stage
        if (held_cols[h] && ks + 1 < k_stages) next[h] = __ldg(held_cols[h] + (ks + 1) * BK);  // under the wait
      }
      spartune::mbar_wait(&empty[s], (((it + ks) / STAGES) & 1) ^ 1);
      if (p == 0) {
        spartune::mbar_arrive_expect_tx(&full[s], STAGE_TX);
        copy_a(mb, ks, s);
      }
      // two copies of the loop, not one predicated one (predicated-off instructions still issue)
      if (ks < full_stages)
        gather_stage<false, BOXES, ROWS, RPW, RW, ROWS_STEP>(b_tiles + s * BOXES * B_STAGE + dst0, base, held, warp, sub, swz);
      else
        gather_stage<true, BOXES, ROWS, RPW, RW, ROWS_STEP>(b_tiles + s * BOXES * B_STAGE + dst0, base, held, warp, sub, swz);
      spartune::cp_async_mbar_arrive(&full[s]);
    }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copies in flight past the thread's exit
#else
    spartune::setmaxnreg_dec<40>();
    int u, k0, k1;
    for (int q = 0, it = 0; threadIdx.x == 0 && segment(q, u, k0, k1); ++q) {
      int mb, n0;
      tile_of(u, mb, n0);
      for (int ks = k0; ks < k1; ++ks, ++it) {
        const int s = it % STAGES;
        spartune::mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
        spartune::mbar_arrive_expect_tx(&full[s], STAGE_TX);
        if constexpr (CLUSTER_M > 1)  // this CTA's share of the box, into every CTA of the cluster
          spartune::tma_load_2d_multicast(b_tiles + s * B_STAGE + rank * BOX_N * BK * 2, &x_map, ks * BK,
                                          n0 + rank * BOX_N, &full[s], (1u << CLUSTER_M) - 1);
        else
          spartune::tma_load_2d(b_tiles + s * B_STAGE, &x_map, ks * BK, n0, &full[s]);
        copy_a(mb, ks, s);
      }
    }
#endif
    if constexpr (CLUSTER_M > 1) {  // pairs the consumers' last one (the warp whole again first)
      __syncwarp();
      spartune::cluster_sync();
    }
    return;
  }

  // (a CTA's pool: what the producers give back is what the consumers may take; taking more deadlocks)
  spartune::setmaxnreg_inc<GATHER ? 224 : 232>();
  const int ct = threadIdx.x - 128, c = ct / 128;  // consumer thread ct; consumer c: rows c * BM / 2 ...
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;

  float acc[WM][ACC];  // no zeroing: the first wgmma overwrites (scale-d 0); an ordinary write
                      // would stall the wgmma pipeline (ptxas C7515)
  const int g = lane >> 2, t = lane & 3;
  float* staged = reinterpret_cast<float*>(smem + EPI_OFFSET);
  const spartune::Epilogue epi{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const bool packed_out = som == 1 && out_code != 2 && son % 8 == 0 && (reinterpret_cast<size_t>(out) & 15) == 0;
  // the common cases, unrolled (the activation is compiled in: SPARTUNE_ACT): no residual, or a
  // 16-bit residual contiguous along m, read 8 rows at a time like the out it is added to
  const bool plain = packed_out && residual == nullptr;
  const bool res_rows = packed_out && residual != nullptr && res_code != 2 && srm == 1 && srn % 8 == 0 &&
                        (reinterpret_cast<size_t>(residual) & 15) == 0;
  constexpr int ACT = SPARTUNE_ACT;  // (the act argument is the host's copy)

  // it: stages consumed before this segment (the ring of stages runs on across tiles); parts:
  // output parts stored so far (a residual's two buffers alternate with them)
  __shared__ int last_part;
  int u, k0, k1, parts = 0;
  for (int q = 0, it = 0; segment(q, u, k0, k1); ++q, it += k1 - k0) {
  int mb, n0;
  tile_of(u, mb, n0);
  const int base = it - k0;  // stage kp of this segment is the ring's stage base + kp
  // Stage kp's metadata goes into register set kp % 2, so that its wgmmas are issued while stage
  // kp - 1's still run (a register operand must stay untouched until its wgmma completes): wait<1>
  // then retires stage kp - 1, which each warp then frees (in every CTA of the cluster). The host
  // pads K to an even number of stages.
  unsigned e[2][WM][KS];
  auto free_stage = [&](int kp) {
    __syncwarp();
    if (lane == 0) {
      if constexpr (CLUSTER_M > 1) {
#pragma unroll
        for (int r = 0; r < CLUSTER_M; ++r) spartune::mbar_arrive_cluster(&empty[(base + kp) % STAGES], r);
      } else {
        spartune::mbar_arrive(&empty[(base + kp) % STAGES]);
      }
    }
  };
#pragma unroll 1
  for (int ks = k0; ks < k1; ks += 2) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // set p holds stage ks + p
      const int kp = ks + p, s = (base + kp) % STAGES;
      spartune::mbar_wait(&full[s], ((base + kp) / STAGES) & 1);
      if (GATHER) spartune::fence_proxy_async();  // the gathered x was written by cp.async
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          const int tile = (c * WM + i) * 4 + warp;
          e[p][i][kk] = e_tiles[s * (E_STAGE / 4) + (kk * T + tile) * 16 + 2 * (lane >> 2) + (lane & 1)];
        }
      // 2:4: K-major box, a K step 64 bytes along its rows; V:N:M: this consumer's MN-major box,
      // a K step four 8-row groups on
      const unsigned long long b_desc =
          MN_MAJOR ? spartune::desc_mn_major_sw128(b_tiles + (s * BOXES + (BOXES == 2 ? c : 0)) * B_STAGE, MN_LBO, MN_SBO)
                 : spartune::desc_k_major_sw128(b_tiles + s * B_STAGE);
      constexpr unsigned K_STEP = MN_MAJOR ? 4 * MN_SBO : 32 * 2;
      const unsigned char* a_stage = reinterpret_cast<const unsigned char*>(a_tiles + s * (A_STAGE / 16));
      spartune::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#pragma unroll
        for (int i = 0; i < WM; ++i)  // the stage's A: blocks (K step, m64 block), this one's
          wgmma_sp(acc[i], spartune::desc_k_major_plain(a_stage + (kk * (BM / 64) + c * WM + i) * A_BLOCK, A_LBO, A_SBO),
                   b_desc + (kk * K_STEP >> 4), e[p][i][kk], kp > k0 || kk > 0);
      spartune::wgmma_commit();
      spartune::wgmma_wait<1>();  // stage kp - 1 (in set 1 - p) is done
      if (kp > k0) {
#pragma unroll
        for (int i = 0; i < WM; ++i)
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) asm volatile("" ::"r"(e[1 - p][i][kk]));
        free_stage(kp - 1);
      }
    }
  }
  spartune::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < WM; ++i) spartune::fence_registers(acc[i]);
  free_stage(k1 - 1);  // (the producer may fill it with the next tile's first stages now)

  if (!GATHER && split && q == whole) {  // half of a tail unit: the second to finish adds both
    // ws: each cluster's partial sums (per CTA), each thread's accumulators float4 by float4 at a
    // stride of the 256 consumer threads (coalesced)
    auto slot = [&](int cl) {
      return reinterpret_cast<float4*>(ws) + (size_t)(cl * CLUSTER_M + rank) * (WM * ACC / 4) * 256 + ct;
    };
    const int t = cid / 2;
    float4* mine = slot(cid);
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int v = 0; v < ACC / 4; ++v)
        mine[(i * ACC / 4 + v) * 256] = make_float4(acc[i][4 * v], acc[i][4 * v + 1], acc[i][4 * v + 2], acc[i][4 * v + 3]);
    __threadfence();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (ct == 0) last_part = atomicAdd(counters + t * CLUSTER_M + rank, 1) == 1;
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (!last_part) continue;
    __threadfence();
    const float4* lo = slot(2 * t);  // the first half's sums, then the second's: the same every run
    const float4* hi = slot(2 * t + 1);
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int v = 0; v < ACC / 4; ++v) {
        const float4 a = __ldcg(lo + (i * ACC / 4 + v) * 256), b = __ldcg(hi + (i * ACC / 4 + v) * 256);
        acc[i][4 * v] = a.x + b.x, acc[i][4 * v + 1] = a.y + b.y, acc[i][4 * v + 2] = a.z + b.z, acc[i][4 * v + 3] = a.w + b.w;
      }
    if (ct == 0) counters[t * CLUSTER_M + rank] = 0;  // for the next launch
  }

  // epilogue: the accumulators go through shared memory EPI_TOKENS tokens at a time, so that the
  // stores run along m, coalesced. Thread (warp, g, t) holds, per m64 sub-tile and 8-token slice j,
  // rows g and g + 8 of its warp's 16 at tokens 2t and 2t + 1. tma_out (a 16-bit out, contiguous
  // along m; tma_res: its residual too, the host checks): the finished values go 16-bit into boxes
  // of 64 rows x EPI_TOKENS tokens (128-byte swizzle) that the tensor copy engine stores while the
  // consumers go on to the next part and tile, the residual's boxes loaded into the same places a
  // part ahead by the copy engine and added in place; else fp32 into rows of tokens, stored by the
  // threads through the generic epilogue.
  float bias_r[WM][2];
  if (tma_out) {
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mb * BM + c * (BM / 2) + i * 64 + warp * 16 + g + 8 * h;
        bias_r[i][h] = row < M ? epi.bias_of(row) : 0.f;
      }
  }
  // (ct 0) this tile's part p's residual boxes into buffer (parts + p) % 2, landing on its res_full
  auto load_residual = [&](int part) {  // (SPARTUNE_RES only)
    unsigned long long* bar = &res_full[(parts + part) % 2];
    spartune::mbar_arrive_expect_tx(bar, BOX_BYTES);
#pragma unroll
    for (int b = 0; b < BM / 64; ++b)
      spartune::tma_load_2d(reinterpret_cast<unsigned char*>(staged) + (parts + part) % 2 * BOX_BYTES + b * (EPI_TOKENS * 128),
                            &res_map, mb * BM + b * 64, n0 + part * EPI_TOKENS, bar);
  };
  // V:N:M's output parts share the ring's first stages: both consumers are done with their x
  // boxes before the first residual boxes land there (2:4's persistent CTAs stage apart)
  if constexpr (!PERSISTENT && SPARTUNE_RES)
    if (tma_out && tma_res) asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
  for (int part = 0; part < BN / EPI_TOKENS; ++part) {
    if (tma_out && ct == 0) {
      spartune::bulk_wait<0, true>();  // the previous part's boxes are read (stored)
      if (SPARTUNE_RES && tma_res) {  // this part's residual (the first part's) and the next one's
        if (part == 0) load_residual(0);
        if (part + 1 < BN / EPI_TOKENS) load_residual(part + 1);
      }
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the buffer is free
    if (tma_out) {
      const int buffer = SPARTUNE_RES ? (parts + part) % 2 : 0;
      unsigned char* boxes = reinterpret_cast<unsigned char*>(staged) + buffer * BOX_BYTES;
      if (SPARTUNE_RES && tma_res) spartune::mbar_wait(&res_full[buffer], (parts + part) / 2 & 1);
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int jj = 0; jj < EPI_TOKENS / 8; ++jj) {
          const int j = part * EPI_TOKENS / 8 + jj;
          // lane l < 16 gives the address of stored row (token) 8 jj + l % 8, rows m .. m + 7 of
          // matrix l / 8 (m = this warp's 16 rows, then 8 on)
          const int n = 8 * jj + (lane & 7), m = c * (BM / 2) + i * 64 + warp * 16 + 8 * ((lane >> 3) & 1);
          const int chunk = (m % 64) / 8;
          unsigned char* at = boxes + (m / 64) * (EPI_TOKENS * 128) + n * 128 + ((chunk ^ (n % 8)) << 4);
          unsigned res[2] = {0u, 0u};
          if (SPARTUNE_RES && tma_res) spartune::ldmatrix_x2_trans(at, res[0], res[1]);
          unsigned packed[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float y0 = spartune::activate(acc[i][4 * j + 2 * h] * scale + bias_r[i][h], ACT);
            float y1 = spartune::activate(acc[i][4 * j + 2 * h + 1] * scale + bias_r[i][h], ACT);
            if (SPARTUNE_RES && tma_res)
              y0 += spartune::unpack_16bit(res[h], 0, res_code), y1 += spartune::unpack_16bit(res[h], 1, res_code);
            packed[h] = spartune::pack_16bit(y0, y1, out_code);
          }
          spartune::stmatrix_x2_trans(at, packed[0], packed[1]);
        }
      spartune::fence_proxy_async();  // the tensor copy engine reads what the threads wrote
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (ct == 0) {
#pragma unroll
        for (int b = 0; b < BM / 64; ++b)
          spartune::tma_store_2d(&out_map, boxes + b * (EPI_TOKENS * 128), mb * BM + b * 64, n0 + part * EPI_TOKENS);
        spartune::bulk_commit();
      }
      continue;
    }
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int jj = 0; jj < EPI_TOKENS / 8; ++jj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int m = c * (BM / 2) + i * 64 + warp * 16 + g + 8 * (r >> 1), n = 8 * jj + 2 * t + (r & 1);
          staged[n * TILE_STRIDE + m] = acc[i][4 * (part * EPI_TOKENS / 8 + jj) + r];
        }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll 1
    for (int idx = ct; idx < BM * EPI_TOKENS / 8; idx += 256) {  // 8 rows of one token each
      const int nq = idx / (BM / 8), m = idx % (BM / 8) * 8, n = part * EPI_TOKENS + nq;
      const int row = mb * BM + m;
      if (row >= M || n0 + n >= N) continue;
      const float4 lo = *reinterpret_cast<const float4*>(staged + nq * TILE_STRIDE + m);
      const float4 hi = *reinterpret_cast<const float4*>(staged + nq * TILE_STRIDE + m + 4);
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      if ((plain || res_rows) && row + 8 <= M) {  // unrolled, no local arrays, 16-byte loads and store
        float y[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) y[q] = spartune::activate(v[q] * scale + epi.bias_of(row + q), ACT);
        if (res_rows) {
          const uint4 r = *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(residual) +
                                                          (long long)(n0 + n) * srn + row);
          const unsigned words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            y[2 * q] += spartune::unpack_16bit(words[q], 0, res_code);
            y[2 * q + 1] += spartune::unpack_16bit(words[q], 1, res_code);
          }
        }
        unsigned packed[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) packed[q] = spartune::pack_16bit(y[2 * q], y[2 * q + 1], out_code);
        *reinterpret_cast<uint4*>(reinterpret_cast<unsigned short*>(out) + (long long)(n0 + n) * son + row) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
      } else if (packed_out && row + 8 <= M) {  // one 16-byte store
        unsigned short h[8];
#pragma unroll 1
        for (int q = 0; q < 8; ++q) {  // rolled: the epilogue's code once (unrolled, ptxas takes 20 s)
          float y = spartune::activate(v[q] * scale + epi.bias_of(row + q), act);
          if (residual) y += spartune::load_as_float(residual, (long long)(n0 + n) * srn + (long long)(row + q) * srm, res_code);
          h[q] = out_code == 0 ? __half_as_ushort(__float2half_rn(y)) : __bfloat16_as_ushort(__float2bfloat16_rn(y));
        }
        *reinterpret_cast<uint4*>(reinterpret_cast<unsigned short*>(out) + (long long)(n0 + n) * son + row) =
            make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16, h[4] | (unsigned)h[5] << 16,
                       h[6] | (unsigned)h[7] << 16);
      } else {
#pragma unroll 1
        for (int q = 0; q < 8; ++q)
          if (row + q < M) epi.store(row + q, n0 + n, v[q], epi.bias_of(row + q));
      }
    }
  }  // part
  parts += BN / EPI_TOKENS;
  }  // unit
  if (tma_out && ct == 0) spartune::bulk_wait<0, false>();  // the last boxes are stored
  // no CTA leaves while a peer may still arrive on its barriers or copy into its stages
  if constexpr (CLUSTER_M > 1) spartune::cluster_sync();
}
