"""Probe (session 27): GPU memory a sparsified Llama-7B decoder layer holds after its calls are
tuned (decode N = 1 and 8, prefill 2048), against the dense layer, and what each weight keeps
beside its own tensors (memos by key). python weight_memory.py"""
import collections
import os

import torch

import spartune as st
from spartune.bench import models

out_dir = os.environ.get("OUT", "out")
lines = []


def say(s):
    print(s)
    lines.append(s)


def memos(model):
    by_key = collections.Counter()
    seen = set()

    def walk(obj, key):
        if torch.is_tensor(obj) and obj.layout != torch.strided:  # torch's CSR / BSR
            for part in (obj.values(), obj.crow_indices(), obj.col_indices()):
                walk(part, key)
        elif torch.is_tensor(obj):
            p = obj.untyped_storage().data_ptr()
            if p not in seen:
                seen.add(p)
                by_key[key] += obj.untyped_storage().nbytes()
        elif isinstance(obj, (tuple, list)):
            for u in obj:
                walk(u, key)
        elif isinstance(obj, dict):
            for u in obj.values():
                walk(u, key)
        elif hasattr(obj, "__dict__") and hasattr(obj, "shape"):
            for k, u in obj.__dict__.items():
                walk(u, key if key != "format" else ("format" if not k.startswith("_") else k))
    for mod in model.modules():
        if isinstance(mod, st.nn.SparseLinear):
            walk(mod.weight, "format")
    return by_key


import argparse  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--history", action="store_true", help="record allocations; list the live ones by stack (2:4 only)")
args = ap.parse_args()
hidden, inter, heads = 4096, 11008, 32
cases = (("dense", None), ("2:4", None)) if args.history else (("dense", None), ("2:4", None), ("64:2:8", None), ("csr", 0.9))
for pattern, sparsity in cases:
    if args.history and pattern == "2:4":
        torch.cuda.memory._record_memory_history(max_entries=200000)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = models.LlamaDecoderLayer(hidden, inter, heads).to("cuda", torch.float16).eval()
    if pattern != "dense":
        st.sparsify(model, pattern, sparsity)
    torch.cuda.synchronize()
    after_sparsify = torch.cuda.memory_allocated() - base
    with torch.no_grad():
        for n, decode in ((1, True), (8, True), (2048, False)):
            x = torch.randn(1, n, hidden, device="cuda", dtype=torch.float16)
            if decode:
                cache = models.KVCache(1, heads, 2048 + n, hidden // heads, dtype=torch.float16, device="cuda")
                model(x, torch.arange(2048, 2048 + n, device="cuda"), cache)
                del cache
            else:
                model(x, torch.arange(n, device="cuda"))
            del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after_calls = torch.cuda.memory_allocated() - base
    import gc  # noqa: E402
    gc.collect()
    say(f"  (after gc.collect: {(torch.cuda.memory_allocated() - base) / 2**20:.1f} MB)")
    if pattern == "dense":
        dense_mb = after_calls / 2**20
    say(f"{pattern:8s} after sparsify {after_sparsify / 2**20:8.1f} MB, after tuned calls {after_calls / 2**20:8.1f} MB "
        f"({after_calls / 2**20 / dense_mb:.2f}x the dense layer)")
    for key, b in memos(model).most_common(12):
        say(f"    {key:40s} {b / 2**20:8.1f} MB")
    if args.history and pattern == "2:4":
        snap = torch.cuda.memory._snapshot()
        live = collections.Counter()
        sizes = collections.defaultdict(list)
        for seg in snap["segments"]:
            for blk in seg["blocks"]:
                if blk["state"] == "active_allocated":
                    frames = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in blk.get("frames", [])
                              if "spartune" in f["filename"] or "benchmarks" in f["filename"]]
                    live[" < ".join(frames[:9]) or "?"] += blk["size"]
                    sizes[" < ".join(frames[:9]) or "?"].append(blk["size"] >> 20)
        for where, b in live.most_common(15):
            say(f"  live {b / 2**20:8.1f} MB  blocks (MB) {sorted(sizes[where])[:12]}  {where}")
    del model
open(os.path.join(out_dir, "weight_memory.txt"), "w").write("\n".join(lines) + "\n")
