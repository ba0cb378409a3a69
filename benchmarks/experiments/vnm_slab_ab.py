"""V:N:M decode at 8-16 tokens: GATHER 2 (kept columns' x^T rows copied one by one through the map)
against the SLAB probe (spmm_nm.cu with EDITS below applied: each stage holds the x^T rows of the
chunk's whole M-column blocks, copied with no offsets, and ldmatrix.trans reads each lane's kept row;
LOG, session 36, lead 2). Timed in turns by cold replay; each output checked against the float64
reference and the other's.
    python benchmarks/experiments/vnm_slab_ab.py            # the GPU A/B
    python benchmarks/experiments/vnm_slab_ab.py --compile  # NVRTC only (CPU: see scripts/compile_check.py)
The probe writes its kernel into the package's src/ while it runs (removed at exit)."""
import atexit
import json
import os
import statistics
import sys

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda import compiler as CC

# spmm_nm.cu's text -> the SLAB variant: (anchor, replacement) pairs, each anchor found once
EDITS = [
    ('''constexpr int XT_STRIDE = ((BN / 8) | 1) * 8;
''',
     '''constexpr int XT_STRIDE = ((BN / 8) | 1) * 8;
// SLAB (probe, GATHER 2 only): each stage holds the x^T rows of the chunk's whole M-column blocks (MB
// columns a block, 4 kept), copied as contiguous rows with no offsets, plus one zero row; the B
// fragments are read by ldmatrix.trans at each lane's kept row (LOG, session 36)
#ifndef SLAB
#define SLAB 0
#endif
#if SLAB
#ifndef MB
#error "SLAB needs MB, the V:N:M block's columns"
#endif
constexpr int SLAB_ROWS = KC / 4 * MB;
static_assert(GATHER == 2, "SLAB stages GATHER 2's x^T rows");
constexpr int XS_BYTES = (SLAB_ROWS + 1) * XT_STRIDE * 2;
#else
'''),
    ('''constexpr int XS_BYTES = GATHER == 4 ? KC * 2 : GATHER >= 2 ? KC * XT_STRIDE * 2 : BN * XS_STRIDE * 2;
''',
     '''constexpr int XS_BYTES = GATHER == 4 ? KC * 2 : GATHER >= 2 ? KC * XT_STRIDE * 2 : BN * XS_STRIDE * 2;
#endif
'''),
    ('''        xs[n * XS_STRIDE + kk] = val;
      }
    }
  };

''',
     '''        xs[n * XS_STRIDE + kk] = val;
      }
    }
  };

#if SLAB
  int cur_off[KSTEPS], nxt_off[KSTEPS];  // this lane's kept columns' offsets, chunk c and c + 1
#endif
'''),
    ('''        b[0] = q.x, b[1] = q.y, b[2] = q.z, b[3] = q.w;
''',
     '''        b[0] = q.x, b[1] = q.y, b[2] = q.z, b[3] = q.w;
#elif SLAB  // lane l: kept column ks * 32 + l of the chunk, at its M-block's rows (none: the zero row)
        const int off = cur_off[s];
        const int row = off >= 0 ? ((ks * 32 + lane) >> 2) * MB + off : SLAB_ROWS;
        ldmatrix_x4_trans(b, xs + row * XT_STRIDE + (warp_n * WN + j) * 8);
'''),
    ('''      next_two[q] = v < KC / 2 && k < map_pitch ? *reinterpret_cast<const unsigned short*>(cols + k) : ~0u;
    }
  };
  load_cols(0);
''',
     '''      next_two[q] = v < KC / 2 && k < map_pitch ? *reinterpret_cast<const unsigned short*>(cols + k) : ~0u;
    }
  };
  load_cols(0);
#elif SLAB
  auto load_lane_offs = [&](int chunk) {
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) nxt_off[s] = offset_of(chunk * KC + (s * WARPS_K + warp_k) * 32 + lane);
  };
  load_lane_offs(0);
  {  // the zero row of every stage (cp.async never writes it; the loop's first barrier orders it)
    for (int e = tid; e < PIPE * XT_STRIDE; e += THREADS)
      reinterpret_cast<unsigned short*>(stage_base(e / XT_STRIDE))[SLAB_ROWS * XT_STRIDE + e % XT_STRIDE] = 0;
  }
'''),
    ('''    }
    load_cols(chunk + 1);
''',
     '''    }
    load_cols(chunk + 1);
#elif SLAB  // x^T rows r0 .. r0 + SLAB_ROWS - 1, this tile's tokens (past x or its tokens: zeros)
    {
      const int r0 = chunk * (KC / 4) * MB;
      constexpr int VECS = SLAB_ROWS * (BN / 8);
#pragma unroll
      for (int q = 0; q < (VECS + THREADS - 1) / THREADS; ++q) {
        const int v = tid + q * THREADS;
        if (VECS % THREADS == 0 || v < VECS) {
          const int r = v / (BN / 8), t8 = (v % (BN / 8)) * 8;
          const bool in = r0 + r < kx && n_cta + t8 < sxn;
          cp_async16(xs_s + r * XT_STRIDE + t8, in ? x + (long long)(r0 + r) * sxk + n_cta + t8 : x, in ? 16 : 0);
        }
      }
    }
'''),
    ('''        cur_m[i][s] = a_ok(c, i, s) ? am_s[frag(i, s)] : 0x44444444u;  // zero values: any valid metadata
      }
''',
     '''        cur_m[i][s] = a_ok(c, i, s) ? am_s[frag(i, s)] : 0x44444444u;  // zero values: any valid metadata
      }
#if SLAB
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) cur_off[s] = nxt_off[s];
    if (c + 1 < chunks) load_lane_offs(c + 1);  // (a chunk's work ahead of its use)
#endif
'''),
]


