"""Probe (session 18): 16-token ring configs with more stages (4, 5) where they fit two CTAs an SM
(ncu: the 16-token configs keep half the warps and bytes in flight of the 8-token ones), clustered
or not, beside the space's best 16-token configs, at N = 16; cold replays, outputs checked in float64."""
import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

SHAPES = {"llama7b-up": (11008, 4096), "llama7b-down": (4096, 11008), "llama13b-up": (13824, 5120)}
CONFIGS = [c for c in (K.Config(bm, 16, w, wk, ks, stages=st, cluster_m=cm)
                        for bm, w, wk in ((16, 8, 8), (16, 8, 4), (16, 4, 2), (16, 4, 4), (32, 8, 4), (32, 8, 8))
                        for ks in (2, 4) for st in (4, 5) for cm in (1, 2, 4))
           if K._warp_grid(c) is not None and K._smem_bytes(c) <= K.PIPE_SMEM] + [
           K.Config(32, 16, 8, 4, 4, stages=3, cluster_m=2), K.Config(32, 16, 4, 2, 4, stages=3, cluster_m=4),
           K.Config(32, 16, 8, 2, 4, stages=3, cluster_m=4)]
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
              f"st{cfg.stages} smem {K._smem_bytes(cfg) // 1024} KB: {t:.1f} us", flush=True)
    t, cfg = min(rows, key=lambda r: r[0])
    print(f"BEST {name}: dense {dense:.1f} us, {t:.1f} us ({dense / t:.2f}x) bm{cfg.bm} w{cfg.num_warps} "
          f"wk{cfg.warps_k} ks{cfg.ksteps} st{cfg.stages} cm{cfg.cluster_m}", flush=True)
