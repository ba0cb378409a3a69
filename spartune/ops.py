"""The public ops. Each checks its inputs (clear errors before any kernel runs), then takes
its (backend, config) from the weight's dispatch state (`_state`); on a miss, `_tune` (the one
place that builds candidates: our kernel configs and the library backends) asks the tuner.

Hot path: a dict lookup on a small tuple per weight (cached choices live next to the weight,
dropped with it) and the launch. Tuning runs once per (weight, call shape, dtype, epilogue);
the tuner's own memory and DB make it a lookup for every further weight of the same problem.
"""
from __future__ import annotations

import os
import weakref

import torch

from . import backends, reference
from .epilogue import check_activation
from .formats import CSR, NM, VNM, BlockSparse, ShuffledBlock, SparseFormat
from .formats._base import PATTERN_CACHES
from .kernels import sddmm as sddmm_kernels
from .kernels import sparse_softmax as softmax_kernels
from .kernels import spmm_blocked, spmm_csr
from .tune.problem import Epilogue, Problem

# Our kernel families for each op and format (the tuner also sees the library backends).
LINEAR_FAMILIES = {BlockSparse: ("blocked", spmm_blocked), ShuffledBlock: ("blocked", spmm_blocked),
                   CSR: ("csr", spmm_csr), NM: None, VNM: None}
