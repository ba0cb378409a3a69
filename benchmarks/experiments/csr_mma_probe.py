"""csr_mma's first GPU run: correctness on odd shapes and epilogues, then cold times of a few
configs beside cuBLAS (fp16, L2 flushed). Prints a table; JSON in $OUT/csr_mma_probe.json."""
import itertools, json, os, sys, time
import torch
import torch.nn.functional as F
import spartune as st
from spartune.kernels import spmm_csr_mma as K
from spartune.tune.measure import cold_replay

OUT = os.environ.get("OUT", "out"); os.makedirs(OUT, exist_ok=True)
gen = torch.Generator(device="cuda").manual_seed(0)
res = {"correct": [], "timing": []}

def weight(M, Kd, d, dt):
    w = torch.randn(M, Kd, device="cuda", dtype=dt, generator=gen)
    return w * (torch.rand(M, Kd, device="cuda", generator=gen) < d)

fails = 0
for (M, Kd, N, d), dt, cfg, epi in itertools.product(
        [(77, 130, 7, 0.3), (300, 1000, 1, 0.1), (4096, 4096, 16, 0.1), (1000, 520, 33, 0.2)],
        [torch.float16, torch.bfloat16],
        [K.Config(128, 16, 8, 1, 4, 2), K.Config(64, 8, 4, 1, 3, 3), K.Config(256, 32, 8, 2, 6, 1)],
        [False, True]):
    w = weight(M, Kd, d, dt)
    w[3] = 0
    w[5] = torch.randn(Kd, device="cuda", dtype=dt, generator=gen)  # a row with every column
    A = st.CSR.from_dense(w)
    xs = torch.randn(N, Kd + 3, device="cuda", dtype=dt, generator=gen)
    x = xs[:, 1:Kd + 1] if epi else xs[:, :Kd]  # strided / misaligned x with the epilogue
    out = torch.full((N, M), float("nan"), device="cuda", dtype=dt)
    bias = torch.randn(M, device="cuda", dtype=dt, generator=gen) if epi else None
    resid = torch.randn(N, M, device="cuda", dtype=torch.float32, generator=gen) if epi else None
    try:
        K.launch(A, x, out, cfg, bias=bias, activation="gelu" if epi else None, residual=resid)
        torch.cuda.synchronize()
        ref = x.double() @ w.double().T
        if epi:
            ref = F.gelu(ref + bias.double()) + resid.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(out).all()) and err < (2e-2 if dt == torch.bfloat16 else 2e-3)
    except Exception as e:  # noqa: BLE001
        err, ok = str(e)[:200], False
    fails += not ok
    res["correct"].append(dict(M=M, K=Kd, N=N, d=d, dt=str(dt), cfg=str(cfg), epi=epi, err=err, ok=ok))
    if not ok:
        print("FAIL", res["correct"][-1], flush=True)
print(f"correctness: {len(res['correct']) - fails} ok, {fails} failed", flush=True)

SHAPES = [("qkv", 4096, 4096), ("7b-up", 11008, 4096), ("7b-down", 4096, 11008), ("70b-up", 28672, 8192)]
cases = [(s, n, d) for d in (0.1, 0.2) for s in SHAPES for n in (8, 16, 32)]
cases = [c for c in cases if c[2] == 0.1 or c[1] <= 16]
if len(sys.argv) > 1:
    cases = cases[: int(sys.argv[1])]
t0 = time.time()
for (name, M, Kd), N, d in cases:
    dt = torch.float16
    w = weight(M, Kd, d, dt)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=dt, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=dt)
    dense = cold_replay(lambda: F.linear(x, w))
    nt = min(32, max(8, 1 << (N - 1).bit_length()))
    cfgs = [K.Config(128, nt, 8, 1, 6, 2), K.Config(128, nt, 8, 1, 4, 2), K.Config(256, nt, 8, 1, 4, 1),
            K.Config(128, nt, 8, 1, 6, 1)] + ([K.Config(128, nt, 8, 2, 6, 2)] if nt == 32 else [])
    rows = []
    ref = x.double() @ w.double().T
    for cfg in cfgs:
        try:
            fn = lambda: K.launch(A, x, out, cfg)
            fn(); torch.cuda.synchronize()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            rows.append((cold_replay(fn), str(cfg), err))
        except Exception as e:  # noqa: BLE001
            rows.append((float("inf"), str(cfg), str(e)[:100]))
        K.release_unused(A, [])
    best = min(rows)
    r = dict(shape=name, N=N, d=d, dense_us=dense * 1e6, best_us=best[0] * 1e6, best=best[1], err=best[2],
             x_dense=dense / best[0], all=[(t * 1e6, c, e) for t, c, e in rows])
    res["timing"].append(r)
    print(json.dumps({k: v for k, v in r.items() if k != "all"}), flush=True)
json.dump(res, open(os.path.join(OUT, "csr_mma_probe.json"), "w"), indent=1)
print(f"\n{'shape':<9}{'N':>4}{'dens':>6}{'cuBLAS':>8}{'mma':>8}{'x':>6}  best config")
for r in res["timing"]:
    print(f"{r['shape']:<9}{r['N']:>4}{r['d']:>6}{r['dense_us']:>8.1f}{r['best_us']:>8.1f}{r['x_dense']:>6.2f}  {r['best']}")
print(f"{time.time() - t0:.0f} s")
