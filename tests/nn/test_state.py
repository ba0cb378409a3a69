"""SparseLinear's state: what a state_dict holds, loading it (another pattern, another mask, from
disk through torch.save and safetensors), refusing bad ones, casts, and in-place updates."""
import json

import pytest
import torch
from torch import nn

import spartune as st
from spartune import dispatch
from spartune.formats import SparseFormat
from spartune.kernels import registry
from spartune.nn import SparseLinear, sparsify
from spartune.tune.problem import Epilogue, Problem

# every pattern, at a sparsity it accepts (N:M and V:N:M fix theirs)
PATTERNS = [("csr", 0.8), ("block:16", 0.5), ("block:16x32", 0.5), ("shfl:16", 0.5), ("2:4", None), ("16:2:8", None)]
IDS = [p for p, _ in PATTERNS]
FIELDS = {"csr": ("crow", "col", "row_order"), "block:16": ("crow", "col"), "block:16x32": ("crow", "col"),
          "shfl:16": ("perm", "crow", "col"), "2:4": ("idx",), "16:2:8": ("cols", "idx")}
SPEC = "_extra_state"


def mlp(seed, pattern, sparsity, out=24):
    """48 -> 40 -> out, both layers sparsified (40 and 24 rows, 48 and 40 columns: edge blocks
    and padded groups in every blocked pattern)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, out))
    sparsify(model, pattern, sparsity)
    return model


def layer(seed, pattern="csr", sparsity=0.8, out=24, bias=True):
    torch.manual_seed(seed)
    return SparseLinear.from_linear(nn.Linear(40, out, bias=bias), pattern, sparsity)


def snapshot(module):
    """Everything a load could change: the state (copied), the format objects, the Parameters."""
    return ({k: v.clone() for k, v in module.state_dict().items()},
            [m.weight for m in module.modules() if isinstance(m, SparseLinear)],
            [p for p in module.parameters()])


def assert_unchanged(module, snap):
    state, weights, params = snap
    now = module.state_dict()
    assert now.keys() == state.keys()
    for k, v in state.items():
        assert now[k].dtype == v.dtype and torch.equal(now[k], v), k
    assert [m.weight for m in module.modules() if isinstance(m, SparseLinear)] == weights  # same objects
    assert all(a is b for a, b in zip(module.parameters(), params))


def spec_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)


def run(model, x):
    with torch.no_grad():
        return model(x)


# --- what a state_dict holds --------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_state_dict_holds_values_indices_and_spec(pattern, sparsity):
    model = mlp(0, pattern, sparsity)
    sd = model.state_dict()
    expect = set()
    for i in ("0", "2"):
        fmt = model[int(i)].weight
        assert type(fmt).tensor_fields() == ("values", *FIELDS[pattern])
        expect |= {f"{i}.weight_{n}" for n in ("values", *FIELDS[pattern])} | {f"{i}.bias", f"{i}.{SPEC}"}
        assert torch.equal(sd[f"{i}.weight_values"], fmt.values)
        for n in FIELDS[pattern]:
            saved = sd[f"{i}.weight_{n}"]
            assert saved.dtype == getattr(fmt, n).dtype and torch.equal(saved, getattr(fmt, n)), n
        spec = sd[f"{i}.{SPEC}"]
        assert spec.dtype == torch.uint8 and bytes(spec.tolist()).decode() == fmt.spec
        assert json.loads(fmt.spec)["shape"] == list(fmt.shape)
    assert set(sd) == expect
    assert all(isinstance(v, torch.Tensor) for v in sd.values())  # tensors only: safetensors takes it as is
    assert [n for n, _ in model.named_parameters()] == ["0.weight_values", "0.bias", "2.weight_values", "2.bias"]


# --- round trips -----------------------------------------------------------------------------------------
def assert_same_model(dst, src, x):
    for i in (0, 2):
        assert type(dst[i].weight) is type(src[i].weight) and dst[i].weight.spec == src[i].weight.spec
        assert dst[i].weight.dtype == torch.float32
        assert torch.equal(dst[i].weight.to_dense(), src[i].weight.to_dense())
        assert torch.equal(dst[i].weight.mask(), src[i].weight.mask())
        assert torch.equal(dst[i].bias, src[i].bias)
    assert torch.equal(run(dst, x), run(src, x))


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_round_trip_into_a_model_with_another_mask(pattern, sparsity):
    src, dst = mlp(0, pattern, sparsity), mlp(1, pattern, sparsity)
    assert not torch.equal(src[0].weight.mask(), dst[0].weight.mask())  # the seeds gave other masks
    x = torch.randn(5, 48)
    assert not torch.allclose(run(src, x), run(dst, x))
    result = dst.load_state_dict(src.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    assert_same_model(dst, src, x)
    # the loaded layer owns its memory: training it leaves the source alone
    for i in (0, 2):
        assert dst[i].weight_values.data_ptr() != src[i].weight_values.data_ptr()
        assert {b.data_ptr() for b in dst[i].buffers()}.isdisjoint(b.data_ptr() for b in src[i].buffers())
    before = src[0].weight_values.clone()
    with torch.no_grad():
        dst[0].weight_values.mul_(2)
    assert torch.equal(src[0].weight_values, before)


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_from_state_dict_rebuilds_a_layer(pattern, sparsity):
    src = mlp(0, pattern, sparsity)
    sd = src.state_dict()
    x = torch.randn(5, 48)
    h = torch.relu(run(src[0], x))
    for i, inp in ((0, x), (2, h)):
        rebuilt = SparseLinear.from_state_dict(sd, f"{i}.")
        assert type(rebuilt.weight) is type(src[i].weight) and rebuilt.weight.spec == src[i].weight.spec
        assert (rebuilt.in_features, rebuilt.out_features) == (src[i].in_features, src[i].out_features)
        assert torch.equal(rebuilt.weight.to_dense(), src[i].weight.to_dense())
        assert torch.equal(rebuilt.bias, src[i].bias)
        assert torch.equal(run(rebuilt, inp), run(src[i], inp))
        assert set(rebuilt.state_dict()) == {k[2:] for k in sd if k.startswith(f"{i}.")}
        mine = [*rebuilt.parameters(), *rebuilt.buffers()]  # copies: training it leaves the source alone
        assert {t.data_ptr() for t in mine}.isdisjoint(t.data_ptr() for t in [*src[i].parameters(), *src[i].buffers()])
    with pytest.raises(KeyError, match="no spartune weight"):
        SparseLinear.from_state_dict(sd, "1.")
    partial = {k: v for k, v in sd.items() if k != f"0.weight_{FIELDS[pattern][0]}"}
    with pytest.raises(KeyError, match=f"0.weight_{FIELDS[pattern][0]}"):
        SparseLinear.from_state_dict(partial, "0.")


def test_from_state_dict_of_a_layer_without_bias():
    src = layer(0, "block:16", 0.5, bias=False)
    rebuilt = SparseLinear.from_state_dict(src.state_dict())
    assert rebuilt.bias is None
    assert torch.equal(rebuilt.weight.to_dense(), src.weight.to_dense())


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_torch_save_and_load(pattern, sparsity, tmp_path):
    src = mlp(0, pattern, sparsity)
    path = tmp_path / "model.pt"
    torch.save(src.state_dict(), path)
    sd = torch.load(path, weights_only=True)  # tensors only: the safe loader takes it
    dst = mlp(1, pattern, sparsity)
    dst.load_state_dict(sd)
    assert_same_model(dst, src, torch.randn(5, 48))


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_a_deep_copy_or_pickle_is_found_by_the_operators(pattern, sparsity):
    """A copied layer's format is the one the operators find at its tensors' addresses, so
    its tuned choices serve every call (not a format wrapped and tuned anew each time)."""
    import copy
    import pickle

    from spartune import library

    src = mlp(0, pattern, sparsity)
    for dst in (copy.deepcopy(src), pickle.loads(pickle.dumps(src))):
        layers = [m for m in dst.modules() if isinstance(m, SparseLinear)]
        assert layers
        for m in layers:
            assert m.weight.tensor_list()[0] is m.weight_values
            assert library.format_of(m.weight.tensor_list(), m.weight.spec) is m.weight
        assert_same_model(dst, src, torch.randn(5, 48))


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_safetensors_round_trip(pattern, sparsity, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src = mlp(0, pattern, sparsity)
    path = str(tmp_path / "model.safetensors")
    safetensors_torch.save_file(src.state_dict(), path)
    sd = safetensors_torch.load_file(path)
    assert sd.keys() == src.state_dict().keys()
    dst = mlp(1, pattern, sparsity)
    dst.load_state_dict(sd)
    assert_same_model(dst, src, torch.randn(5, 48))


@pytest.mark.parametrize("src_i", range(len(PATTERNS)), ids=[f"{a}->{b}" for a, b in zip(IDS, IDS[1:] + IDS[:1])])
def test_loading_another_pattern_adopts_the_saved_format(src_i):
    """Intended: a state_dict holds a whole format (its spec says which), so loading one saved
    from another pattern replaces the layer's format by the saved one, values and pattern alike;
    it is never squeezed into the layer's old pattern (which would silently lose weights)."""
    (src_pat, src_sp), (dst_pat, dst_sp) = PATTERNS[src_i], PATTERNS[(src_i + 1) % len(PATTERNS)]
    src, dst = mlp(0, src_pat, src_sp), mlp(1, dst_pat, dst_sp)
    assert type(dst[0].weight) is not type(src[0].weight) or dst[0].weight.spec != src[0].weight.spec
    dst.load_state_dict(src.state_dict())
    assert_same_model(dst, src, torch.randn(5, 48))
    assert dst.state_dict().keys() == src.state_dict().keys()
    assert dst[0].weight.signature == str(st.parse_pattern(src_pat))


