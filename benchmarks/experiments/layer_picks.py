"""Probe (session 29): the tuner's picks for each sparse call of the Llama-7B layer at eager prefill
2048 (2:4 and 64:2:8) and the eager layer's time beside dense's, in turns (5 rounds)."""
import copy
import time

import torch

from spartune import dispatch
from spartune.bench.e2e import _llama
from spartune.nn import sparsify

torch.set_grad_enabled(False)
torch.manual_seed(0)
model, call = _llama(2048, decode=False)(torch.float16, "cuda", False)


def ms(fn, n=10):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


for pattern in ("2:4", "64:2:8"):
    m = copy.deepcopy(model)
    sparsify(m, pattern)
    call(m)()
    torch.cuda.synchronize()
    for A, st in list(dispatch._states.items()):
        for key, c in st.chosen.items():
            print(pattern, tuple(A.shape), key[:6] if isinstance(key, tuple) else key, "->", c.backend,
                  getattr(c, "config", None), f"{c.measured * 1e6:.1f} us" if c.measured else "", flush=True)
    rounds = [(ms(call(model)), ms(call(m))) for _ in range(5)]
    print(pattern, "eager layer ms dense / sparse per round:", [(round(a, 3), round(b, 3)) for a, b in rounds], flush=True)
    dispatch._states.clear()
    del m
