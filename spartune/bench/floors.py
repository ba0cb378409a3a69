"""The floor of a problem (DESIGN.md, "Measuring performance"): the time no kernel can beat,
max(useful flops / matrix rate, compulsory bytes / DRAM bandwidth). Reports divide it by
measured times ("fraction of floor"); the tuner never reads it."""
from __future__ import annotations

from ..tune.device import DeviceSpec, dtype_name
from ..tune.problem import ELEMENT_BYTES, Problem


def compulsory_bytes(problem: Problem) -> float:
    """Sparse values + indices + dense inputs + outputs, each moved once."""
    s, elt = problem.stats, ELEMENT_BYTES[dtype_name(problem.dtype)]
    items = s.units * s.items_mean
    kind = problem.fmt.split(":")[0]
    if kind.isdigit():  # N:M and V:N:M: a uint8 position per stored value
        index = s.nnz * 1.0
    else:  # CSR / block / Shfl-BW: a column index per item and a pointer per unit
        index = items * (2 if s.cols < 2**15 else 4) + (s.units + 1) * 4
    values = s.nnz * elt
    if problem.op == "sddmm":  # dense (m, n) and (k, n) in, sparse values out
        return values + index + (problem.m + problem.k) * problem.n * elt
    if problem.op == "softmax":  # sparse values in and out
        return 2 * values + index
    x, y = problem.k * problem.n * elt, problem.m * problem.n * elt
    extra = (problem.m * elt if problem.epilogue.bias else 0) + (y if problem.epilogue.residual else 0)
    return values + index + x + y + extra


def useful_flops(problem: Problem) -> float:
    """2 * nnz * n: a multiply-add per stored entry and dense column (nnz * 5 for softmax)."""
    if problem.op == "softmax":
        return 5.0 * problem.stats.nnz
    return 2.0 * problem.stats.nnz * problem.n


def floor_seconds(problem: Problem, device: DeviceSpec, *, cuda_cores: bool = False) -> float:
    """max(useful flops / measured rate, compulsory bytes / DRAM bandwidth). `cuda_cores`
    uses the fp32 FMA rate, for kernels that do not use the tensor cores."""
    rate = device.fma if cuda_cores or problem.op == "softmax" else device.matrix_rate(problem.dtype)
    return max(useful_flops(problem) / rate, compulsory_bytes(problem) / device.dram_bw)
