"""Probe (session 22): csr_smem's warp rows dealt over the row blocks (DEAL 1, the tree's default)
against consecutive warp rows per CTA (DEAL 0, main before), on session 21's tuned configs, cold,
90% uniform random, fp16 and bf16; both variants timed in turns (three rounds, best of each) and
both checked against the float64 product."""
import json
import os
import sys

import torch

import spartune as st
from spartune.kernels import cuda as C
from spartune.kernels import spmm_csr_smem as K
from spartune.tune.measure import cold_replay

Cf = K.Config
CASES = {
    "qkv:8": ((4096, 4096), Cf(8, 4096, 16, 1, 1, 16)), "qkv:16": ((4096, 4096), Cf(16, 4096, 16, 1, 1, 8)),
    "7b-up:8": ((11008, 4096), Cf(8, 4096, 24, 1, 1, 8)), "7b-up:16": ((11008, 4096), Cf(16, 4096, 24, 1, 1, 4)),
    "7b-down:8": ((4096, 11008), Cf(8, 4096, 24, 1, 1, 8)), "7b-down:16": ((4096, 11008), Cf(16, 4096, 24, 1, 1, 4)),
    "70b-up:8": ((28672, 8192), Cf(8, 8192, 28, 1, 1, 4)),
    "70b-up:16": ((28672, 8192), Cf(16, 4096, 28, 2, 1, 4, 2, 16)),
}


def main():
    shipped = K._instance
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for case in sys.argv[1:] or list(CASES):
            (M, Kd), cfg = CASES[case]
            N = int(case.split(":")[1])
            w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
            w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
            A = st.CSR.from_dense(w)
            x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            expect = x.double() @ w.double().T
            fns = {}
            for name, deal in (("consecutive", 0), ("dealt", 1)):
                defines = dict(shipped(cfg, dtype).defines, DEAL=deal)
                inst = C.instance("spmm_csr_smem.cu", "spmm_csr_smem", defines, arch_specific=cfg.ck > 1)
                K._kernels.clear()
                K._instance = lambda c, d, inst=inst: inst  # noqa: E731
                out.fill_(float("nan"))
                K.launch(A, x, out, cfg)
                torch.cuda.synchronize()
                err = ((out.double() - expect).norm() / expect.norm()).item()
                assert err < 1e-2 and not out.isnan().any(), (case, name, err)
                kernel = K._kernel(cfg, dtype, x.device)
                fns[name] = (kernel, lambda: K.launch(A, x, out, cfg))
            times = {name: float("inf") for name in fns}
            for _ in range(3):
                for name, (kernel, fn) in fns.items():
                    K._kernels.clear()
                    K._kernels[(cfg, dtype, x.device.index)] = kernel
                    times[name] = min(times[name], cold_replay(fn))
            K._instance = shipped
            K._kernels.clear()
            rows.append(dict(case=case, dtype=str(dtype), config=str(cfg), **times))
            print(f"{case:<11} {str(dtype)[6:]:<9} " + "  ".join(f"{k} {v*1e6:6.1f}" for k, v in times.items())
                  + f" us  ({times['dealt'] / times['consecutive'] - 1:+.1%})", flush=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "deal_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
