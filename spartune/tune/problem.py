"""What the tuner knows about a call: the Problem (its key in the DB) and the features a kernel
family declares for the cost model. Kernels import this; they never import the tuner."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..formats import FormatStats


ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # by Problem.dtype
# "speed": the fastest candidate, whatever copy of the weight it keeps (cuBLAS's dense copy, a
# library's conversion, V:N:M's 2:4 copy); "lean": none of those, our kernels on the format and
# their own layouts of it (each about its size), dense on a decompression made for each call
MEMORY_POLICIES = ("speed", "lean")


@dataclass(frozen=True)
class Epilogue:
    """What is fused after the product: y = act(scale * acc + bias) + residual, cast to out_dtype."""

    bias: bool = False
    activation: str | None = None
    residual: bool = False
    scale: bool = False  # a scale other than 1
    prologue: str | None = None  # x -> act(x + x_bias) on load: "bias" or "bias+<activation>"

    def signature(self) -> str:
        parts = [p for p, on in (("bias", self.bias), (self.activation, bool(self.activation)), ("res", self.residual), ("scale", self.scale)) if on]
        if self.prologue:
            parts.insert(0, f"pre:{self.prologue}")
        return "+".join(parts) or "none"


@dataclass(frozen=True)
class Problem:
    """One sparse op on one shape. `n` is the dense dimension: tokens for `linear`, columns of
    X for `spmm`, the head dim for `sddmm`."""

    op: str  # "linear" | "spmm" | "sddmm" | "softmax"
    fmt: str  # format signature: "csr", "block:64x64", "shfl:64", "2:4", "64:2:8"
    m: int
    k: int
    n: int
    dtype: str  # "float16" | "bfloat16" | "float32"
    stats: FormatStats
    epilogue: Epilogue = Epilogue()
    device: str = ""  # device name + capability; filled in by the dispatch point
    layout: str = "linear"  # "linear": x (N, K) K-contiguous; "spmm": x = X.T, tokens contiguous
    # torch's fp16 reduced-precision flag (`fp16_reduction_allowed`) for linear's fp16 problems, read when the
    # Problem is made unless given: cuBLAS's speed and csr_smem's sums follow it, so a choice tuned
    # under one setting is not served under the other; False for other dtypes and ops
    fp16_reduction: bool | None = None
    # the weight-memory policy the choice is made under (dispatch.set_memory_policy; linear only):
    # "lean" leaves out the candidates that keep a dense, library or 2:4 copy of the weight
    memory: str = "speed"

    def __post_init__(self):
        if self.memory not in MEMORY_POLICIES:
            raise ValueError(f"memory must be one of {MEMORY_POLICIES}, got {self.memory!r}")
        flag = self.fp16_reduction
        flag = fp16_reduction_allowed(self.dtype) if flag is None and self.op == "linear" else bool(flag)
        object.__setattr__(self, "fp16_reduction", flag and self.dtype == "float16")

    def key(self) -> tuple:
        """The DB key (its fields named by KEY_FIELDS): shapes exact except N (bucketed), sparsity
        statistics bucketed."""
        return (
            self.op,
            self.fmt,
            self.m,
            self.k,
            n_bucket(self.n),
            self.dtype,
            self.epilogue.signature(),
            round(self.stats.density, 2),
            round(min(self.stats.items_cv, 4.0), 1),
            self.device,
            self.layout,
            self.fp16_reduction,
            self.memory,
        )


_get_fp16_reduction = getattr(torch._C, "_get_cublas_allow_fp16_reduced_precision_reduction", None)


def fp16_reduction_allowed(dtype) -> bool:
    """Whether an fp16 matmul may reduce in fp16 now
    (`torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`, on by default), False
    for other dtypes (a torch.dtype or its name). Read on every call: the public property costs
    ~1.4 us of host time, the getter behind it ~0.1 (a bool, or (allowed, split-K allowed) in newer
    torch)."""
    if dtype is not torch.float16 and dtype != "float16":
        return False
    if _get_fp16_reduction is None:
        return bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    allowed = _get_fp16_reduction()
    return bool(allowed[0] if isinstance(allowed, tuple) else allowed)


# Problem.key()'s entries by position; stored keys of older versions end earlier (no layout, no
# fp16_reduction), so readers of stored keys (`spartune info`) index by name, not from the end
KEY_FIELDS = ("op", "fmt", "m", "k", "n", "dtype", "epilogue", "density", "items_cv", "device", "layout", "fp16_reduction", "memory")


def n_bucket(n: int) -> int:
    """N rounded up to a power of two (exact up to 16: decode sizes matter one by one)."""
    return n if n <= 16 else 1 << math.ceil(math.log2(n))


# A sparse kernel's main-loop step loads an index (block column, kept column, bitmap word) and
# then the tile it addresses: two dependent round trips that the pipeline has to cover. A
# family whose step has a longer chain declares it as proportionally more steps.
INDEX_CHAIN = 2


@dataclass(frozen=True)
class KernelFeatures:
    """What one (kernel family, config) does on one problem: all the cost model reads.

    Totals are over the whole launch; `steps_*` count a program's main-loop trips (a step
    is one tile of K loaded and multiplied), which sets pipeline fill and load imbalance.
    """

    programs: int  # programs launched (persistent kernels: their fixed count)
    tiles: int  # output tiles (work items); equals programs for one-tile-per-program grids
    mma_flops: float  # tensor-core flops issued, padding and stored zeros included
    fma_flops: float  # CUDA-core flops
    dram_bytes: float  # bytes that must come from DRAM at least once (values, indices, X, Y)
    l2_bytes: float  # bytes read through L2 including re-reads (X reloaded by every tile)
    steps_max: int  # main-loop trips of the longest tile
    steps_mean: float  # mean main-loop trips per tile
    smem_bytes: int  # shared memory per program (stages x tiles)
    num_warps: int
    num_stages: int
    split_k: int = 1  # partial results reduced through memory
    launches: int = 1  # kernels per call
    reduce_bytes: float = 0.0  # split-K: partial results written and read back to combine them
    regs_per_thread: int = 0  # 0 = unknown: registers are then not an occupancy limit
    cluster: int = 1  # CTAs per thread-block cluster (sm_90): a wave holds only whole clusters that fit a GPC
