"""Probe (session 18): 16-token ring configs that the 112 KB cap leaves out at ksteps 4 (bm 16,
8 warps splitting K 8 ways: 159 KB), at ksteps 2 (and 1), clustered or not, beside the space's best
16-token config, at N = 16; cold replays, every output checked in float64."""
import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

SHAPES = {"llama7b-up": (11008, 4096), "llama7b-down": (4096, 11008), "llama13b-up": (13824, 5120)}
CONFIGS = [K.Config(bm, 16, w, wk, ks, stages=3, cluster_m=cm)
           for bm, w, wk in ((16, 8, 8), (32, 8, 4), (16, 4, 4), (32, 8, 8), (16, 8, 4), (32, 8, 2))
           for ks in (1, 2) for cm in (1, 2, 4)] + [
           K.Config(32, 16, 8, 4, 4, stages=3, cluster_m=2), K.Config(32, 16, 4, 2, 4, stages=3, cluster_m=4),
           K.Config(32, 16, 8, 2, 4, stages=3, cluster_m=4)] + [
           K.Config(16, 16, 8, 8, 4, stages=3, cluster_m=cm) for cm in (1, 4)]  # 159 KB: one CTA an SM
for name, (M, Kd) in SHAPES.items():
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    x = torch.randn(16, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(16, M, device="cuda", dtype=torch.float16)
    ref = F.linear(x.double(), A.to_dense().double())
    dense = cold_replay(lambda: F.linear(x, w)) * 1e6
    rows = []
    for cfg in CONFIGS:
        if K._warp_grid(cfg) is None:
            continue
        try:
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, err
            t = cold_replay(lambda: K.launch(A, x, out, cfg)) * 1e6
        except Exception as e:  # noqa: BLE001
            print(name, cfg.bm, cfg.num_warps, cfg.warps_k, cfg.ksteps, cfg.cluster_m, "failed", str(e)[:100])
            continue
        rows.append((t, cfg))
        print(f"{name} bm{cfg.bm} w{cfg.num_warps} wk{cfg.warps_k} ks{cfg.ksteps} cm{cfg.cluster_m} "
              f"smem {K._smem_bytes(cfg) // 1024} KB: {t:.1f} us", flush=True)
    t, cfg = min(rows, key=lambda r: r[0])
    print(f"BEST {name}: dense {dense:.1f} us, {t:.1f} us ({dense / t:.2f}x) bm{cfg.bm} w{cfg.num_warps} "
          f"wk{cfg.warps_k} ks{cfg.ksteps} cm{cfg.cluster_m}", flush=True)
