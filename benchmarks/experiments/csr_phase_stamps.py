"""What a CTA's ~10 us of CSR decode at 7B is made of (lead 2 of session 39). csr_smem with clock
stamps per warp (a copy of the template written next to it, the stamps inserted by text; the kernel
otherwise unchanged): entry, offsets back, x staged (the CTA barrier), the stream's first chunk
back, the stream's end, the end (after the KW sums and the epilogue). %globaltimer at entry and end
places the CTAs on one time line (the launch's ramp, the tail); %clock64 splits a warp's life.
Each stamp that follows a load first stores the loaded register (a store waits for it), so the
clock is read after the data came. The stamps' buffer travels in the workspace slot (one K slice: the
kernel never reads it). Cold (L2 written over before each call), 15 calls, medians.
    python benchmarks/experiments/csr_phase_stamps.py [--compile]"""
import json
import math
import os
import statistics
import sys

import numpy as np
import torch

from spartune.kernels import spmm_csr_smem as S
from spartune.kernels.cuda import compiler as C

STAMPED = "spmm_csr_smem_stamps.cu"
SLOTS = 10  # g0, g_end, c0 .. c5, smid, scratch
CASES = [  # (name, M, K, N, config): session 39's fp16 picks (slices = 1)
    ("qkv", 4096, 4096, 8, S.Config(nt=8, ks=4096, warps=32, gpw=1, qs=1, kw=32)),
    ("7B up", 11008, 4096, 1, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("7B up", 11008, 4096, 8, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("70B up", 28672, 8192, 8, S.Config(nt=8, ks=8192, warps=28, gpw=1, qs=1, kw=4)),
]

HELPERS = r"""
__device__ __forceinline__ unsigned long long stamp_gt() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t; }
__device__ __forceinline__ unsigned long long stamp_clk() {
  unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) :: "memory"); return t; }
__device__ __forceinline__ unsigned stamp_smid() {
  unsigned t; asm volatile("mov.u32 %0, %%smid;" : "=r"(t)); return t; }
// the clock after `dep` arrived: the store waits for its register
#define STAMP_AFTER(var, dep) do { if (lane == 0) *stamp_scratch = (dep); var = stamp_clk(); } while (0)
"""

EDITS = [  # (anchor, text inserted after it)
    ('#include "epilogue.cuh"\n', HELPERS),
    ("  const int gn = max(0, min(GPW, groups - g0));  // and how many (maybe none)\n",
     "  unsigned long long* stamp_p = reinterpret_cast<unsigned long long*>(ws) +\n"
     "      ((static_cast<long long>(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * WARPS + warp) * 10;\n"
     "  volatile unsigned* stamp_scratch = reinterpret_cast<volatile unsigned*>(stamp_p + 9);\n"
     "  const unsigned long long sg0 = stamp_gt(), sc0 = stamp_clk();\n"
     "  unsigned long long sc1 = 0, sc2 = 0, sc3 = 0, sc4 = 0;\n"),
    ("  const int total = gn > 0 ? (__shfl_sync(0xffffffffu, start, gn) - base) / (R * QS) : 0;  // steps\n",
     "  STAMP_AFTER(sc1, static_cast<unsigned>(total));\n"),
    ("  __syncthreads();\n  // the stream's first loads only now",
     None),  # handled below: after the barrier
    ("  for (int j = 0; j < DEPTH; ++j) buf[j] = c + j * KW < total ? load_stream(wp + (c + j * KW) * STEP) : zero;\n",
     "  STAMP_AFTER(sc3, buf[0].x);\n"),
    ("    for (; c < end; c += KW) {  // the group's last steps, the registers back in order\n",
     None),  # handled below: after the loop
    ("#if CK > 1\n  // the cluster's slices meet",
     None),  # handled below: before it
]


def stamped_source() -> str:
    src = (C.SRC_DIR / "spmm_csr_smem.cu").read_text()
    for anchor, text in EDITS:
        assert src.count(anchor) == 1, anchor
        if text is not None:
            src = src.replace(anchor, anchor + text)
    src = src.replace("  __syncthreads();\n  // the stream's first loads only now",
                      "  __syncthreads();\n  sc2 = stamp_clk();\n  // the stream's first loads only now")
    tail = "#pragma unroll\n    for (int i = 0; i < TPL; ++i) {  // the row's K parts meet in lane q = 0\n"
    assert src.count(tail) == 1
    src = src.replace(tail, "    STAMP_AFTER(sc4, __float_as_uint(acc[0]));\n" + tail)
    end = "#if CK > 1\n  // the cluster's slices meet"
    src = src.replace(end, "  if (lane == 0) {\n"
                           "    const unsigned long long sc5 = stamp_clk();\n"
                           "    stamp_p[0] = sg0; stamp_p[1] = stamp_gt(); stamp_p[2] = sc0; stamp_p[3] = sc1;\n"
                           "    stamp_p[4] = sc2; stamp_p[5] = sc3; stamp_p[6] = sc4; stamp_p[7] = sc5;\n"
                           "    stamp_p[8] = stamp_smid();\n  }\n" + end)
    return src


def stamped_instance(config, dtype=torch.float16):
    base = S._instance(config, dtype, S.half_sums(config, True))
    return C.Instance(STAMPED, base.kernel, base.defines, base.arch_specific, base.options)


def compile_only():
    (C.SRC_DIR / STAMPED).write_text(stamped_source())
    try:
        for name, M, K, N, cfg in CASES:
            inst = stamped_instance(cfg)
            opts = C.program_options(inst, C.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(C.SRC_DIR)]
            try:
                C.nvrtc_compile(C.read_sources(inst.template)[inst.template], opts)
                print("ok", name, N, flush=True)
            except Exception as e:  # noqa: BLE001
                print("FAILED", name, N, str(e)[:3000], flush=True)
    finally:
        (C.SRC_DIR / STAMPED).unlink()


def q(v, p):
    return float(np.percentile(v, p))


def main():
    import spartune as st
    from spartune.kernels import cuda
    from spartune.kernels.cuda.epilogue import epilogue_args, or_null
    from spartune.tune.measure import _evict_buffer, cold_replay

    (C.SRC_DIR / STAMPED).write_text(stamped_source())
    evict = _evict_buffer()
    rows = []
    for name, M, K, N, cfg in CASES:
        g = torch.Generator(device="cuda").manual_seed(M + K + N)
        w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = w * (torch.rand(M, K, device="cuda", generator=g) < 0.1)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
        ref = x.double() @ w.double().T
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        plain = S.bind(A, x, out, cfg)
        ell = S.layout(A, cfg)
        grid = (S._row_blocks(ell.groups, cfg), ell.slices, math.ceil(N / cfg.nt))
        assert ell.slices == 1
        stamps = torch.zeros(grid[0] * grid[1] * grid[2] * cfg.warps * SLOTS, dtype=torch.int64, device="cuda")
        kernel = cuda.load(stamped_instance(cfg), x.device)
        out2 = torch.empty_like(out)
        prepared = kernel.prepare(grid, (32 * cfg.warps, 1, 1), ell.words, ell.offsets, ell.rows, x, out2, or_null(None),
                                  or_null(None), stamps, or_null(None), M, N, K, ell.groups, ell.slices,
                                  np.int64(x.stride(0)), np.int64(x.stride(1)), S._x_rows(x),
                                  *epilogue_args(out2, None, None, None, 1.0), shmem=S._smem_bytes(cfg))
        plain(x, out, None, None)
        prepared()
        torch.cuda.synchronize()
        err = ((out2.double() - ref).norm() / ref.norm()).item()
        assert torch.equal(out, out2), "the stamped kernel computes otherwise"
        t_plain = statistics.median(cold_replay(lambda: plain(x, out, None, None)) for _ in range(3)) * 1e6
        t_stamped = statistics.median(cold_replay(prepared) for _ in range(3)) * 1e6
        reps = []
        for _ in range(15):
            evict.fill_(1)
            stamps.zero_()
            prepared()
            torch.cuda.synchronize()
            s = stamps.view(-1, SLOTS).cpu().numpy().astype(np.float64)
            s = s[s[:, 0] > 0]  # warps with groups (all write; guard anyway)
            g0, ge = s[:, 0] - s[:, 0].min(), s[:, 1] - s[:, 0].min()
            c = s[:, 2:8]
            ghz = np.median((c[:, 5] - c[:, 0]) / np.maximum(s[:, 1] - s[:, 0], 1))
            ph = np.diff(c, axis=1) / ghz  # ns: offsets, staging, first chunk, stream, tail
            cta = np.arange(len(s)) // cfg.warps
            cta_start = np.array([g0[cta == b].min() for b in range(cta.max() + 1)])
            last = cta[np.argmax(ge)]
            ticks = np.diff(np.unique(s[:, 0]))
            reps.append(dict(
                span=ge.max(), start_p50=q(cta_start, 50), start_max=cta_start.max(), end_min=ge.min(),
                end_p50=q(ge, 50), ghz=ghz, tick=float(ticks.min()) if len(ticks) else 0.0,
                **{f"{p}_mean": ph[:, i].mean() for i, p in enumerate(("offsets", "staging", "first", "stream", "tail"))},
                **{f"{p}_max": ph[:, i].max() for i, p in enumerate(("offsets", "staging", "first", "stream", "tail"))},
                **{f"{p}_last": ph[cta == last][:, i].mean()
                   for i, p in enumerate(("offsets", "staging", "first", "stream", "tail"))},
                last_start=cta_start[last], sms=int(len(np.unique(s[:, 8])))))
        r = dict(case=name, N=N, config=str(cfg), ctas=grid[0], err=err, plain_us=t_plain, stamped_us=t_stamped,
                 **{k: statistics.median(d[k] for d in reps) for k in reps[0]})
        rows.append(r)
        print(f"{name:7s} N {N:2d} ctas {grid[0]:3d} plain {t_plain:6.2f} stamped {t_stamped:6.2f} us | span "
              f"{r['span'] / 1e3:5.2f} start p50/max {r['start_p50'] / 1e3:4.2f}/{r['start_max'] / 1e3:4.2f} "
              f"end min/p50 {r['end_min'] / 1e3:5.2f}/{r['end_p50'] / 1e3:5.2f} | {r['ghz']:.2f} GHz tick "
              f"{r['tick']:.0f} ns | mean offs {r['offsets_mean']:4.0f} stage {r['staging_mean']:4.0f} first "
              f"{r['first_mean']:4.0f} stream {r['stream_mean']:5.0f} tail {r['tail_mean']:4.0f} | last CTA start "
              f"{r['last_start']:4.0f} offs {r['offsets_last']:4.0f} stage {r['staging_last']:4.0f} first "
              f"{r['first_last']:4.0f} stream {r['stream_last']:5.0f} tail {r['tail_last']:4.0f}", flush=True)
    (C.SRC_DIR / STAMPED).unlink()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "csr_phase_stamps.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
