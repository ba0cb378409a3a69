"""Is CSR decode at 7B up bound per SM (bytes in flight) or by the DRAM as a whole? The tuned
csr_smem pick (nt 8, ks 4096, 24 warps, kw 8: 96 rows a CTA) leaves 17 of 132 SMs idle at M = 11008
(115 CTAs). Same config, K = 4096, 90%, fp16, cold: M = 8448 (88 CTAs), 11008 (115), 12672 (132),
13824 (144). If the time grows with M (the bytes), the DRAM binds and balancing rows over all SMs
gains nothing; if 12672 takes about what 11008 does, the idle SMs are lost bandwidth (~15%)."""
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_csr_smem as S
from spartune.tune.measure import cold_replay

cfg = S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8, ck=1, tpl=8)
rows = []
for M in (8448, 11008, 12672, 13824):
    g = torch.Generator(device="cuda").manual_seed(M)
    w = torch.randn(M, 4096, device="cuda", dtype=torch.float16, generator=g)
    w = w * (torch.rand(M, 4096, device="cuda", generator=g) < 0.1)
    A = st.CSR.from_dense(w)
    for N in (1, 8):
        x = torch.randn(N, 4096, device="cuda", dtype=torch.float16, generator=g)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        run = S.bind(A, x, out, cfg)
        run(x, out, None, None)
        torch.cuda.synchronize()
        ref = x.double() @ w.double().T
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ell = S.layout(A, cfg)
        words = ell.words.numel() * ell.words.element_size()
        t = min(cold_replay(lambda: run(x, out, None, None)) for _ in range(3))
        d = min(cold_replay(lambda: F.linear(x, w)) for _ in range(3))
        r = dict(M=M, N=N, ctas=S._row_blocks(ell.groups, cfg), us=t * 1e6, dense_us=d * 1e6, words_MB=words / 1e6,
                 GBps=words / t / 1e9, err=err)
        rows.append(r)
        print(f"M {M:6d} N {N} ctas {r['ctas']:4d} ours {t*1e6:6.2f} us  dense {d*1e6:6.1f}  words {words/1e6:5.1f} MB "
              f"{words/t/1e12:5.2f} TB/s  x{d/t:4.2f}  err {err:.1e}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "csr_sm_fill_probe.json"), "w"), indent=1)
