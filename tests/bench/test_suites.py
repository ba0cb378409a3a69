"""Benchmark suites: their shapes, the parsing of user shapes and patterns, real weights."""
import json
import struct

import pytest
import torch

import spartune as st
from spartune.bench import suites
from spartune.bench.weights import make_weight

# --- suites ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in suites.SUITES if n != "real"])
def test_every_suite_is_sane(name):
    specs = suites.problems(name)
    assert specs, name
    for s in specs:
        assert s.M > 0 and s.K > 0 and s.N > 0
        assert 0 < s.density <= 1
        assert suites.normalize_pattern(s.pattern) == s.pattern
        fixed = suites.fixed_density(s.pattern)
        if fixed is not None:
            assert s.density == fixed
    assert len(set(specs)) == len(specs)


def test_llm_suite_shapes():
    shapes = {(s.name, s.M, s.K, s.N) for s in suites.SUITES["llm"].shapes()}
    assert len(shapes) == 27  # 3 models x 3 distinct projections x 3 token counts
    assert ("llama7b-qkvo", 4096, 4096, 2048) in shapes
    assert ("llama7b-upgate", 11008, 4096, 1) in shapes
    assert ("llama7b-down", 4096, 11008, 16) in shapes
    assert ("llama13b-upgate", 13824, 5120, 2048) in shapes
    assert ("llama70b-down", 8192, 28672, 16) in shapes
    assert {n for *_, n in shapes} == {1, 16, 2048}


def test_bert_suite_shapes():
    shapes = {(s.M, s.K, s.N) for s in suites.SUITES["bert"].shapes()}
    assert shapes == {(768, 768, 4096), (3072, 768, 4096), (768, 3072, 4096),
                      (1024, 1024, 4096), (4096, 1024, 4096), (1024, 4096, 4096)}


