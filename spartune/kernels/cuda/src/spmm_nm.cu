// 2:4 SpMM on the sparse tensor cores (mma.sp m16n8k32), linear layout with the fused epilogue:
//   out (N, M) = act(scale * x (N, K) @ A^T + bias) + residual.
// V:N:M (VENOM) runs on the same kernel: A is then the 2:4 matrix over each row block's kept
// columns, and `col_map` names, per block of `map_rows` rows, where in its M-column block the column
// of x behind each of its K columns lies (none past the map or past x: zeros), so x's chunks are
// gathered as they are staged.
// A CTA owns BM rows of A x BN tokens; its warps split the rows in 16-row slices, the tokens in
// 8-token slices and K in WARPS_K interleaved parts (summed through shared memory at the end:
// decode has few row tiles, so K is where the parallelism is). K is walked in chunks of
// WARPS_K x KSTEPS x 32: the chunk's x tile is staged in shared memory (ldmatrix gives mma.sp's
// B fragment directly), A's fragments come from global memory (the packing that the wgmma
// variant reads too, kernels/spmm_nm.py: per 16-row tile and K step 512 bytes of 8 x 8 core
// matrices, four 4-byte loads per lane, and a metadata word); the next chunk's A fragments and x
// tile are loaded into registers while this chunk multiplies. With PIPE >= 3 (2:4, x rows 16-byte
// aligned) they move by cp.async instead, into a ring of PIPE shared-memory stages PIPE - 1 chunks ahead, so
// more of the weight is in flight per warp without registers to hold it (decode's limit); a
// unit lands whole (16 bytes a lane) and ldmatrix reads the fragment from it.
// V:N:M takes the ring too (GATHER 2): x is then read as x^T (K rows, tokens contiguous), where a
// kept column's tokens are one 16-byte row per 8 tokens, copied by cp.async into a k-major tile
// that ldmatrix.trans turns into the same B fragments. GATHER 3, for a few tokens: x's rows are
// staged whole in shared memory once per CTA (behind the ring) and each chunk's k-major tile is
// filled from there, so no x^T copy (a second launch, at decode a fifth of the call) is needed.
// GATHER 4, one token (N = 1): as 3, but each chunk's kept columns go into one row of the stage,
// 2 bytes a column instead of a 16-byte k-major row of 8 tokens (7 of them zeros), ordered so that
// lane t of token 0 reads its B fragment's four registers with one 16-byte load: filling 3's tile
// cost 5-12% of the call (LOG, session 35).
// CLUSTER_M > 1 (2:4 on the ring, sm_90): the CTAs of a cluster own adjacent row blocks of the same
// tokens and share each x chunk, copied once from L2 by bulk copies multicast to all of them: with
// small BM (decode's many CTAs) every row block otherwise re-reads all of x, 16x the weight's bytes
// at 16 tokens (LOG, session 18).
//   SPARTUNE_BF16  0: fp16 operands, 1: bf16
//   BM, BN, WARPS, WARPS_K, KSTEPS  tile rows, tile tokens, warps per CTA, of them along K,
//                                   32-wide K steps per warp and chunk
//   GATHER  0 for 2:4; V:N:M: 1 (x gathered element by element through col_map), 2 (rows of
//           x^T through col_map, PIPE only), 3 (x's rows staged whole, PIPE only), 4 (3 for one
//           token, BN 8)
//   SPARTUNE_ACT  the epilogue's activation code (epilogue.cuh), fixed per instance
//   PIPE    0: the register prefetch; >= 3: the cp.async ring of PIPE stages (dynamic shared
//           memory of PIPE_BYTES, which the launch passes; needs x_vec for GATHER 0)
//   CLUSTER_M  CTAs of a cluster sharing x's chunks (GATHER 0 on the ring; K % 8 == 0, x_vec)
#include "epilogue.cuh"
#include "mma_sp.cuh"

