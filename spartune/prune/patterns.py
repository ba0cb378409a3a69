"""Pattern strings: the short names users give for a sparsity pattern."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..formats import BLOCK_SIZES


@dataclass(frozen=True)
class Pattern:
    kind: str  # "csr" | "block" | "shfl" | "nm" | "vnm"
    bm: int = 0  # block height, Shfl-BW / V:N:M group height V
    bk: int = 0  # block width
    n: int = 0
    m: int = 0

    @property
    def fixed_density(self) -> float | None:
        """N:M and V:N:M fix their density; the others take a sparsity."""
        if self.kind == "nm":
            return self.n / self.m
        if self.kind == "vnm":
            return 2 / self.m
        return None

    def __str__(self) -> str:
        return {
            "csr": "csr",
            "block": f"block:{self.bm}x{self.bk}",
            "shfl": f"shfl:{self.bm}",
            "nm": f"{self.n}:{self.m}",
            "vnm": f"{self.bm}:2:{self.m}",
        }[self.kind]


_FORMS = "'csr', 'block:64x64', 'block:64', 'shfl:64', '2:4', '64:2:8'"


def parse_pattern(spec) -> Pattern:
    """The Pattern a string names, its sizes checked (a bad one fails before anything is pruned)."""
    if isinstance(spec, Pattern):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"pattern must be a string such as {_FORMS}, got {type(spec).__name__}")
    p = _parse(spec.strip().lower(), spec)
    if p.kind in ("block", "shfl", "vnm"):
        sizes = (p.bm, p.bk) if p.kind == "block" else (p.bm,)
        if any(s not in BLOCK_SIZES for s in sizes):
            raise ValueError(f"pattern {spec!r}: block sizes must be one of {BLOCK_SIZES}")
    if p.kind == "nm" and not 1 <= p.n < p.m <= 128:
        raise ValueError(f"pattern {spec!r}: N:M needs 1 <= N < M <= 128")
    if p.kind == "vnm" and not 4 <= p.m <= 128:
        raise ValueError(f"pattern {spec!r}: V:N:M needs M in 4..128")
    return p


def _parse(s: str, spec) -> Pattern:
    if s == "csr":
        return Pattern("csr")
    if m := re.fullmatch(r"block:(\d+)(?:x(\d+))?", s):
        bm = int(m[1])
        return Pattern("block", bm=bm, bk=int(m[2] or bm))
    if m := re.fullmatch(r"shfl:(\d+)", s):
        return Pattern("shfl", bm=int(m[1]))
    if m := re.fullmatch(r"(\d+):(\d+)", s):
        return Pattern("nm", n=int(m[1]), m=int(m[2]))
    if m := re.fullmatch(r"(\d+):2:(\d+)", s):
        return Pattern("vnm", bm=int(m[1]), n=2, m=int(m[2]))
    if m := re.fullmatch(r"(\d+):(\d+):(\d+)", s):
        raise ValueError(f"V:N:M pattern {spec!r}: N must be 2 (the hardware 2:4 inside the kept 4 columns)")
    raise ValueError(f"unknown pattern {spec!r}; expected one of {_FORMS}")