def test_load_copies_into_the_same_parameter_so_an_optimizer_built_before_still_trains_it():
    src, dst = layer(0), layer(1)
    dst.requires_grad_(True)
    opt = torch.optim.SGD(dst.parameters(), lr=0.1)
    param = dst.weight_values
    dst.load_state_dict(src.state_dict())
    assert dst.weight_values is param and dst.weight_values.requires_grad
    assert torch.equal(dst.weight.to_dense(), src.weight.to_dense())
    x = torch.randn(6, 40)
    dst(x).square().sum().backward()
    opt.step()
    assert not torch.equal(dst.weight.to_dense(), src.weight.to_dense())  # the step reached the loaded layer
    assert torch.allclose(run(dst, x), st.reference.linear(x, dst.weight, dst.bias).float(), atol=1e-5)


def test_a_checkpoint_keeping_other_values_warns_that_the_parameter_is_new():
    """nn.Linear refuses a size mismatch; a sparse checkpoint pruned further is adopted, and the
    user is told that an optimizer built before the load no longer holds the layer's values."""
    src, dst = layer(0, "csr", 0.9), layer(1, "csr", 0.5)
    param = dst.weight_values
    with pytest.warns(UserWarning, match="new Parameter") as caught:
        dst.load_state_dict(src.state_dict())
    assert caught[0].filename == __file__  # the user's load_state_dict call, not torch's machinery
    assert dst.weight_values is not param
    assert torch.equal(dst.weight.to_dense(), src.weight.to_dense())


