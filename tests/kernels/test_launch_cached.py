"""kernels/_common.launch_cached's host logic with a stand-in kernel (the GPU test in
tests/gpu/test_blocked_gpu.py runs the real one): a miss goes through Triton's launch, a hit
calls the compiled kernel's run with the grid of the call and every argument in signature order."""
from types import SimpleNamespace

import pytest

from spartune.kernels import _common


class FakeCompiled:
    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.runs = []

    def run(self, *call):
        self.runs.append(call)


class FakeKernel:
    arg_names = ["x", "n", "BM", "ACT"]

    def __init__(self):
        self.fn = lambda: None  # what the cache keys on
        self.launches, self.compiled = [], FakeCompiled()

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            return self.compiled
        return launch


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(_common, "INTERPRETED", False)
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 77)
    monkeypatch.setattr(_common, "driver", SimpleNamespace(active=active))
    monkeypatch.setattr(_common.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(_common.knobs.runtime, "launch_exit_hook", None)


def test_a_hit_runs_the_compiled_kernel_with_its_arguments_in_order(on_a_gpu):
    kernel, cache, built = FakeKernel(), _common.LaunchCache(), []

    def constexprs():
        built.append(1)
        return dict(ACT=2, BM=64, num_warps=4)  # keyword order differs from the signature's

    _common.launch_cached(cache, ("k",), kernel, (5,), ("x0", 16), constexprs)
    assert kernel.launches == [((5,), ("x0", 16), dict(ACT=2, BM=64, num_warps=4))]
    _common.launch_cached(cache, ("k",), kernel, (9, 2), ("x1", 16), constexprs)
    assert len(kernel.launches) == 1 and len(built) == 1  # the hit built no keywords
    assert kernel.compiled.runs == [(9, 2, 1, 77, "function", "packed", None, None, None, "x1", 16, 64, 2)]
    _common.launch_cached(cache, ("other",), kernel, (5,), ("x2", 17), constexprs)
    assert len(kernel.launches) == 2 and len(cache) == 2


def test_the_cache_is_per_kernel_and_copies_empty(on_a_gpu):
    import copy
    import pickle

    first, second, cache = FakeKernel(), FakeKernel(), _common.LaunchCache()
    for kernel in (first, second):
        _common.launch_cached(cache, ("same key",), kernel, (1,), ("x", 1), lambda: dict(BM=1, ACT=0))
    assert len(first.launches) == len(second.launches) == 1
    assert copy.deepcopy(cache) == {} and pickle.loads(pickle.dumps(cache)) == {}


def test_arg_key_tells_apart_what_triton_specialises_on():
    """Tensors by dtype and 16-byte alignment (not address), ints by value, floats not at all."""
    import torch

    buf = torch.zeros(64, dtype=torch.float16)
    key = _common.arg_key
    assert key((buf, 7, 0.5)) == key((torch.zeros(64, dtype=torch.float16), 7, 2.0))  # another address, scale
    assert key((buf, 7, 0.5)) != key((buf[1:], 7, 0.5))  # a 2-byte offset: no longer 16-byte aligned
    assert key((buf, 7, 0.5)) != key((buf.float(), 7, 0.5))
    assert key((buf, 7, 0.5)) != key((buf, 16, 0.5)) != key((buf, 1, 0.5))
    assert key((buf, (0, 64))) != key((buf, (0, 65)))  # a tuple argument (the ELL band table)
    assert key((True,)) != key((1,)) and key((False,)) != key((0,))  # Triton: a runtime bool, a constant 1
