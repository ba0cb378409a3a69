"""One-off probe (issue 18): where the host time of a compiled (no CUDA graphs) sparse BERT goes.
    python benchmarks/experiments/compile_host.py"""
import cProfile, copy, pstats, time
import torch
from spartune import sparsify
from spartune.bench import bert

torch.manual_seed(0)
c = bert.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
dense = bert.BertEncoder(c).to("cuda", torch.float16).eval()
ids = torch.randint(0, c.vocab_size, (8, 128), device="cuda")
sp = copy.deepcopy(dense)
sparsify(sp, "block:64", 0.9)
with torch.no_grad():
    for name, model in (("dense", dense), ("sparse", sp)):
        torch._dynamo.reset()
        f = torch.compile(model)
        for _ in range(3):
            f(ids)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            f(ids)
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - t) / 10 * 1e3:.2f} ms per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        f(ids)
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(45)