class TiedPair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(40, 40), nn.Linear(40, 40)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_tied_weight_stays_tied_through_a_load():
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(TiedPair())
        sparsify(models[-1], "csr", 0.8)
    src, dst = models
    assert dst.a.weight_values is dst.b.weight_values and dst.a.weight is dst.b.weight
    dst.load_state_dict(src.state_dict())
    assert dst.a.weight_values is dst.b.weight_values  # still one Parameter: an optimizer step moves both
    for m in (dst.a, dst.b):
        assert torch.equal(m.weight.to_dense(), src.a.weight.to_dense())
    x = torch.randn(3, 40)
    assert torch.equal(run(dst, x), run(src, x))


# --- bad state dicts: refused, with a message, the layer unchanged -------------------------------------------
def load_error(module, sd, strict=True) -> str:
    with pytest.raises(RuntimeError) as info:
        module.load_state_dict(sd, strict=strict)
    return str(info.value)


def test_missing_keys_are_refused():
    target, sd = layer(1), layer(0).state_dict()
    for key in ("weight_col", "weight_values", "bias", SPEC):
        snap = snapshot(target)
        bad = {k: v for k, v in sd.items() if k != key}
        assert f'Missing key(s) in state_dict: "{key}"' in load_error(target, bad)
        assert_unchanged(target, snap)