TOLERANCE = {torch.float32: 5e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # fp32 runs as tf32

_tuner = None
_mode = os.environ.get("SPARTUNE_MODE", "fast")
_choices: "weakref.WeakKeyDictionary[SparseFormat, dict]" = weakref.WeakKeyDictionary()


# --- the tuner of this process ---------------------------------------------------------------
def get_tuner():
    """The process's Tuner: with CUDA, a SQLite DB and the device's calibration; without,
    model-only ranking of our kernels (they run under the Triton interpreter)."""
    global _tuner
    if _tuner is None:
        from .tune.model import DeviceSpec
        from .tune.tuner import Tuner, load_or_calibrate

        if torch.cuda.is_available():
            from .tune.db import TuningDB

            db = TuningDB()
            _tuner = Tuner(db, load_or_calibrate(db), mode=_mode)
        else:
            _tuner = Tuner(None, DeviceSpec.h100(), mode="model")
    return _tuner


def set_mode(mode: str) -> None:
    """'fast' (default: measure the model's top k and the libraries), 'model' (no
    measurement), 'exhaustive' (measure everything). Forgets choices made in this process."""
    global _mode, _tuner
    from .tune.tuner import MODES

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _mode, _tuner = mode, None
    _choices.clear()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        from .tune.model import device_name

        return device_name(device.index or 0)
    return "cpu-triton-interpreter"


# --- input checks ------------------------------------------------------------------------------
def _state(A, op) -> dict:
    """Per-weight dispatch state, kept beside the weight and dropped with it: its checked
    metadata under "meta" (dtype, device, M, K) and the cached choice of every call shape."""
    state = _choices.get(A) if isinstance(A, SparseFormat) else None
    if state is None:
        _check_format(A, op)
        state = _choices[A] = {"meta": (A.dtype, A.device, *A.shape)}
    return state


def _check_format(A, op):
    op, name = {"softmax": ("sparse_softmax", "A"), "sddmm": ("sddmm", "pattern")}.get(op, (op, "A"))
    if not isinstance(A, SparseFormat):
        raise TypeError(f"{op}: {name} must be a spartune format (CSR, BlockSparse, ...), got {type(A).__name__}")
    if A.dtype not in TOLERANCE:
        raise TypeError(f"{op}: {name} must hold float16, bfloat16 or float32 values, got {A.dtype} (use .with_values)")


def _check_tensor(name, t, *, dtype=None, device=None, dim=None, last=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but the weight is {dtype}: convert one of them")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the weight is on {device}: move one of them (A.to(device))")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if last is not None and (t.dim() == 0 or t.shape[-1] != last):
        raise ValueError(f"{name} must have last dimension {last}, got shape {tuple(t.shape)}")


def _check_scale(scale) -> float:
    """scale as a float, or a clear error before any kernel (or tuning) runs."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    return float(scale)


def _check_out_dtype(out_dtype):
    if out_dtype is not None and out_dtype not in TOLERANCE:
        raise TypeError(f"out_dtype must be one of {list(TOLERANCE)}, got {out_dtype}")


# --- public ops ---------------------------------------------------------------------------------
def linear(x, A, bias=None, activation=None, residual=None, *, scale: float = 1.0, out_dtype=None):
    """act(scale * x @ A^T + bias) + residual, for x of shape (..., K): torch's F.linear layout.

    fp16/bf16 inputs accumulate in fp32; fp32 inputs run on the tensor cores as tf32.
    """
    state = _state(A, "linear")
    dtype, device, M, K = state["meta"]
    if type(x) is not torch.Tensor or x.dim() == 0 or x.shape[-1] != K or x.dtype != dtype or x.device != device \
            or x.layout != torch.strided:
        _check_tensor("x", x, dtype=dtype, device=device, last=K)  # raises the precise error
    if bias is not None:
        _check_tensor("bias", bias, device=device, dim=1, last=M)
    if residual is not None:
        _check_tensor("residual", residual, device=device)
        if residual.shape[:-1] != x.shape[:-1] or residual.shape[-1] != M:
            raise ValueError(f"residual must have shape {(*x.shape[:-1], M)}, got {tuple(residual.shape)}")
    if activation is not None:
        check_activation(activation)
    if out_dtype is not None:
        _check_out_dtype(out_dtype)
    if scale != 1.0:
        scale = _check_scale(scale)
    flat = x.dim() == 2
    x2 = x if flat else x.reshape(-1, K)  # a view whenever the leading dims allow one
    out = torch.empty((x2.shape[0], M), dtype=out_dtype or dtype, device=device)
    res2 = residual if residual is None or flat else residual.reshape(-1, M)
    key = (x2.shape[0], dtype, out.dtype, bias is not None, activation, residual is not None, scale != 1.0,
           x2.stride(1) == 1)
    launch = state.get(key) or _launcher(
        A, state, key, lambda: _tune_linear(A, x2, out, bias, activation, res2, scale))
    out = launch(A, x2, out, bias, activation, res2, scale)
    return out if flat else out.reshape(*x.shape[:-1], M)


def spmm(A, X, *, out_dtype=None):
    """A @ X for X of shape (K, N). Same kernels as `linear`, on transposed views (no copies)."""
    _, device, M, K = _state(A, "spmm")["meta"]
    _check_tensor("X", X, dtype=A.dtype, device=device, dim=2)
    if X.shape[0] != K:
        raise ValueError(f"X must have {K} rows (A is {M}x{K}), got shape {tuple(X.shape)}")
    _check_out_dtype(out_dtype)
    Y = torch.empty(M, X.shape[1], dtype=out_dtype or X.dtype, device=X.device)
    got = _run_linear(A, X.T, Y.T)
    if got.data_ptr() != Y.data_ptr():  # a library backend returned its own tensor
        Y.T.copy_(got)
    return Y


def prepare(A, n: int, *, bias: bool = False, activation=None, residual: bool = False, out_dtype=None) -> None:
    """Tune `linear` for this weight at n tokens now (on random inputs), not at the first call."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prepare: n (tokens) must be a positive int, got {n!r}")
    _state(A, "prepare")
    M, K = A.shape
    x = torch.randn(n, K, device=A.device).to(A.dtype)
    linear(x, A, torch.randn(M, device=A.device).to(A.dtype) if bias else None, activation,
           torch.randn(n, M, device=A.device).to(A.dtype) if residual else None, out_dtype=out_dtype)


def sddmm(a, b, pattern, *, scale: float = 1.0):
    """scale * (a @ b^T) at the stored positions of `pattern` (CSR or BlockSparse), returned as
    the same format with new values (fp32 accumulation, a's dtype)."""
    if not isinstance(pattern, (CSR, BlockSparse)):
        raise TypeError(f"sddmm: pattern must be CSR or BlockSparse, got {type(pattern).__name__}")
    scale = _check_scale(scale)
    M, N = pattern.shape
    _check_tensor("a", a, device=pattern.device, dim=2)
    _check_tensor("b", b, dtype=a.dtype, device=pattern.device, dim=2)
    if a.dtype not in TOLERANCE:
        raise TypeError(f"a must be float16, bfloat16 or float32, got {a.dtype}")
    if a.shape[0] != M or b.shape[0] != N or a.shape[1] != b.shape[1]:
        raise ValueError(f"sddmm needs a (M={M}, D) and b (N={N}, D); got {tuple(a.shape)} and {tuple(b.shape)}")
    epi = Epilogue(scale=scale != 1.0)
    ours = {"sddmm": (sddmm_kernels, lambda cfg: sddmm_kernels.launch(a, b, pattern, cfg, scale=scale))}
    library = {"dense": lambda: _dense_sddmm(a, b, pattern, scale)}
    choice = _dispatch(pattern, ("sddmm", a.shape[1], a.dtype, scale != 1.0), lambda: _tune(
        "sddmm", pattern, a.shape[1], N, a.dtype, epi, ours, library,
        reference=lambda: reference.sddmm(a, b, pattern, scale)[pattern.mask()],
        result=lambda values: values.reshape(-1).double()[_order_of(pattern)]))
    return pattern._with_values_trusted(_run(choice, ours, library))


