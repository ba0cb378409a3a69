"""Probe (session 21): csr_smem at N = 8-16, the tuned configs timed cold (fp16, 90%) with variants
of the template side by side: `main` (the tree's), `nooffs` (each warp's start computed from a fixed
stride instead of loaded from `offsets`: the time without that dependent round trip; results
wrong), `balanced` (the stride's start, yet after the dependent load), `nostage` (x not staged). Then a one-element kernel (the fixed cost
of a call under this timing)."""
import json
import os
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
    "7b-down:8": ((4096, 11008), Cf(8, 4096, 24, 1, 1, 8)), "7b-down:16": ((4096, 11008), Cf(16, 4096, 24, 1, 1, 4)),
    "70b-up:8": ((28672, 8192), Cf(8, 8192, 28, 1, 1, 4)), "70b-up:16": ((28672, 8192), Cf(16, 4096, 28, 4, 1, 4, 2)),
}


def variants():
    rot = (SRC_DIR / "spmm_csr_smem.cu").read_text()
    out = {"main": rot}
    load = "start = offsets[s * groups + g0 + lane] / 4;"
    assert load in rot
    out["nooffs"] = rot.replace(load, "start = (s * groups + g0 + lane) * (OFFS_STRIDE / 4);")
    out["balanced"] = rot.replace(load, "start = (s * groups + g0 + lane) * (OFFS_STRIDE / 4) + (offsets[s * groups + g0 + lane] == -7);")
    out["nostage"] = rot.replace("  if (x_rows) {", "  if (1) {\n  } else if (x_rows) {", 1)
    files = {}
    for name, src in out.items():
        (SRC_DIR / f"spmm_csr_smem_{name}.cu").write_text(src)
        files[name] = f"spmm_csr_smem_{name}.cu"
    return files


def main():  # noqa: C901
    files = variants()
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
        expect = (x.double() @ w.double().T)
        times = {}
        for name, fname in files.items():
            defines = dict(shipped(cfg, torch.float16).defines)
            ell = K.layout(A, cfg)
            if name in ("nooffs", "balanced"):
                _, R, _ = K._team(cfg)
                unit = R * cfg.qs * 4
                defines["OFFS_STRIDE"] = ell.words.numel() // (ell.offsets.numel() - 1) // unit * unit
            inst = C.instance(fname, "spmm_csr_smem", defines, arch_specific=cfg.ck > 1)
            K._kernels.clear()
            K._instance = lambda c, d, inst=inst: inst  # noqa: E731
            fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            if name == "main":
                err = ((out.double() - expect).norm() / expect.norm()).item()
                assert err < 1e-2, (case, name, err)
            times[name] = min(cold_replay(fn) for _ in range(3))
        K._instance = shipped
        rows.append(dict(case=case, config=str(cfg), **{k: v for k, v in times.items()}))
        print(f"{case:<11} " + "  ".join(f"{k} {v*1e6:6.1f}" for k, v in times.items()) + " us", flush=True)
    z = torch.zeros(1, device="cuda")
    rows.append(dict(case="one-element kernel", s=min(cold_replay(lambda: z.add_(1)) for _ in range(3))))
    print(f"one-element kernel: {rows[-1]['s']*1e6:.1f} us", flush=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "stage_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
