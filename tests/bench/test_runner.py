"""The runner's CPU paths (no timing here: the timing pipeline runs with a fake timer, only
to check what it records)."""
import math
import time

import pytest
import torch

from spartune.bench import report, runner, suites
from spartune.bench.correctness import run_correctness
from spartune.bench.environment import interpreter_active, interpreter_problem
from spartune.bench.timing import run_timing
from spartune.tune.device import DeviceSpec

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths; the GPU runs the real benchmark")

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
    doc = run_timing(specs, runner.Options(suite="t", progress=False), checkpoint=lambda d: seen.append(len(d["rows"])),
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
    doc = run_correctness(specs, runner.Options(progress=False))
    assert doc["kind"] == "correctness" and report.validate(doc) == []
    assert len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert row["M"] <= 256 and row["N"] == 16
        assert row["ok"], row
        assert row["checks"]["ours"]["rel_err"] <= 1e-2
        if interpreter_active():
            kernels = [k for k in row["checks"] if k.startswith("kernel:")]
            assert kernels and all(row["checks"][k]["ok"] for k in kernels)
    assert "correctness only" in report.format_table(doc)
    assert math.isfinite(doc["wall_s"])


@pytest.mark.parametrize("triton_v, numpy_v, refused", [("3.6.0", "2.5.2", True), ("3.6.0", "2.2.6", False),
                                                       ("3.7.0", "2.5.2", False), ("3.6.0", "2.3.0rc1", True)])
def test_interpreter_problem_names_the_numpy_that_breaks_it(monkeypatch, triton_v, numpy_v, refused):
    import numpy
    import triton

    monkeypatch.setattr(triton, "__version__", triton_v)
    monkeypatch.setattr(numpy, "__version__", numpy_v)
    problem = interpreter_problem()
    assert (problem is not None) == refused
    if refused:
        assert numpy_v in problem and "numpy<2.3" in problem


@CPU_ONLY
def test_correctness_pass_says_why_the_interpreter_cannot_run(monkeypatch):
    """Only torch paths are checked, with the reason in the notes, instead of every kernel failing."""
    import numpy

    monkeypatch.setattr(numpy, "__version__", "2.5.2")
    specs = suites.problems(None, shapes=suites.custom_shapes([(512, 512, 4)]), patterns=["csr"], densities=[0.1])
    doc = run_correctness(specs, runner.Options(progress=False))
    assert any("numpy<2.3" in note for note in doc["notes"])
    assert doc["rows"] and all(row["ok"] for row in doc["rows"])
    assert not any(k.startswith("kernel:") and row["checks"][k].get("ok") for row in doc["rows"] for k in row["checks"])


def test_kernel_runs_come_from_the_registry():
    """One run per path of every linear family serving the format (none for N:M, which no
    family serves yet), keyed as the report shows them."""
    from spartune.bench.correctness import kernel_runs
    from spartune.bench.weights import random_weight

    g = torch.Generator().manual_seed(0)
    _, A = random_weight("csr", 128, 128, 0.2, dtype=torch.float16, device="cpu", gen=g)
    runs = kernel_runs(A, 8, "float16")
    keys = [k for k, _, _ in runs]
    assert keys and len(set(keys)) == len(keys) and all(k.startswith("kernel:csr/") for k in keys)
    assert all(label.startswith("csr ") for _, label, _ in runs)
    _, B = random_weight("block:32", 128, 128, 0.5, dtype=torch.float16, device="cpu", gen=g)
    assert [k for k, _, _ in kernel_runs(B, 8, "float16")] == ["kernel:blocked"]
    _, N = random_weight("2:4", 128, 128, 0.5, dtype=torch.float16, device="cpu", gen=g)
    assert kernel_runs(N, 8, "float16") == []
