"""SparseMultiheadAttention against the nn.MultiheadAttention it came from, and transformer
encoders whose fused eval path must be switched off once a weight is not a tensor."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spartune.nn.attention import SparseMultiheadAttention, disable_fused_fast_paths

E, H, L, S, N = 16, 4, 5, 7, 3
F64 = torch.float64


class OpaqueLinear(nn.Module):
    """nn.Linear's computation with `.weight` a non-tensor, as a SparseLinear's format is."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.w = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    @property
    def weight(self):
        return object()

    def forward(self, x):
        return F.linear(x, self.w, self.bias)


def _mha(batch_first=True, bias=True, dropout=0.0):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, dropout=dropout, bias=bias, batch_first=batch_first, dtype=F64)
    if bias:  # MHA zero-initialises its biases; make them count
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha


def _inputs(case, batch_first):
    g = torch.Generator().manual_seed(1)
    unbatched = case.startswith("unbatched")
    src = S if case in ("cross", "kv_shared") else L

    def seq(n):
        shape = (n, E) if unbatched else (N, n, E) if batch_first else (n, N, E)
        return torch.randn(*shape, generator=g, dtype=F64)

    q = seq(L)
    k, v = (q, q) if src == L else (seq(S), seq(S))
    if case == "kv_shared":
        v = k
    kw = {}
    bool_mask = torch.rand(L, src, generator=g) < 0.3
    bool_mask[:, 0] = False  # no fully masked row: both sides would give NaN
    kpm = torch.rand(N, src, generator=g) < 0.3
    kpm[:, 0] = False
    if case == "bool_mask":
        kw["attn_mask"] = bool_mask
    elif case == "float_mask":
        kw["attn_mask"] = torch.randn(L, src, generator=g, dtype=F64)
    elif case == "mask_3d":
        kw["attn_mask"] = torch.randn(N * H, L, src, generator=g, dtype=F64)
    elif case == "key_padding":
        kw["key_padding_mask"] = kpm
    elif case == "both_masks":
        kw["attn_mask"], kw["key_padding_mask"] = bool_mask, kpm
    elif case == "float_both":
        kw["attn_mask"] = torch.randn(L, src, generator=g, dtype=F64)
        kw["key_padding_mask"] = torch.zeros(N, src, dtype=F64).masked_fill(kpm, -1e4)
    elif case == "causal":
        kw["attn_mask"], kw["is_causal"] = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64), True
    elif case == "causal_padding":
        kw["attn_mask"], kw["is_causal"] = torch.ones(L, L, dtype=torch.bool).triu(1), True
        kw["key_padding_mask"] = kpm
    elif case == "mask_3d_padding":
        kw["attn_mask"] = (torch.rand(N * H, L, src, generator=g) < 0.3).index_fill(2, torch.tensor([0]), False)
        kw["key_padding_mask"] = kpm
    elif case == "unbatched":
        kw["attn_mask"] = bool_mask
        kw["key_padding_mask"] = kpm[0]
    elif case == "unbatched_3d":
        kw["attn_mask"] = torch.randn(H, L, src, generator=g, dtype=F64)
    return q, k, v, kw


