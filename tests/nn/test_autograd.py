"""Autograd through spartune's operators: gradcheck in float64 (linear with its epilogue, spmm,
SparseLinear), gradients against the dense model's at the stored positions, a fixed pattern
under an optimizer, and torch.compile in training mode."""
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck
from torch.func import functional_call

import spartune as st
from spartune.formats import SparseFormat
from spartune.nn import SparseLinear, sparsify

PATTERNS = [("csr", 0.8), ("block:16", 0.5), ("block:16x32", 0.5), ("shfl:16", 0.5), ("2:4", None), ("16:2:8", None)]
IDS = [p for p, _ in PATTERNS]
ACTIVATIONS = [None, "relu", "gelu"]

def weight(pattern, sparsity, rows=24, cols=40, seed=0):
    """A float64 format (24x40: edge blocks, padded groups) whose values tensor requires grad,
    and the mask of its slots inside the matrix (0 in padding slots)."""
    g = torch.Generator().manual_seed(seed)
    A = st.sparsify_weight(torch.randn(rows, cols, generator=g, dtype=torch.float64), pattern, sparsity)
    values = A.values.detach().requires_grad_()
    A = A.with_values(values)
    assert A.values is values  # with_values keeps the tensor object (contiguous already)
    return A, A.gather(torch.ones(A.shape, dtype=torch.float64))


def inputs(n=3, rows=24, cols=40, seed=1, relu_for=None):
    """x, bias, residual (float64, requiring grad). `relu_for=(A, scale)`: the bias moves every
    pre-activation scale x A^T + bias at least 0.25 off relu's kink, even columns all positive,
    odd ones all negative (both branches, no finite difference across the kink)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cols, generator=g, dtype=torch.float64)
    b = torch.randn(rows, generator=g, dtype=torch.float64)
    r = torch.randn(n, rows, generator=g, dtype=torch.float64)
    if relu_for is not None:
        A, scale = relu_for
        acc = scale * (x @ A.to_dense().detach().T)
        up = torch.arange(rows) % 2 == 0
        b = torch.where(up, 0.25 - acc.min(0).values, -0.25 - acc.max(0).values)
        pre = acc + b
        assert bool((pre[:, up] >= 0.25 - 1e-12).all() and (pre[:, ~up] <= -0.25 + 1e-12).all())
    return [t.requires_grad_() for t in (x, b, r)]


# --- gradcheck of the functional ops ---------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradcheck_linear(pattern, sparsity, activation):
    """d/d(x, values, bias, residual) of act(scale x A^T + bias) + residual. The values enter as
    `values * keep`, a new tensor each call (see test_gradcheck_values_perturbed_in_place), which
    also keeps the padding slots at zero (they are outside the matrix: no gradient)."""
    A, keep = weight(pattern, sparsity)
    x, b, r = inputs(relu_for=(A, 0.7) if activation == "relu" else None)

    def f(x, values, b, r):
        return st.linear(x, A.with_values(values * keep), b, activation, r, scale=0.7)

    assert gradcheck(f, (x, A.values, b, r), fast_mode=True)


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.8), ("block:16", 0.5), ("2:4", None)], ids=["csr", "block:16", "2:4"])
def test_gradcheck_linear_full_jacobian(pattern, sparsity):
    """Every entry of the Jacobians (fast_mode checks random projections of them)."""
    A, keep = weight(pattern, sparsity, rows=16, cols=24)
    x, b, r = inputs(n=2, rows=16, cols=24)
    assert gradcheck(lambda x, values, b, r: st.linear(x, A.with_values(values * keep), b, "gelu", r, scale=0.7),
                     (x, A.values, b, r))


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradcheck_spmm(pattern, sparsity):
    A, keep = weight(pattern, sparsity)
    X = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda values, X: st.spmm(A.with_values(values * keep), X), (A.values, X), fast_mode=True)


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradcheck_linear_of_a_fixed_format_in_x_bias_residual(pattern, sparsity):
    """The format object itself as the op's argument (its values not perturbed)."""
    A, _ = weight(pattern, sparsity)
    x, b, r = inputs()
    assert gradcheck(lambda x, b, r: st.linear(x, A, b, "gelu", r, scale=1.5), (x, b, r), fast_mode=True)
    X = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda X: st.spmm(A, X), (X,), fast_mode=True)


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradcheck_values_perturbed_in_place(pattern, sparsity):
    """The plain way to write it: gradcheck w.r.t. A.values of linear(x, A, ...)."""
    A, _ = weight(pattern, sparsity)
    x, b, r = inputs()
    assert gradcheck(lambda x, values, b, r: st.linear(x, A, b, None, r), (x, A.values, b, r), fast_mode=True)