#if !defined(SPARTUNE_BF16) || !defined(BM) || !defined(BN) || !defined(WARPS) || !defined(KSTEPS)
#error "spmm_nm.cu needs SPARTUNE_BF16, BM, BN, WARPS and KSTEPS"
#endif
#ifndef WARPS_K
#define WARPS_K 1
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1
#endif
#if CLUSTER_M > 1
#include "wgmma_sp.cuh"  // mbarriers, bulk copies, cluster barriers
#define SPARTUNE_CLUSTER __cluster_dims__(1, CLUSTER_M, 1)
#else
#define SPARTUNE_CLUSTER
#endif

constexpr int MT = BM / 16;                            // 16-row slices per CTA
constexpr int NT = BN / 8;                             // 8-token slices per CTA
constexpr int WARPS_MN = WARPS / WARPS_K;             // warps over the output tile
constexpr int WARPS_M = WARPS_MN < MT ? WARPS_MN : MT;
constexpr int WARPS_N = WARPS_MN / WARPS_M;
constexpr int WM = MT / WARPS_M;                       // row slices per warp
constexpr int WN = NT / WARPS_N;                       // token slices per warp
constexpr int KC = 32 * KSTEPS * WARPS_K;              // K per chunk
constexpr int XS_STRIDE = KC + 8;                      // halves per staged token row (+16 B: no bank conflicts)
constexpr int THREADS = WARPS * 32;
constexpr int XVECS = BN * KC / 8;                     // 16-byte vectors of a chunk's x tile
constexpr int XV = (XVECS + THREADS - 1) / THREADS;    // of them per thread
#ifndef GATHER
#define GATHER 0  // 1, 2, 3, 4: V:N:M, x read through col_map
#endif
// GATHER 2 and 3's k-major tile: rows of BN tokens at an odd number of 16-byte units, so the 8 rows
// an ldmatrix.trans reads fall in 8 different bank groups
constexpr int XT_STRIDE = ((BN / 8) | 1) * 8;
constexpr int XS_BYTES = GATHER == 4 ? KC * 2 : GATHER >= 2 ? KC * XT_STRIDE * 2 : BN * XS_STRIDE * 2;
constexpr int XP = (KC / 2 + THREADS - 1) / THREADS;   // GATHER 4: pairs of kept columns per thread and chunk
constexpr int XG = (BN * KC + THREADS - 1) / THREADS;  // gathered x elements per thread and chunk
constexpr bool XG_REGS = GATHER && XG <= 16;            // prefetched into registers when few
constexpr int RED_BYTES = (WARPS_K - 1) * WARPS_MN * (BM / 16 / WARPS_M) * (BN / 8 / WARPS_N) * 4 * 32 * 4;
constexpr int SMEM_BYTES = XS_BYTES > RED_BYTES ? XS_BYTES : RED_BYTES;
#ifndef PIPE
#define PIPE 0
#endif
static_assert(PIPE == 0 || (PIPE >= 3 && GATHER != 1), "the cp.async ring runs 2:4 or GATHER 2, 3 or 4, with at least 3 stages");
static_assert((GATHER >= 2) == (PIPE != 0 && GATHER != 0), "GATHER 2, 3 and 4 are the ring's V:N:M");
static_assert(GATHER != 4 || BN == 8, "GATHER 4 is one token's tile");
static_assert(CLUSTER_M == 1 || (PIPE >= 3 && GATHER == 0), "a cluster shares 2:4's x chunks on the ring");
// a stage's A fragments (one per lane and step); the ring's warps that split a tile's tokens
// (WARPS_N > 1) share theirs: each copies a 1 / WARPS_N share, all read them
constexpr int A_FRAGS = WARPS / WARPS_N * WM * KSTEPS * 32;
constexpr int STAGE_BYTES = XS_BYTES + A_FRAGS * (16 + 4);  // x chunk, A values, metadata
constexpr int PIPE_BYTES = PIPE * STAGE_BYTES > RED_BYTES ? PIPE * STAGE_BYTES : RED_BYTES;
static_assert(BM % 16 == 0 && BN % 8 == 0, "BM must be a multiple of 16 and BN of 8");
static_assert(WARPS_MN * WARPS_K == WARPS, "WARPS_K must divide WARPS");
static_assert(WARPS_M * WARPS_N == WARPS_MN && MT % WARPS_M == 0 && NT % WARPS_N == 0, "warps must tile the CTA");