CASES = ["self", "cross", "kv_shared", "bool_mask", "float_mask", "mask_3d", "key_padding", "both_masks",
         "float_both", "causal", "causal_padding", "mask_3d_padding", "unbatched", "unbatched_3d"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_matches_multihead_attention(case, batch_first, training, need_weights, average):
    mha = _mha(batch_first).train(training)
    sparse = SparseMultiheadAttention.from_mha(mha)
    assert sparse.training == training
    q, k, v, kw = _inputs(case, batch_first)
    kw.update(need_weights=need_weights, average_attn_weights=average)
    out, w = sparse(q, k, v, **kw)
    ref_out, ref_w = mha(q, k, v, **kw)
    assert out.shape == ref_out.shape
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    else:
        assert w is None and ref_w is None


@pytest.mark.parametrize("need_weights", [True, False])
def test_dropout_only_in_training_and_same_as_mha_under_one_seed(need_weights):
    mha = _mha(dropout=0.4)
    sparse = SparseMultiheadAttention.from_mha(mha)
    q, _, _, _ = _inputs("self", True)
    torch.manual_seed(5)
    out, w = sparse(q, q, q, need_weights=need_weights)
    torch.manual_seed(5)
    ref_out, ref_w = mha(q, q, q, need_weights=need_weights)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    eval_out = sparse.eval()(q, q, q, need_weights=need_weights)[0]
    assert not torch.allclose(out, eval_out)
    torch.testing.assert_close(eval_out, mha.eval()(q, q, q, need_weights=need_weights)[0], atol=1e-10, rtol=0)


def test_no_bias_and_module_layout():
    mha = _mha(bias=False)
    sparse = SparseMultiheadAttention.from_mha(mha)
    assert sparse.in_proj.bias is None and sparse.out_proj.bias is None and sparse.in_proj_bias is None
    assert sparse.in_proj_weight is sparse.in_proj.weight and sparse.in_proj.weight.shape == (3 * E, E)
    assert sparse.in_proj.weight.dtype == F64 and sparse.batch_first and sparse.head_dim == E // H
    q, k, v, _ = _inputs("cross", True)
    torch.testing.assert_close(sparse(q, k, v)[0], mha(q, k, v)[0], atol=1e-10, rtol=0)


def test_projections_are_called_as_modules():
    sparse = SparseMultiheadAttention.from_mha(_mha())
    calls = []
    for m in (sparse.in_proj, sparse.out_proj):
        m.register_forward_hook(lambda mod, args, out: calls.append(mod))
    q, k, v, _ = _inputs("self", True)
    sparse(q, q, q)
    assert calls == [sparse.in_proj, sparse.out_proj]
    calls.clear()
    q, k, v, _ = _inputs("cross", True)
    sparse(q, k, v)
    assert calls == [sparse.in_proj] * 3 + [sparse.out_proj]


def test_bad_dimensions_are_refused():
    for kwargs in (dict(embed_dim=10, num_heads=4), dict(embed_dim=8, num_heads=0), dict(embed_dim=8, num_heads=2, kdim=0)):
        with pytest.raises(ValueError, match="must be"):
            SparseMultiheadAttention(**kwargs)


OPTIONS = [dict(kdim=8, vdim=8), dict(kdim=6, vdim=10), dict(add_bias_kv=True), dict(add_zero_attn=True),
           dict(kdim=6, vdim=10, add_bias_kv=True, add_zero_attn=True)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("masks", ["none", "key_padding", "both", "mask_3d"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_every_mha_option_matches_multihead_attention(options, masks, batch_first, need_weights):
    """kdim / vdim apart from embed_dim (separate q/k/v projections), add_bias_kv and
    add_zero_attn (key/value rows appended after the masks' columns)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=F64, **options)
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_()  # biases too (MHA zero-initialises them)
    sparse = SparseMultiheadAttention.from_mha(mha)
    g = torch.Generator().manual_seed(1)
    kd, vd = options.get("kdim", E), options.get("vdim", E)

    def seq(n, d):
        return torch.randn(*((N, n, d) if batch_first else (n, N, d)), generator=g, dtype=F64)

    q, k, v = seq(L, E), seq(S, kd), seq(S, vd)
    kw = dict(need_weights=need_weights)
    kpm = torch.rand(N, S, generator=g) < 0.3
    kpm[:, 0] = False
    if masks in ("key_padding", "both"):
        kw["key_padding_mask"] = kpm
    if masks == "both":
        kw["attn_mask"] = torch.randn(L, S, generator=g, dtype=F64)
    if masks == "mask_3d":
        kw["attn_mask"] = torch.randn(N * H, L, S, generator=g, dtype=F64)
    out, w = sparse(q, k, v, **kw)
    ref_out, ref_w = mha(q, k, v, **kw)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    if "kdim" in options:
        assert not hasattr(sparse, "in_proj") and sparse.k_proj.weight.shape == (E, kd)
        torch.testing.assert_close(sparse.in_proj_bias, mha.in_proj_bias, atol=0, rtol=0)


def _randomize(module):
    torch.manual_seed(2)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3).add_(1 if p.dim() == 1 else 0)
    return module


def _batch(batch_first):
    torch.manual_seed(3)
    x = torch.randn(N, L, E, dtype=F64) if batch_first else torch.randn(L, N, E, dtype=F64)
    kpm = torch.zeros(N, L, dtype=torch.bool)
    kpm[1, 3:] = True  # left-aligned padding, which the nested-tensor path accepts
    return x, kpm


def _swap(layer):
    layer.self_attn = SparseMultiheadAttention.from_mha(layer.self_attn)
    layer.linear1 = OpaqueLinear(layer.linear1)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_runs_its_slow_path_once_disabled(batch_first, norm_first, grad):
    dense = _randomize(nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=batch_first,
                                                  norm_first=norm_first, dtype=F64))
    layer = copy.deepcopy(dense).eval()
    _swap(layer)
    x, kpm = _batch(batch_first)
    with torch.set_grad_enabled(grad):
        if batch_first:  # the fused path is tried, and cannot take a non-tensor weight
            with pytest.raises((AttributeError, TypeError)):
                layer(x, src_key_padding_mask=kpm)
        assert disable_fused_fast_paths(layer) == [""]
        ref = dense.train()(x, src_key_padding_mask=kpm)  # training mode never takes the fast path
        torch.testing.assert_close(layer(x, src_key_padding_mask=kpm), ref, atol=1e-10, rtol=0)
    assert disable_fused_fast_paths(layer) == []


@pytest.mark.parametrize("grad", [False, True])
def test_encoder_with_nested_tensors_runs_its_slow_path_once_disabled(grad):
    dense = _randomize(nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, dtype=F64),
        2, enable_nested_tensor=True)).eval()
    x, kpm = _batch(True)
    with torch.no_grad():  # the dense model does take the nested path: it zeroes the padded rows
        assert dense(x, src_key_padding_mask=kpm)[1, 3:].abs().max() == 0
    model = copy.deepcopy(dense)
    for layer in model.layers:
        _swap(layer)
    with torch.set_grad_enabled(grad):
        if not grad:
            with pytest.raises((AttributeError, TypeError)):
                model(x, src_key_padding_mask=kpm)
        assert disable_fused_fast_paths(model) == ["", "layers.0", "layers.1"]
        ref = dense.train()(x, src_key_padding_mask=kpm)
        torch.testing.assert_close(model(x, src_key_padding_mask=kpm), ref, atol=1e-10, rtol=0)


def test_dense_sparse_mha_is_accepted_by_the_fused_encoder_layer(monkeypatch):
    """With dense projections the fused kernel gets everything it reads from self_attn."""
    dense = _randomize(nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, dtype=F64)).eval()
    layer = copy.deepcopy(dense)
    layer.self_attn = SparseMultiheadAttention.from_mha(layer.self_attn)
    fused = torch._transformer_encoder_layer_fwd
    calls = []
    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", lambda *a: calls.append(1) or fused(*a))
    x, kpm = _batch(True)
    with torch.no_grad():
        out = layer(x, src_key_padding_mask=kpm)
    assert calls == [1]
    torch.testing.assert_close(out, dense.train()(x, src_key_padding_mask=kpm), atol=1e-10, rtol=0)


def test_plain_mha_with_opaque_weight_is_refused():
    model = nn.Sequential(nn.MultiheadAttention(E, H))
    model[0].out_proj = OpaqueLinear(model[0].out_proj)
    with pytest.raises(TypeError, match="from_mha"):
        disable_fused_fast_paths(model)


def test_compiles_without_graph_break():
    sparse = SparseMultiheadAttention.from_mha(_mha()).eval()
    q, _, _, kw = _inputs("key_padding", True)
    compiled = torch.compile(sparse, fullgraph=True, backend="aot_eager")
    out, w = compiled(q, q, q, key_padding_mask=kw["key_padding_mask"], need_weights=False)
    assert w is None
    torch.testing.assert_close(out, sparse(q, q, q, key_padding_mask=kw["key_padding_mask"],
                                           need_weights=False)[0], atol=1e-10, rtol=0)