def test_gradcheck_spmm_values_perturbed_in_place():
    A, _ = weight("csr", 0.8)
    X = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda values, X: st.spmm(A, X), (A.values, X), fast_mode=True)


# --- through SparseLinear ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradcheck_sparse_linear(pattern, sparsity):
    A, keep = weight(pattern, sparsity)
    x, b, _ = inputs()
    layer = SparseLinear(A, b.detach(), requires_grad=True)
    assert layer.weight_values.dtype == torch.float64 and layer.weight_values.requires_grad
    assert gradcheck(layer, (x,), fast_mode=True)  # w.r.t. the input, the module's own weight

    def f(x, values, bias):  # w.r.t. its parameters, swapped in (new tensors each call)
        return functional_call(layer, {"weight_values": values * keep, "bias": bias}, (x,))

    values, bias = (p.detach().clone().requires_grad_() for p in (layer.weight_values, layer.bias))
    assert gradcheck(f, (x, values, bias), fast_mode=True)


def test_gradcheck_sparse_linear_parameters_perturbed_in_place():
    A, _ = weight("block:16", 0.5)
    x, b, _ = inputs()
    layer = SparseLinear(A, b.detach(), requires_grad=True)
    values, bias = (p.detach().clone().requires_grad_() for p in (layer.weight_values, layer.bias))
    assert gradcheck(lambda x, v, bb: functional_call(layer, {"weight_values": v, "bias": bb}, (x,)),
                     (x, values, bias), fast_mode=True)


def dense_twin(model):
    """The pruned model as nn.Linear layers (the sparse weights densified)."""
    twin = nn.Sequential(*(nn.Linear(m.in_features, m.out_features, dtype=m.bias.dtype)
                           if isinstance(m, SparseLinear) else m for m in model))
    with torch.no_grad():
        for m, d in zip(model, twin):
            if isinstance(m, SparseLinear):
                d.weight.copy_(m.weight.to_dense())
                d.bias.copy_(m.bias)
    return twin


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_gradients_are_the_dense_gradients_at_the_stored_positions(pattern, sparsity, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 40), nn.GELU(), nn.Linear(40, 24)).to(dtype)
    sparsify(model, pattern, sparsity)
    model.requires_grad_(True)
    twin = dense_twin(model)
    x = torch.randn(9, 48, dtype=dtype, requires_grad=True)
    xd = x.detach().clone().requires_grad_()
    target = torch.randn(9, 24, dtype=dtype)
    (model(x) - target).square().mean().backward()
    (twin(xd) - target).square().mean().backward()
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-6)
    assert torch.allclose(x.grad, xd.grad, **tol)
    for i in (0, 2):
        m, d = model[i], twin[i]
        expect = m.weight.gather(d.weight.grad)  # the dense gradient at the stored positions, 0 in padding
        assert m.weight_values.grad.shape == m.weight_values.shape
        assert torch.allclose(m.weight_values.grad, expect, **tol), i
        assert torch.allclose(m.bias.grad, d.bias.grad, **tol)
        # and nothing of the dense gradient off the pattern made it in
        assert torch.equal(m.weight.with_values(m.weight_values.grad).to_dense() != 0,
                           (d.weight.grad * m.weight.mask()) != 0)


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_the_pattern_stays_fixed_under_an_optimizer(pattern, sparsity):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 24))
    sparsify(model, pattern, sparsity)
    model.requires_grad_(True)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == \
        ["0.weight_values", "0.bias", "2.weight_values", "2.bias"]  # index tensors are buffers
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    masks = [model[i].weight.mask() for i in (0, 2)]
    values = [model[i].weight_values.detach().clone() for i in (0, 2)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 48)).square().mean().backward()
        opt.step()
    for n, b in model.named_buffers():
        assert b.dtype == buffers[n].dtype and torch.equal(b, buffers[n]), n
    for i, mask, v in zip((0, 2), masks, values):
        A = model[i].weight
        assert not torch.equal(A.values, v)  # the values trained ...
        assert torch.equal(A.mask(), mask)  # ... in the same pattern ...
        SparseFormat.from_spec(A.spec, A.tensor_list())  # ... still a valid format (padding slots still zero)
        assert torch.equal(A.to_dense() != 0, mask)