def sparse_softmax(A, *, scale: float = 1.0):
    """Row-wise softmax over the stored entries of A (CSR or BlockSparse); an empty row stays
    empty. Returns the same format with the probabilities as values."""
    if not isinstance(A, (CSR, BlockSparse)):
        raise TypeError(f"sparse_softmax: A must be CSR or BlockSparse, got {type(A).__name__}")
    scale = _check_scale(scale)
    epi = Epilogue(scale=scale != 1.0)
    ours = {"softmax": (softmax_kernels, lambda cfg: softmax_kernels.launch(A, cfg, scale=scale))}
    library = {"dense": lambda: _dense_softmax(A, scale)}
    choice = _dispatch(A, ("softmax", scale != 1.0), lambda: _tune(
        "softmax", A, A.shape[1], 1, A.dtype, epi, ours, library,
        reference=lambda: reference.sparse_softmax(A, scale)[A.mask()],
        result=lambda values: values.reshape(-1).double()[_order_of(A)]))
    return A._with_values_trusted(_run(choice, ours, library))


# --- the dispatch point -----------------------------------------------------------------------------
def _dispatch(A, key, tune):
    """The cached choice for (weight, call key), or the tuner's pick on a miss. linear and
    spmm inline this lookup on their hot path."""
    state = _state(A, key[0])
    chosen = state.get(key)
    if chosen is None:
        chosen = state[key] = tune()
    return chosen


def _run(choice, ours, library):
    if choice.backend in ours:
        return ours[choice.backend][1](choice.config)
    return library[choice.backend]()


def _run_linear(A, x, out):
    """spmm's way in: the linear dispatch on transposed views, no epilogue."""
    state = _state(A, "spmm")
    key = (x.shape[0], x.dtype, out.dtype, False, None, False, False, x.stride(1) == 1)
    launch = state.get(key) or _launcher(A, state, key, lambda: _tune_linear(A, x, out, None, None, None, 1.0))
    return launch(A, x, out, None, None, None, 1.0)


def _launcher(A, state, key, tune):
    """Tunes a new call shape and caches its launcher. A kernel family may memoise layouts on
    the weight while the tuner measures (spmm_csr's banded ELL copy: a second copy of the
    weight); its `release_unused` drops those that no config chosen for this weight uses."""
    choice = tune()
    launch = state[key] = _linear_launcher(choice, A)
    family = LINEAR_FAMILIES[type(A)]
    release = getattr(family[1], "release_unused", None) if family is not None else None
    if release is not None:
        chosen = state.setdefault("chosen", {})
        chosen[key] = choice.config if choice.backend == family[0] else None
        release(A, [c for c in chosen.values() if c is not None])
    return launch


def _tune_linear(A, x, out, bias, activation, residual, scale):
    epi = dict(bias=bias, activation=activation, residual=residual, scale=scale)
    family = LINEAR_FAMILIES[type(A)]
    ours = {} if family is None else {family[0]: (family[1], lambda cfg: family[1].launch(A, x, out, cfg, **epi))}
    library = {name: (lambda fn=fn: fn(A, x, out, **epi)) for name, fn in _library_linear(A).items()}
    epilogue = Epilogue(epi["bias"] is not None, epi["activation"], epi["residual"] is not None, epi["scale"] != 1.0)
    return _tune("linear", A, A.shape[1], x.shape[0], x.dtype, epilogue, ours, library, layout=_layout(x),
                 reference=lambda: reference.linear(x, A, epi["bias"], epi["activation"], epi["residual"], epi["scale"]),
                 result=lambda y: y)


def _library_linear(A):
    return backends.library_backends(A) if A.device.type == "cuda" else {"dense": backends.dense_linear}


