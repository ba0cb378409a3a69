"""The end-to-end suite's harness on tiny models (CPU, eager): rows, speedups, memory, CLI."""
import json

import pytest
import torch

from spartune.bench import e2e
from spartune.cli import main


def test_points_fixed_patterns_once():
    pts = e2e.points(["block:64", "2:4", "64:2:8"], [0.5, 0.9])
    assert pts == [("block:64", 0.5), ("block:64", 0.9), ("2:4", 0.5), ("64:2:8", 0.75)]
    assert e2e.points(quick=True) == [("block:64", 0.9)]


@pytest.mark.parametrize("workload", e2e.WORKLOADS, ids=lambda w: w.name)
def test_every_workload_runs_tiny(workload):
    rows = e2e.run_workload(workload, [("csr", 0.9), ("2:4", 0.5)], dtype=torch.float32, device="cpu",
                            compile=False, tiny=True, progress=lambda _: None)
    assert [(r["pattern"], r["variant"]) for r in rows] == [("dense", "eager"), ("csr", "eager"), ("2:4", "eager")]
    assert all(r["workload"] == f"{workload.name} (tiny)" for r in rows)  # not the real model's name
    dense, csr, nm = rows
    assert all(r["ms"] > 0 for r in rows)
    # timed in turns with the dense model: the speedup is the median round's ratio, within the
    # range of the rounds' medians (both models' times from the same rounds)
    assert csr["dense_ms"] > 0 and "dense_ms" not in dense and "_fn" not in csr
    assert all(r["speedup"] > 0 for r in (csr, nm))
    assert csr["sparse_layers"] >= 1 and csr["layers"] >= csr["sparse_layers"]
    assert csr["weight_bytes"] < nm["weight_bytes"] < dense["weight_bytes"]  # 90% CSR < 2:4 < dense
    assert all(r["resident_bytes"] > 0 for r in rows)  # the device's share: kernels' copies included
    assert csr["resident_ratio"] == pytest.approx(csr["resident_bytes"] / dense["resident_bytes"])


def test_time_in_turns_alternates_the_models(monkeypatch):
    """Each round times every model once, in order: a slow phase of the host lands on both."""
    order = []

    def fake_time_ms(fn, device, **_):
        order.append(fn.__name__)
        return {"dense": 2.0, "sparse": 1.0}[fn.__name__] * len(order)

    def dense():
        pass

    def sparse():
        pass

    monkeypatch.setattr(e2e, "time_ms", fake_time_ms)
    d, s_ = e2e.time_in_turns([dense, sparse], "cpu", rounds=3)
    assert order == ["dense", "sparse"] * 3
    assert d == [2.0, 6.0, 10.0] and s_ == [2.0, 4.0, 6.0]


def test_bad_settings_are_refused_before_any_model_is_built():
    with pytest.raises(ValueError, match="sparsities must lie in"):
        e2e.points(["block:64"], [1.5])
    with pytest.raises(ValueError, match="unknown pattern"):
        e2e.points(["nope"])
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        e2e.run(e2e.WORKLOADS[:1], [], dtype=torch.int8, device="cpu")


def test_weight_bytes_counts_shared_storage_once():
    lin = torch.nn.Linear(8, 4, bias=False)
    tied = torch.nn.ModuleDict({"a": lin, "b": lin})
    assert e2e.weight_bytes(tied) == 8 * 4 * 4


def test_cli_writes_table_json_plot(tmp_path, capsys):
    code = main(["bench", "--suite", "e2e", "--filter", "mobilenet", "--pattern", "block:64", "--density", "0.25",
                 "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "bench-e2e.json").read_text())
    assert {r["pattern"] for r in doc["rows"]} == {"dense", "block:64x64"}
    assert "| mobilenet-v1 batch 64 (tiny) | block:64x64 | 75% |" in (tmp_path / "bench-e2e.txt").read_text()
    assert (tmp_path / "bench-e2e.png").stat().st_size > 0


def test_cli_lean_run_records_its_policy(tmp_path, monkeypatch):
    from spartune import dispatch

    monkeypatch.setattr(dispatch, "_memory", dispatch._memory)
    code = main(["bench", "--suite", "e2e", "--filter", "mobilenet", "--pattern", "csr", "--density", "0.25",
                 "--memory", "lean", "--out", str(tmp_path)])
    assert code == 0
    assert json.loads((tmp_path / "bench-e2e.json").read_text())["memory_policy"] == "lean"
    assert "memory policy: lean" in (tmp_path / "bench-e2e.txt").read_text()
    dispatch.set_memory_policy("speed")


def test_cli_refuses_what_does_not_apply(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "e2e", "--filter", "resnet"])
    assert "no e2e model matches" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "e2e", "--shape", "64,64,64"])