def test_a_layer_missing_from_the_checkpoint_reports_each_of_its_keys():
    """As nn.Linear reports weight and bias, a SparseLinear absent from a checkpoint reports every
    key it holds (strict=False), not its spec alone."""
    src, dst = mlp(0, "csr", 0.8), mlp(1, "csr", 0.8)
    sd = {k: v for k, v in src.state_dict().items() if not k.startswith("2.")}
    result = dst.load_state_dict(sd, strict=False)
    assert sorted(result.missing_keys) == sorted(k for k in dst.state_dict() if k.startswith("2."))


def test_an_unexpected_key_is_refused_when_strict():
    """strict=True raises on an extra key, naming it. As for nn.Linear, the layer's own keys are
    loaded all the same: torch calls every module's _load_from_state_dict with strict=True
    whatever the caller asked, and raises only once all of them ran, so no layer can tell a
    strict load from a lenient one. strict=False loads and reports the key."""
    target, src = layer(1), layer(0)
    bad = {**src.state_dict(), "weight_extra": torch.zeros(3)}
    assert 'Unexpected key(s) in state_dict: "weight_extra"' in load_error(target, bad)
    assert torch.equal(target.weight.to_dense(), src.weight.to_dense())
    torch.manual_seed(1)
    dense = nn.Linear(40, 24)
    with pytest.raises(RuntimeError, match="weight_extra"):
        dense.load_state_dict({"weight": torch.zeros(24, 40), "bias": torch.zeros(24), "weight_extra": torch.zeros(3)})
    assert not dense.weight.any()  # nn.Linear: the same contract
    target = layer(1)
    result = target.load_state_dict(bad, strict=False)
    assert result.unexpected_keys == ["weight_extra"] and not result.missing_keys
    assert torch.equal(target.weight.to_dense(), src.weight.to_dense())


def test_a_dense_linear_state_dict_is_refused():
    target = layer(1)
    snap = snapshot(target)
    torch.manual_seed(0)
    msg = load_error(target, nn.Linear(40, 24).state_dict())
    assert "weight is a dense tensor" in msg and "nn.Linear" in msg and "from_linear" in msg
    assert_unchanged(target, snap)
    # inside a model: the dense checkpoint of the model before sparsify
    model = mlp(1, "block:16", 0.5)
    snap = snapshot(model)
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 24))
    msg = load_error(model, dense.state_dict())
    assert "0.weight is a dense tensor" in msg and "2.weight is a dense tensor" in msg
    assert_unchanged(model, snap)


def test_another_shape_is_refused():
    target = layer(1)  # 24 x 40
    snap = snapshot(target)
    msg = load_error(target, layer(0, out=16).state_dict())
    assert "size mismatch for weight: the saved weight is 16x40, this layer's is 24x40" in msg
    assert_unchanged(target, snap)
    # a model whose second layer has another out_features: that layer refused and unchanged
    model = mlp(1, "csr", 0.8)
    snap2 = snapshot(model[2])
    assert "size mismatch for 2.weight" in load_error(model, mlp(0, "csr", 0.8, out=16).state_dict())
    assert_unchanged(model[2], snap2)


def test_a_bias_of_another_shape_is_refused():
    target, sd = layer(1), dict(layer(0).state_dict())
    sd["bias"] = torch.zeros(7)
    snap = snapshot(target)
    assert "size mismatch for bias" in load_error(target, sd)
    assert_unchanged(target, snap)