def _linear_launcher(choice, A):
    """What the linear hot path calls: the chosen kernel re-bound to each call's tensors."""
    family = LINEAR_FAMILIES[type(A)]
    if family is not None and choice.backend == family[0]:
        launch, cfg = family[1].launch, choice.config
        return lambda A, x, out, bias, act, res, scale: launch(
            A, x, out, cfg, bias=bias, activation=act, residual=res, scale=scale)
    fn = _library_linear(A)[choice.backend]
    return lambda A, x, out, bias, act, res, scale: fn(A, x, out, bias=bias, activation=act, residual=res, scale=scale)


def _layout(x) -> str:
    """'linear' when x's K is contiguous (tokens x features), 'spmm' when its tokens are
    (x = X.T of a (K, N) matrix): kernels gather differently, so choices differ."""
    return "linear" if x.stride(-1) == 1 else "spmm"


def _tune(op, A, k, n, dtype, epilogue, ours, library, reference, result, layout="linear"):
    """Build every candidate (our configs with their cost-model features, the library
    backends with a prior) and let the tuner pick. `ours`: name -> (module, run(config))."""
    from .tune.model import dense_gemm_seconds
    from .tune.tuner import Candidate

    tuner = get_tuner()
    M = A.shape[0]
    problem = Problem(op, A.signature, M, k, n, str(dtype).removeprefix("torch."), A.stats(), epilogue,
                      _device_name(A.device), layout)
    if A.device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
        ours = {}  # no GPU and no interpreter: only torch can run

    def checker(run):
        def check():
            expect = reference()
            if expect.numel() == 0:
                return True
            got = result(run())
            err = ((got.double() - expect).norm() / expect.norm().clamp_min(1e-30)).item()
            return err <= TOLERANCE[dtype] and bool(torch.isfinite(got).all())
        return check

    def candidates():
        cands = []
        for name, (mod, run_cfg) in ours.items():
            for cfg in mod.space(problem):
                run = lambda cfg=cfg, run_cfg=run_cfg: run_cfg(cfg)  # noqa: E731
                cands.append(Candidate(name, cfg, mod.features(problem, cfg), run=run, check=checker(run)))
        for name, run in library.items():
            # a prior for ranking only: fast mode measures every library backend anyway
            if op == "linear":
                guess = dense_gemm_seconds(M, k, n, dtype, tuner.device, layout=layout) * (1 if name == "dense" else 4)
            else:
                guess = 2 * M * k * n / tuner.device.matrix_rate(dtype) + 3 * M * n * 4 / tuner.device.dram_bw
            cands.append(Candidate(name, None, predicted=guess, run=run, check=checker(run), library=True))
        return cands

    return tuner.pick(problem, candidates)


def _dense_sddmm(a, b, pattern, scale):
    return _gather_values(pattern, (a.float() @ b.float().T) * scale).to(a.dtype)


def _dense_softmax(A, scale):
    return _gather_values(A, reference.sparse_softmax(A, scale)).to(A.dtype)


def _gather_values(pattern, dense):
    """The entries of `dense` at the pattern's stored positions, in the pattern's value order."""
    order, flat = _stored_positions(pattern)
    out = torch.zeros(pattern.values.numel(), dtype=dense.dtype, device=dense.device)
    out[order] = dense.reshape(-1)[flat]
    return out.reshape(pattern.values.shape)


def _order_of(pattern):
    """Value positions in row-major order of their (row, col), to compare with mask-indexed references."""
    return _stored_positions(pattern)[0]


_POSITIONS_KEY = "_spartune_stored_positions"
PATTERN_CACHES.add(_POSITIONS_KEY)


def _stored_positions(pattern):
    """(order, flat), int64 (nnz,) each, in row-major order of the stored entries: their slots
    in `values` and their flat positions in the dense (rows, cols) matrix. Memoised on the
    pattern: the dense backends of sddmm / sparse_softmax gather with them on every call."""
    cached = pattern.__dict__.get(_POSITIONS_KEY)
    if cached is None:
        mask = pattern.mask()
        idx = pattern._scatter(torch.arange(pattern.values.numel(), device=pattern.device, dtype=torch.float64)
                               .reshape(pattern.values.shape))
        cached = (idx[mask].long(), mask.reshape(-1).nonzero().squeeze(1))
        object.__setattr__(pattern, _POSITIONS_KEY, cached)
    return cached