def slab_source() -> str:
    text = (CC.SRC_DIR / "spmm_nm.cu").read_text()
    for old, new in EDITS:
        if text.count(old) != 1:
            raise RuntimeError(f"spmm_nm.cu changed: the SLAB edit's anchor is not found once: {old[:60]!r}")
        text = text.replace(old, new)
    return text


SLAB_SRC = CC.SRC_DIR / "spmm_nm_slab.cu"
SLAB_SRC.write_text(slab_source())
atexit.register(lambda: SLAB_SRC.unlink(missing_ok=True))

C = K.Config
SHAPES = {"7b-up": (11008, 4096), "7b-down": (4096, 11008), "13b-up": (13824, 5120), "70b-up": (28672, 8192)}
# (pattern, N, shape, configs): the tuned GATHER 2 picks of session 36 and neighbours with fewer K steps
# a chunk (the slab's stage is larger)
CASES = [("64:2:8", 16, "7b-up", [C(32, 16, 8, 2, stages=3), C(32, 16, 4, 2, stages=3), C(32, 16, 4, 1, stages=3)]),
         ("64:2:8", 16, "7b-down", [C(32, 8, 8, 4, stages=3), C(32, 16, 8, 2, stages=3), C(32, 16, 8, 4, stages=3)]),
         ("64:2:8", 16, "13b-up", [C(64, 16, 4, 2, stages=3), C(64, 16, 4, 1, stages=3)]),
         ("64:2:8", 16, "70b-up", [C(64, 16, 4, 1, stages=3), C(64, 16, 8, 2, stages=3)]),
         ("64:2:8", 8, "7b-up", [C(32, 8, 4, 2, stages=3), C(32, 8, 8, 4, stages=3)]),
         ("128:2:8", 16, "7b-up", [C(32, 16, 8, 2, stages=3), C(64, 16, 4, 2, stages=3)])]
_instance, _smem = K._instance, K._mma_smem_bytes
MODE = {"slab": False, "mb": 8}


