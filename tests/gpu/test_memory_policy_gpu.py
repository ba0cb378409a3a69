"""The lean memory policy on the GPU: a sparsified model keeps no dense, library or 2:4 copy of
its weights, at decode and at prefill (where dense may still win, on a transient decompression),
eager and under CUDA graphs, against the float64 reference."""
import pytest
import torch

import spartune as st
from helpers import GatedMLP, finite_rel_err as rel_err, gated_mlp_reference as reference
from spartune import dispatch
from spartune.formats.stack import stacks_of
from spartune.nn import resident_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_cache")]

PATTERNS = [("csr", 0.9), ("64:2:8", None), ("2:4", None), ("block:64", 0.9)]
TOL = 2e-2
COPIES = ("_backend_", "_nm_as24_packed")  # a dense copy, a library's conversion, V:N:M's 2:4 copy


@pytest.fixture
def lean():
    previous = dispatch.memory_policy()
    st.set_memory_policy("lean")
    yield
    st.set_memory_policy(previous)
    torch._dynamo.reset()


def copies(model):
    """Each layer's kept copies, torch.compile's stacks of sibling layers included."""
    return {name: [k for k in vars(m.weight) if k.startswith(COPIES)] + ["stack"] * len(stacks_of(m.weight))
            for name, m in model.named_children()}


@pytest.mark.parametrize("pattern,sparsity", PATTERNS)
def test_lean_model_keeps_no_copy(lean, pattern, sparsity):
    torch.manual_seed(0)
    model = GatedMLP(512, 1408).to("cuda", torch.float16).eval()
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    st.sparsify(model, pattern, sparsity)
    with torch.no_grad():
        for n in (1, 8, 2048):  # decode, and a prefill where dense may win
            x = torch.randn(n, 512, device="cuda", dtype=torch.float16)
            assert rel_err(model(x), reference(model, x)) < TOL, n
    assert copies(model) == {name: [] for name in ("gate", "up", "down")}
    picks = {c.backend for m in model.children() for c in dispatch.state(m.weight, lambda A: None).chosen.values()}
    assert not picks & {"cusparse", "cusparselt", "cusparselt_search"}, picks
    if pattern in ("csr", "64:2:8"):  # 10% and 25% kept: the model stays smaller than dense
        assert resident_bytes(model) < dense_bytes, (resident_bytes(model), dense_bytes)


@pytest.mark.parametrize("pattern", ["csr", "block:64"])
def test_lean_dense_under_cuda_graphs(lean, pattern):
    """Where dense wins (half-dense weights at prefill), its per-call decompression is captured
    in the graph (CSR by the one-pass kernel, block-sparse by torch's scatter), and
    torch.compile stacks no sibling layers."""
    torch.manual_seed(1)
    model = GatedMLP(512, 1408).to("cuda", torch.float16).eval()
    st.sparsify(model, pattern, 0.5)  # half dense: cuBLAS wins at 2048 tokens
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for i in range(4):  # warm-up (tunes), record, then replays on new inputs
            x = torch.randn(2048, 512, device="cuda", dtype=torch.float16)
            y = compiled(x).clone()
            assert rel_err(y, reference(model, x)) < TOL, f"call {i}"
    assert copies(model) == {name: [] for name in ("gate", "up", "down")}