# --- torch.compile, training ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_compiled_training_step_matches_eager(pattern, sparsity, fresh_dynamo):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 40), nn.GELU(), nn.Linear(40, 24))
    sparsify(model, pattern, sparsity)
    model.train().requires_grad_(True)
    x = torch.randn(8, 48, requires_grad=True)
    target = torch.randn(8, 24)

    def step(fn):
        model.zero_grad(set_to_none=True)
        x.grad = None
        loss = (fn(x) - target).square().mean()
        loss.backward()
        return loss.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, dx, grads = step(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for _ in range(2):  # the second call reuses the compiled graph
        c_loss, c_dx, c_grads = step(compiled)
        assert torch.allclose(c_loss, loss, rtol=1e-5)
        assert torch.allclose(c_dx, dx, rtol=1e-4, atol=1e-6)
        assert c_grads.keys() == grads.keys()
        for n in grads:
            assert torch.allclose(c_grads[n], grads[n], rtol=1e-4, atol=1e-6), n
    # a step of the optimizer between compiled calls: the compiled model sees the new values
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.1 * p.grad)
    with torch.no_grad():
        expect = model(x)
    assert torch.allclose(compiled(x), expect, rtol=1e-4, atol=1e-6)


# --- examples/finetune_recovery.py, reduced ---------------------------------------------------------------------
def test_finetune_recovery_example(monkeypatch, capsys):
    """Pruning the trained MLP hurts; fine-tuning wins back at least half of it for every
    pattern, in the pattern it was pruned to. (Without TRITON_INTERPRET, as the script runs on
    a CPU: torch's dense product serves every layer, instead of interpreted kernels.)"""
    path = Path(__file__).resolve().parents[2] / "examples" / "finetune_recovery.py"
    spec = importlib.util.spec_from_file_location("finetune_recovery", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    threads = torch.get_num_threads()
    try:  # one thread: small matrices, and a busy machine's cores would make 2 threads 20x slower
        rows = example.main(["--dense-steps", "300", "--tune-steps", "100", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "recovered" in out and all(p in out for p in ("csr", "block:16", "2:4"))
    assert [r["pattern"] for r in rows] == ["csr", "block:16", "2:4"]
    for r in rows:
        assert r["pruned"] > r["dense"] + 0.02, r["pattern"]  # pruning hurt
        assert r["recovered"] >= 0.5, (r["pattern"], r["dense"], r["pruned"], r["tuned"])
        sparse = [m for m in r["model"].modules() if isinstance(m, SparseLinear)]
        assert len(sparse) == 2 and all(m.weight_values.grad is not None for m in sparse)  # they trained
        after = dict(r["model"].named_buffers())
        assert after.keys() == r["index_before"].keys() and after
        for name, before in r["index_before"].items():
            assert torch.equal(after[name], before), (r["pattern"], name)


def test_the_differentiable_route_rejects_bad_inputs_before_any_kernel():
    A = st.sparsify_weight(torch.randn(32, 48), "csr", 0.5)
    A = A.with_values(A.values.detach().requires_grad_())  # autograd records: the operator route
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        st.linear([[1.0] * 48], A)
    with pytest.raises(TypeError, match="X must be a torch.Tensor"):
        st.spmm(A, [[1.0]])
    with pytest.raises(TypeError, match="A must be a spartune format"):
        st.linear(torch.randn(3, 48, requires_grad=True), torch.randn(32, 48))
    with pytest.raises(ValueError, match="last dimension 48"):
        st.linear(torch.randn(3, 40), A)
    with pytest.raises(TypeError, match="dtype"):
        st.linear(torch.randn(3, 48, dtype=torch.float64), A)
