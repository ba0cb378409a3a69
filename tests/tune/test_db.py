"""The tuning DB: storage, keys, several writers at once, recovery from bad files, export/import."""
import dataclasses
import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from spartune.formats import FormatStats
from spartune.tune import db as dbmod
from spartune.tune.db import SCHEMA_VERSION, TuningDB
from spartune.tune.device import H100
from spartune.tune.problem import KEY_FIELDS, Problem

VERSIONS = {"torch": "2.13.0", "cuda": "13.0", "triton": "3.6.0", "spartune": "0.1.0", "kernels": "0123abcd",
            "measure": "cold-replay"}
STATS = FormatStats(rows=4096, cols=4096, nnz=419430, density=0.1, unit_rows=64, units=64, items_mean=6.4,
                    items_cv=0.2, items_max=9, empty_units=0, item_cols=64)


def problem(n=2048, device="NVIDIA H100 80GB HBM3 sm_90", m=4096):
    return Problem("linear", "block:64x64", m, 4096, n, "float16", STATS, device=device)


def row(backend="blocked", bn=128, seconds=1e-5, error=None, predicted=2e-5):
    return {"backend": backend, "config": {"type": "Config", "fields": {"bn": bn}}, "seconds": seconds,
            "error": error, "predicted": predicted}


def best(backend="blocked", bn=128, seconds=1e-5, mode="fast"):
    return {"backend": backend, "config": {"type": "Config", "fields": {"bn": bn}}, "seconds": seconds,
            "predicted": 2e-5, "mode": mode}


@pytest.fixture
def path(tmp_path):
    return tmp_path / "tuning.sqlite3"  # any name: the default one is tested below


def test_record_and_read_back(path):
    db = TuningDB(path, versions=VERSIONS)
    key = db.key(problem())
    assert db.get_best(key) is None
    db.record(key, [row(bn=64, seconds=2e-5), row(bn=128), row(bn=256, seconds=None, error="CompilationError: smem")],
              best(bn=128))
    got = db.get_best(key)
    assert got["backend"] == "blocked" and got["config"]["fields"] == {"bn": 128} and got["seconds"] == 1e-5
    rows = db.results(key)
    assert [r["config"]["fields"]["bn"] for r in rows] == [64, 128, 256]
    assert rows[2]["seconds"] is None and rows[2]["error"].startswith("CompilationError")
    # every measurement is kept: a second tuning run adds rows, it never replaces them
    db.record(key, [row(bn=64, seconds=3e-5)], best(bn=64))
    assert len(db.results(key)) == 4 and db.get_best(key)["config"]["fields"] == {"bn": 64}
    assert db.results(db.key(problem(n=16))) == []


def test_infinite_prediction_is_stored_as_null(path):
    db = TuningDB(path, versions=VERSIONS)
    key = db.key(problem())
    db.record(key, [row(predicted=float("inf"))])
    assert db.results(key)[0]["predicted"] is None


