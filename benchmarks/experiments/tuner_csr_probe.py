"""Probe (session 35): does fast mode's pick of csr_smem match the fastest config it measured,
timed the way the benchmarks time it? For each problem: tune through st.linear (fresh DB, fast
mode), list what the tuner measured (its brief timings) and then time, cold and in turns, the
pick and the tuner's three fastest other measured configs with family.launch."""
import json
import os
import sys

import torch

import spartune as st
from spartune.dispatch import find_choice, get_tuner
from spartune.kernels import spmm_csr_smem
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem

CASES = [("llama7b-up", 11008, 4096, 16, 0.05), ("llama7b-up", 11008, 4096, 16, 0.1),
         ("llama7b-down", 4096, 11008, 8, 0.1), ("qkv", 4096, 4096, 32, 0.05)]


def cold(fn):
    fn()
    torch.cuda.synchronize()
    return cold_replay(fn)


def main():
    out_rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    tuner = get_tuner()
    for name, M, K, N, d in CASES:
        w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
        w = w * (torch.rand(M, K, device="cuda", generator=gen) < d)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
        st.linear(x, A)
        prob = Problem("linear", "csr", M, K, N, "float16", A.stats(), device=device_name())
        rows = tuner.db.results(tuner.db.key(prob))
        measured = sorted((r for r in rows if r.get("seconds")), key=lambda r: r["seconds"])
        pick = find_choice(A, N, "float16")
        print(f"== {name} N={N} density {d}: {len(rows)} rows measured; pick {pick}", flush=True)
        for r in measured[:8]:
            print(f"   {r['backend']:10} {r['seconds']*1e6:8.1f} us  pred {r['predicted']*1e6:8.1f}  "
                  f"{json.dumps(r['config']['fields']) if r['config'] else ''}", flush=True)
        smem = [r for r in measured if r["backend"] == "csr_smem"][:4]
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        res = []
        for rnd in range(3):
            for r in smem:
                cfg = spmm_csr_smem.Config(**r["config"]["fields"])
                res.append(dict(round=rnd, config=str(cfg), tuner_s=r["seconds"],
                                cold_s=cold(lambda: spmm_csr_smem.launch(A, x, out, cfg))))
            res.append(dict(round=rnd, config="st.linear", cold_s=cold(lambda: st.linear(x, A))))
            res.append(dict(round=rnd, config="cuBLAS", cold_s=cold(lambda: torch.nn.functional.linear(x, w))))
        for r in res:
            print(f"   r{r['round']} {r['cold_s']*1e6:8.1f} us cold  tuner {r.get('tuner_s', 0)*1e6:8.1f}  {r['config']}")
        out_rows.append(dict(case=[name, M, K, N, d], pick=str(pick), measured=measured, timed=res))
        del A, w
    os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "tuner_csr_probe.json"), "w") as f:
        json.dump(out_rows, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
