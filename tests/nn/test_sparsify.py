"""sparsify(model) on what real models hold: nn.Linear subclasses, nn.MultiheadAttention, fused
Transformer encoders, tied weights; per-layer patterns, dry runs, and all-or-nothing failures.

The reference for a sparsified model is the dense model with each pruned weight written back
(`layer.weight.to_dense()` copied into a deepcopy of the original): the two must agree."""
import copy
import importlib

import pytest
import torch
from torch import nn

from spartune.nn import LayerReport, SparseLinear, SparseMultiheadAttention, sparsify

sparsify_mod = importlib.import_module("spartune.nn.sparsify")  # spartune.nn.sparsify is the function

F64 = torch.float64
PATTERNS = [("csr", 0.5), ("block:16", 0.5), ("shfl:16", 0.5), ("2:4", None), ("16:2:8", None)]
IDS = [p for p, _ in PATTERNS]
E, H = 32, 4


def _randomize(module, seed=2):
    """Random weights and non-zero biases (MHA zero-initialises its biases)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3).add_(0.5 if p.dim() == 1 else 0)
    return module


def _reference(original: nn.Module, sparse: nn.Module, reports) -> nn.Module:
    """A deepcopy of the dense original with every pruned weight written back."""
    ref = copy.deepcopy(original)
    with torch.no_grad():
        for name, r in reports.items():
            if r.pattern is None:
                continue
            w = sparse.get_submodule(name).weight.to_dense()
            parent, _, child = name.rpartition(".")
            owner = ref.get_submodule(parent) if parent else ref
            if child in ("in_proj", "q_proj", "k_proj", "v_proj") and isinstance(owner, nn.MultiheadAttention):
                getattr(owner, f"{child}_weight").copy_(w)
            else:
                owner.get_submodule(child).weight.copy_(w)
    return ref


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model, modules_before, state_before):
    assert [(n, m) for n, m in model.named_modules()] == modules_before
    assert all(a[1] is b[1] for a, b in zip(model.named_modules(), modules_before))
    state = model.state_dict()
    assert state.keys() == state_before.keys()
    for k, v in state_before.items():
        assert torch.equal(state[k], v), k


# --- nn.Linear subclasses ---------------------------------------------------------------------------
def test_sparsify_again_reports_the_layers_already_sparse_and_warns():
    """Iterative pruning by calling sparsify twice does nothing to a SparseLinear: it says so
    (a report per layer asked for, and one warning) instead of returning nothing."""
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 16))
    sparsify(model, "csr", 0.5)
    before = [m.weight.to_dense().clone() for m in (model[0], model[2])]
    with pytest.warns(UserWarning, match="already sparse"):
        reports = sparsify(model, {"0": ("csr", 0.9)})
    assert list(reports) == ["0"] and reports["0"].pattern is None and "already sparse" in reports["0"].skipped
    assert reports["0"].shape == (48, 32)
    assert all(torch.equal(b, m.weight.to_dense()) for b, m in zip(before, (model[0], model[2])))
    # a filter written for nn.Linear is not applied to them (it would fail: a format has no numel)
    assert sparsify(model, "csr", 0.9, filter_fn=lambda name, m: m.weight.numel() > 100) == {}


def test_linear_subclass_keeping_forward_is_converted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.modules.linear.NonDynamicallyQuantizableLinear(32, 48, dtype=F64), nn.ReLU(),
                          nn.Linear(48, 16, dtype=F64))
    dense = copy.deepcopy(model)
    reports = sparsify(model, "csr", 0.6)
    assert isinstance(model[0], SparseLinear) and isinstance(model[2], SparseLinear)
    assert reports["0"].pattern == "csr" and reports["0"].skipped == ""
    x = torch.randn(5, 32, dtype=F64)
    torch.testing.assert_close(model(x), _reference(dense, model, reports)(x), atol=1e-10, rtol=0)


class ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_linear_subclass_overriding_forward_is_skipped_with_a_reason():
    model = nn.Sequential(ScaledLinear(16, 16), nn.Linear(16, 16))
    reports = sparsify(model, "csr", 0.5)
    assert type(model[0]) is ScaledLinear and isinstance(model[1], SparseLinear)
    assert reports["0"].pattern is None and "overrides nn.Linear.forward" in reports["0"].skipped
    assert "ScaledLinear" in reports["0"].skipped


# --- nn.MultiheadAttention and Transformer encoders -------------------------------------------------
class AttentionModel(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, dropout=dropout, batch_first=True, dtype=F64)
        self.head = nn.Linear(E, 16, dtype=F64)

    def forward(self, x, key_padding_mask=None):
        return self.head(self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0])


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_multihead_attention_in_a_model_is_converted(pattern, sparsity, training, grad):
    dense = _randomize(AttentionModel()).train(training)
    model = copy.deepcopy(dense)
    reports = sparsify(model, pattern, sparsity)
    assert set(reports) == {"attn.in_proj", "attn.out_proj", "head"}
    assert reports["attn.in_proj"].shape == (3 * E, E) and reports["attn.out_proj"].shape == (E, E)
    assert isinstance(model.attn, SparseMultiheadAttention) and model.attn.training == training
    assert isinstance(model.attn.in_proj, SparseLinear) and isinstance(model.attn.out_proj, SparseLinear)
    assert all(0 < r.retained < 1 and r.sparsity > 0 for r in reports.values())
    ref = _reference(dense, model, reports)
    torch.manual_seed(3)
    x = torch.randn(3, 6, E, dtype=F64)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(model(x), ref(x), atol=1e-10, rtol=0)
        torch.testing.assert_close(model(x, kpm), ref(x, kpm), atol=1e-10, rtol=0)


def test_multihead_attention_with_every_option_is_converted():
    """kdim / vdim apart from embed_dim (three in-projections), add_bias_kv, add_zero_attn."""
    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(E, H, kdim=16, vdim=12, add_bias_kv=True, add_zero_attn=True,
                                              batch_first=True, dtype=F64)

        def forward(self, x, m, n):
            return self.attn(x, m, n)[0]

    dense = _randomize(Cross()).eval()
    model = copy.deepcopy(dense)
    reports = sparsify(model, "csr", 0.5)
    assert set(reports) == {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj"}
    assert reports["attn.k_proj"].shape == (E, 16) and reports["attn.v_proj"].shape == (E, 12)
    assert isinstance(model.attn, SparseMultiheadAttention)
    assert all(isinstance(getattr(model.attn, c), SparseLinear) for c in ("q_proj", "k_proj", "v_proj", "out_proj"))
    ref = _reference(dense, model, reports)
    torch.manual_seed(3)
    x, m, n = (torch.randn(3, t, d, dtype=F64) for t, d in ((5, E), (7, 16), (7, 12)))
    torch.testing.assert_close(model(x, m, n), ref(x, m, n), atol=1e-10, rtol=0)


def _encoder(kind):
    layer = nn.TransformerEncoderLayer(E, H, 64, dropout=0.0, batch_first=True, dtype=F64)
    if kind == "layer":
        return _randomize(layer).eval()
    return _randomize(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)).eval()


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("kind", ["layer", "encoder"])
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_transformer_encoders_in_eval_give_the_reference(pattern, sparsity, kind, grad):
    dense = _encoder(kind)
    model = copy.deepcopy(dense)
    reports = sparsify(model, pattern, sparsity)
    layers = [model] if kind == "layer" else list(model.layers)
    prefixes = [""] if kind == "layer" else ["layers.0.", "layers.1."]
    assert set(reports) == {p + n for p in prefixes
                            for n in ("self_attn.in_proj", "self_attn.out_proj", "linear1", "linear2")}
    for layer in layers:
        assert isinstance(layer.self_attn, SparseMultiheadAttention)
        assert isinstance(layer.linear1, SparseLinear) and isinstance(layer.linear2, SparseLinear)
    ref = _reference(dense, model, reports).train()  # training mode (dropout 0): the module-by-module path
    torch.manual_seed(3)
    x = torch.randn(3, 6, E, dtype=F64)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, 4:] = True  # left-aligned padding, which the nested-tensor path accepts
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(model(x), ref(x), atol=1e-10, rtol=0)
        torch.testing.assert_close(model(x, src_key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm),
                                   atol=1e-10, rtol=0)
        # the rows that are not padded agree with the dense reference's own (fused) eval path too
        fused = ref.eval()(x, src_key_padding_mask=kpm)
        keep = ~kpm
        torch.testing.assert_close(model(x, src_key_padding_mask=kpm)[keep], fused[keep], atol=1e-10, rtol=0)


# --- tied weights ----------------------------------------------------------------------------------
class TiedPair(nn.Module):
    def __init__(self, share_bias=False):
        super().__init__()
        self.a = nn.Linear(32, 32, dtype=F64)
        self.b = nn.Linear(32, 32, dtype=F64)
        self.b.weight = self.a.weight
        if share_bias:
            self.b.bias = self.a.bias

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("share_bias", [False, True])
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_tied_linear_weights_are_pruned_once_and_shared(pattern, sparsity, share_bias, monkeypatch):
    dense = _randomize(TiedPair(share_bias))
    model = copy.deepcopy(dense)
    assert model.a.weight is model.b.weight
    pruned = []
    from_linear = SparseLinear.from_linear.__func__
    monkeypatch.setattr(SparseLinear, "from_linear",
                        classmethod(lambda cls, *a, **k: pruned.append(1) or from_linear(cls, *a, **k)))
    reports = sparsify(model, pattern, sparsity)
    assert len(pruned) == 1
    assert isinstance(model.a, SparseLinear) and isinstance(model.b, SparseLinear)
    assert model.a.weight_values is model.b.weight_values
    assert all(getattr(model.a, f"weight_{n}") is getattr(model.b, f"weight_{n}") for n in model.a._weight_names)
    assert (model.a.bias is model.b.bias) == share_bias
    assert reports["a"].skipped == "" and "tied" in reports["b"].skipped and "a" in reports["b"].skipped
    assert reports["b"].pattern == reports["a"].pattern and reports["b"].retained == reports["a"].retained
    assert reports["b"].sparse_bytes == 0 < reports["a"].sparse_bytes
    x = torch.randn(4, 32, dtype=F64)
    torch.testing.assert_close(model(x), _reference(dense, model, reports)(x), atol=1e-10, rtol=0)
    # still one parameter: an optimizer step moves both layers
    assert len(list(model.parameters())) == (2 if share_bias else 3)


def test_linear_tied_to_an_embedding_is_skipped():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.body = nn.Linear(16, 16)
            self.lm_head = nn.Linear(16, 50, bias=False)
            self.lm_head.weight = self.embed.weight

    model = LM()
    before = model.embed.weight.detach().clone()
    reports = sparsify(model, "csr", 0.5)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.embed.weight
    assert torch.equal(model.embed.weight, before)
    assert reports["lm_head"].pattern is None and "tied" in reports["lm_head"].skipped
    assert "not a linear layer" in reports["lm_head"].skipped
    assert isinstance(model.body, SparseLinear)


def test_tie_with_a_layer_left_dense_is_not_broken():
    """A weight shared by a selected layer and an unselected one stays dense in both."""
    torch.manual_seed(0)
    model = TiedPair()
    reports = sparsify(model, "csr", 0.5, filter_fn=lambda name, m: name == "b")
    assert type(model.a) is nn.Linear and type(model.b) is nn.Linear and model.a.weight is model.b.weight
    assert reports["a"].skipped == "not selected"
    assert reports["b"].pattern is None and "tied to 'a'" in reports["b"].skipped
    reports = sparsify(model, {"a": "csr"}, 0.5)  # the same through a dict
    assert type(model.a) is nn.Linear and "tied to 'b'" in reports["a"].skipped


def test_a_module_held_at_two_names_is_replaced_at_both():
    torch.manual_seed(0)
    shared = nn.Linear(16, 16, dtype=F64)
    dense = nn.Sequential(shared, nn.ReLU(), shared)
    model = copy.deepcopy(dense)  # deepcopy keeps the sharing
    reports = sparsify(model, "csr", 0.5)
    assert list(reports) == ["0"]
    assert isinstance(model[0], SparseLinear) and model[2] is model[0]
    x = torch.randn(3, 16, dtype=F64)
    torch.testing.assert_close(model(x), _reference(dense, model, reports)(x), atol=1e-10, rtol=0)


def test_the_root_module_cannot_be_replaced_and_is_left_alone():
    for model in (nn.Linear(16, 16), nn.MultiheadAttention(16, 4)):
        state = _state(model)
        reports = sparsify(model, "csr", 0.5)
        assert not isinstance(model, SparseLinear) and "" not in model._modules
        assert all(r.pattern is None and "the model itself" in r.skipped for r in reports.values())
        assert all(not isinstance(m, SparseLinear) for m in model.modules())
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_lazy_linear_not_yet_initialized_is_skipped():
    model = nn.Sequential(nn.LazyLinear(8), nn.Linear(8, 8))
    reports = sparsify(model, "csr", 0.5)
    assert isinstance(model[0], nn.LazyLinear) and "lazy" in reports["0"].skipped
    assert isinstance(model[1], SparseLinear)


# --- choosing layers and patterns --------------------------------------------------------------------
class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(32, 64), "fc2": nn.Linear(64, 32)})
                                    for _ in range(2))
        self.head = nn.Linear(32, 16)


def test_filter_fn_receives_names_and_modules():
    torch.manual_seed(0)
    model = Blocks()
    seen = []
    reports = sparsify(model, "csr", 0.5, filter_fn=lambda name, m: seen.append((name, m)) or "fc2" in name)
    assert [n for n, _ in seen] == ["blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "head"]
    assert all(isinstance(m, nn.Linear) for _, m in seen)
    assert [n for n, r in reports.items() if r.pattern] == ["blocks.0.fc2", "blocks.1.fc2"]
    assert reports["head"].skipped == "not selected" and type(model.head) is nn.Linear


def test_dict_of_globs_gives_per_layer_patterns_and_sparsities():
    torch.manual_seed(0)
    model = Blocks()
    reports = sparsify(model, {"blocks.0.*": "2:4", "*.fc1": ("csr", 0.75), "*.fc2": "block:16"}, 0.5)
    got = {n: (r.pattern, round(r.sparsity, 2)) for n, r in reports.items()}
    assert got == {"blocks.0.fc1": ("2:4", 0.5), "blocks.0.fc2": ("2:4", 0.5),  # first match wins
                   "blocks.1.fc1": ("csr", 0.75), "blocks.1.fc2": ("block:16x16", 0.5),
                   "head": (None, 0.0)}
    assert type(model.head) is nn.Linear and reports["head"].skipped == "not selected"
    assert isinstance(model.blocks[1].fc1, SparseLinear) and type(model.blocks[1].fc1.weight).__name__ == "CSR"


def test_callable_pattern():
    torch.manual_seed(0)
    model = Blocks()

    def choose(name, m):
        if name == "head":
            return None
        return "2:4" if m.in_features == 32 else ("csr", 0.9)

    reports = sparsify(model, choose)
    assert {n: r.pattern for n, r in reports.items()} == {
        "blocks.0.fc1": "2:4", "blocks.0.fc2": "csr", "blocks.1.fc1": "2:4", "blocks.1.fc2": "csr", "head": None}
    assert reports["blocks.0.fc2"].sparsity == pytest.approx(0.9, abs=0.01)
    assert type(model.head) is nn.Linear


# --- dry run -------------------------------------------------------------------------------------------
def _mixed():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32),
                         nn.TransformerEncoderLayer(E, H, 64, dropout=0.0, batch_first=True).eval())


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_dry_run_changes_nothing_and_reports(pattern, sparsity):
    model = _mixed()
    modules, state = list(model.named_modules()), _state(model)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        out = model(x)
    reports = sparsify(model, pattern, sparsity, dry_run=True, tokens=512)
    _assert_unchanged(model, modules, state)
    assert model[3].activation_relu_or_gelu  # the fused path is still on
    with torch.no_grad():
        torch.testing.assert_close(model(x), out, atol=0, rtol=0)
    assert set(reports) == {"0", "2", "3.self_attn.in_proj", "3.self_attn.out_proj", "3.linear1", "3.linear2"}
    for name, r in reports.items():
        assert isinstance(r, LayerReport) and r.name == name and r.skipped == ""
        w = model.get_submodule(name).weight if "in_proj" not in name else model[3].self_attn.in_proj_weight
        assert r.shape == tuple(w.shape) and r.dense_bytes == w.numel() * 4
        assert r.pattern == str(sparsify_mod.parse_pattern(pattern))
        fixed = sparsify_mod.parse_pattern(pattern).fixed_density  # 2:4 and 16:2:8 fix it
        assert r.sparsity == pytest.approx(sparsity if sparsity is not None else 1 - fixed, abs=0.02)
        assert 0 < r.retained < 1 and 0 < r.sparse_bytes
        assert r.predicted_speedup > 0 and isinstance(r.predicted_backend, str) and r.predicted_backend
    # the real run prunes exactly as the dry run said
    real = sparsify(model, pattern, sparsity, tokens=512)
    assert real == reports


@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)),
                                  lambda: nn.Sequential(nn.MultiheadAttention(E, H))], ids=["linears", "attention"])
def test_dry_run_does_not_draw_from_the_global_rng(make):
    model = make()
    torch.manual_seed(0)
    sparsify(model, "csr", 0.5, dry_run=True)
    after = torch.randn(4)
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(4))


# --- failures leave the model as it was -------------------------------------------------------------
def test_invalid_sparsity_for_one_layer_raises_naming_it_and_changes_nothing():
    model = _mixed()
    modules, state = list(model.named_modules()), _state(model)
    with pytest.raises(ValueError, match=r"layer '3\.linear1'.*sparsity must be a number in \[0, 1\], got 1\.5"):
        sparsify(model, {"3.linear1": ("csr", 1.5), "*": "csr"}, 0.5)
    _assert_unchanged(model, modules, state)
    assert type(model[3].self_attn) is nn.MultiheadAttention and model[3].activation_relu_or_gelu


def test_failure_in_a_later_layer_leaves_the_model_exactly_as_it_was(monkeypatch):
    model = _mixed()
    modules, state = list(model.named_modules()), _state(model)
    calls = []
    from_linear = SparseLinear.from_linear.__func__

    def failing(cls, linear, *a, **k):
        calls.append(linear)
        if len(calls) == 4:
            raise RuntimeError("boom")
        return from_linear(cls, linear, *a, **k)

    monkeypatch.setattr(SparseLinear, "from_linear", classmethod(failing))
    with pytest.raises(RuntimeError, match=r"layer '3\.self_attn\.out_proj' \(32x32\).*boom") as info:
        sparsify(model, "block:16", 0.5)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert len(calls) == 4
    _assert_unchanged(model, modules, state)
    assert all(not isinstance(m, (SparseLinear, SparseMultiheadAttention)) for m in model.modules())
    monkeypatch.undo()
    sparsify(model, "block:16", 0.5)  # and it can still be sparsified
    assert isinstance(model[3].self_attn.out_proj, SparseLinear)


@pytest.mark.parametrize("pattern", ["bogus", {"0": "csr", "2": "block:x"}, "16:3:8", lambda n, m: "csr:4"])
def test_bad_pattern_fails_before_anything_is_pruned(pattern, monkeypatch):
    model = _mixed()
    modules, state = list(model.named_modules()), _state(model)
    pruned = []
    monkeypatch.setattr(SparseLinear, "from_linear", classmethod(lambda cls, *a, **k: pruned.append(1)))
    with pytest.raises(ValueError, match="pattern"):
        sparsify(model, pattern, 0.5)
    assert pruned == []
    _assert_unchanged(model, modules, state)


INVALID_SIZES = ["block:5", "5:4", "3:2:8", "shfl:7"]  # well-formed strings that no format takes


@pytest.mark.parametrize("pattern", INVALID_SIZES)
def test_pattern_with_invalid_sizes_fails_before_anything_is_pruned(pattern, monkeypatch):
    model = _mixed()
    pruned = []
    from_linear = SparseLinear.from_linear.__func__
    monkeypatch.setattr(SparseLinear, "from_linear",
                        classmethod(lambda cls, *a, **k: pruned.append(1) or from_linear(cls, *a, **k)))
    with pytest.raises(ValueError):
        sparsify(model, pattern, 0.5 if pattern.startswith(("block", "shfl")) else None)
    assert pruned == []


def test_an_error_whose_type_needs_other_arguments_still_names_the_layer(monkeypatch):
    class TwoArgError(Exception):
        def __init__(self, code, detail):
            super().__init__(f"{code}: {detail}")

    def failing(cls, linear, *a, **k):
        raise TwoArgError(7, "no luck")

    model = _mixed()
    monkeypatch.setattr(SparseLinear, "from_linear", classmethod(failing))
    with pytest.raises(Exception, match=r"layer '0'.*7: no luck") as info:
        sparsify(model, "csr", 0.5)
    assert isinstance(info.value.__cause__, TwoArgError)


def test_bad_pattern_from_a_callable_fails_before_anything_is_pruned(monkeypatch):
    model = _mixed()
    modules, state = list(model.named_modules()), _state(model)
    pruned = []
    from_linear = SparseLinear.from_linear.__func__
    monkeypatch.setattr(SparseLinear, "from_linear",
                        classmethod(lambda cls, *a, **k: pruned.append(1) or from_linear(cls, *a, **k)))
    with pytest.raises(ValueError, match="unknown pattern"):
        sparsify(model, lambda name, m: "nope" if name == "3.linear2" else "csr", 0.5)
    with pytest.raises(TypeError, match="pattern must be a string"):
        sparsify(model, lambda name, m: 4, 0.5)
    assert pruned == []
    _assert_unchanged(model, modules, state)


def test_bad_arguments_are_refused_before_anything_is_pruned():
    model = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        sparsify(model, "csr", 0.5, dry_run=True, tokens=0)
    with pytest.raises(TypeError, match="must be an nn.Module"):
        sparsify(torch.randn(8, 8), "csr", 0.5)
    assert type(model[0]) is nn.Linear


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))


def test_no_pattern_is_an_error_not_a_no_op():
    with pytest.raises(TypeError, match="got None"):
        sparsify(_mlp(), None, 0.9)


def test_rules_that_match_nothing_and_a_call_that_converts_nothing_warn():
    model = _mlp()
    with pytest.warns(UserWarning, match=r"no layer matches \['\*\.mlp\.\*'\]") as caught:
        reports = sparsify(model, {"*.mlp.*": ("csr", 0.5)})
    assert any("no layer was converted" in str(w.message) for w in caught)
    assert all(r.pattern is None for r in reports.values()) and isinstance(model[0], nn.Linear)
    with pytest.warns(UserWarning, match="no layer was converted: the model itself is this layer"):
        sparsify(nn.Linear(8, 8), "csr", 0.5)


def test_a_global_sparsity_passes_by_the_patterns_that_fix_their_own():
    model = _mlp()
    reports = sparsify(model, {"0": "2:4", "2": "csr"}, 0.75)
    assert reports["0"].pattern == "2:4" and reports["0"].sparsity == pytest.approx(0.5)
    assert reports["2"].sparsity == pytest.approx(0.75, abs=0.01)
    with pytest.raises(ValueError, match="fixes the sparsity"):  # one pattern for all: the contradiction is said
        sparsify(_mlp(), "2:4", 0.75)


def test_blocks_too_coarse_for_a_layer_warn():
    model = _mlp()
    with pytest.warns(UserWarning, match=r"miss the sparsity asked.*asked 0.90, got 1.00"):
        reports = sparsify(model, "block:64", 0.9)
    assert reports["0"].retained == 0.0  # (what the warning is about: the layer pruned to zeros)
