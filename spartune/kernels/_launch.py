"""Triton's launch without its per-call argument binding.

`kernel[grid](...)` binds every argument, computes a specialization key and looks the compiled
kernel up on every call: some 15-25 µs of host time for our kernels' long argument lists, more
than a decode kernel runs. `fast(kernel)[grid](...)` takes that path once per specialization
(what Triton specializes on: dtypes, 16-byte alignment of pointers, integers equal to 1 or
multiples of 16, constexpr values) and then calls the compiled kernel directly.
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime import driver


def _key(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return a == 1, a % 16 == 0
    if isinstance(a, float):
        return float
    if isinstance(a, tuple):
        return tuple(_key(v) for v in a)
    base = getattr(a, "base", None)  # a TensorDescriptor: its dtype, block and alignment
    if isinstance(base, torch.Tensor):
        return type(a), base.dtype, base.data_ptr() % 16 == 0, tuple(a.block_shape), \
            tuple(s % 16 == 0 for s in a.strides[:-1])
    return type(a), a


def _hooked() -> bool:
    """Whether a launch hook (a profiler's) is installed: then Triton's own path runs, which
    feeds it. Triton keeps an empty chain of hooks when there is none."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class FastKernel:
    def __init__(self, fn):
        self.fn = fn
        self.compiled: dict = {}  # specialization key -> (compiled kernel, names of keyword params)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def run(self, grid, args, kwargs):
        key = (tuple(_key(a) for a in args), tuple((k, v if not isinstance(v, torch.Tensor) else _key(v))
                                                   for k, v in kwargs.items()))
        hit = self.compiled.get(key)
        if hit is None or _hooked():
            kernel = self.fn[grid](*args, **kwargs)
            if hasattr(kernel, "run") and hasattr(kernel, "packed_metadata"):  # not under the interpreter
                names = [n for n in self.fn.arg_names[len(args):] if n in kwargs]
                if len(args) + len(names) == len(self.fn.arg_names):  # every parameter given: replayable
                    self.compiled[key] = (kernel, names)
            return
        kernel, names = hit
        grid = grid + (1,) * (3 - len(grid))
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *(kwargs[n] for n in names))


def fast(fn) -> FastKernel:
    return FastKernel(fn)
