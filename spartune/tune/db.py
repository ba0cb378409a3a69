"""The tuning database: every measurement and the chosen (backend, config) per problem, in
SQLite, so a problem is tuned once per device and software stack, not once per process.

One file in the user cache directory (SPARTUNE_CACHE_DIR overrides). WAL mode and a busy
timeout let several processes tune at once; writes are short `BEGIN IMMEDIATE` transactions.
Keys hold the device, the torch / triton / CUDA / spartune versions and a digest of the kernels'
sources, so an entry is never reused across any of them. A corrupt file, or one of another
schema, is moved aside and rebuilt with a warning: losing a cache must never stop a model from
running.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path

from .device import DeviceSpec
from .problem import Problem

SCHEMA_VERSION = 1
FILE_NAME = f"tuning-v{SCHEMA_VERSION}.sqlite3"  # spartune releases of other schemas never share a file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calibration (
    device TEXT PRIMARY KEY, spec TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem TEXT NOT NULL, backend TEXT NOT NULL, config TEXT NOT NULL,
    seconds REAL,          -- NULL when it failed or gave a wrong result
    error TEXT,
    predicted REAL,
    created REAL NOT NULL,
    UNIQUE (problem, backend, config, created));
CREATE INDEX IF NOT EXISTS results_problem ON results (problem);
CREATE TABLE IF NOT EXISTS best (
    problem TEXT PRIMARY KEY, backend TEXT NOT NULL, config TEXT NOT NULL,
    seconds REAL, predicted REAL, mode TEXT NOT NULL, created REAL NOT NULL);
"""


def default_path() -> Path:
    root = os.environ.get("SPARTUNE_CACHE_DIR")
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("spartune")
    return Path(root) / FILE_NAME


@functools.cache
def software_versions() -> dict:
    """What a tuned entry depends on besides the device: the software that builds and runs the
    kernels, and how they were timed."""
    from ..versions import software_versions as versions
    from .measure import MEASURER

    v = versions()
    return {**{k: v[k] for k in ("torch", "cuda", "triton", "spartune", "kernels")}, "measure": MEASURER}


