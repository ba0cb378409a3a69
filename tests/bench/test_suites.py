"""Benchmark suites, weights, the report writer and the runner's CPU paths (no timing here:
the timing pipeline runs with a fake timer, only to check what it records)."""
import json
import math
import struct
import time

import pytest
import torch

import spartune as st
from spartune.bench import report, runner, suites
from spartune.tune.device import DeviceSpec

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths; the GPU runs the real benchmark")


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
    w, A = runner.make_weight(spec, dtype=torch.float32, device="cpu", gen=torch.Generator())
    assert isinstance(A, st.BlockSparse) and A.stats().density == pytest.approx(0.25, abs=0.02)
    assert torch.equal(w[w != 0], q[w != 0])  # magnitude-pruned real values, not random ones


def test_real_suite_unavailable_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv(suites.REAL_WEIGHTS_ENV, str(tmp_path / "missing.safetensors"))
    with pytest.raises(suites.SuiteUnavailable, match="not a file"):
        suites.problems("real")


# --- weights ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,density,kind", [("csr", 0.2, st.CSR), ("block:32x32", 0.25, st.BlockSparse),
                                                  ("shfl:32", 0.3, st.ShuffledBlock), ("2:4", 0.5, st.NM),
                                                  ("32:2:8", 0.25, st.VNM)])
def test_random_weights_hold_their_pattern(pattern, density, kind):
    g = torch.Generator().manual_seed(1)
    w, A = runner.random_weight(pattern, 256, 512, density, dtype=torch.float16, device="cpu", gen=g)
    assert isinstance(A, kind) and torch.equal(A.to_dense(), w)
    assert A.stats().density == pytest.approx(density, rel=0.15)
    assert torch.equal(A.mask(), w != 0)  # every stored entry holds a nonzero value: no zeros to time on
    assert not bool(torch.isnan(w).any())
    other = runner.revalued(A, g)  # same pattern, new values
    assert torch.equal(other.mask(), A.mask()) and not torch.equal(other.values, A.values)


def test_row_spread():
    g = torch.Generator().manual_seed(2)
    _, flat = runner.random_weight("csr", 512, 1024, 0.1, dtype=torch.float32, device="cpu", gen=g)
    _, spread = runner.random_weight("csr", 512, 1024, 0.1, dtype=torch.float32, device="cpu", gen=g, row_cv=0.3)
    assert flat.stats().items_cv < 0.15 < spread.stats().items_cv < 0.45


# --- report ---------------------------------------------------------------------------------------

def fabricated_doc():
    rows = []
    for density in (0.5, 0.2, 0.1):
        for pattern in ("block:64x64", "csr"):
            ours = 100e-6 * density * (1 if pattern.startswith("block") else 3)
            times = {"ours": ours, "dense": 100e-6, "cusparse_csr": 400e-6 * density}
            notes = {}
            if pattern.startswith("block"):
                times.update(cusparse_bsr=200e-6 * density, torch_bsr=None)
                notes["torch_bsr"] = "n/a: RuntimeError: no kernel for this shape"
            rows.append({"problem": "llama7b-upgate", "M": 11008, "K": 4096, "N": 2048, "pattern": pattern,
                         "density": density, "weights": "random", "times": times, "notes": notes,
                         "rel_err": {k: 1e-3 for k, v in times.items() if v}, "ok": True,
                         "speedup": {k: 100e-6 / v for k, v in times.items() if v},
                         "floor_s": 20e-6 * density, "frac_floor": 20e-6 * density / ours,
                         "picked": {"backend": "blocked", "config": {"bn": 128}, "label": "blocked bn=128"}})
    rows.append({"problem": "bert-base-ffn1", "M": 3072, "K": 768, "N": 4096, "pattern": "2:4", "density": 0.5,
                 "weights": "random", "times": {"ours": 30e-6, "dense": 33e-6, "cusparselt": 60e-6},
                 "notes": {}, "rel_err": {"ours": 2e-2, "dense": 0.0, "cusparselt": 1e-3}, "ok": False,
                 "speedup": {"ours": 1.1, "dense": 1.0, "cusparselt": 0.55}, "frac_floor": float("nan"),
                 "picked": {"backend": "dense", "config": None, "label": "dense"}})
    return {"schema": runner.SCHEMA, "kind": "timing", "suite": "test", "date": "2026-11-22T00:00:00+00:00",
            "device": {"name": "NVIDIA H100 80GB HBM3", "cuda": True, "capability": "sm_90"},
            "versions": {"torch": "2.13.0", "triton": "3.6.0", "spartune": "0.1.0"},
            "rates": {"matrix_flops": 731e12, "dram_bw": 2.93e12, "fma_flops": 39e12, "l2_bw": 8e12, "source": "test"},
            "options": {"dtype": "float16", "op": "linear", "mode": "fast"}, "tolerance": 1e-2,
            "implementations": list(runner.IMPLS), "problems": len(rows), "rows": rows, "skipped": [], "wall_s": 1.0}


