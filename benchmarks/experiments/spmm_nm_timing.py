"""spmm_nm (mma.sp.sync 2:4) against cuBLAS F.linear on the dense weight, fp16, L2 flushed
(cold_replay): every config of the family's space, the best kept. Prints a markdown table."""
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_nm as K
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem


def weight(m, k, dtype):
    w = torch.randn(m, k, device="cuda")
    keep = torch.rand(m, k // 4, 4, device="cuda").argsort(-1) < 2
    return (w.reshape(m, k // 4, 4) * keep).reshape(m, k).to(dtype)


def main(shapes):
    dtype = torch.float16
    print("| M x K | N | dense us | spmm_nm us | x dense | best config | configs |")
    print("|---|---|---|---|---|---|---|")
    for m, k, n in shapes:
        w = weight(m, k, dtype)
        A = st.NM.from_dense(w, 2, 4)
        x = torch.randn(n, k, device="cuda", dtype=dtype)
        out = torch.empty(n, m, device="cuda", dtype=dtype)
        dense = cold_replay(lambda: F.linear(x, w))
        prob = Problem("linear", "2:4", m, k, n, "float16", A.stats())
        best = None
        configs = K.space(prob)
        for cfg in configs:
            t = cold_replay(lambda: K.launch(A, x, out, cfg), rep_ms=10)
            if best is None or t < best[0]:
                best = (t, cfg)
        err = ((out.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item()
        K.launch(A, x, out, best[1])
        err = ((out.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item()
        print(f"| {m}x{k} | {n} | {dense * 1e6:.1f} | {best[0] * 1e6:.1f} | {dense / best[0]:.2f} | "
              f"bm={best[1].bm} bn={best[1].bn} w={best[1].num_warps} wk={best[1].warps_k} (rel err {err:.1e}) | {len(configs)} |",
              flush=True)


if __name__ == "__main__":
    shapes = [(4096, 4096, 1), (4096, 4096, 16), (4096, 4096, 2048), (11008, 4096, 16), (11008, 4096, 2048)]
    if len(sys.argv) > 1:
        shapes = shapes[: int(sys.argv[1])]
    main(shapes)
