"""The stream's first loads at the kernel's entry (session 40, after csr_phase_stamps.py): at 7B up
a warp's first chunk comes back ~3.4 us into a ~9.2 us CTA, after two DRAM round trips in a row
(the offsets that say where its stream starts, then the chunk) and x's staging. Here every block of
the sliced ELL copy starts at a fixed pitch (PITCH words, the longest block's size; the gaps are
never read), so a warp knows its stream's start without the offsets and issues its first DEPTH
loads right after x's, at entry; the offsets (still read for the lengths) only mask them. GPW = 1
configs only (a warp's groups at a pitch are no longer one stream). Cold replay, in turns, 5 rounds,
median; outputs against the kernel's bit for bit.
    python benchmarks/experiments/csr_head_first_ab.py [--compile]"""
import json
import math
import os
import statistics
import sys

import numpy as np
import torch

from spartune.kernels import spmm_csr_smem as S
from spartune.kernels.cuda import compiler as C

VARIANT = "spmm_csr_smem_head.cu"
CASES = [  # (name, M, K, N, config): session 39's fp16 picks with one group a warp
    ("qkv", 4096, 4096, 8, S.Config(nt=8, ks=4096, warps=32, gpw=1, qs=1, kw=32)),
    ("7B up", 11008, 4096, 1, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("7B up", 11008, 4096, 8, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("7B up", 11008, 4096, 16, S.Config(nt=16, ks=4096, warps=24, gpw=1, qs=1, kw=4)),
    ("7B down", 4096, 11008, 8, S.Config(nt=8, ks=3680, warps=24, gpw=1, qs=1, kw=8)),
    ("70B up", 28672, 8192, 8, S.Config(nt=8, ks=8192, warps=28, gpw=1, qs=1, kw=4)),
]


def edited(src: str, old: str, new: str) -> str:
    assert src.count(old) == 1, old
    return src.replace(old, new)


def variant_source() -> str:
    src = (C.SRC_DIR / "spmm_csr_smem.cu").read_text()
    x_loads = "  if (X_ONE_BATCH && x_rows) load_x_batch(xv, warp, x_rows == 2, x, N, K, sxn, n0, k0, lane);\n"
    src = edited(src, x_loads, x_loads +
                 "  static_assert(GPW == 1, \"a pitch per block: one group a warp\");\n"
                 "  const uint4* head = words + (static_cast<long long>(s) * groups + g0) * (PITCH / 4) + q * R + t;\n"
                 "  uint4 buf[DEPTH];  // the stream's first chunks at once: their place needs no offsets\n"
                 "#pragma unroll\n"
                 "  for (int j = 0; j < DEPTH; ++j)\n"
                 "    buf[j] = gn > 0 ? load_stream(head + (kw + j * KW) * QS * R) : make_uint4(0, 0, 0, 0);\n")
    src = edited(src, "  const uint4* wp = words + base + q * R + t;\n", "  const uint4* wp = head;\n")
    src = edited(src, "  uint4 buf[DEPTH];\n#pragma unroll\n  for (int j = 0; j < DEPTH; ++j) buf[j] = c + j * KW < total ? "
                      "load_stream(wp + (c + j * KW) * STEP) : zero;\n",
                 "#pragma unroll\n  for (int j = 0; j < DEPTH; ++j) if (c + j * KW >= total) buf[j] = zero;\n")
    return src


def variant_instance(config, pitch, dtype=torch.float16):
    base = S._instance(config, dtype, S.half_sums(config, True))
    return C.Instance(VARIANT, base.kernel, tuple(sorted((*base.defines, ("PITCH", pitch)))), base.arch_specific,
                      base.options)


def pitched(ell, config):
    """The blocks of the copy at a fixed pitch (the longest block's size, in words), zeros between
    and past the end (the entry's loads may run past a short block)."""
    sizes = (ell.offsets[1:] - ell.offsets[:-1]).long()
    pitch = int(sizes.max())
    _, R, _ = S._team(config)
    tail = 3 * config.kw * config.qs * R * 4 + 4 * 1024
    words = torch.zeros(sizes.numel() * pitch + tail, dtype=torch.int32, device=ell.words.device)
    block = torch.repeat_interleave(torch.arange(sizes.numel(), device=sizes.device), sizes)
    within = torch.arange(ell.words.numel(), device=sizes.device) - ell.offsets[:-1].long()[block]
    words[block * pitch + within] = ell.words
    return words, pitch


def compile_only():
    (C.SRC_DIR / VARIANT).write_text(variant_source())
    try:
        for name, M, K, N, cfg in CASES:
            inst = variant_instance(cfg, 4 * 32 * 128)
            opts = C.program_options(inst, C.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(C.SRC_DIR)]
            try:
                C.nvrtc_compile(C.read_sources(inst.template)[inst.template], opts)
                print("ok", name, N, flush=True)
            except Exception as e:  # noqa: BLE001
                print("FAILED", name, N, str(e)[:3000], flush=True)
    finally:
        (C.SRC_DIR / VARIANT).unlink()


def main():
    import spartune as st
    from spartune.kernels import cuda
    from spartune.kernels.cuda.epilogue import epilogue_args, or_null
    from spartune.tune.measure import cold_replay

    (C.SRC_DIR / VARIANT).write_text(variant_source())
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
        words, pitch = pitched(ell, cfg)
        grid = (S._row_blocks(ell.groups, cfg), ell.slices, math.ceil(N / cfg.nt))
        split = ell.slices > 1
        _, R, _ = S._team(cfg)
        ws = torch.empty(grid[2] * ell.slices * ell.groups * R * cfg.nt, dtype=torch.float32, device="cuda") \
            if split else None
        counters = torch.zeros(grid[0] * grid[2], dtype=torch.int32, device="cuda") if split else None
        kernel = cuda.load(variant_instance(cfg, pitch), x.device)
        out2 = torch.empty_like(out)
        head = kernel.prepare(grid, (32 * cfg.warps, 1, 1), words, ell.offsets, ell.rows, x, out2, or_null(None),
                              or_null(None), or_null(ws), or_null(counters), M, N, K, ell.groups, ell.slices,
                              np.int64(x.stride(0)), np.int64(x.stride(1)), S._x_rows(x),
                              *epilogue_args(out2, None, None, None, 1.0), shmem=S._smem_bytes(cfg))
        plain(x, out, None, None)
        head()
        torch.cuda.synchronize()
        err = ((out2.double() - ref).norm() / ref.norm()).item()
        same = bool(torch.equal(out, out2))
        times = {"kernel": [], "head": []}
        for _ in range(5):
            times["kernel"].append(cold_replay(lambda: plain(x, out, None, None)) * 1e6)
            times["head"].append(cold_replay(head) * 1e6)
        r = dict(case=name, N=N, config=str(cfg), pitch_words=pitch, words=ell.words.numel(), err=err, same=same,
                 **{f"{k}_us": statistics.median(v) for k, v in times.items()})
        r["change"] = r["head_us"] / r["kernel_us"] - 1
        rows.append(r)
        print(f"{name:7s} N {N:2d} kernel {r['kernel_us']:6.2f} head {r['head_us']:6.2f} us ({100 * r['change']:+.1f}%) "
              f"pitch x{pitch * ell.offsets.numel() / ell.words.numel():.2f} err {err:.1e} "
              f"{'same' if same else 'DIFFERENT'}", flush=True)
    (C.SRC_DIR / VARIANT).unlink()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "csr_head_first_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
