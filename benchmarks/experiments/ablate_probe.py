"""Probe (session 20): where csr_smem's time goes at N = 8-16. The tuned configs timed cold (fp16, 90%)
as built and with parts compiled out: 1 = x not staged (the loop reads stale shared memory),
2 = no arithmetic (each chunk's words xor-ed into one accumulator: the loads stay, no shared
loads, conversions or FMAs), 3 = both (the words' stream, the sums' exit and the epilogue).
Writes an ablated copy of the template next to it (on the throwaway device tree only)."""
import json
import os
import re
import sys

import torch

import spartune as st
from spartune.kernels import cuda as C
from spartune.kernels import spmm_csr_smem as K
from spartune.kernels.cuda.compiler import SRC_DIR
from spartune.tune.measure import cold_replay

Cf = K.Config
CASES = {
    "qkv:8": ((4096, 4096), Cf(8, 4096, 16, 1, 1, 16)), "qkv:16": ((4096, 4096), Cf(16, 4096, 16, 1, 1, 8)),
    "7b-up:8": ((11008, 4096), Cf(8, 4096, 24, 1, 1, 8)), "7b-up:16": ((11008, 4096), Cf(16, 4096, 24, 1, 1, 4)),
    "70b-up:16": ((28672, 8192), Cf(16, 4096, 28, 4, 1, 4, 2)), "7b-down:16": ((4096, 11008), Cf(16, 4096, 24, 1, 1, 4)),
}


def write_ablated():
    src = (SRC_DIR / "spmm_csr_smem.cu").read_text()
    a = src.replace("  if (x_rows) {", "  if (ABLATE & 1) {\n  } else if (x_rows) {")
    body = re.search(r"(__device__ __forceinline__ void fma_chunk\(.*?\) \{\n)(.*?)(\n\})", a, re.S)
    a = a[:body.end(1)] + ("#if ABLATE & 2\n  acc[0] += __uint_as_float((w.x ^ w.y ^ w.z ^ w.w) & 0x007fffffu);\n#else\n"
                           + body.group(2) + "\n#endif") + a[body.start(3):]
    assert a.count("ABLATE") == 2, "the template changed: update the probe"
    (SRC_DIR / "spmm_csr_smem_ablate.cu").write_text(a)


def main():
    write_ablated()
    shipped = K._instance
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for case in sys.argv[1:] or list(CASES):
        (M, Kd), cfg = CASES[case]
        N = int(case.split(":")[1])
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        K._instance, K._kernels = shipped, {}
        times = {}
        for ablate in (0, 1, 2, 3):
            defines = dict(shipped(cfg, torch.float16).defines)
            inst = C.instance("spmm_csr_smem_ablate.cu", "spmm_csr_smem", {**defines, "ABLATE": ablate},
                              arch_specific=cfg.ck > 1)
            K._kernels.clear()
            K._instance = lambda c, d, inst=inst: inst  # noqa: E731
            fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            times[ablate] = cold_replay(fn)
        rows.append(dict(case=case, config=str(cfg), **{f"t{k}": v for k, v in times.items()}))
        print(f"{case:<11} {str(cfg):<60} full {times[0]*1e6:6.1f}  no-stage {times[1]*1e6:6.1f}  "
              f"no-math {times[2]*1e6:6.1f}  stream-only {times[3]*1e6:6.1f} us", flush=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "ablate_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