// cp.async: `bytes` (0..16) of src, the rest of the 16 (or 4) zero-filled
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// a_values: (Mt, Kt) units of 512 bytes, each (8-row half, K core matrix, row, 8 halves); a_meta:
// (Mt, Kt, 16) words, those of lanes 4g and 4g + 1 (selector 0 reads no other lane's).
// x: (N, K) at strides (sxn, sxk) (GATHER 2: x^T, K rows at pitch sxk, tokens contiguous and sxn
// of them readable per row, a multiple of 8; GATHER 3, 4: x (N, kx), staged in rows of kx rounded
// up to 8 after the ring's PIPE_BYTES); x_vec: 1 when sxk == 1, sxn % 8 == 0 and x is 16-byte aligned
// (GATHER 0: chunks then move as 16-byte vectors; 3, 4: so do the staged rows). col_map: null (2:4), or
// V:N:M's kept columns as offsets inside their M-column block, one byte each (the format's own `cols`,
// map_pitch = 4 x column blocks a row block; 4x fewer bytes than a column index: LOG, session 35),
// BM dividing map_rows. bias (M,) / residual (N, M) may be null.
extern "C" __global__ void SPARTUNE_CLUSTER __launch_bounds__(THREADS)
    spmm_nm(const uint4* __restrict__ a_values, const unsigned* __restrict__ a_meta,
            const unsigned short* __restrict__ x, void* __restrict__ out, const void* __restrict__ bias,
            const void* __restrict__ residual, const unsigned char* __restrict__ col_map, int map_rows, int map_pitch, int m_block,
            int M, int K, int N,
            int Mt, int Kt, int sxn, int sxk, int x_vec, int kx,
            int son, int som, int srn, int srm, int out_code, int bias_code, int res_code, int act, float scale) {
#if PIPE
  extern __shared__ __align__(16) unsigned char smem[];  // PIPE_BYTES
#else
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
#endif
  unsigned short* xs = reinterpret_cast<unsigned short*>(smem);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_mn = warp % WARPS_MN, warp_k = warp / WARPS_MN;
  const int warp_m = warp_mn % WARPS_M, warp_n = warp_mn / WARPS_M;
  // token tiles run fastest: a row block's tiles run together and share A's stream through L2
  const int mt0 = blockIdx.y * MT + warp_m * WM;  // this warp's first 16-row slice
  const int n_cta = blockIdx.x * BN;

  float acc[WM][WN][4];
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  // the packing's unit of (16-row tile mt, K step kt)
  auto unit = [&](int mt, int kt) { return (long long)mt * Kt + kt; };
  uint4 av[WM][KSTEPS];
  unsigned am[WM][KSTEPS];
  auto load_a = [&](int chunk) {  // this warp's K steps of the chunk: warp_k, + WARPS_K, ...
    // lane (g, t)'s registers: rows g, g + 8 (the unit's 256-byte halves) x columns 2t, 8 + 2t (its
    // 128-byte core matrices), 4 bytes at row g's 16
    const int word = (lane >> 2) * 4 + (lane & 3);
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        const int mt = mt0 + i, kt = chunk * KSTEPS * WARPS_K + s * WARPS_K + warp_k;
        if (mt < Mt && kt < Kt) {
          const long long at = unit(mt, kt);
          const unsigned* w = reinterpret_cast<const unsigned*>(a_values + at * 32) + word;
          av[i][s] = make_uint4(w[0], w[64], w[32], w[96]);
          am[i][s] = a_meta[at * 16 + 2 * (lane >> 2) + (lane & 1)];
        } else {
          av[i][s] = make_uint4(0u, 0u, 0u, 0u);
          am[i][s] = 0x44444444u;  // positions (0, 1) in every group: valid, values zero
        }
      }
  };
  // x tile of a chunk: 16-byte vectors into registers when the chunk is whole and aligned,
  // else element by element straight into shared memory (the K tail, strided x)
  uint4 xr[XV];
  auto x_vec_ok = [&](int chunk) { return x_vec && (chunk + 1) * KC <= K; };
  const unsigned char* cols = col_map ? col_map + (long long)(blockIdx.y * BM / map_rows) * map_pitch : nullptr;
  // V:N:M: the column of x behind kept column k of this row block, from k's offset inside its
  // M-column block (-1: none, past the map or past x). The ring loads the offsets a chunk ahead and
  // adds only when it uses them: adding at the load made every chunk wait for its round trip
  // (+2-5 us at decode: LOG, session 35).
  auto offset_of = [&](int k) -> int { return k < map_pitch ? cols[k] : -1; };
  auto col_at = [&](int k, int off) -> int {
    const int c = (k >> 2) * m_block + off;
    return off >= 0 && c < kx ? c : -1;
  };
  auto col_of = [&](int k) -> int { return col_at(k, offset_of(k)); };
  auto load_x = [&](int chunk) {
    const int k0 = chunk * KC;
#pragma unroll
    for (int q = 0; q < XV; ++q) {
      const int v = tid + q * THREADS;
      const int n = v / (KC / 8), kk = (v % (KC / 8)) * 8;
      xr[q] = make_uint4(0u, 0u, 0u, 0u);
      if (v < XVECS && n_cta + n < N) xr[q] = *reinterpret_cast<const uint4*>(x + (long long)(n_cta + n) * sxn + k0 + kk);
    }
  };
  // V:N:M: the chunk's kept columns, gathered element by element into registers (all loads in
  // flight at once, under the previous chunk's MMAs), x's contiguous dimension fastest
  unsigned short xg[XG_REGS ? XG : 1];
  constexpr bool gather_regs = XG_REGS;
  auto gather_x = [&](int chunk) {
    const int k0 = chunk * KC;
#pragma unroll
    for (int q = 0; q < (XG_REGS ? XG : 1); ++q) {
      const int e = tid + q * THREADS;
      const int n = sxk == 1 ? e / KC : e % BN, kk = sxk == 1 ? e % KC : e / BN;
      const int col = e < BN * KC ? col_of(k0 + kk) : -1;
      xg[q] = n_cta + n < N && col >= 0 ? x[(long long)(n_cta + n) * sxn + (long long)col * sxk] : 0;
    }
  };
  auto stage_x = [&](int chunk) {
    if (gather_regs) {
#pragma unroll
      for (int q = 0; q < (XG_REGS ? XG : 1); ++q) {
        const int e = tid + q * THREADS;
        const int n = sxk == 1 ? e / KC : e % BN, kk = sxk == 1 ? e % KC : e / BN;
        if (e < BN * KC) xs[n * XS_STRIDE + kk] = xg[q];
      }
    } else if (x_vec_ok(chunk)) {
#pragma unroll
      for (int q = 0; q < XV; ++q) {
        const int v = tid + q * THREADS;
        const int n = v / (KC / 8), kk = (v % (KC / 8)) * 8;
        if (v < XVECS) *reinterpret_cast<uint4*>(xs + n * XS_STRIDE + kk) = xr[q];
      }
    } else {
      const int k0 = chunk * KC;
      const bool k_fast = sxk == 1;  // walk x along its contiguous dimension
      for (int e = tid; e < BN * KC; e += THREADS) {
        const int n = k_fast ? e / KC : e % BN, kk = k_fast ? e % KC : e / BN;
        unsigned short val = 0;
        const int col = k0 + kk >= K ? -1 : cols ? col_of(k0 + kk) : k0 + kk;
        if (n_cta + n < N && col >= 0) val = x[(long long)(n_cta + n) * sxn + (long long)col * sxk];
        xs[n * XS_STRIDE + kk] = val;
      }
    }
  };

  // chunk c's K steps on the staged x chunk `xs`, this warp's A fragments in registers
  auto multiply = [&](int c, const uint4 (&cur_v)[WM][KSTEPS], const unsigned (&cur_m)[WM][KSTEPS]) {
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
      const int ks = s * WARPS_K + warp_k;  // K step inside the chunk
      if (c * KSTEPS * WARPS_K + ks >= Kt) break;
#pragma unroll
      for (int j = 0; j < WN; ++j) {
        // B fragment of token slice j: reg r = token g, k = 8r + 2t, +1 (ldmatrix's layout)
        unsigned b[4];
#if GATHER == 4  // lane t of token 0: registers r = 0..3 (k = 8r + 2t, +1) are the K step's words 4t..4t+3
        uint4 q = make_uint4(0u, 0u, 0u, 0u);
        if (lane < 4) q = *reinterpret_cast<const uint4*>(xs + ks * 32 + lane * 8);
        b[0] = q.x, b[1] = q.y, b[2] = q.z, b[3] = q.w;
#elif GATHER >= 2
        ldmatrix_x4_trans(b, xs + (ks * 32 + (lane >> 3) * 8 + (lane & 7)) * XT_STRIDE + (warp_n * WN + j) * 8);
#else
        const int row = (warp_n * WN + j) * 8 + (lane & 7);
        ldmatrix_x4(b, xs + row * XS_STRIDE + ks * 32 + (lane >> 3) * 8);
#endif
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          const unsigned a[4] = {cur_v[i][s].x, cur_v[i][s].y, cur_v[i][s].z, cur_v[i][s].w};
          spartune::mma_sp_m16n8k32<SPARTUNE_BF16 != 0>(acc[i][j], a, b, cur_m[i][s]);
        }
      }
    }
  };

  const int chunks = (Kt + KSTEPS * WARPS_K - 1) / (KSTEPS * WARPS_K);