def canonical(obj) -> str:
    """JSON with a single spelling per value, so equal keys are equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class TuningDB:
    """SQLite tuning DB. `versions` overrides software_versions() (tests, shipped tables)."""

    def __init__(self, path: str | os.PathLike | None = None, versions: dict | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.versions = dict(versions) if versions is not None else software_versions()
        self._lock = threading.Lock()
        self._conn = self._open()

    # --- keys ----------------------------------------------------------------------------------
    def key(self, problem: Problem) -> str:
        """The problem's key (device included) plus the software versions, as JSON."""
        return canonical([list(problem.key()), self.versions])

    # --- opening, recovery ---------------------------------------------------------------------
    def _open(self, thorough: bool = False) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.path.with_name(self.path.name + ".lock")):
            problem = self._check_file(thorough)
            if problem:
                moved = _move_aside(self.path, problem[0])
                warnings.warn(f"spartune tuning DB {self.path} {problem[1]}; moved it to {moved} and started a new one",
                              RuntimeWarning, stacklevel=3)
            conn = self._connect()
            with _transaction(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('spartune_version', ?)", (self.versions.get("spartune", ""),))
            return conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _check_file(self, thorough: bool) -> tuple[str, str] | None:
        """None when the file is absent, empty or ours; else (suffix, why) to move it aside.
        `thorough` adds an integrity check of every page: after an error, not on every open."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        try:
            conn = sqlite3.connect(self.path, timeout=60.0)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if not tables:
                    return None
                if "meta" not in tables:
                    return "foreign", "is not a spartune tuning DB"
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None or row[0] != str(SCHEMA_VERSION):
                    return f"schema{row[0] if row else 'none'}", f"has schema version {row[0] if row else 'none'}, not {SCHEMA_VERSION}"
                ok = conn.execute("PRAGMA quick_check").fetchone() if thorough else ("ok",)
                if ok is None or ok[0] != "ok":
                    return "corrupt", f"failed its integrity check ({ok[0] if ok else 'no answer'})"
                return None
            finally:
                conn.close()
        except sqlite3.DatabaseError as e:
            return "corrupt", f"cannot be read ({e})"

    def _run(self, fn, default=None, write: bool = False):
        """fn(conn) under the lock. A broken or replaced file is reopened (moved aside and
        rebuilt if bad) and fn tried once more; after that it degrades to `default` with a
        warning instead of raising."""
        try:
            return self._call(fn, write)
        except sqlite3.DatabaseError:
            pass
        try:
            with self._lock:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = self._open(thorough=True)
            return self._call(fn, write)
        except (sqlite3.Error, OSError) as e:
            warnings.warn(f"spartune tuning DB {self.path} failed ({e}); carrying on without it", RuntimeWarning, stacklevel=3)
            return default

    def _call(self, fn, write: bool):
        with self._lock:
            if not write:
                return fn(self._conn)
            with _transaction(self._conn):
                return fn(self._conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- best ----------------------------------------------------------------------------------
    def get_best(self, key: str) -> dict | None:
        """{'backend', 'config' (parsed JSON), 'seconds', 'predicted', 'mode'} or None."""
        row = self._run(lambda c: c.execute(
            "SELECT backend, config, seconds, predicted, mode FROM best WHERE problem=?", (key,)).fetchone())
        if row is None:
            return None
        return {"backend": row[0], "config": json.loads(row[1]), "seconds": row[2], "predicted": row[3], "mode": row[4]}

    def tunings(self, key: str) -> int:
        """How many tunings stored measurements of this problem (their distinct times)."""
        row = self._run(lambda c: c.execute(
            "SELECT COUNT(DISTINCT created) FROM results WHERE problem=?", (key,)).fetchone())
        return row[0] if row else 0

    def record(self, key: str, results: list[dict], best: dict | None = None) -> None:
        """Store measurements (dicts with backend, config, seconds, error, predicted) and, if
        given, the chosen best ({backend, config, seconds, predicted, mode}) in one transaction."""
        now = time.time()

        def write(c):
            c.executemany(
                "INSERT OR IGNORE INTO results (problem, backend, config, seconds, error, predicted, created) VALUES (?,?,?,?,?,?,?)",
                [(key, r["backend"], canonical(r["config"]), r.get("seconds"), r.get("error"), _finite(r.get("predicted")), now)
                 for r in results])
            if best is not None:
                c.execute("INSERT OR REPLACE INTO best VALUES (?,?,?,?,?,?,?)",
                          (key, best["backend"], canonical(best["config"]), best.get("seconds"),
                           _finite(best.get("predicted")), best["mode"], now))

        self._run(write, write=True)

    def results(self, key: str | None = None) -> list[dict]:
        """Every stored measurement (of one problem key, or all), oldest first."""
        where, args = ("WHERE problem=?", (key,)) if key is not None else ("", ())
        rows = self._run(lambda c: c.execute(
            f"SELECT problem, backend, config, seconds, error, predicted, created FROM results {where} ORDER BY id", args
        ).fetchall(), default=[])
        return [{"problem": r[0], "backend": r[1], "config": json.loads(r[2]), "seconds": r[3], "error": r[4],
                 "predicted": r[5], "created": r[6]} for r in rows]

    # --- calibration ---------------------------------------------------------------------------
    def get_calibration(self, device: str) -> DeviceSpec | None:
        row = self._run(lambda c: c.execute("SELECT spec FROM calibration WHERE device=?", (device,)).fetchone())
        return DeviceSpec.from_json(row[0]) if row else None

    def set_calibration(self, device: str, spec: DeviceSpec) -> None:
        self._run(lambda c: c.execute("INSERT OR REPLACE INTO calibration VALUES (?,?,?)",
                                      (device, spec.to_json(), time.time())), write=True)

    # --- export / import -----------------------------------------------------------------------
    def export_json(self, path: str | os.PathLike) -> None:
        """Everything, as one JSON file that `import_json` on another machine reads back."""

        def read(c):
            return {
                "format": "spartune-tuning",
                "schema": SCHEMA_VERSION,
                "calibration": [{"device": d, "spec": json.loads(s), "created": t}
                                for d, s, t in c.execute("SELECT device, spec, created FROM calibration")],
                "results": [{"problem": json.loads(p), "backend": b, "config": json.loads(cf), "seconds": s,
                             "error": e, "predicted": pr, "created": t}
                            for p, b, cf, s, e, pr, t in c.execute(
                                "SELECT problem, backend, config, seconds, error, predicted, created FROM results ORDER BY id")],
                "best": [{"problem": json.loads(p), "backend": b, "config": json.loads(cf), "seconds": s,
                          "predicted": pr, "mode": m, "created": t}
                         for p, b, cf, s, pr, m, t in c.execute(
                             "SELECT problem, backend, config, seconds, predicted, mode, created FROM best")],
            }

        data = self._run(read)
        if data is None:
            raise RuntimeError(f"could not read the tuning DB {self.path} to export it")
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        try:
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def clear(self, *, stale_only: bool = False, calibration: bool = False) -> int:
        """Delete the stored measurements and choices: all of them, or (`stale_only`) those made
        under other software versions, which this install never reads again; with `calibration`
        the device calibrations too (measured again at next use). Returns the rows deleted."""
        mine = canonical(self.versions)

        def stale(key: str) -> bool:
            try:
                return canonical(json.loads(key)[1]) != mine
            except (ValueError, TypeError, IndexError, KeyError):
                return True

        def write(c):
            before = c.total_changes
            for table in ("results", "best"):
                if stale_only:
                    keys = [k for (k,) in c.execute(f"SELECT DISTINCT problem FROM {table}") if stale(k)]
                    c.executemany(f"DELETE FROM {table} WHERE problem = ?", [(k,) for k in keys])
                else:
                    c.execute(f"DELETE FROM {table}")
            if calibration:
                c.execute("DELETE FROM calibration")
            return c.total_changes - before

        return self._run(write, default=0, write=True)

    def import_json(self, path: str | os.PathLike, *, overwrite: bool = False) -> int:
        """Merge an exported file; returns the rows added. Local choices win unless
        `overwrite`: a table measured here is better evidence than a shipped one."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != "spartune-tuning" or data.get("schema") != SCHEMA_VERSION:
            found = f"format {data.get('format')!r}, schema {data.get('schema')!r}" if isinstance(data, dict) \
                else f"a JSON {type(data).__name__}"
            raise ValueError(f"{path} is not a spartune tuning export of schema {SCHEMA_VERSION} ({found})")
        _check_export(data, path)
        verb = "INSERT OR REPLACE" if overwrite else "INSERT OR IGNORE"

        def write(c):
            before = c.total_changes
            c.executemany(f"{verb} INTO calibration VALUES (?,?,?)",
                          [(r["device"], canonical(r["spec"]), r["created"]) for r in data["calibration"]])
            c.executemany(
                "INSERT OR IGNORE INTO results (problem, backend, config, seconds, error, predicted, created) VALUES (?,?,?,?,?,?,?)",
                [(canonical(r["problem"]), r["backend"], canonical(r["config"]), r["seconds"], r["error"],
                  r["predicted"], r["created"]) for r in data["results"]])
            c.executemany(f"{verb} INTO best VALUES (?,?,?,?,?,?,?)",
                          [(canonical(r["problem"]), r["backend"], canonical(r["config"]), r["seconds"],
                            r["predicted"], r["mode"], r["created"]) for r in data["best"]])
            return c.total_changes - before

        return self._run(write, default=0, write=True)


_NUMBER, _TEXT, _ANY = (int, float), (str,), object
# what each row of an export holds: field -> (types, may be null)
_EXPORT_ROWS = {
    "calibration": {"device": (_TEXT, False), "spec": ((dict,), False), "created": (_NUMBER, False)},
    "results": {"problem": ((list,), False), "backend": (_TEXT, False), "config": (_ANY, True),
                "seconds": (_NUMBER, True), "error": (_TEXT, True), "predicted": (_NUMBER, True),
                "created": (_NUMBER, False)},
    "best": {"problem": ((list,), False), "backend": (_TEXT, False), "config": (_ANY, True),
             "seconds": (_NUMBER, True), "predicted": (_NUMBER, True), "mode": (_TEXT, False),
             "created": (_NUMBER, False)},
}


def _check_export(data: dict, path) -> None:
    """Every row of an export as export_json writes it, before any is stored: a bad row would
    otherwise be dropped silently or break `spartune info` and the tuner later."""
    from .device import DeviceSpec

    for table, fields in _EXPORT_ROWS.items():
        rows = data.get(table)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: {table!r} must be a list of rows, got {type(rows).__name__}")
        for i, row in enumerate(rows):
            where = f"{path}: {table}[{i}]"
            if not isinstance(row, dict):
                raise ValueError(f"{where} must be an object, got {type(row).__name__}")
            for name, (types, nullable) in fields.items():
                if name not in row:
                    raise ValueError(f"{where} lacks {name!r}")
                v = row[name]
                if not (v is None and nullable) and (v is None or isinstance(v, bool) or not isinstance(v, types)):
                    raise ValueError(f"{where}: {name} = {v!r} is not a valid {name}")
            if table == "calibration":
                try:
                    DeviceSpec.from_json(json.dumps(row["spec"]))
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{where}: its spec is not a device calibration ({e})") from None


def _finite(x):
    """SQLite has no infinity in JSON exports; an impossible prediction is stored as NULL."""
    return x if x is not None and x == x and abs(x) != float("inf") else None


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection):
    """BEGIN IMMEDIATE takes the write lock up front: a deferred transaction that upgrades
    later can fail at once with 'database is locked' instead of waiting its turn."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock around opening/rebuilding, so two processes never both move a file
    aside (the second would move the first one's fresh DB). POSIX only; elsewhere a no-op."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _move_aside(path: Path, why: str) -> Path:
    """Rename the DB (and its WAL files) to '<name>.<why>-<time>-<pid>'."""
    target = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.replace(path, target)
    for extra in ("-wal", "-shm"):
        side = path.with_name(path.name + extra)
        if side.exists():
            os.replace(side, target.with_name(target.name + extra))
    return target
