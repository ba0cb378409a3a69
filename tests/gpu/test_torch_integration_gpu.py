"""spartune inside PyTorch on the GPU: a sparsified MLP compiled by inductor (fullgraph), under
CUDA graphs (mode="reduce-overhead"), and trained one step, against the float64 reference of
the pruned model, fp16 and bf16, for the patterns with GPU kernels."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spartune as st
from spartune import dispatch
from helpers import GatedMLP, finite_rel_err as rel_err, gated_mlp_reference as reference, inf_column_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_cache")]

PATTERNS = [("block:64", 0.9), ("csr", 0.9), ("2:4", None)]
DTYPES = [torch.float16, torch.bfloat16]
TOL = 2e-2


def sparse_model(pattern, sparsity, dtype, seed=0):
    torch.manual_seed(seed)
    model = GatedMLP().to("cuda", dtype).eval()
    st.sparsify(model, pattern, sparsity)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_inductor_fullgraph(pattern, sparsity, dtype):
    model = sparse_model(pattern, sparsity, dtype)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for n in (7, 64):  # a second shape: a recompile, tuned at run time
            x = torch.randn(n, 256, device="cuda", dtype=dtype)
            assert rel_err(compiled(x), reference(model, x)) < TOL


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_cuda_graphs_reduce_overhead(pattern, sparsity, dtype):
    model = sparse_model(pattern, sparsity, dtype)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for i in range(4):  # warm-up (tunes), record, then replays on new inputs
            x = torch.randn(8, 256, device="cuda", dtype=dtype)
            y = compiled(x).clone()
            assert rel_err(y, reference(model, x)) < TOL, f"call {i}"


@pytest.mark.parametrize("pattern,sparsity", [("block:64", 0.9), ("csr", 0.9)])
def test_training_step_gradients(pattern, sparsity):
    """One fp32 backward (the SDDMM kernels give the values' gradient, the transposed format
    dX) against the dense model's gradients at the stored positions."""
    model = sparse_model(pattern, sparsity, torch.float32)
    model.train().requires_grad_(True)
    x = torch.randn(96, 256, device="cuda", requires_grad=True)
    model(x).square().mean().backward()
    dense = GatedMLP().cuda()
    with torch.no_grad():
        for name, m in model.named_children():
            getattr(dense, name).weight.copy_(m.weight.to_dense())
        dense.down.bias.copy_(model.down.bias)
    xd = x.detach().clone().requires_grad_(True)
    dense(xd).square().mean().backward()
    assert rel_err(x.grad, xd.grad.double()) < 5e-3
    for name, m in model.named_children():
        expect = m.weight.gather(getattr(dense, name).weight.grad)
        assert rel_err(m.weight_values.grad, expect.double()) < 5e-3, name
    assert rel_err(model.down.bias.grad, dense.down.bias.grad.double()) < 5e-3


@pytest.mark.parametrize("pattern,sparsity", [("block:64", 0.9), ("csr", 0.9)])
def test_eager_decode_calls(pattern, sparsity):
    """Eager decode calls (cached launches): new inputs each call, outputs held by the caller
    never overwritten, and an in-place update of the values seen by the next call."""
    model = sparse_model(pattern, sparsity, torch.float16)
    with torch.no_grad():
        held = []
        for i in range(6):
            x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
            y = model(x)
            assert rel_err(y, reference(model, x)) < TOL, f"call {i}"
            held.append((x, y))
        for i, (x, y) in enumerate(held):  # six outputs held at once: each still its own call's
            assert rel_err(y, reference(model, x)) < TOL, f"held output {i}"
        model.up.weight_values.mul_(-0.5)
        x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
        assert rel_err(model(x), reference(model, x)) < TOL, "after an in-place update"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_epilogue_fusion_under_inductor(pattern, sparsity, dtype, act, monkeypatch):
    """h + down(act(up(h))): the pass moves act into up's kernel and the residual into down's
    (no bias); the compiled block matches the float64 reference of the pruned block."""
    from spartune import fusion

    torch.manual_seed(0)
    up, down = nn.Linear(256, 704).to("cuda", dtype), nn.Linear(704, 256, bias=False).to("cuda", dtype)
    block = nn.ModuleDict(dict(up=up, down=down)).eval()
    st.sparsify(block, pattern, sparsity)
    fn = getattr(F, act)
    counted = []
    real = fusion.fuse_epilogues
    monkeypatch.setattr(fusion, "fuse_epilogues", lambda g: counted.append(real(g)) or counted[-1])
    import torch._inductor.config as inductor

    with torch.no_grad(), inductor.patch(force_disable_caches=True):
        compiled = torch.compile(lambda h: h + block.down(fn(block.up(h))), fullgraph=True)
        h = torch.randn(3, 40, 256, device="cuda", dtype=dtype)
        y = compiled(h)
    wu, wd = block.up.weight.to_dense().double(), block.down.weight.to_dense().double()
    expect = h.double() + fn(h.double() @ wu.T + block.up.bias.double()) @ wd.T
    assert counted == [2]
    assert rel_err(y, expect) < TOL


