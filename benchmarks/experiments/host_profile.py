"""Where the host time of a SparseLinear call goes at N = 2048 (block:64 90%, Llama-7B up):
eager calls and the operator route, under cProfile."""
import cProfile
import pstats
import time

import torch

import spartune as st
from spartune import library

torch.set_grad_enabled(False)
w = torch.randn(11008, 4096, device="cuda", dtype=torch.float16)
layer = st.SparseLinear(st.sparsify_weight(w, "block:64", 0.9)).cuda()
x = torch.randn(2048, 4096, device="cuda", dtype=torch.float16)
layer(x)
tensors = [getattr(layer, f"weight_{n}") for n in layer._weight_names]
for name, fn in (("eager", lambda: layer(x)),
                 ("operator", lambda: library.linear_op(x, tensors, layer.weight.spec, None))):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        fn()
    print(name, f"host {(time.perf_counter() - t) / 50 * 1e6:.1f} us/call", flush=True)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)