def test_mobilenet_layer_list():
    layers = suites.MOBILENET_V1_POINTWISE
    assert len(layers) == 13
    assert layers[0][1:] == (64, 32, 112) and layers[-1][1:] == (1024, 1024, 7)
    for (_, out_prev, _, hw_prev), (_, _, in_ch, hw) in zip(layers, layers[1:]):
        assert in_ch == out_prev  # each pointwise conv consumes the previous one's channels
        assert hw in (hw_prev, hw_prev // 2)  # strided depthwise convs halve the resolution
    shapes = suites.SUITES["mobilenet"].shapes()
    assert {s.N for s in shapes if s.name == "mbv1-pw1-b1"} == {112 * 112}
    assert {s.N for s in shapes if s.name == "mbv1-pw13-b32"} == {7 * 7 * 32}
    assert any(s.name.startswith("mbv1-pw7-11") for s in shapes)  # the five identical layers, once
    assert len(shapes) == 2 * 9


def test_dlmc_suite_spread_and_sparsity():
    specs = suites.problems("dlmc")
    assert {s.pattern for s in specs} == {"csr"}
    assert min(s.sparsity for s in specs) == pytest.approx(0.5) and max(s.sparsity for s in specs) == pytest.approx(0.98)
    assert all(0.1 <= s.row_cv <= 0.3 for s in specs)


def test_quick_suite_and_overrides():
    quick = suites.problems("quick")
    assert 3 <= len(quick) <= 4
    crossed = suites.problems("quick", patterns=["csr"], densities=[0.1, 0.3])
    assert {s.pattern for s in crossed} == {"csr"} and {s.density for s in crossed} == {0.1, 0.3}
    assert len(crossed) == 2 * len({(s.name, s.N) for s in quick})
    fixed = suites.problems("bert", patterns=["2:4", "block:32"], densities=[0.2])
    assert {(s.pattern, s.density) for s in fixed} == {("2:4", 0.5), ("block:32x32", 0.2)}
    custom = suites.problems(None, shapes=suites.custom_shapes([(256, 128, 8)]), patterns=["csr"], densities=[0.5])
    assert [(s.name, s.M, s.K, s.N) for s in custom] == [("shape-256x128", 256, 128, 8)]
    assert all("7b" in s.name for s in suites.problems("llm", filters=["7B"]))


@pytest.mark.parametrize("text", ["1,2", "a,b,c", "0,4,4", "4,4,-1", "4,4,4,4", ""])
def test_parse_shape_rejects(text):
    with pytest.raises(ValueError, match="M,K,N"):
        suites.parse_shape(text)


def test_parse_inputs():
    assert suites.parse_shape("4096,11008, 16") == (4096, 11008, 16)
    assert suites.parse_shape("64x32x12544") == (64, 32, 12544)
    assert suites.normalize_pattern("block:64") == "block:64x64"
    for bad in ("block:48", "shfl:7", "nope", "4:2", "64:3:8"):
        with pytest.raises(ValueError):
            suites.normalize_pattern(bad)
    for bad in ("0", "1.5", "x", "-0.1"):
        with pytest.raises(ValueError, match="density"):
            suites.parse_density(bad)


def test_shapes_file(tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text("# my model\nqkv 4096,4096,2048\n11008,4096,16  # up\nffn 3072 768 4096\n\n")
    shapes = suites.read_shapes_file(f)
    assert [(s.name, s.M, s.K, s.N) for s in shapes] == [
        ("qkv", 4096, 4096, 2048), ("11008x4096", 11008, 4096, 16), ("ffn", 3072, 768, 4096)]
    f.write_text("1,2,3\n4,5\n")
    with pytest.raises(ValueError, match=":2:"):
        suites.read_shapes_file(f)


def test_scaled_down_and_spread():
    for s in suites.problems("llm") + suites.problems("mobilenet"):
        t = suites.scaled_down(s, dense_enough=True)
        assert 128 <= t.M <= 256 and 128 <= t.K <= 256 and t.M % 64 == 0 and t.K % 64 == 0
        assert t.N == min(s.N, 32) and t.density >= s.density
    specs = suites.problems("bert")
    picked = suites.spread(specs, 5)
    assert len(picked) == 5 and picked[0] == specs[0] and picked[-1] == specs[-1]
    assert suites.spread(specs, 1000) == specs


# --- real weights ---------------------------------------------------------------------------------

def write_safetensors(path, tensors: dict):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_real_suite_from_a_safetensors_file(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(128, 64, generator=g)
    f = tmp_path / "w.safetensors"
    write_safetensors(f, {"embeddings.word_embeddings.weight": torch.randn(100, 64, generator=g),
                          "encoder.layer.0.attention.self.query.weight": q,
                          "encoder.layer.0.output.dense.weight": torch.randn(64, 128, generator=g),
                          "encoder.layer.0.output.dense.bias": torch.randn(64, generator=g)})
    monkeypatch.setenv(suites.REAL_WEIGHTS_ENV, str(f))
    specs = suites.problems("real", patterns=["block:32", "2:4"], densities=[0.25])
    assert {(s.weight, s.M, s.K) for s in specs} == {("encoder.layer.0.attention.self.query.weight", 128, 64),
                                                    ("encoder.layer.0.output.dense.weight", 64, 128)}
    assert torch.equal(suites.load_real_weight("encoder.layer.0.attention.self.query.weight"), q)
    spec = next(s for s in specs if s.M == 128 and s.pattern == "block:32x32")
    w, A = make_weight(spec, dtype=torch.float32, device="cpu", gen=torch.Generator())
    assert isinstance(A, st.BlockSparse) and A.stats().density == pytest.approx(0.25, abs=0.02)
    assert torch.equal(w[w != 0], q[w != 0])  # magnitude-pruned real values, not random ones


def test_real_suite_unavailable_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv(suites.REAL_WEIGHTS_ENV, str(tmp_path / "missing.safetensors"))
    with pytest.raises(suites.SuiteUnavailable, match="not a file"):
        suites.problems("real")
