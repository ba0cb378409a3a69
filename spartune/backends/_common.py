"""What every library backend shares: weight conversions cached per format object (and version
of its values), torch's sparse warnings silenced, and the epilogue as separate torch ops."""
from __future__ import annotations

import contextlib
import contextvars
import warnings

import torch

from ..epilogue import apply_epilogue
from ..formats import SparseFormat, memo
from ..tune.measure import capture_stream


def cached(A: SparseFormat, what: str, make, keep: bool = True):
    """`make()` once per (format object, what), made again when A's values change in place (a
    converted copy of the weight would be stale); dropped with the format (keep=False: `memo`'s)."""
    return memo(A, f"_backend_{what}", make, keep=keep)


@contextlib.contextmanager
def quiet():
    """torch.sparse warns on each conversion ("beta state") and bsr_dense_mm on shapes it has
    no tuned parameters for: noise, not news, in a loop over problems."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def finish(acc, out, bias, activation, residual, scale):
    """The epilogue as separate torch ops, as a user without spartune writes them: libraries do
    not fuse it. In the output's dtype and in place where nothing changes dtype (a pass each, as
    eager torch and torch.compile's unfused code run them), else in fp32."""
    if bias is None and activation is None and residual is None and scale == 1.0:
        return out.copy_(acc)
    if _same_dtype(out, acc, bias, residual) and out.dtype in (torch.float16, torch.bfloat16):
        if bias is not None:
            torch.add(bias, acc, alpha=scale, out=out)  # bias + scale * acc
        elif scale != 1.0:
            torch.mul(acc, scale, out=out)
        else:
            out.copy_(acc)
        return activate_and_add_(out, activation, residual)
    wide = torch.promote_types(acc.dtype, torch.float32)  # fp32 math, float64 kept
    return out.copy_(apply_epilogue(acc.to(wide), None if bias is None else bias.to(wide), activation,
                                    None if residual is None else residual.to(wide), scale))


def _same_dtype(out, *tensors) -> bool:
    return all(t is None or t.dtype == out.dtype for t in tensors)


def activate_and_add_(y, activation, residual):
    """The tail of the epilogue, in place on y: act(y) + residual."""
    if activation is not None:
        IN_PLACE[activation](y)
    return y if residual is None else y.add_(residual)


IN_PLACE = {"relu": torch.relu_, "silu": lambda t: torch.nn.functional.silu(t, inplace=True),
            "gelu": lambda t: torch.ops.aten.gelu_(t), "gelu_tanh": lambda t: torch.ops.aten.gelu_(t, approximate="tanh")}


class GraphReplay:
    """One captured call: static inputs `x` and `bias` (owned here, filled on each call), the
    output it returns recorded once, and a replay allowed only when no tensor handed out still
    views that output (so a replay never overwrites what a caller holds)."""

    def __init__(self, run, x: torch.Tensor, bias: torch.Tensor | None):
        self.x, self.bias = x, bias
        side = capture_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (compilation, plans, workspace)
            run(x, bias)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y = run(x, bias)
        self._unheld = self._uses()

    def _uses(self) -> int:
        return torch._C._storage_Use_Count(self.y.untyped_storage()._cdata)

    def free(self) -> bool:
        return self._uses() == self._unheld

    def __call__(self, x, bias) -> torch.Tensor:
        """Replay on `x` (its rows copied into the leading rows of the static input); returns the
        static output, which the caller hands out as a view."""
        self.x[: x.shape[0]].copy_(x)
        if bias is not None:
            self.bias.copy_(bias)
        self.graph.replay()
        return self.y


_direct = contextvars.ContextVar("spartune_direct_launch", default=False)


class direct_launches:  # noqa: N801 (used as a context manager, like contextlib's)
    """Within: every call launches its kernel and no graph is replayed. The torch operators run
    so: what they return must be memory of their own (torch.compile's CUDA graphs track it).
    (A class: a generator-based context costs a few us of host time on every operator call.)"""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _direct.set(True)

    def __exit__(self, *exc):
        _direct.reset(self._token)


def replays_allowed() -> bool:
    """Whether a call may replay a graph of its own: not inside a torch operator, not while the
    caller's stream is being captured (the capture records the kernel itself)."""
    return not _direct.get() and not torch.cuda.is_current_stream_capturing()
