"""Probe (session 28): under torch.compile the Llama layer's 2:4 calls carry fused epilogues
(gate: silu, o/down: + residual), and the tuner picked dense for gate and o_proj there. Time the
wgmma pick with each epilogue beside cuBLAS (+ the same epilogue as torch ops), cold, and print
the tuner's choice per epilogue. python epilogue_picks.py"""
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

out_dir = os.environ.get("OUT", "out")
lines = []


def say(s):
    print(s, flush=True)
    lines.append(s)


N = 2048
torch.set_grad_enabled(False)
for name, (M, K) in (("gate 11008x4096", (11008, 4096)), ("o 4096x4096", (4096, 4096)), ("down 4096x11008", (4096, 11008))):
    torch.manual_seed(0)
    w = torch.randn(M, K, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    wd = A.to_dense()
    x = torch.randn(N, K, device="cuda", dtype=torch.float16)
    r = torch.randn(N, M, device="cuda", dtype=torch.float16)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    for epi, kw, dense in (("none", {}, lambda: F.linear(x, wd)),
                           ("silu", {"activation": "silu"}, lambda: F.silu(F.linear(x, wd))),
                           ("residual", {"residual": r}, lambda: torch.add(F.linear(x, wd), r))):
        st.linear(x, A, **kw)
        torch.cuda.synchronize()
        wst = dispatch._states[A]
        key = [k for k in wst.chosen if k[3:6] == ("bias" in kw, kw.get("activation"), "residual" in kw)][-1]
        choice = wst.chosen[key]
        times = {"dense+torch": cold_replay(dense)}
        for cfg_name, cfg in (("pick", choice.config),):
            if choice.backend == "nm":
                times[f"nm {cfg.bm}x{cfg.bn} st{cfg.stages}"] = cold_replay(
                    lambda: spmm_nm.launch(A, x, out, cfg, activation=kw.get("activation"), residual=kw.get("residual")))
        if choice.backend != "nm":  # the eager pick's config with this epilogue
            cfg0 = dispatch._states[A].chosen[[k for k in wst.chosen if k[3:6] == (False, None, False)][0]].config
            times[f"nm(no-epi pick) {cfg0.bm}x{cfg0.bn}"] = cold_replay(
                lambda: spmm_nm.launch(A, x, out, cfg0, activation=kw.get("activation"), residual=kw.get("residual")))
        say(f"{name} N={N} epilogue {epi}: choice {choice.backend} {choice.config} predicted "
            f"{choice.predicted * 1e6:.1f} measured {choice.measured * 1e6:.1f} us; cold us: "
            + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in times.items()))
os.makedirs(out_dir, exist_ok=True)
open(os.path.join(out_dir, "epilogue_picks.txt"), "w").write("\n".join(lines) + "\n")