def test_table_text():
    doc = fabricated_doc()
    text = report.format_table(doc)
    lines = text.splitlines()
    assert "NVIDIA H100" in lines[0] and "731 TFLOP/s" in lines[0] and "2026-11-22" in lines[0]
    header = next(line for line in lines if line.startswith("problem"))
    for col in ("ours us", "dense us", "cuSPARSE CSR us", "cuSPARSE BSR us", "torch BSR (Triton) us",
                "cuSPARSELt 2:4 us", "x dense", "floor", "picked"):
        assert col in header
    body = lines[lines.index(header) + 2: lines.index(header) + 2 + len(doc["rows"])]
    assert len(body) == 7
    first = body[0].split()
    assert first[:4] == ["llama7b-upgate", "11008x4096x2048", "block:64x64", "0.5"]
    assert "50.0" in first and "100.0" in first and "2.00" in first and "20%" in first  # ours, dense, x dense, floor
    # columns line up: the 'x dense' column ends at the same place on every row
    end = header.index("x dense") + len("x dense")
    assert all(line[end - 4:end].strip() for line in body)
    assert "n/a" in body[0] and "-" in body[2].split()  # torch BSR failed; not applicable to csr
    assert "30.0!" in body[-1]  # wrong result flagged
    assert "no kernel for this shape" in text and "wrong result" in text


def test_json_schema(tmp_path):
    doc = fabricated_doc()
    assert report.validate(doc) == []
    path = report.write_json(doc, tmp_path / "r.json")
    back = json.loads(path.read_text())
    for key in report.REQUIRED_KEYS:
        assert key in back
    assert back["rows"][-1]["frac_floor"] is None  # NaN is not JSON
    assert back["rows"][0]["times"]["torch_bsr"] is None
    bad = dict(doc)
    del bad["rates"]
    bad["rows"] = [{"problem": "x"}]
    problems = report.validate(bad)
    assert "missing key 'rates'" in problems and any("row 0" in p for p in problems)


def test_png_plot(tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.write_all(fabricated_doc(), tmp_path, "bench-test")
    png = paths["plot"]
    assert png.exists() and png.stat().st_size > 5000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["table"].read_text().startswith("NVIDIA H100")
    assert report.plot({**fabricated_doc(), "rows": []}, tmp_path / "none.png") is None


def test_correctness_table():
    doc = {"kind": "correctness", "device": {"name": "CPU"}, "versions": {}, "options": {}, "tolerance": 1e-2,
           "rows": [{"problem": "p", "M": 128, "K": 128, "N": 8, "pattern": "csr", "density": 0.1, "ok": True,
                     "failed": False, "checks": {"ours": {"rel_err": 2e-4, "ok": True, "picked": {"label": "csr x"}},
                                                 "kernel:csr/row": {"rel_err": 3e-4, "ok": True}}},
                    {"problem": "q", "M": 128, "K": 128, "N": 8, "pattern": "2:4", "density": 0.5, "ok": False,
                     "failed": True, "checks": {"ours": {"error": "RuntimeError: boom", "ok": False}}}]}
    text = report.format_table(doc)
    assert "correctness only" in text and "csr/row 3.0e-04" in text and "FAILED" in text and "boom" in text


# --- the runner on the CPU ------------------------------------------------------------------------

def _fake_timer(fn):
    fn()
    t = time.perf_counter()
    fn()
    return max(time.perf_counter() - t, 1e-9)


@CPU_ONLY
def test_timing_pipeline_records_every_implementation():
    """The GPU pipeline on tiny CPU problems with a wall-clock timer: the rows, checks, notes
    and floor fields it writes (times mean nothing here)."""
    spec = DeviceSpec.h100()
    rates = {"matrix_flops": spec.mma_fp16, "dram_bw": spec.dram_bw, "fma_flops": spec.fma, "l2_bw": spec.l2_bw,
             "source": "test", "dtype": "float16"}
    specs = suites.problems(None, shapes=suites.custom_shapes([(128, 128, 8)]), patterns=["block:32", "2:4"],
                            densities=[0.5])
    seen = []
    doc = runner.run_timing(specs, runner.Options(suite="t", progress=False), checkpoint=lambda d: seen.append(len(d["rows"])),
                            device="cpu", timer=_fake_timer, rates=(spec, rates))
    assert seen == [1, 2] and report.validate(doc) == []
    block, nm = doc["rows"]
    for row in doc["rows"]:
        assert row["ok"], row
        assert row["times"]["ours"] > 0 and row["times"]["dense"] > 0 and row["rel_err"]["ours"] < 1e-2
        assert row["floor_s"] > 0 and 0 < row["frac_floor"] and row["picked"]["backend"]
        assert row["sets"] >= 1
    assert {"cusparse_csr", "cusparse_bsr", "torch_bsr"} <= set(block["times"]) and "cusparselt" not in block["times"]
    assert "cusparselt" in nm["times"] and "torch_bsr" not in nm["times"]
    for row in doc["rows"]:  # CPU torch has no fp16 sparse matmul: recorded, not raised
        for impl, seconds in row["times"].items():
            assert seconds is not None or row["notes"][impl].startswith("n/a")
    assert "ours us" in report.format_table(doc)


@CPU_ONLY
def test_correctness_pass_on_a_tiny_problem():
    specs = suites.problems(None, shapes=suites.custom_shapes([(4096, 4096, 16)]), patterns=["block:64", "csr"],
                            densities=[0.1])
    doc = runner.run_correctness(specs, runner.Options(progress=False))
    assert doc["kind"] == "correctness" and report.validate(doc) == []
    assert len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert row["M"] <= 256 and row["N"] == 16
        assert row["ok"], row
        assert row["checks"]["ours"]["rel_err"] <= 1e-2
        if runner.interpreter_active():
            kernels = [k for k in row["checks"] if k.startswith("kernel:")]
            assert kernels and all(row["checks"][k]["ok"] for k in kernels)
    assert "correctness only" in report.format_table(doc)
    assert math.isfinite(doc["wall_s"])
