"""Where the time of a sparse BERT-base / MobileNetV1 forward goes (torch.profiler), and what
the tuner picked per layer shape."""
import copy
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import spartune as st
from spartune.bench import e2e

name = sys.argv[1] if len(sys.argv) > 1 else "bert-base 8x512"
pattern = sys.argv[2] if len(sys.argv) > 2 else "block:64"
w = next(w for w in e2e.WORKLOADS if w.name == name)
torch.manual_seed(0)
dense, call = w.build(torch.float16, "cuda", False)
model = copy.deepcopy(dense)
st.sparsify(model, pattern, 0.9)
with torch.no_grad():
    fn = call(model)
    fn(); torch.cuda.synchronize()
    seen = set()
    for n, m in model.named_modules():
        if hasattr(m, "weight_values") and tuple(m._weight.shape) not in seen:
            seen.add(tuple(m._weight.shape))
            for tokens in (4096, 64 * 112 * 112, 64 * 56 * 56, 64 * 28 * 28, 64 * 14 * 14, 64 * 7 * 7, 2048):
                c = st.dispatch.find_choice(m._weight, tokens, "float16")
                if c is not None:
                    print(n, tuple(m._weight.shape), tokens, c)
    for f, label in ((call(dense), "dense"), (fn, "sparse")):
        f(); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                f()
            torch.cuda.synchronize()
        print(f"== {label}")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
