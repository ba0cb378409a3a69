"""Probe (session 28): what each sparse weight of a Llama-7B layer keeps (memos by key, MB) and
which backend each call key chose, after eager prefill 2048, then compiled prefill, then
decode N = 1: where resident_bytes' 705 MB for 2:4 at prefill (531 expected) comes from.
python layer_memos.py"""
import collections
import os

import torch

import spartune as st
from spartune import dispatch
from spartune.bench import e2e
from spartune.nn import resident_bytes

out_dir = os.environ.get("OUT", "out")
lines = []


def say(s):
    print(s, flush=True)
    lines.append(s)


def report(model, stage):
    say(f"== {stage}: resident {resident_bytes(model) / 2**20:.1f} MB, allocated {torch.cuda.memory_allocated() / 2**20:.1f} MB")
    total = collections.Counter()
    for name, mod in model.named_modules():
        A = getattr(mod, "weight", None)
        if not isinstance(A, st.SparseFormat):
            continue
        memo = {}
        for k, v in vars(A).items():
            if k.startswith("_") and isinstance(v, tuple) and v:
                ts = [t for t in (v[1] if isinstance(v[1], (tuple, list)) else (v[1],)) if torch.is_tensor(t)]
                if isinstance(v[1], dict):
                    ts = [t for g in v[1].values() for t in (g if isinstance(g, (list, tuple)) else [g]) if torch.is_tensor(t)]
                memo[k] = sum(t.untyped_storage().nbytes() for t in ts) / 2**20
                total[k.rstrip("0123456789_")] += memo[k]
        own = sum(t.untyped_storage().nbytes() for t in (A.values, A.idx)) / 2**20 if hasattr(A, "idx") else 0
        wst = dispatch._states.get(A)
        chosen = [] if wst is None else [(k[0], k[3:8], c.backend, getattr(c.config, "bm", None), round(c.measured * 1e6, 1)
                                          if c.measured else None) for k, c in wst.chosen.items()]
        say(f"  {name:24s} own {own:6.1f} MB memos {', '.join(f'{k}={v:.1f}' for k, v in memo.items())} chosen {chosen}")
    say(f"  totals by memo kind: {dict((k, round(v, 1)) for k, v in total.items())}")


torch.manual_seed(0)
build = e2e._llama(2048, decode=False)
model, call = build(torch.float16, "cuda", False)
st.sparsify(model, "2:4")
with torch.no_grad():
    call(model)()
    torch.cuda.synchronize()
    report(model, "eager prefill 2048")
    torch._dynamo.reset()
    call(torch.compile(model))()
    torch.cuda.synchronize()
    report(model, "compiled prefill 2048")
open(os.path.join(out_dir, "layer_memos.txt"), "w").write("\n".join(lines) + "\n")