# (the block's dtype, the autocast dtype or None)
PROLOGUE_DTYPES = [(torch.float16, None), (torch.bfloat16, None), (torch.float32, torch.float16),
                   (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("dtype,autocast", PROLOGUE_DTYPES, ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_prologue_fusion_in_a_separable_block_under_cuda_graphs(pattern, sparsity, dtype, autocast, monkeypatch):
    """MobileNet's block, depthwise 3x3 + bias + ReLU then a sparse pointwise convolution + ReLU,
    compiled with CUDA graphs: the pass moves the depthwise bias and ReLU into the SpMM's load
    (a pass of its own before the kernels that do not fuse it); the output matches the float64
    reference of the pruned block, on a second input too (replayed). Under autocast (a float32
    block) the depthwise convolution runs in the autocast dtype, so linear_cast's cast of x
    changes nothing and its fp32 bias and ReLU move all the same."""
    import torch._inductor.config as inductor

    from spartune import fusion

    torch.manual_seed(0)
    c, out = 96, 160
    block = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.ReLU(inplace=True), nn.Conv2d(c, out, 1),
                          nn.ReLU(inplace=True)).to("cuda", dtype).eval()
    st.sparsify(block, pattern, sparsity)
    counted = []
    real = fusion.fuse_prologues
    monkeypatch.setattr(fusion, "fuse_prologues", lambda g: counted.append(real(g)) or counted[-1])
    runs_in = autocast or dtype

    def expect(x):
        dw = block[0]
        h = F.relu(F.conv2d(x.double(), dw.weight.double(), dw.bias.double(), padding=1, groups=c))
        h = h.to(runs_in).double()  # the rounding of the kernel's load
        w = block[2].weight.to_dense().double()
        return F.relu(torch.einsum("bchw,oc->bohw", h, w) + block[2].bias.double()[:, None, None])

    with torch.no_grad(), torch.autocast("cuda", dtype=autocast or torch.float16, enabled=autocast is not None), \
            inductor.patch(force_disable_caches=True):
        compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
        for seed in range(3):
            x = torch.randn(4, c, 14, 14, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(seed))
            x = x.to(memory_format=torch.channels_last)
            y = compiled(x)
            assert y.dtype == runs_in and rel_err(y, expect(x)) < TOL, seed
    assert counted == [1]


@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_a_first_call_with_nan_and_inf_tokens(pattern, sparsity):
    """A layer's first call (the tuner measuring on the GPU) whose input holds a NaN token, then
    one whose only token holds an inf: neither fails; finite outputs match the float64 reference
    and the choice serves a clean third call."""
    from spartune import reference as ref
    from spartune.prune import sparsify_weight

    torch.manual_seed(0)
    dtype = torch.float16
    A = sparsify_weight(torch.randn(384, 256, device="cuda", dtype=dtype), pattern, sparsity)
    x = torch.randn(9, 256, device="cuda", dtype=dtype)
    x[0, 5] = float("nan")
    given = x.clone()
    y = st.linear(x, A)
    assert torch.equal(x.isnan(), given.isnan()) and torch.equal(x.nan_to_num(), given.nan_to_num())
    assert rel_err(y[1:], ref.linear(x[1:], A)) < TOL
    x1 = torch.randn(1, 512, device="cuda", dtype=dtype)[:, ::2]  # another problem, strided
    A1 = sparsify_weight(torch.randn(384, 256, device="cuda", dtype=dtype), pattern, sparsity)
    col = int(A1.mask().any(0).nonzero()[0])
    x1[0, col] = float("inf")
    expect, hit = inf_column_reference(x1, A1, 0, col)
    y1 = st.linear(x1, A1)
    assert hit.any() and not hit.all()
    picked = {c.backend for c in dispatch._states[A1].chosen.values()}
    if picked == {"dense"}:  # dense multiplies the inf by every zero: NaN everywhere
        assert not y1.isfinite().any()
    else:
        assert not y1[0, hit].isfinite().any()
        assert (y1[0, ~hit].double() - expect[0, ~hit]).norm() <= TOL * expect[0, ~hit].norm()
    x2 = torch.randn(1, 256, device="cuda", dtype=dtype)
    assert rel_err(st.linear(x2, A1), ref.linear(x2, A1)) < TOL


@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_a_checkpoint_loaded_on_the_cpu_into_a_fresh_gpu_model(pattern, sparsity):
    """A sparsified fp16 model's state_dict saved, loaded with map_location="cpu", then into a
    freshly built model on the GPU: its layers come back sparse on the GPU, the outputs match the
    float64 reference of the saved model."""
    import io

    model = sparse_model(pattern, sparsity, torch.float16)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    sd = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")
    torch.manual_seed(1)
    fresh = GatedMLP().to("cuda", torch.float16).eval()
    result = st.load_sparse_state_dict(fresh, sd)
    assert not result.missing_keys and not result.unexpected_keys
    layers = [m for m in fresh.modules() if isinstance(m, st.SparseLinear)]
    assert layers and all(m.weight_values.is_cuda for m in layers)
    with torch.no_grad():
        x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
        assert rel_err(fresh(x), reference(model, x)) < TOL


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.9), ("2:4", None), ("block:64", 0.9)])
def test_autocast_on_a_float32_model(pattern, sparsity, dtype):
    """A float32 model under torch.autocast: the sparse layers return the autocast dtype and
    agree with the pruned dense model under the same autocast: eager and compiled inference, and
    a training step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    st.sparsify(model, pattern, sparsity, filter_fn=lambda name, _: name == "2")
    dense = nn.Sequential(model[0], model[1], nn.Linear(1024, 256).cuda())
    with torch.no_grad():
        dense[2].weight.copy_(model[2].weight.to_dense())
        dense[2].bias.copy_(model[2].bias)
    x = torch.randn(16, 512, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        got, want = model(x), dense(x)
    assert got.dtype == want.dtype == dtype
    assert rel_err(got.float(), want.float()) < 2e-2
    model[2].weight.__dict__.pop(f"_autocast_{dtype}")  # eager's copy: the compiled call makes its own
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):  # compiled: on the copy kept on the format
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert compiled.dtype == dtype and rel_err(compiled.float(), want.float()) < 2e-2
    assert f"_autocast_{dtype}" in model[2].weight.__dict__
    model[2].requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        y = model(x)
    y.float().square().mean().backward()
    assert y.dtype == dtype and model[2].weight_values.grad is not None
    assert model[2].weight_values.grad.dtype == torch.float32 and torch.isfinite(model[2].weight_values.grad).all()


@pytest.mark.parametrize("policy", ["speed", "lean"])
def test_autocast_under_compiled_cuda_graphs(policy):
    """A float32 model compiled with mode="reduce-overhead" (cudagraph trees) under autocast: the
    weight's fp16 copy is made off the graph's pool (speed) or none is made (lean); the replays
    match the pruned dense model, and the copy is made once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    st.sparsify(model, "csr", 0.9, filter_fn=lambda name, _: name == "2")
    dense = nn.Sequential(model[0], model[1], nn.Linear(1024, 256).cuda())
    with torch.no_grad():
        dense[2].weight.copy_(model[2].weight.to_dense())
        dense[2].bias.copy_(model[2].bias)
    x = torch.randn(16, 512, device="cuda")
    before = st.memory_policy()
    st.set_memory_policy(policy)
    try:
        graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            want = dense(x)
            outs = [graphed(x).clone() for _ in range(4)]  # warm-up, record, replays
            copy = model[2].weight.__dict__.get("_autocast_torch.float16")
            outs.append(graphed(x).clone())
            assert model[2].weight.__dict__.get("_autocast_torch.float16") is copy
    finally:
        st.set_memory_policy(before)
    assert (copy is None) == (policy == "lean")
    for out in outs:
        assert out.dtype == torch.float16 and rel_err(out.float(), want.float()) < 2e-2


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.9), ("block:64", 0.9)])
def test_autocast_compiled_block_merges_siblings_and_fuses(pattern, sparsity, mode, monkeypatch):
    """h + down(silu(gate(h)) * up(h)), float32, compiled under autocast (linear_cast calls): gate
    and up run as one stacked call on their fp16 copies and the residual goes into down's
    epilogue; the outputs match the float64 reference, plain and replayed from CUDA graphs."""
    import torch._inductor.config as inductor

    from spartune import fusion

    torch.manual_seed(0)
    model = GatedMLP().cuda().eval()
    model.down = nn.Linear(704, 256, bias=False).cuda()  # (a residual fuses where there is no bias)
    st.sparsify(model, pattern, sparsity)
    counts = {}
    for name in ("merge_siblings", "fuse_epilogues"):
        real = getattr(fusion, name)
        monkeypatch.setattr(fusion, name, lambda g, real=real, name=name: counts.setdefault(name, real(g)))
    compiled = torch.compile(lambda h: h + model(h), mode=mode, fullgraph=True)
    h = torch.randn(2, 24, 256, device="cuda", dtype=torch.float16)  # (an fp32 h would make the sum fp32)
    w = {name: m.weight.to_dense().double() for name, m in model.named_children()}
    h64 = h.double()
    expect = h64 + (F.silu(h64 @ w["gate"].T) * (h64 @ w["up"].T)) @ w["down"].T
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16), inductor.patch(force_disable_caches=True):
        outs = [compiled(h).clone() for _ in range(4)]  # (reduce-overhead: warm-up, record, replays)
    assert counts == {"merge_siblings": 1, "fuse_epilogues": 1}
    assert "_autocast_torch.float16" in model.gate.weight.__dict__
    for y in outs:
        assert y.dtype == torch.float16 and rel_err(y, expect) < TOL