def test_location_mode_and_meta(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "cache"))
    db = TuningDB(versions=VERSIONS)
    assert db.path == tmp_path / "cache" / dbmod.FILE_NAME and db.path.exists()
    con = sqlite3.connect(db.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(con.execute("SELECT key, value FROM meta"))
    assert meta == {"schema_version": str(SCHEMA_VERSION), "spartune_version": "0.1.0"}


def test_calibration_round_trip(path):
    db = TuningDB(path, versions=VERSIONS)
    assert db.get_calibration(H100.name) is None
    spec = dataclasses.replace(H100, dram_bw=2.9e12)
    db.set_calibration(H100.name, spec)
    assert TuningDB(path, versions=VERSIONS).get_calibration(H100.name) == spec


# --- keys ------------------------------------------------------------------------------------------

def test_keys_never_cross_devices_or_versions(path):
    db = TuningDB(path, versions=VERSIONS)
    db.record(db.key(problem()), [row()], best())
    assert db.get_best(db.key(problem())) is not None
    assert db.get_best(db.key(problem(device="NVIDIA H200 sm_90"))) is None
    assert db.get_best(db.key(problem(m=4160))) is None
    for name, other in (("torch", "2.14.0"), ("triton", "3.7.0"), ("spartune", "0.2.0"), ("cuda", "12.8"),
                        ("kernels", "4567ef01"), ("measure", "warm-replay")):
        newer = TuningDB(path, versions={**VERSIONS, name: other})
        assert newer.get_best(newer.key(problem())) is None, name
    # N is bucketed: 1500 and 2048 share an entry, 16 does not
    assert db.key(problem(n=1500)) == db.key(problem(n=2048)) != db.key(problem(n=16))
    assert len(problem().key()) == len(KEY_FIELDS)  # (what `spartune info` reads stored keys by)
    # fp16 problems tuned with and without torch's reduced-precision reductions are kept apart
    assert db.key(dataclasses.replace(problem(), fp16_reduction=True)) != db.key(dataclasses.replace(problem(), fp16_reduction=False))


def test_problems_read_torchs_fp16_flag_when_made():
    """linear's fp16 problems carry torch's reduced-precision flag as it is when they are made (or
    as given); other dtypes and ops never do."""
    import helpers

    for allowed in (True, False):
        with helpers.fp16_reduced_precision(allowed):
            assert problem().fp16_reduction is allowed
            assert not dataclasses.replace(problem(), dtype="bfloat16").fp16_reduction
            assert not dataclasses.replace(problem(), op="sddmm", fp16_reduction=None).fp16_reduction
        assert dataclasses.replace(problem(), fp16_reduction=allowed).fp16_reduction is allowed


def test_default_versions_name_the_installed_stack(path):
    versions = TuningDB(path).versions
    import torch

    assert versions["torch"] == torch.__version__ and versions["triton"] and versions["spartune"]
    assert versions["measure"] == "cold-replay-paired-v6"  # entries timed another way are not reused
    assert versions["kernels"] == dbmod.software_versions()["kernels"]  # the sources' digest, in every key
    assert len(versions["kernels"]) == 16 and int(versions["kernels"], 16) >= 0


def test_the_kernels_digest_follows_their_sources(tmp_path, monkeypatch):
    """An edit to any kernel or backend source changes the digest (so the DB re-tunes)."""
    import shutil

    import spartune.versions as versions

    root = tmp_path / "spartune"
    for d in ("kernels", "backends", "formats"):
        shutil.copytree(Path(versions.__file__).parent / d, root / d)
    shutil.copy(versions.__file__, root / "versions.py")
    monkeypatch.setattr(versions, "__file__", str(root / "versions.py"))
    versions.kernel_sources.cache_clear()
    try:
        before = versions.kernel_sources()
        src = root / "kernels" / "cuda" / "src" / "spmm_csr_smem.cu"
        src.write_text(src.read_text() + "\n")
        versions.kernel_sources.cache_clear()
        assert versions.kernel_sources() != before
    finally:
        versions.kernel_sources.cache_clear()


# --- several processes -----------------------------------------------------------------------------

def _writer(path, worker, count, start):
    db = TuningDB(path, versions=VERSIONS)
    start.wait(60)  # all open first, then all write at once
    for i in range(count):
        key = db.key(problem(m=64 * (i + 1), device=f"gpu{worker}"))
        db.record(key, [row(bn=i, seconds=1e-6 * (i + 1)), row(bn=i + 1000)], best(bn=i))
    db.close()


def test_several_processes_write_at_once(path):
    workers, count = 4, 100
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(workers)
    procs = [ctx.Process(target=_writer, args=(str(path), w, count, start)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    db = TuningDB(path, versions=VERSIONS)
    assert len(db.results()) == 2 * workers * count
    for w in range(workers):
        for i in range(count):
            got = db.get_best(db.key(problem(m=64 * (i + 1), device=f"gpu{w}")))
            assert got is not None and got["config"]["fields"] == {"bn": i}


# --- recovery --------------------------------------------------------------------------------------

def test_garbage_file_is_moved_aside_and_rebuilt(path):
    path.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        db = TuningDB(path, versions=VERSIONS)
    db.record(db.key(problem()), [row()], best())
    assert db.get_best(db.key(problem())) is not None
    aside = list(path.parent.glob("tuning.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")


def test_other_schema_version_is_moved_aside(path):
    old = TuningDB(path, versions=VERSIONS)
    old.record(old.key(problem()), [row()], best())
    old.close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='0' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.warns(RuntimeWarning, match="schema version 0"):
        db = TuningDB(path, versions=VERSIONS)
    assert db.get_best(db.key(problem())) is None and db.results() == []
    assert len(list(path.parent.glob("tuning.sqlite3.schema0-*"))) == 1
    # the rebuilt file is of the current schema: opening it again is quiet
    db.close()
    TuningDB(path, versions=VERSIONS).close()


def test_foreign_sqlite_file_is_moved_aside(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE photos (id INTEGER)")
    con.commit()
    con.close()
    with pytest.warns(RuntimeWarning, match="not a spartune tuning DB"):
        TuningDB(path, versions=VERSIONS)
    assert len(list(path.parent.glob("tuning.sqlite3.foreign-*"))) == 1


def test_corruption_while_open_never_raises(path):
    db = TuningDB(path, versions=VERSIONS)
    key = db.key(problem())
    db.record(key, [row()], best())
    db._conn.close()  # what another process might leave behind: the file overwritten under us
    for side in path.parent.glob("tuning.sqlite3-*"):
        side.unlink()
    path.write_bytes(b"\x00garbage" * 4096)
    db._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    with pytest.warns(RuntimeWarning):
        assert db.get_best(key) is None
    db.record(key, [row()], best())  # the rebuilt DB takes writes again
    assert db.get_best(key) is not None


# --- export / import -------------------------------------------------------------------------------

def test_export_import_round_trip(path, tmp_path):
    src = TuningDB(path, versions=VERSIONS)
    for n in (16, 2048):
        k = src.key(problem(n=n))
        src.record(k, [row(bn=64, seconds=2e-5), row(bn=128), row(bn=256, seconds=None, error="wrong result")], best())
    src.set_calibration(H100.name, H100)
    out = tmp_path / "table.json"
    src.export_json(out)
    data = json.loads(out.read_text())
    assert data["format"] == "spartune-tuning" and len(data["results"]) == 6 and len(data["best"]) == 2

    dst = TuningDB(tmp_path / "other.sqlite3", versions=VERSIONS)
    assert dst.import_json(out) == 6 + 2 + 1
    assert dst.results() == src.results()
    for n in (16, 2048):
        assert dst.get_best(dst.key(problem(n=n))) == src.get_best(src.key(problem(n=n)))
    assert dst.get_calibration(H100.name) == H100
    assert dst.import_json(out) == 0  # importing twice adds nothing


def test_import_keeps_local_choices_unless_told(path, tmp_path):
    shipped = TuningDB(tmp_path / "shipped.sqlite3", versions=VERSIONS)
    shipped.record(shipped.key(problem()), [], best(bn=256))
    out = tmp_path / "table.json"
    shipped.export_json(out)
    local = TuningDB(path, versions=VERSIONS)
    key = local.key(problem())
    local.record(key, [], best(bn=64))
    local.import_json(out)
    assert local.get_best(key)["config"]["fields"] == {"bn": 64}
    local.import_json(out, overwrite=True)
    assert local.get_best(key)["config"]["fields"] == {"bn": 256}


def test_import_rejects_other_files(path, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "spartune-tuning", "schema": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="schema"):
        TuningDB(path, versions=VERSIONS).import_json(bad)


def test_software_versions_are_read_once():
    assert dbmod.software_versions() is dbmod.software_versions()


def test_a_cache_dir_that_cannot_hold_a_db_leaves_the_process_without_one(tmp_path, monkeypatch):
    """(dispatch opens the DB so: a lost cache must never stop a model from running)"""
    from spartune import dispatch

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(blocker))
    with pytest.warns(RuntimeWarning, match="tunes without one"):
        assert dispatch._open_db() is None
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path / "fine"))
    assert isinstance(dispatch._open_db(), TuningDB)


@pytest.mark.parametrize("edit,message", [
    (lambda d: [], "a JSON list"),
    (lambda d: {**d, "best": {}}, "'best' must be a list"),
    (lambda d: {**d, "calibration": [{**d["calibration"][0], "created": "yesterday"}]}, "created = 'yesterday'"),
    (lambda d: {**d, "calibration": [{**d["calibration"][0], "spec": {"sms": 132}}]}, "not a device calibration"),
    (lambda d: {**d, "results": [{k: v for k, v in d["results"][0].items() if k != "backend"}]}, "lacks 'backend'"),
    (lambda d: {**d, "best": [{**d["best"][0], "seconds": "fast"}]}, "seconds = 'fast'"),
])
def test_an_import_with_a_bad_row_is_refused_whole(tmp_path, edit, message):
    src = TuningDB(tmp_path / "src.db", versions=VERSIONS)
    src.set_calibration("NVIDIA H100 sm_90", H100)
    key = src.key(problem())
    src.record(key, [row()], best=best())
    src.export_json(tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(json.loads((tmp_path / "good.json").read_text()))))
    dst = TuningDB(tmp_path / "dst.db", versions=VERSIONS)
    with pytest.raises(ValueError, match=message):
        dst.import_json(bad)
    assert dst.import_json(tmp_path / "good.json") > 0  # nothing of the bad file went in
