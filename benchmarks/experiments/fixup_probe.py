"""Probe (session 22): split K's fix-up by every thread of the last CTA (sum_slices, the tree's) against
the kw = 0 warps' loop (src/spmm_csr_smem_prev.cu, a copy of HEAD before it), on 7B down's tuned split-K
configs (3 x 3680, no cluster) and a cluster, cold, 90%, fp16 and bf16, in turns; outputs checked."""
import json
import os

import torch

import spartune as st
from spartune.kernels import cuda as C
from spartune.kernels import spmm_csr_smem as K
from spartune.tune.measure import cold_replay

Cf = K.Config
CASES = [(8, Cf(8, 3680, 24, 1, 1, 8)), (16, Cf(16, 3680, 24, 1, 1, 4)), (16, Cf(16, 3680, 28, 1, 1, 4, 3))]


def main():
    shipped = K._instance
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        w = torch.randn(4096, 11008, device="cuda", dtype=dtype, generator=gen)
        w = w * (torch.rand(4096, 11008, device="cuda", generator=gen) < 0.1)
        A = st.CSR.from_dense(w)
        for N, cfg in CASES:
            x = torch.randn(N, 11008, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, 4096, device="cuda", dtype=dtype)
            expect = x.double() @ w.double().T
            kernels = {}
            for name, src in (("kw0_warps", "spmm_csr_smem_prev.cu"), ("every_thread", "spmm_csr_smem.cu")):
                inst = C.instance(src, "spmm_csr_smem", dict(shipped(cfg, dtype).defines), arch_specific=cfg.ck > 1)
                kernels[name] = C.load(inst, x.device)
            times = {k: float("inf") for k in kernels}
            for r in range(4):
                for name, kernel in kernels.items():
                    K._kernels[(cfg, dtype, x.device.index)] = kernel
                    if r == 0:
                        out.fill_(float("nan"))
                        K.launch(A, x, out, cfg)
                        err = ((out.double() - expect).norm() / expect.norm()).item()
                        assert err < 1e-2 and not out.isnan().any(), (cfg, name, err)
                    else:
                        times[name] = min(times[name], cold_replay(lambda: K.launch(A, x, out, cfg)))
            K._kernels.clear()
            rows.append(dict(N=N, dtype=str(dtype), config=str(cfg), **times))
            print(f"7B down N={N:<3} {str(dtype)[6:]:<9} " + "  ".join(f"{k} {v*1e6:6.1f}" for k, v in times.items())
                  + f" us  {cfg}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "fixup_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
