"""One-off probe (issue 18): kernel table of one e2e workload, dense against a sparse pattern,
compiled with CUDA graphs, and how many epilogues the fusion pass fused.
    WORKLOAD="llama7b-layer decode N=8" PATTERN=block:64 python benchmarks/experiments/e2e_profile.py"""
import copy, os
import torch
from torch.profiler import ProfilerActivity, profile

from spartune import sparsify
from spartune.bench import e2e
from spartune import fusion

WORKLOAD = os.environ.get("WORKLOAD", "bert-base 8x512")
PATTERN = os.environ.get("PATTERN", "block:64")
work = next(w for w in e2e.WORKLOADS if w.name == WORKLOAD)
dense, call = work.build(torch.float16, "cuda", False)
fused = []
real = fusion.fuse_epilogues
fusion.fuse_epilogues = lambda g: fused.append(real(g)) or fused[-1]


def table(model, name, reps=10):
    torch._dynamo.reset()
    fns = e2e._variants(model, call, work, "cuda", True)
    fn = fns["compile+graph" if work.graphed else "compile+graphs"]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ms = e2e.time_ms(fn, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            c, t = rows.get(ev.name[:80], (0, 0.0))
            rows[ev.name[:80]] = (c + 1, t + ev.device_time_total)
    total = sum(t for _, t in rows.values()) / reps
    print(f"\n== {name}: {ms * 1e3:.1f} us per call (wall), kernels {total:.1f} us; fusions {fused}")
    for k, (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:int(os.environ.get('ROWS', 14))]:
        print(f"{t / reps:8.1f} us {c / reps:5.1f}x  {k}")


with torch.no_grad():
    table(dense, "dense")
    for pattern in PATTERN.split(","):
        sp = copy.deepcopy(dense)
        sparsify(sp, pattern, 0.9)
        call(sp)()
        table(sp, f"{pattern} 90%")