#if PIPE
  // stage st: [x chunk (BN rows of XS_STRIDE halves; GATHER 2, 3: KC rows of XT_STRIDE; 4: KC halves)][A values:
  // A_FRAGS uint4][metadata: A_FRAGS words],
  // the fragments of each (warp_k, warp_m) at ((warp_k, warp_m), i, s, lane)
  auto stage_base = [&](int st) { return smem + st * STAGE_BYTES; };
  auto frag = [&](int i, int s) { return (((warp_k * WARPS_M + warp_m) * WM + i) * KSTEPS + s) * 32 + lane; };
  auto a_ok = [&](int chunk, int i, int s) {
    return mt0 + i < Mt && chunk * KSTEPS * WARPS_K + s * WARPS_K + warp_k < Kt;
  };
#if GATHER == 4  // (pairs of offsets: 2-byte loads)
  unsigned next_two[XP];  // the offsets of kept columns 2v, 2v + 1 (all ones: none)
  auto load_cols = [&](int chunk) {
#pragma unroll
    for (int q = 0; q < XP; ++q) {
      const int v = tid + q * THREADS, k = chunk * KC + 2 * v;
      // (map_pitch is a multiple of 4: k + 1 is in k's block)
      next_two[q] = v < KC / 2 && k < map_pitch ? *reinterpret_cast<const unsigned short*>(cols + k) : ~0u;
    }
  };
  load_cols(0);