@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_a_model_saved_whole_after_calls_loads_and_computes_the_same(pattern, sparsity):
    """torch.save(model) after tuned calls (packed layouts, launch caches memoised on the formats)
    holds the weights once; the loaded model and a deep copy compute what the model did."""
    import copy
    import io

    model = sparse_model(pattern, sparsity, torch.float16)
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.float16)
    fresh = io.BytesIO()
    torch.save(model, fresh)
    with torch.no_grad():
        y = model(x)
        model(x[:1, :1])  # a decode-sized call too
    buf = io.BytesIO()
    torch.save(model, buf)
    assert len(buf.getvalue()) < 1.1 * len(fresh.getvalue())
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert rel_err(loaded(x), y) < 1e-3 and rel_err(copy.deepcopy(model)(x), y) < 1e-3


@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_a_model_sparsified_under_inference_mode(pattern, sparsity):
    """Inference tensors carry no version counter: the layouts, stacks and autocast copies kept
    on the formats key on the values' address instead. Tuned eager calls (decode and prefill),
    fp16 autocast on a float32 copy, and a compiled model replayed from CUDA graphs all match the
    float64 reference."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = GatedMLP().to("cuda", torch.float16).eval()
        st.sparsify(model, pattern, sparsity)
        assert model.gate.weight_values.is_inference()
        for n in (1, 64):
            x = torch.randn(n, 256, device="cuda", dtype=torch.float16)
            assert rel_err(model(x), reference(model, x)) < TOL, n
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for i in range(4):  # warm-up, record, replays
            x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
            assert rel_err(compiled(x).clone(), reference(model, x)) < TOL, f"call {i}"
        fp32 = GatedMLP().cuda().eval()
        st.sparsify(fp32, pattern, sparsity)
        x = torch.randn(16, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            got = [fp32(x), fp32(x)]
    for y in got:
        assert y.dtype == torch.float16 and rel_err(y.float(), reference(fp32, x).float()) < TOL


def test_autocast_keeps_the_bias_copy_on_the_format():
    """Under autocast the fp32 bias's fp16 copy is made once per layer and follows an edit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 256)).cuda()
    st.sparsify(model, "csr", 0.9)
    layer = model[0]
    x = torch.randn(8, 512, device="cuda")
    key = "_autocast_bias_torch.float16"
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        layer(x)
        kept = layer.weight.__dict__[key][1]
        layer(x)
        assert layer.weight.__dict__[key][1] is kept
        layer.bias.add_(1.0)
        got = layer(x)
    want = x.double() @ layer.weight.to_dense().double().T + layer.bias.double()
    assert got.dtype == torch.float16 and rel_err(got.double(), want) < TOL
