"""How much of a compiled dense model's GPU time the sparsifiable layers take (Amdahl's bound on
the sparse model's speedup): kernel times of 3 forwards by torch.profiler, split into the
matrix products (GEMM and 1x1-convolution kernels) and the rest."""
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from spartune.bench import e2e

GEMM = re.compile(r"gemm|nvjet|xmma|conv2d_c1_k1|cutlass|sm90_|_mm_|ampere_", re.I)
ATTN = re.compile(r"sdpa|flash|fmha|attention", re.I)
for name in sys.argv[1:] or ["bert-base 8x512", "mobilenet-v1 batch 64"]:
    w = next(w for w in e2e.WORKLOADS if w.name == name)
    torch.manual_seed(0)
    model, call = w.build(torch.float16, "cuda", False)
    with torch.no_grad():
        f = call(torch.compile(model))
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                f()
            torch.cuda.synchronize()
    parts = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    names = {}
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.self_device_time_total <= 0:
            continue
        kind = "attention" if ATTN.search(e.key) else "gemm" if GEMM.search(e.key) else "other"
        parts[kind] += e.self_device_time_total / 3
        names[e.key[:70]] = (kind, e.self_device_time_total / 3)
    total = sum(parts.values())
    print(f"== {name}: {total:.0f} us of kernels per forward: " +
          ", ".join(f"{k} {v:.0f} us ({v / total:.0%})" for k, v in parts.items()))
    for k, (kind, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"   {kind:<9} {us:8.1f} us  {k}")
