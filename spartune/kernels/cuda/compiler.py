"""Run-time compilation of the CUDA templates in src/ with NVRTC through `cuda.core`.

An instance is a template file, the kernel to take from it, its compile-time constants (emitted
as `-D` defines) and options. NVRTC and the CUDA headers are those of the NVIDIA wheels that a
CUDA build of torch installs, found by `cuda-pathfinder`: users need no CUDA toolkit. cuda.core
is imported inside functions only, so this module imports on any machine.
"""
from __future__ import annotations

import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

SRC_DIR = Path(__file__).parent / "src"
STD = "c++17"

# A compiler: (source text, ProgramOptions fields as a dict) -> cubin bytes; raises
# CompilerFailed. Injectable, so CPU tests can count and fake compiles.
Compiler = Callable[[str, dict], bytes]

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


class CompilerFailed(Exception):
    """Raised by a compiler; `log` is what it printed."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log


class CudaCompileError(RuntimeError):
    """A template instance failed to compile; names the instance and carries NVRTC's log."""

    def __init__(self, instance: "Instance", log: str):
        super().__init__(f"NVRTC failed to compile {instance.describe()}:\n{log}")
        self.instance = instance
        self.log = log


def _frozen(mapping: dict | None) -> tuple:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True)
class Instance:
    """One compiled variant of a template: hashable, so a process loads it once."""

    template: str  # file name under src/
    kernel: str  # the name of a kernel entry point in it (declared with C linkage: unmangled)
    defines: tuple = ()  # sorted (name, value) compile-time constants, emitted as -Dname=value
    arch_specific: bool = False  # compile for sm_XXa (wgmma, setmaxnreg, ...)
    options: tuple = ()  # sorted (field, value) extra cuda.core ProgramOptions

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.defines)
        extra = " [arch-specific]" if self.arch_specific else ""
        return f"{self.template}:{self.kernel}({args}){extra}"


def instance(template: str, kernel: str, defines: dict[str, Any] | None = None, *,
             arch_specific: bool = False, **options) -> Instance:
    """Build an Instance from a dict of compile-time constants and ProgramOptions fields."""
    for name, value in (defines or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not isinstance(value, (int, str)):
            raise ValueError(f"{template}: define {name}={value!r} must be an identifier set to an int or str")
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return Instance(template, kernel, _frozen(defines), arch_specific, _frozen(options))


def read_sources(template: str, src_dir: Path = SRC_DIR) -> dict[str, str]:
    """The template's text and that of every local `#include "..."` it pulls from src_dir,
    recursively: everything a cubin depends on besides the CUDA headers and NVRTC itself."""
    if not (src_dir / template).is_file():
        raise FileNotFoundError(f"CUDA template {template!r} not found in {src_dir}")
    texts: dict[str, str] = {}
    pending = [template]
    while pending:
        name = pending.pop()
        if name not in texts and (src_dir / name).is_file():  # others come from the include path
            texts[name] = (src_dir / name).read_text()
            pending.extend(_LOCAL_INCLUDE.findall(texts[name]))
    return texts


def device_arch(capability: tuple[int, int], arch_specific: bool) -> str:
    """NVRTC's target for a device: sm_90, or sm_90a where Hopper-only instructions are used."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if arch_specific else "")


def program_options(inst: Instance, arch: str) -> dict:
    """The cuda.core ProgramOptions fields of an instance, without the include paths of src/
    and of the CUDA headers (added just before compiling): machine-independent, so they can
    enter the cache key."""
    opts = {"name": inst.template, "arch": arch, "std": STD}
    if inst.defines:
        opts["define_macro"] = [(k, str(v)) for k, v in inst.defines]
    opts.update(dict(inst.options))
    return opts


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """The CUDA runtime headers (cuda_fp16.h, cuda_bf16.h, ...) from the NVIDIA wheels, by
    cuda-pathfinder; raises RuntimeError when none are found."""
    from cuda.pathfinder import locate_nvidia_header_directory

    found = locate_nvidia_header_directory("cudart")
    if found is None:
        raise RuntimeError("cuda-pathfinder found no CUDA runtime headers (pip install nvidia-cuda-runtime)")
    return (found.abs_path,)


@functools.cache
def nvrtc_version() -> str:
    """NVRTC's version, e.g. "13.0": part of every cache key."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


def nvrtc_compile(source: str, options: dict) -> bytes:
    """The real compiler: NVRTC through cuda.core, to a cubin for options["arch"]; adds the
    CUDA headers' directory to options["include_path"]."""
    from cuda.core import Program, ProgramOptions

    opts = dict(options)
    opts["include_path"] = [*opts.get("include_path", ()), *cuda_include_dirs()]
    log = io.StringIO()
    try:
        program = Program(source, "c++", ProgramOptions(**opts))
        code = program.compile("cubin", logs=log)
    except Exception as exc:  # cuda.core reports NVRTC failures with several exception types
        text = "\n".join(s for s in (log.getvalue(), str(exc)) if s.strip())
        raise CompilerFailed(text.replace("\x00", "").strip()) from exc
    return bytes(code.code)
