"""The `spartune` command: argument handling and errors, info, db export/import, and the
CPU correctness-only bench pass end to end."""
import json

import pytest
import torch

from spartune.cli import build_parser, db_summary, main
from spartune.tune.db import TuningDB

VERSIONS = {"torch": "2.13.0", "cuda": "13.0", "triton": "3.6.0", "spartune": "0.1.0"}


def usage_error(capsys, argv) -> str:
    """Run argv, expect argparse's usage error (exit 2), return its message."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["bench", "--shape", "4096,4096"], "M,K,N"),
    (["bench", "--shape", "0,4096,16"], "at least 1"),
    (["bench", "--shape", "a,b,c"], "M,K,N"),
    (["bench", "--density", "0"], "density"),
    (["bench", "--density", "1.5"], "density"),
    (["bench", "--density", "dense"], "density"),
    (["bench", "--pattern", "block:48"], "block sizes"),
    (["bench", "--pattern", "diagonal"], "unknown pattern"),
    (["bench", "--suite", "resnet"], "invalid choice"),
    (["bench", "--dtype", "int8"], "invalid choice"),
    (["bench", "--budget-s", "-5"], "positive"),
    (["bench", "--max-problems", "0"], "positive"),
    (["bench", "--skip", "dense"], "invalid choice"),
    (["bench", "--filter", "nothing-is-called-this", "--list"], "no problem matches"),
    (["tune"], "--shape"),
    (["tune", "--shape", "1,2,3,4"], "M,K,N"),
    (["db"], "required"),
    (["db", "export"], "path"),
    ([], "required"),
])
def test_argument_errors(capsys, argv, message):
    err = usage_error(capsys, argv)
    assert message in err, err
    assert "usage: spartune" in err


def test_shapes_file_errors(capsys, tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text("4096,4096,16\n4096,4096\n")
    assert ":2:" in usage_error(capsys, ["tune", "--shapes-file", str(f)])
    assert "No such file" in usage_error(capsys, ["tune", "--shapes-file", str(tmp_path / "none.txt")])


def test_help_lists_suites_and_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("llm", "bert", "mobilenet", "dlmc", "real", "quick", "--shape", "--pattern", "--density", "--out"):
        assert word in out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("bench", "tune", "info", "db", "demo"):
        assert command in out


def test_version(capsys):
    from spartune.versions import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"spartune {__version__}"


def test_bench_list(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "4 problems" in out and "llama7b-upgate" in out
    assert main(["bench", "--shape", "256,128,8", "--shape", "64x64x1", "--pattern", "csr", "--pattern", "2:4",
                 "--density", "0.1", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "4 problems"  # 2 shapes x (csr at 0.1, 2:4 at its own 0.5)
    assert any("shape-256x128" in line and "csr" in line and line.rstrip().endswith("0.1") for line in lines)
    assert any("2:4" in line and line.rstrip().endswith("0.5") for line in lines)
    assert main(["bench", "--suite", "llm", "--quick", "--list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "4 problems"
    assert main(["bench", "--suite", "bert", "--pattern", "block:32", "--filter", "large", "--list"]) == 0
    out = capsys.readouterr().out
    assert "bert-large" in out and "bert-base" not in out


def test_e2e_list_runs_nothing_and_flags_it_ignores_are_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--suite", "e2e", "--filter", "decode N=1", "--pattern", "csr", "--density", "0.1",
                 "--pattern", "2:4", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("3 runs") and any("csr" in line and "90%" in line for line in lines)
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written
    for flag in (["--skip", "cusparselt"], ["--op", "spmm"], ["--max-problems", "3"]):
        assert "does not apply to the e2e suite" in usage_error(capsys, ["bench", "--suite", "e2e", *flag])


def test_real_suite_without_weights_is_skipped(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARTUNE_REAL_WEIGHTS", str(tmp_path / "missing.safetensors"))
    assert main(["bench", "--suite", "real", "--list"]) == 0
    assert "suite skipped" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="no-GPU behaviour")
def test_tune_without_gpu_says_so(capsys):
    assert main(["tune", "--shape", "256,256,16", "--pattern", "csr", "--density", "0.1"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU correctness-only pass")
def test_bench_quick_on_cpu_runs_the_correctness_pass(capsys, tmp_path):
    code = main(["bench", "--quick", "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert "No CUDA device" in out and "correctness only" in out
    assert code == 0, out
    doc = json.loads((tmp_path / "bench-quick-cpu.json").read_text())
    assert doc["kind"] == "correctness" and doc["suite"] == "quick" and len(doc["rows"]) == 4
    assert all(r["ok"] for r in doc["rows"])
    assert (tmp_path / "bench-quick-cpu.txt").read_text().startswith("CPU")


def test_the_cpu_pass_runs_the_op_asked_and_says_which_mode_it_ran(capsys, tmp_path, monkeypatch):
    import spartune

    calls = []
    monkeypatch.setattr(spartune, "spmm", lambda A, X, _f=spartune.spmm, **kw: calls.append(1) or _f(A, X, **kw))
    assert main(["bench", "--quick", "--op", "spmm", "--mode", "exhaustive", "--max-problems", "2", "--out",
                 str(tmp_path), "--no-progress"]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "bench-quick-cpu.json").read_text())
    assert calls and all(r["ok"] for r in doc["rows"]) and doc["options"]["op"] == "spmm"
    assert doc["options"]["mode"] == "model" and any("--mode exhaustive" in n for n in doc["notes"])


def _fill_db(today=False):
    db = TuningDB(versions=VERSIONS)
    key = json.dumps([["linear", "block:64x64", 4096, 4096, 2048, "float16", "none", 0.1, 0.0, "GPU sm_90"], VERSIONS])
    db.record(key, [{"backend": "blocked", "config": {"type": "Config", "fields": {"bn": 128}}, "seconds": 1e-5,
                     "error": None, "predicted": 2e-5},
                    {"backend": "dense", "config": None, "seconds": None, "error": "boom", "predicted": 3e-5}],
              {"backend": "blocked", "config": {"type": "Config", "fields": {"bn": 128}}, "seconds": 1e-5,
               "predicted": 2e-5, "mode": "fast"})
    if today:  # and a key of today's Problem (longer: layout, the fp16 flag) on the same device
        import torch

        from spartune.formats._base import stats_from_counts
        from spartune.tune.problem import Problem

        stats = stats_from_counts(4096, 4096, 4096 * 2048, 1, 1, torch.full((4096,), 2048))
        prob = Problem("linear", "2:4", 4096, 4096, 16, "float16", stats, device="GPU sm_90", fp16_reduction=True)
        db.record(db.key(prob), [{"backend": "nm", "config": None, "seconds": 1e-5, "error": None, "predicted": 2e-5}],
                  {"backend": "nm", "config": None, "seconds": 1e-5, "predicted": 2e-5, "mode": "fast"})
    from spartune.tune.device import H100

    db.set_calibration("GPU sm_90", H100)
    db.close()


def test_info(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "empty"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "spartune 0.1.0" in out and "torch" in out and "triton" in out and "nothing tuned yet" in out
    assert not (tmp_path / "empty").exists()  # info reads; it creates no DB

    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "full"))
    _fill_db()
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "1 tuned problems (linear 1); 2 measurements (1 failed or wrong)" in out
    assert "calibration  GPU sm_90" in out and "750 TFLOP/s" in out
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"device", "versions", "db", "tuner_mode", "memory_policy"} <= set(info)
    assert info["db"]["best"] == 1 and info["db"]["best_by_backend"] == {"blocked": 1}

    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "both"))
    _fill_db(today=True)  # keys of an older version and of today's: counted by device, not by their last entry
    assert main(["info"]) == 0
    assert "2 on GPU sm_90" in capsys.readouterr().out


def test_db_summary_of_a_foreign_file(tmp_path):
    bad = tmp_path / "x.sqlite3"
    bad.write_bytes(b"not a database at all" * 100)
    assert "error" in db_summary(bad)


def test_db_export_import_round_trip(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "a"))
    _fill_db()
    dump = tmp_path / "table.json"
    assert main(["db", "export", str(dump)]) == 0
    assert "exported 1 tuned problems, 2 measurements and 1 calibrations" in capsys.readouterr().out
    data = json.loads(dump.read_text())
    assert data["format"] == "spartune-tuning" and len(data["best"]) == 1

    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "b"))
    assert main(["db", "import", str(dump)]) == 0
    assert "4 rows added" in capsys.readouterr().out
    assert main(["db", "import", str(dump)]) == 0  # again: nothing new
    assert "0 rows added" in capsys.readouterr().out
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["db"]["best"] == 1

    assert main(["db", "import", str(tmp_path / "missing.json")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["db", "export", str(tmp_path / "no_dir" / "x.json")]) == 1
    assert f"{tmp_path / 'no_dir'}: no such directory" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else"}))
    assert main(["db", "import", str(other)]) == 1
    assert "not a spartune tuning export" in capsys.readouterr().err
    other.write_text("{ not json")
    assert main(["db", "import", str(other)]) == 1
    capsys.readouterr()


def test_db_clear_all_or_only_other_versions(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path))
    _fill_db()  # (tuned under the test's VERSIONS: another install's)
    current = TuningDB()  # and one problem under this install's versions
    key = json.dumps([["linear", "csr", 64, 64, 1, "float16"], current.versions], sort_keys=True, separators=(",", ":"))
    current.record(key, [{"backend": "dense", "config": None, "seconds": 1e-5, "error": None, "predicted": 1e-5}],
                   {"backend": "dense", "config": None, "seconds": 1e-5, "predicted": 1e-5, "mode": "fast"})
    current.close()
    assert main(["db", "clear", "--stale"]) == 0
    assert "cleared 3 rows" in capsys.readouterr().out  # the other install's 2 measurements and choice
    with TuningDB() as db:
        assert db.get_best(key) is not None and len(db.results(key)) == 1
    assert main(["db", "clear"]) == 0 and "cleared 2 rows" in capsys.readouterr().out
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["db"]
    assert info["best"] == 0 and info["results"] == 0 and len(info["calibration"]) == 1
    assert main(["db", "clear", "--calibration"]) == 0 and "cleared 1 rows" in capsys.readouterr().out


def test_demo_still_there():
    assert main(["demo", "--rows", "128", "--cols", "128"]) == 0


def test_parser_builds_without_torch_work():
    parser = build_parser()
    args = parser.parse_args(["bench", "--shape", "1,2,3", "--pattern", "block:64", "--density", "0.25"])
    assert args.shape == [(1, 2, 3)] and args.pattern == ["block:64x64"] and args.density == [0.25]


def test_memory_flag_sets_the_policy(monkeypatch):
    from spartune import dispatch

    monkeypatch.setattr(dispatch, "_memory", dispatch._memory)
    assert build_parser().parse_args(["bench", "--memory", "lean"]).memory == "lean"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--memory", "tiny"])
    with pytest.raises(SystemExit):  # tune without problems: refused, after the policy is set
        main(["tune", "--memory", "lean"])
    assert dispatch.memory_policy() == "lean"
    dispatch.set_memory_policy("speed")


def test_a_bad_mode_variable_is_named_and_an_unwritable_out_is_refused_first(capsys, monkeypatch, tmp_path):
    from spartune import dispatch

    monkeypatch.setenv("SPARTUNE_MODE", "bogus")
    monkeypatch.setattr(dispatch, "_mode", None)
    with pytest.raises(ValueError, match="SPARTUNE_MODE"):
        dispatch.tuning_mode()
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["info"]) == 0 and "invalid: SPARTUNE_MODE" in capsys.readouterr().out
    monkeypatch.setattr(dispatch, "_mode", "fast")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for suite in ("quick", "e2e"):
        assert "cannot make the directory" in usage_error(capsys, ["bench", "--suite", suite, "--out",
                                                                   str(blocker / "results")])
