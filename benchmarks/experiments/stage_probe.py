"""Probe (session 25): how fast can 128 CTAs stage the same 64 KB of x (8 tokens x 4096 fp16)
into shared memory as rows of 8 tokens? Modes (src/stage_probe.cu): 0 csr_smem's register path,
1 cp.async raw rows + on-chip transpose, 2 bulk copies (TMA) + transpose, 3 bulk copies multicast
over a cluster. Conditions: x cold (L2 flushed) or warm; the same x for every CTA or a distinct one;
with or without the stream's first three loads a thread in flight. Prints the median over launches
of the span (first start to last staged) and of the median CTA's staging time, in us.

    python benchmarks/experiments/stage_probe.py [--out DIR]
"""
import json
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from spartune.kernels import cuda  # noqa: E402
from spartune.kernels.cuda.epilogue import NULL  # noqa: E402

KS, CTAS, REPS = 4096, 128, 15


def main(out_dir=None):
    dev = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x_all = torch.randn(CTAS * 8, KS, device=dev, dtype=torch.float16, generator=gen)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    times = torch.zeros(2 * CTAS, dtype=torch.int64, device=dev)
    sink = torch.zeros(4, dtype=torch.int32, device=dev)
    results = []
    modes = [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1), (2, 0, 1), (3, 0, 2), (3, 0, 4)]
    for warps in (16, 24):
        stream = torch.randint(0, 1 << 30, (CTAS * 3 * warps * 32 * 4,), dtype=torch.int32, device=dev)
        for mode, rotate, cl in modes:
            defines = {"MODE": mode, "KS": KS, "WARPS": warps, "ROTATE": rotate, "CL": cl}
            k = cuda.load(cuda.instance("stage_probe.cu", "stage_probe", defines, arch_specific=True))
            smem = (KS + 8) * 16 + (8 * (KS * 2 + 16) if mode else 0)
            for same in (True, False):
                for cold in (True, False):
                    for with_stream in (False, True):
                        stride = 0 if same else 8 * KS
                        dump = torch.zeros(KS, 8, dtype=torch.float16, device=dev)
                        spans, meds = [], []
                        for _ in range(REPS):
                            flush.zero_()
                            if not cold:
                                x_all[: 8 if same else None].float().sum()  # x into L2, the stream stays cold
                            torch.cuda.synchronize()
                            k((CTAS, 1, 1), (warps * 32, 1, 1), x_all, np.int64(stride),
                              stream if with_stream else NULL, np.int64(3 * warps * 32),
                              times, dump, sink, np.int64(KS), shmem=smem)
                            torch.cuda.synchronize()
                            t = times.view(CTAS, 2).cpu().numpy().astype(np.float64)
                            spans.append((t[:, 1].max() - t[:, 0].min()) / 1e3)
                            meds.append(float(np.median(t[:, 1] - t[:, 0])) / 1e3)
                        ok = torch.equal(dump, x_all[:8].t().contiguous())
                        row = dict(warps=warps, mode=mode, rotate=rotate, cl=cl, same=same, cold=cold,
                                   stream=with_stream, span=statistics.median(spans),
                                   cta=statistics.median(meds), ok=ok)
                        results.append(row)
                        print(f"w{warps} mode {mode} rot {rotate} cl {cl} {'same' if same else 'dist'} "
                              f"{'cold' if cold else 'warm'} {'stream' if with_stream else '      '}: "
                              f"span {row['span']:.2f} cta {row['cta']:.2f} {'ok' if ok else 'WRONG'}", flush=True)
    if out_dir:
        json.dump(results, open(f"{out_dir}/stage_probe.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--out" else None)