def _corrupt(pattern, sd, prefix):
    """An index out of range for each format, and the validation message it must raise."""
    sd = dict(sd)
    field = {"2:4": "idx", "16:2:8": "cols"}.get(pattern, "col")
    t = sd[prefix + f"weight_{field}"].clone()
    cols = 40  # both layers' in_features it is corrupted in
    limit = {"csr": cols, "block:16": -(-cols // 16), "block:16x32": -(-cols // 32), "shfl:16": cols,
             "2:4": 4, "16:2:8": 8}[pattern]
    sd[prefix + f"weight_{field}"] = t
    if pattern == "2:4":  # 2-bit codes hold no position out of range: a repeated one (0, 0)
        t.view(-1)[0] = 0
        return sd, "idx must be strictly increasing"
    t.view(-1)[0] = limit
    return sd, f"{field} must lie in [0, {limit})"


@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_a_corrupted_index_is_refused_by_validation(pattern, sparsity):
    target = layer(1, pattern, sparsity)
    sd, expect = _corrupt(pattern, layer(0, pattern, sparsity).state_dict(), "")
    snap = snapshot(target)
    msg = load_error(target, sd)
    assert "the saved sparse weight is not valid" in msg and expect in msg, msg
    assert_unchanged(target, snap)
    with pytest.raises(ValueError, match=expect.replace("[", r"\[").replace(")", r"\)")):
        SparseLinear.from_state_dict(sd)
    # in a model: the corrupted layer refused and unchanged (torch loads the others, then raises)
    model = mlp(1, pattern, sparsity)
    snap2 = snapshot(model[2])
    sd2, _ = _corrupt(pattern, mlp(0, pattern, sparsity).state_dict(), "2.")
    assert expect in load_error(model, sd2)
    assert_unchanged(model[2], snap2)


@pytest.mark.parametrize("raw,expect", [
    (spec_bytes('{"format":"CSR","sha'), "not a spartune format spec"),  # truncated
    (torch.tensor([0xFF, 0xFE, 0x00, 0x7B], dtype=torch.uint8), "not a spartune format spec"),  # not UTF-8
    (spec_bytes("[1, 2]"), "not a spartune format spec"),
    (spec_bytes('{"format":"Dense","shape":[24,40]}'), "unknown sparse format 'Dense'"),
    (spec_bytes('{"format":"CSR","shape":[25,40]}'), "the saved sparse weight is not valid"),  # crow, row_order: 24 rows
    (spec_bytes('{"format":"CSR","shape":[24,40],"block":[16,16]}'), "the saved sparse weight is not valid"),
    (spec_bytes('{"format":"CSR","shape":[24,4000]}'), "size mismatch for weight"),  # a valid CSR, of another shape
    (spec_bytes('{"format":"BlockSparse","shape":[24,40],"block":[16,16]}'), 'Unexpected key(s) in state_dict: "weight_row_order"'),
], ids=["truncated", "not-utf8", "not-an-object", "unknown-format", "rows", "stray-field", "cols", "other-format"])
def test_corrupted_spec_bytes_are_refused(raw, expect):
    target, sd = layer(1), dict(layer(0).state_dict())
    sd[SPEC] = raw
    snap = snapshot(target)
    msg = load_error(target, sd)
    assert expect in msg, msg
    assert_unchanged(target, snap)


# --- casts -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_casts_keep_index_types_and_requires_grad_and_compute(pattern, sparsity, requires_grad):
    src = layer(0, pattern, sparsity).requires_grad_(requires_grad)
    x = torch.randn(7, 40)
    run(src, x)  # tuned and memoised in fp32 first: a cast must not reuse any of it
    index_dtypes = {n: b.dtype for n, b in src.named_buffers()}
    for cast, dtype in ((lambda m: m.double(), torch.float64), (lambda m: m.to(torch.float16), torch.float16),
                        (lambda m: m.to(dtype=torch.float32), torch.float32)):
        old = src.weight
        out = cast(src)
        assert out is src
        assert {n: b.dtype for n, b in src.named_buffers()} == index_dtypes
        assert src.weight_values.dtype == dtype and src.bias.dtype == dtype
        assert src.weight_values.requires_grad == requires_grad and src.bias.requires_grad == requires_grad
        assert isinstance(src.weight_values, nn.Parameter)
        fmt = src.weight
        assert fmt is not old and fmt.dtype == dtype  # a new format object ...
        assert all(a is b for a, b in zip(fmt.tensor_list(), [src.weight_values, *src.buffers()]))  # ... over these
        xd = x.to(dtype)
        ref = st.reference.linear(xd, fmt, src.bias)
        y = run(src, xd)
        assert y.dtype == dtype
        if dtype == torch.float64:
            assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)  # float64 is torch's dense product: exact
        else:
            assert st.reference.rel_err(y, ref) < st.reference.tolerance(dtype)
        if requires_grad:  # the operator route too (autograd records)
            y = src(xd)
            assert y.requires_grad and st.reference.rel_err(y, ref) < (1e-12 if dtype == torch.float64 else 1e-2)


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.8), ("2:4", None)], ids=["csr", "2:4"])
def test_load_keeps_the_layers_dtype(pattern, sparsity):
    src = mlp(0, pattern, sparsity)  # fp32
    dst = mlp(1, pattern, sparsity).double()
    dst.load_state_dict(src.state_dict())
    x = torch.randn(5, 48, dtype=torch.float64)
    for i in (0, 2):
        assert dst[i].weight.dtype == torch.float64 and dst[i].bias.dtype == torch.float64
        assert torch.equal(dst[i].weight.to_dense(), src[i].weight.to_dense().double())
    assert run(dst, x).dtype == torch.float64
    ref = st.reference.linear(torch.relu(st.reference.linear(x, dst[0].weight, dst[0].bias)), dst[2].weight, dst[2].bias)
    assert torch.allclose(run(dst, x), ref, rtol=1e-12, atol=1e-12)
    half = mlp(2, pattern, sparsity).half()  # and the other way: fp32 saved into an fp16 layer
    half.load_state_dict(src.state_dict())
    assert half[0].weight.dtype == torch.float16
    assert torch.equal(half[0].weight.to_dense(), src[0].weight.to_dense().half())