def instance(config, dtype, gather=0, act=0, res=False):
    inst = _instance(config, dtype, gather, act, res)
    if MODE["slab"] and gather == 2:
        return cuda.instance("spmm_nm_slab.cu", "spmm_nm", {**dict(inst.defines), "SLAB": 1, "MB": MODE["mb"]},
                             arch_specific=inst.arch_specific)
    return inst


def smem_bytes(config, vnm, n=0, k=0):
    if not (MODE["slab"] and vnm and K.mma_gather(config, n) == 2):
        return _smem(config, vnm, n, k)
    kc = 32 * config.ksteps * config.warps_k
    slab = (kc // 4 * MODE["mb"] + 1) * ((config.bn // 8) | 1) * 8 * 2
    wm, wn = K._warp_grid(config)
    frags = config.num_warps // wn * (config.bm // 16 // wm) * config.ksteps * 32
    return max(config.stages * (slab + frags * 20), (config.warps_k - 1) * config.bm * config.bn * 4)


K._instance, K._mma_smem_bytes = instance, smem_bytes


def bound(A, x, out, cfg, slab):
    MODE["slab"], MODE["mb"] = slab, A.m
    K._kernels.clear()
    try:
        run = K.bind(A, x, out, cfg)
    finally:
        MODE["slab"] = False
        K._kernels.clear()
    return lambda: run(x, out, None, None)


def compile_only():
    for pattern, n, _, configs in CASES:
        MODE["mb"] = int(pattern.split(":")[2])
        for cfg in configs:
            MODE["slab"] = True
            inst = instance(cfg, torch.float16, 2)
            smem = smem_bytes(cfg, True, n, 4096)
            MODE["slab"] = False
            opts = CC.program_options(inst, CC.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(CC.SRC_DIR)]
            try:
                cubin = CC.nvrtc_compile(CC.read_sources(inst.template)[inst.template], opts)
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {pattern} {cfg}: {str(e)[-300:]}", flush=True)
                continue
            print(f"ok {len(cubin):7d} B smem {smem // 1024} KB (GATHER 2: {smem_bytes(cfg, True, n, 4096) // 1024}) {pattern} {cfg}", flush=True)


def main():
    from spartune.prune import sparsify_weight
    from spartune.tune.measure import cold_replay

    rows = []
    for pattern, n, shape, configs in CASES:
        M, Kd = SHAPES[shape]
        A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), pattern)
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        ref = x.double() @ A.to_dense().double().t()
        for cfg in configs:
            outs = {s: torch.full((n, M), float("nan"), device="cuda", dtype=torch.float16) for s in (False, True)}
            try:
                calls = {s: bound(A, x, outs[s], cfg, s) for s in (False, True)}
            except Exception as e:  # noqa: BLE001 (a config past shared memory)
                print(f"{pattern} N={n} {shape} {cfg}: {type(e).__name__}: {e}", flush=True)
                continue
            for call in calls.values():
                call()
            errs = {s: ((o.double() - ref).abs().max() / ref.abs().max()).item() for s, o in outs.items()}
            times = {s: [] for s in calls}
            for _ in range(3):
                for s, call in calls.items():
                    times[s].append(cold_replay(call) * 1e6)
            row = dict(pattern=pattern, n=n, shape=shape, config=str(cfg), gather2_us=statistics.median(times[False]),
                       slab_us=statistics.median(times[True]), err_gather2=errs[False], err_slab=errs[True],
                       identical=torch.equal(outs[False], outs[True]))
            rows.append(row)
            print(f"{pattern:8} N={n:<3} {shape:8} ({cfg.bm}, {cfg.bn}, {cfg.num_warps}, {cfg.warps_k}) gather2 "
                  f"{row['gather2_us']:6.1f} slab {row['slab_us']:6.1f} ({row['slab_us'] / row['gather2_us'] - 1:+.1%}) "
                  f"err {errs[True]:.1e} identical {row['identical']}", flush=True)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(os.path.join(out, "vnm_slab_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
