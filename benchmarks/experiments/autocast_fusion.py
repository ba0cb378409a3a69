"""Probe (session 41): a float32 Llama-7B MLP block, h + down(silu(gate(h)) * up(h)), CSR 90%,
compiled under torch.autocast(fp16) and replayed from a CUDA graph at decode: the fusion passes
on (gate/up merged on their fp16 copies, the residual in down's epilogue) against off, beside
the dense block (fp32 weights under autocast, and fp16 weights). In turns, L2 evicted.
    python benchmarks/experiments/autocast_fusion.py [--n 1 8]"""
import argparse
import json
import os

import torch
import torch._inductor.config as inductor
import torch.nn.functional as F
from torch import nn

import spartune as st
from spartune.bench.e2e import captured
from spartune.tune.measure import interleaved


class MLP(nn.Module):
    def __init__(self, d=4096, hidden=11008):
        super().__init__()
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, h):
        return h + self.down(F.silu(self.gate(h)) * self.up(h))


def graphed(model, h, fuse: bool):
    os.environ["SPARTUNE_FUSE_EPILOGUES"] = "1" if fuse else "0"
    torch._dynamo.reset()
    with inductor.patch(pre_grad_custom_pass=None, force_disable_caches=True):
        compiled = torch.compile(model, fullgraph=True)

        def call():
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                return compiled(h)
        return captured(call)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    dense = MLP().cuda().eval()
    sparse = MLP().cuda().eval()
    sparse.load_state_dict(dense.state_dict())
    st.sparsify(sparse, "csr", 0.9)
    with torch.no_grad():  # the dense blocks hold the pruned weights
        for name in ("gate", "up", "down"):
            getattr(dense, name).weight.copy_(getattr(sparse, name).weight.to_dense())
    half = MLP().cuda().half().eval()
    half.load_state_dict({k: v.half() for k, v in dense.state_dict().items()})
    rows = []
    for n in args.n:
        h = torch.randn(n, 4096, device="cuda", dtype=torch.float16)
        fns = {"dense fp32 autocast": graphed(dense, h, True), "dense fp16": graphed(half, h, True),
               "sparse fused": graphed(sparse, h, True), "sparse unfused": graphed(sparse, h, False)}
        w = {k: getattr(sparse, k).weight.to_dense().double() for k in ("gate", "up", "down")}
        h64 = h.double()
        ref = h64 + (F.silu(h64 @ w["gate"].T) * (h64 @ w["up"].T)) @ w["down"].T
        errs = {k: float((f().double() - ref).norm() / ref.norm()) for k, f in fns.items()}
        t = interleaved(fns, rounds=15)
        row = {"n": n, **{f"{k} us": round(t[k] * 1e6, 2) for k in fns}, "errors": errs}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "autocast_fusion.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