# --- in-place updates of the values: memoised copies follow -----------------------------------------------------
@pytest.mark.parametrize("pattern,sparsity", PATTERNS, ids=IDS)
def test_an_optimizer_step_changes_the_eager_no_grad_output(pattern, sparsity):
    model = mlp(0, pattern, sparsity).requires_grad_(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(6, 48)
    before = run(model, x)  # eager, no grad: ops.linear straight, its memos made now
    buffers = [b.clone() for b in model.buffers()]
    formats = [model[0].weight, model[2].weight]
    for _ in range(2):  # a second step: memos refreshed again, not only once
        opt.zero_grad()
        model(torch.randn(6, 48)).square().mean().backward()
        opt.step()  # in place on weight_values
        after = run(model, x)
        h = torch.relu(x.double() @ model[0].weight.to_dense().double().T + model[0].bias.double())
        ref = h @ model[2].weight.to_dense().double().T + model[2].bias.double()
        assert st.reference.rel_err(after, ref) < 1e-5
        assert not torch.allclose(after, before, atol=1e-3)
        before = after
    assert [model[0].weight, model[2].weight] == formats  # the same format objects, values updated in place
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))  # the pattern stays


def _kernel_configs(A, n):
    """One config of each kernel path of every family that serves A here (the interpreter)."""
    problem = Problem("linear", A.signature, *A.shape, n, "float32", A.stats(), Epilogue(),
                      dispatch.device_name(A.device), "linear")
    for family in registry.families("linear", A):
        if not family.available(A.device):
            continue
        seen = set()
        for cfg in family.space(problem):
            path = (getattr(cfg, "path", None), getattr(cfg, "tma", False), getattr(cfg, "persistent", False))
            if path not in seen and not path[1]:
                seen.add(path)
                yield family, cfg


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.8), ("block:16", 0.5), ("shfl:16", 0.5)],
                         ids=["csr", "block:16", "shfl:16"])
