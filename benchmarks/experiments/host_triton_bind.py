"""Probe (session 44): host time of one decode call by route; a Triton launch replayed through
its CompiledKernel.run (bound args) against jit's run and against a CUDA-graph replay."""
import time, copy
import torch
import torch.nn.functional as F
import triton
from triton.runtime.jit import JITFunction
import spartune as st
from spartune import ops, library, dispatch
from spartune.backends import direct_launches
from spartune.kernels import registry
from spartune.nn import SparseLinear
from spartune.bench.weights import random_weight


def host_us(fn, calls=100, bound_us=200):
    fn(); torch.cuda.synchronize()
    s = []
    for _ in range(15):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * bound_us * 2e3))
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        s.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    s.sort()
    return s[len(s) // 2], s[0]


def report(name, fn, **kw):
    m, b = host_us(fn, **kw)
    print(f"{name:>44}: host us median / best {m:6.1f} / {b:6.1f}", flush=True)


torch.manual_seed(0)
dev = "cuda"
x = torch.randn(1, 4096, device=dev, dtype=torch.float16)
W = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
report("F.linear 4096^2", lambda: F.linear(x, W))
report("torch.empty (1, 4096)", lambda: torch.empty((1, 4096), dtype=torch.float16, device=dev))
gen = torch.Generator(dev).manual_seed(0)
_, A = random_weight("csr", 4096, 4096, 0.1, dtype=torch.float16, device=dev, gen=gen)
y = st.linear(x, A)
sta = dispatch._states[A]
print("csr pick", list(sta.chosen.values()))
report("ops.linear csr (graphed)", lambda: ops.linear(x, A))
fam = registry.by_name("csr")
from spartune.kernels.spmm_csr import Config as CsrConfig
cfg = CsrConfig(path="ell", block_m=4, block_n=1, block_k=512, num_warps=4, num_stages=2, group_m=8, split_k=1)
out = torch.empty(1, 4096, device=dev, dtype=torch.float16)
TRITON = dev == "cuda"
if TRITON: report("csr family.launch (jit run)", lambda: fam.launch(A, x, out, cfg))
with direct_launches():
    report("ops.linear csr (direct)", lambda: ops.linear(x, A))
def triton_part():
    global JITFunction
    rec = []
    orig = JITFunction.run
    def recording(self, *args, grid, warmup, **kwargs):
        k = orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        device = triton.runtime.driver.active.get_current_device()
        binder = self.device_caches[device][4]
        bound_args, _, _ = binder(*args, **kwargs)
        g = grid(bound_args) if callable(grid) else grid
        rec.append((k, tuple(g) + (1,) * (3 - len(g)), list(bound_args.values())))
        return k
    JITFunction.run = recording
    fam.launch(A, x, out, cfg)
    JITFunction.run = orig
    print("recorded", len(rec), "launches")
    ck, g, args = rec[0]
    fn_, pm = ck.function, ck.packed_metadata
    run = ck.run
    xi = [i for i, a in enumerate(args) if a is x]
    oi = [i for i, a in enumerate(args) if a is out]
    print("x at", xi, "out at", oi, "n args", len(args))
    get_stream = torch._C._cuda_getCurrentRawStream
    def bound(xn, on):
        a = list(args)
        for i in xi: a[i] = xn
        for i in oi: a[i] = on
        run(g[0], g[1], g[2], get_stream(0), fn_, pm, None, None, None, *a)
        return on
    def bound_fixed():
        run(g[0], g[1], g[2], get_stream(0), fn_, pm, None, None, None, *args)
    report("bound ck.run (list subst)", lambda: bound(x, out))
    report("bound ck.run (fixed args)", bound_fixed)
    x2 = torch.randn(1, 4096, device=dev, dtype=torch.float16)
    o2 = torch.empty_like(out)
    bound(x2, o2); torch.cuda.synchronize()
    ref = (x2.double() @ A.to_dense().double().T)
    print("bound replay max err", float((o2.double() - ref).abs().max()))

if TRITON: triton_part()
# the operator route (what a compiled graph calls)
tl_ = A.tensor_list(); spec = A.spec
op = torch.ops.spartune.linear_nograd.default
with torch.no_grad():
    report("torch.ops.spartune.linear_nograd", lambda: op(x, tl_, spec, None, None, None, 1.0, None))
    report("library.format_of", lambda: library.format_of(tl_, spec))
# 2:4 bound CUDA launch
_, A24 = random_weight("2:4", 4096, 4096, 0.5, dtype=torch.float16, device=dev, gen=gen)
st.linear(x, A24)
report("ops.linear 2:4 (bound CUDA)", lambda: ops.linear(x, A24))
with torch.no_grad():
    report("torch.ops linear_nograd 2:4", lambda: op(x, A24.tensor_list(), A24.spec, None, None, None, 1.0, None))
# modules, eager and compiled
lin = torch.nn.Linear(4096, 4096, bias=False, device=dev, dtype=torch.float16)
slin = SparseLinear.from_linear(lin, "csr", 0.9)
print("SparseLinear:", type(slin))
x3 = x.view(1, 1, 4096)
with torch.no_grad():
    report("nn.Linear eager", lambda: lin(x3))
    if slin is not None:
        slin(x3)
        report("SparseLinear csr eager", lambda: slin(x3))
    cl = torch.compile(lin)
    report("nn.Linear compiled", lambda: cl(x3))
    if slin is not None:
        cs = torch.compile(slin)
        report("SparseLinear csr compiled", lambda: cs(x3))
