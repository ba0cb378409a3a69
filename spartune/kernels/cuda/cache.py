"""The on-disk cubin cache: an instance is compiled once per machine, not once per process.

Entries live in `<spartune cache dir>/cubin/` (SPARTUNE_CACHE_DIR overrides, as for the tuning
DB), named by a sha256 of everything the cubin depends on: the template's text and that of its
local headers, the defines, the options, the arch and NVRTC's version. Each is written to a temp
file in the same directory and renamed into place, so concurrent processes never see a partial
file; each carries a header (magic, length, sha256 of the payload), so a corrupt or truncated
entry is detected, recompiled and replaced. Losing the cache must never stop a model: a
directory that cannot hold entries (read-only, a file in the way, a full disk) costs one warning
and this process's compiles, nothing else.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import time
from pathlib import Path

from .compiler import SRC_DIR, Compiler, CompilerFailed, CudaCompileError, Instance, program_options, read_sources

log = logging.getLogger("spartune.cuda")

MAGIC = b"SPTCUBIN"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256(payload)


def default_dir() -> Path:
    from ...tune.db import default_path

    return default_path().parent / "cubin"


def cache_key(sources: dict[str, str], options: dict, arch: str, nvrtc_version: str) -> str:
    """sha256 over the sources (template + local headers), the options (defines included),
    the arch and the NVRTC version."""
    blob = json.dumps({"sources": sources, "options": options, "arch": arch, "nvrtc": nvrtc_version},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def encode_entry(payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode_entry(blob: bytes) -> bytes | None:
    """The payload, or None when the entry is not intact."""
    if len(blob) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class CubinCache:
    """Cubins by instance, from disk or compiled. `stats` counts compiles and disk hits (the
    tests read it to prove a second process compiles nothing)."""

    def __init__(self, directory: Path | str | None = None, compiler: Compiler | None = None,
                 src_dir: Path = SRC_DIR):
        self.directory = Path(directory) if directory is not None else default_dir()
        self.src_dir = src_dir
        self._compiler = compiler
        self._lock = threading.Lock()  # guards stats and _locks
        self._locks: dict[Path, threading.Lock] = {}  # one per entry: instances compile in parallel
        self.stats = {"compiles": 0, "disk_hits": 0, "corrupt": 0, "compile_seconds": 0.0}
        self._can_read = self._can_write = True  # turned off by a directory that failed

    @property
    def compiler(self) -> Compiler:
        if self._compiler is None:
            from .compiler import nvrtc_compile

            self._compiler = nvrtc_compile
        return self._compiler

    def path(self, inst: Instance, arch: str, nvrtc_version: str) -> Path:
        key = cache_key(read_sources(inst.template, self.src_dir), program_options(inst, arch), arch, nvrtc_version)
        return self.directory / f"{Path(inst.template).stem}-{key}.cubin"

    def get(self, inst: Instance, arch: str, nvrtc_version: str) -> bytes:
        """The instance's cubin: read from disk when intact, else compiled and stored.
        Raises CudaCompileError when the compiler fails."""
        path = self.path(inst, arch, nvrtc_version)
        with self._lock:
            entry_lock = self._locks.setdefault(path, threading.Lock())
        with entry_lock:  # another thread compiling this entry: wait for it, then read it
            cubin = self._read(path) if self._can_read else None
            if cubin is not None:
                self._count("disk_hits")
                return cubin
            cubin = self._compile(inst, arch)
            if self._can_write:
                try:
                    write_atomic(path, encode_entry(cubin))
                except OSError as exc:
                    self._give_up(exc, reading=False)
            return cubin

    def _give_up(self, exc: OSError, reading: bool) -> None:
        """Stop writing (a write failed: a read-only cache is still read) or reading too (the
        directory is not one); one warning for the process, however many instances it compiles."""
        with self._lock:
            first = self._can_read and self._can_write
            self._can_write = False
            self._can_read = self._can_read and not reading
        if first:
            log.warning("spartune: the cubin cache at %s cannot hold new entries (%s): this process compiles what "
                        "it does not find there (set SPARTUNE_CACHE_DIR to a writable directory)", self.directory, exc)

    def _read(self, path: Path) -> bytes | None:
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except NotADirectoryError as exc:  # the directory, not this entry
            self._give_up(exc, reading=True)
            return None
        except OSError as exc:
            log.warning("spartune: unreadable cubin cache entry %s (%s): recompiling", path, exc)
            return None
        payload = decode_entry(blob)
        if payload is None:
            self._count("corrupt")
            log.warning("spartune: corrupt cubin cache entry %s: recompiling", path)
        return payload

    def _compile(self, inst: Instance, arch: str) -> bytes:
        source = read_sources(inst.template, self.src_dir)[inst.template]
        start = time.perf_counter()
        try:
            options = program_options(inst, arch)
            extra = options.get("include_path") or ()
            options["include_path"] = [str(self.src_dir), *([extra] if isinstance(extra, str) else extra)]
            cubin = self.compiler(source, options)
        except CompilerFailed as exc:
            raise CudaCompileError(inst, exc.log) from None
        seconds = time.perf_counter() - start
        self._count("compiles")
        self._count("compile_seconds", seconds)
        log.info("spartune: compiled %s for %s in %.2f s", inst.describe(), arch, seconds)
        return cubin

    def _count(self, stat: str, amount: float = 1) -> None:
        with self._lock:
            self.stats[stat] += amount
