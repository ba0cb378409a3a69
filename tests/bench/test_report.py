"""The report writer: the table, the JSON document and its schema, the plot."""
import json

import pytest

from spartune.bench import report
from spartune.bench.baselines import IMPLS
from spartune.bench.document import SCHEMA

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
    return {"schema": SCHEMA, "kind": "timing", "suite": "test", "date": "2026-11-22T00:00:00+00:00",
            "device": {"name": "NVIDIA H100 80GB HBM3", "cuda": True, "capability": "sm_90"},
            "versions": {"torch": "2.13.0", "triton": "3.6.0", "spartune": "0.1.0"},
            "rates": {"matrix_flops": 731e12, "dram_bw": 2.93e12, "fma_flops": 39e12, "l2_bw": 8e12, "source": "test"},
            "options": {"dtype": "float16", "op": "linear", "mode": "fast"}, "tolerance": 1e-2,
            "implementations": list(IMPLS), "problems": len(rows), "rows": rows, "skipped": [], "wall_s": 1.0}


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