#elif GATHER >= 2
  // the map entries of the next chunk issue() copies, loaded one chunk ahead: a load that issue()
  // waited on stalled every chunk by an L2 round trip
  int next_off[XV];
  auto load_cols = [&](int chunk) {
#pragma unroll
    for (int q = 0; q < XV; ++q) {
      const int v = tid + q * THREADS, k = chunk * KC + v / (BN / 8);
      next_off[q] = v < XVECS ? offset_of(k) : -1;
    }
  };
  load_cols(0);
#endif
  const int x_rows = min(BN, N - n_cta);  // this tile's tokens
#if GATHER >= 3
  // x's rows n_cta .. n_cta + x_rows - 1, whole, behind the ring (rows of xwp halves)
  unsigned short* xw = reinterpret_cast<unsigned short*>(smem + PIPE_BYTES);
  const int xwp = (kx + 7) & ~7;
  auto stage_xw = [&]() {
    if (x_vec) {
      const int vecs = xwp / 8;
      for (int v = tid; v < x_rows * vecs; v += THREADS) {
        const int t = v / vecs, k = (v % vecs) * 8;
        cp_async16(xw + t * xwp + k, x + (long long)(n_cta + t) * sxn + k, min(8, kx - k) * 2);
      }
    } else {
      for (int e = tid; e < x_rows * kx; e += THREADS) {
        const int t = e / kx, k = e % kx;
        xw[t * xwp + k] = x[(long long)(n_cta + t) * sxn + (long long)k * sxk];
      }
    }
  };
