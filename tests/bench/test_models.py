"""The end-to-end models on the CPU: shapes, sizes, batch-norm folding and what sparsify converts."""
import torch
from torch import nn

import spartune as st
from spartune.bench.models import fold_batch_norms, mobilenet_v1


def test_mobilenet_v1_shape_and_size():
    model = mobilenet_v1().eval()
    assert sum(p.numel() for p in model.parameters()) == 4_231_976  # the paper's 4.2 M
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_folding_batch_norms_keeps_the_output():
    torch.manual_seed(0)
    model = mobilenet_v1(num_classes=10, width=0.25).double()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        fold_batch_norms(model)
        assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
        assert torch.allclose(model(x), before, atol=1e-10)


def test_sparsify_takes_the_pointwise_convolutions_and_the_classifier():
    model = fold_batch_norms(mobilenet_v1(num_classes=10, width=0.25).eval())
    reports = st.sparsify(model, "csr", 0.9)
    converted = [n for n, r in reports.items() if r.pattern]
    assert len(converted) == 14  # 13 pointwise convolutions and the classifier
    assert sum(1 for m in model.modules() if isinstance(m, st.SparseConv2d)) == 13
    assert sum(1 for r in reports.values() if "pointwise" in r.skipped) == 14  # the stem and 13 depthwise
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def tiny_llama():
    from spartune.bench.models import LlamaDecoderLayer

    torch.manual_seed(5)
    return LlamaDecoderLayer(hidden=64, intermediate=160, heads=4).double().eval()


def test_llama_layer_size():
    from spartune.bench.models import LlamaDecoderLayer

    with torch.device("meta"):
        layer = LlamaDecoderLayer()
    assert sum(p.numel() for p in layer.parameters()) == 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096


def test_llama_decode_with_the_cache_matches_prefill():
    from spartune.bench.models import KVCache

    layer = tiny_llama()
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, torch.arange(9))
        cache = KVCache(2, 4, 16, 16, dtype=torch.float64)
        prefill = layer(x[:, :5], torch.arange(5), cache)  # prefill 5 tokens, then decode one at a time
        steps = [layer(x[:, i:i + 1], torch.tensor([i]), cache) for i in range(5, 9)]
    assert torch.allclose(prefill, full[:, :5], atol=1e-12)
    assert torch.allclose(torch.cat(steps, 1), full[:, 5:], atol=1e-12)


def test_llama_both_cache_routes_match_prefill():
    """Fewer than FUSED_ATTENTION_MIN_QUERIES tokens take two matmuls, more take SDPA's kernels."""
    from spartune.bench.models import FUSED_ATTENTION_MIN_QUERIES as Q, KVCache

    layer = tiny_llama()
    x = torch.randn(1, Q + 3, 64, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, torch.arange(Q + 3))
        cache = KVCache(1, 4, Q + 3, 16, dtype=torch.float64)
        long = layer(x[:, :Q], torch.arange(Q), cache)
        short = layer(x[:, Q:], torch.arange(Q, Q + 3), cache)
    assert torch.allclose(long, full[:, :Q], atol=1e-12)
    assert torch.allclose(short, full[:, Q:], atol=1e-12)


def test_sparsify_takes_the_seven_projections():
    layer = tiny_llama()
    reports = st.sparsify(layer, "csr", 0.75)
    assert sorted(n for n, r in reports.items() if r.pattern) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    with torch.no_grad():
        assert layer(torch.randn(1, 3, 64, dtype=torch.float64), torch.arange(3)).shape == (1, 3, 64)


def test_bad_input_is_refused_with_a_clear_error():
    import pytest

    from spartune.bench.bert import BertConfig, BertEncoder
    from spartune.bench.models import KVCache, LlamaDecoderLayer

    with pytest.raises(ValueError, match="width"):
        mobilenet_v1(width=0)
    with pytest.raises(ValueError, match="heads"):
        LlamaDecoderLayer(hidden=60, intermediate=64, heads=8)
    layer = tiny_llama()
    with pytest.raises(ValueError, match="x must be"):
        layer(torch.randn(2, 3, 32, dtype=torch.float64), torch.arange(3))
    with pytest.raises(ValueError, match="positions"):
        layer(torch.randn(2, 3, 64, dtype=torch.float64), torch.arange(4))
    with pytest.raises(ValueError, match="cache"):
        layer(torch.randn(2, 3, 64, dtype=torch.float64), torch.arange(3), KVCache(1, 4, 8, 16, dtype=torch.float64))
    bert = BertEncoder(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=8))
    with pytest.raises(ValueError, match="ids"):
        bert(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="ids"):
        bert(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="attention_mask"):
        bert(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 5))