def test_an_in_place_update_reaches_every_kernel_path(pattern, sparsity):
    """The kernels' own memos (CSR's ELL copy, packed layouts) follow the values too."""
    lin = layer(0, pattern, sparsity)
    A, x = lin.weight, torch.randn(6, 40)
    configs = list(_kernel_configs(A, 6))
    assert configs
    for family, cfg in configs:
        out = torch.empty(6, 24)
        family.launch(A, x, out, cfg)
        assert st.reference.rel_err(out, st.reference.linear(x, A)) < 1e-5, (family.name, cfg)
    with torch.no_grad():
        lin.weight_values.mul_(-2).add_(lin.weight.gather(torch.ones(A.shape)))  # padding stays zero
    SparseFormat.from_spec(A.spec, A.tensor_list())  # still a valid format
    for family, cfg in configs:
        out = torch.empty(6, 24)
        family.launch(A, x, out, cfg)
        assert st.reference.rel_err(out, st.reference.linear(x, A)) < 1e-5, (family.name, cfg)


def test_the_operators_do_not_take_a_moved_format_for_new_tensors_at_its_old_address():
    """After `param.data = ...` moves a layer's values, tensors at the old address (the old
    storage, still alive) are not mistaken for that layer's format."""
    from spartune import library

    m = layer(0, "csr", 0.8)
    old = m.weight_values.data
    m.weight_values.data = old.clone()
    tensors = [old, *m.weight.tensor_list()[1:]]
    found = library.format_of(tensors, m.weight.spec)
    assert found is not m.weight and found.values is old


@pytest.mark.parametrize("pattern", ["2:4", "16:2:8"])
def test_a_checkpoint_with_positions_one_a_byte_still_loads(pattern):
    """Before 2026-11-27 N:M and V:N:M weights stored each position in a byte: such a state_dict
    loads, and the layer keeps them packed (2 bits each)."""
    source, target = layer(0, pattern, None), layer(1, pattern, None)
    sd = source.state_dict()
    sd["weight_idx"] = source.weight.positions.clone()
    target.load_state_dict(sd)
    assert torch.equal(target.weight.to_dense(), source.weight.to_dense())
    assert torch.equal(target.weight_idx, source.weight_idx)
    assert target.weight_idx.shape[1] == -(-sd["weight_idx"].shape[1] // 4)  # four 2-bit codes a byte
    x = torch.randn(3, 40)
    torch.testing.assert_close(target(x), source(x))


def test_a_pickle_with_positions_one_a_byte_still_loads():
    """A whole model pickled before the positions were packed (torch.save(model)): its format and
    the layer's buffer come back packed, and the layer computes what it did."""
    import pickle

    source = layer(0, "2:4", None)
    x = torch.randn(3, 40)
    expected = source(x)
    legacy = source.weight.positions.clone()  # what the buffer and the format held then
    object.__setattr__(source.weight, "idx", legacy)
    source.weight_idx = legacy
    loaded = pickle.loads(pickle.dumps(source))
    assert loaded.weight_idx.shape[1] == -(-legacy.shape[1] // 4) and loaded.weight.idx is loaded.weight_idx
    torch.testing.assert_close(loaded(x), expected)


def test_a_pickled_or_copied_model_holds_its_weights_once():
    """torch.save(model) and copy.deepcopy leave the kernels' copies (a dense copy, layouts) behind:
    the file is the size of a fresh sparsified model's, and the copy computes what the model did."""
    import copy
    import dataclasses
    import io

    def saved_bytes(model):
        buf = io.BytesIO()
        torch.save(model, buf)
        return len(buf.getvalue())

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 64))
    sparsify(model, "csr", 0.9)
    fresh = saved_bytes(model)
    x = torch.randn(5, 128)
    with torch.no_grad():
        y = model(x)
        model(torch.randn(64, 128))  # another call shape: more copies memoised
    assert saved_bytes(model) < 1.1 * fresh
    twin = copy.deepcopy(model)
    w = twin[0].weight
    assert set(w.__dict__) <= {f.name for f in dataclasses.fields(w)} | {"_spec", "_stats"}
    with torch.no_grad():
        torch.testing.assert_close(twin(x), y)