#endif
#if CLUSTER_M > 1
  // full[st]: the bytes of x landing in this CTA's stage st (the copies of every CTA of the cluster).
  // Rows past the tokens are never written: they only feed output tokens the epilogue skips.
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + PIPE_BYTES);
  const unsigned rank = spartune::cluster_rank();
  if (tid == 0) {
    for (int st = 0; st < PIPE; ++st) spartune::mbar_init(&full[st], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  spartune::cluster_sync();  // every CTA's barriers exist before any copy
#endif
  auto issue_x = [&](int chunk) {
    unsigned short* xs_s = reinterpret_cast<unsigned short*>(stage_base(chunk % PIPE));
#if CLUSTER_M > 1  // this CTA's rows of the chunk (rank, + CLUSTER_M, ...) into every CTA of the cluster
    const int k0 = chunk * KC, kb = min(KC, K - k0), st = chunk % PIPE;
    if (tid == 0) spartune::mbar_arrive_expect_tx(&full[st], x_rows * kb * 2);
    if (kb < KC) {  // the K tail: zeros past K (this stage's earlier chunk left its columns there)
      for (int e = tid; e < BN * (KC - kb); e += THREADS) xs_s[(e / (KC - kb)) * XS_STRIDE + kb + e % (KC - kb)] = 0;
      __syncthreads();  // seen by the CTA's readers (kb is the CTA's: every thread is here)
    }
    for (int n = rank + CLUSTER_M * tid; n < x_rows; n += CLUSTER_M * THREADS)
      spartune::bulk_copy_multicast(xs_s + n * XS_STRIDE, x + (long long)(n_cta + n) * sxn + k0, kb * 2, &full[st],
                                    (unsigned short)((1u << CLUSTER_M) - 1));
#elif GATHER == 4  // pair v of the chunk's kept columns: word v % 16 of its K step, at its lane's place
#pragma unroll
    for (int q = 0; q < XP; ++q) {
      const int v = tid + q * THREADS, w = v % 16;
      if (v < KC / 2) {
        const unsigned two = next_two[q];
        const int k = chunk * KC + 2 * v;
        const bool none = two == ~0u;
        const int c0 = none ? -1 : col_at(k, two & 0xff), c1 = none ? -1 : col_at(k, two >> 8);
        const unsigned h0 = c0 >= 0 ? xw[c0] : 0u, h1 = c1 >= 0 ? xw[c1] : 0u;
        reinterpret_cast<unsigned*>(xs_s)[(v / 16) * 16 + (w % 4) * 4 + w / 4] = h0 | h1 << 16;
      }
    }
    load_cols(chunk + 1);
#else
#pragma unroll
    for (int q = 0; q < XV; ++q) {
      const int v = tid + q * THREADS;
      if (v < XVECS) {
#if GATHER >= 2  // kept column k0 + kk of the block, 8 tokens (padding: column -1, zeros)
        const int kk = v / (BN / 8), t8 = (v % (BN / 8)) * 8;
        const int col = col_at(chunk * KC + kk, next_off[q]);
#endif
#if GATHER == 2  // from its x^T row
        const bool in = col >= 0 && n_cta + t8 < sxn;
        cp_async16(xs_s + kk * XT_STRIDE + t8, in ? x + (long long)col * sxk + n_cta + t8 : x, in ? 16 : 0);
#elif GATHER == 3  // from the staged rows (zeros past them)
        unsigned h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = col >= 0 && t8 + i < x_rows ? xw[(t8 + i) * xwp + col] : 0u;
        *reinterpret_cast<uint4*>(xs_s + kk * XT_STRIDE + t8) =
            make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
#else
        const int k0 = chunk * KC, n = v / (KC / 8), kk = (v % (KC / 8)) * 8;
        const bool in = n_cta + n < N && k0 + kk < K;
        const int bytes = !in ? 0 : K - k0 - kk >= 8 ? 16 : 2 * (K - k0 - kk);  // the K tail zero-filled
        cp_async16(xs_s + n * XS_STRIDE + kk, in ? x + (long long)(n_cta + n) * sxn + k0 + kk : x, bytes);
#endif
      }
    }
#if GATHER >= 2
    load_cols(chunk + 1);
#endif
#endif  // CLUSTER_M
  };
  auto issue_a = [&](int chunk) {
    unsigned char* base = stage_base(chunk % PIPE);
    uint4* av_s = reinterpret_cast<uint4*>(base + XS_BYTES);
    unsigned* am_s = reinterpret_cast<unsigned*>(base + XS_BYTES + A_FRAGS * 16);
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        if ((i * KSTEPS + s) % WARPS_N != warp_n) continue;  // a token warp's share
        const bool ok = a_ok(chunk, i, s);
        const long long at = ok ? unit(mt0 + i, chunk * KSTEPS * WARPS_K + s * WARPS_K + warp_k) : 0;
        cp_async16(av_s + frag(i, s), a_values + at * 32 + lane, ok ? 16 : 0);
        cp_async4(am_s + frag(i, s), a_meta + at * 16 + 2 * (lane >> 2) + (lane & 1), ok ? 4 : 0);
      }
  };
  auto issue = [&](int chunk) {  // (GATHER 3, 4: A's copies first, then the tile's fill from shared memory)
    if (GATHER < 3) issue_x(chunk);
    issue_a(chunk);
    if (GATHER >= 3) issue_x(chunk);
  };
#if GATHER >= 3
  // x's rows first (the oldest group), the first chunks' A behind them; the chunks' x tiles are
  // filled once the rows have landed
  stage_xw();
  cp_async_commit();
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) {
    if (p < chunks) issue_a(p);
    cp_async_commit();
  }
  cp_async_wait<PIPE - 1>();
  __syncthreads();
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p)
    if (p < chunks) issue_x(p);
#else
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) {
    if (p < chunks) issue(p);
    cp_async_commit();
  }
#endif
#if CLUSTER_M > 1
  spartune::cluster_arrive();  // (the first chunk's wait)
#endif
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<PIPE - 2>();  // chunk c has landed (this thread's copies) ...
#if CLUSTER_M > 1
    spartune::mbar_wait(&full[c % PIPE], (c / PIPE) & 1);  // ... and its x
    spartune::cluster_wait();  // every CTA of the cluster is done with chunk c - 1, whose stage is refilled next
    if constexpr (WARPS_N > 1) __syncthreads();  // the token warps' shares of A
#else
    __syncthreads();            // ... everyone's; and the stage refilled next is free
#endif
    if (c + PIPE - 1 < chunks) issue(c + PIPE - 1);
    cp_async_commit();
    const unsigned char* base = stage_base(c % PIPE);
    xs = reinterpret_cast<unsigned short*>(stage_base(c % PIPE));
    const uint4* av_s = reinterpret_cast<const uint4*>(base + XS_BYTES);
    const unsigned* am_s = reinterpret_cast<const unsigned*>(base + XS_BYTES + A_FRAGS * 16);
    uint4 cur_v[WM][KSTEPS];
    unsigned cur_m[WM][KSTEPS];
    // ldmatrix's four 8 x 8 matrices of a unit: (rows 0-7, 8-15) x (columns 0-7, 8-15) are a0..a3
    const int a_row = (lane >> 3 & 1) * 128 + (lane >> 4) * 64 + (lane & 7) * 8;  // halves into the unit
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        unsigned a[4];
        ldmatrix_x4(a, reinterpret_cast<const unsigned short*>(av_s + frag(i, s) - lane) + a_row);
        cur_v[i][s] = make_uint4(a[0], a[1], a[2], a[3]);
        cur_m[i][s] = a_ok(c, i, s) ? am_s[frag(i, s)] : 0x44444444u;  // zero values: any valid metadata
      }
    multiply(c, cur_v, cur_m);
#if CLUSTER_M > 1
    spartune::cluster_arrive();  // (this chunk's fragments were consumed by the MMAs issued above)
#endif
  }
#if CLUSTER_M > 1
  spartune::cluster_wait();
#endif
  cp_async_wait<0>();
  __syncthreads();  // the reduction below reuses the stages
#else
  load_a(0);
  if (gather_regs) gather_x(0);
  else if (x_vec_ok(0)) load_x(0);
  for (int c = 0; c < chunks; ++c) {
    stage_x(c);
    __syncthreads();

    uint4 cur_v[WM][KSTEPS];
    unsigned cur_m[WM][KSTEPS];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) cur_v[i][s] = av[i][s], cur_m[i][s] = am[i][s];
    if (c + 1 < chunks) {  // in flight while this chunk multiplies
      load_a(c + 1);
      if (gather_regs) gather_x(c + 1);
      else if (x_vec_ok(c + 1)) load_x(c + 1);
    }

    multiply(c, cur_v, cur_m);
    __syncthreads();
  }

#endif

  if constexpr (WARPS_K > 1) {  // sum the K parts into the warps of part 0
    float* red = reinterpret_cast<float*>(smem);
    constexpr int PER_WARP = WM * WN * 4 * 32;
    // where K part p (>= 1) of this warp's slice leaves accumulator (i, j, e) of this lane
    auto slot = [&](int p, int i, int j, int e) {
      return ((p - 1) * WARPS_MN + warp_mn) * PER_WARP + ((i * WN + j) * 4 + e) * 32 + lane;
    };
    if (warp_k > 0) {
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            red[slot(warp_k, i, j, e)] = acc[i][j][e];
    }
    __syncthreads();
    if (warp_k > 0) return;
#pragma unroll
    for (int p = 1; p < WARPS_K; ++p)
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc[i][j][e] += red[slot(p, i, j, e)];
  }

  // epilogue: lane (g, t) holds rows g, g + 8 of each slice at tokens 2t, 2t + 1
  const spartune::Epilogue epi{out, bias, residual, M, N, son, som, srn, srm, out_code, bias_code, res_code, act, scale};
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = (mt0 + i) * 16 + g + 8 * h;
      if (m >= M) continue;
      const float b_m = epi.bias_of(m);
#pragma unroll
      for (int j = 0; j < WN; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          epi.store(m, n_cta + (warp_n * WN + j) * 8 + 2 * t + e, acc[i][j][2 * h + e], b_m);
    }
}
