"""The one dispatch point between the public ops and the kernels.

Per weight, one cache (`WeightState`, kept beside the weight and dropped with it) holds what
dispatch needs: the checked metadata, a launcher per call shape and the choice behind it. A hit
is a dict lookup; a miss builds the candidates (every config of every kernel family the registry
lists for the op and format, and the library backends), asks the tuner, and caches the launcher.
A tuning-DB hit rebuilds the stored Config directly: no config space is ranked.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import weakref

import torch

from . import backends, reference
from .epilogue import apply_prologue
from .formats import SparseFormat, memo, values_anchor, values_version
from .kernels import registry
from .tune.device import INTERPRETER_DEVICE
from .tune.problem import MEMORY_POLICIES, Epilogue, Problem

_tuner = None
_mode = None  # the tuner mode: SPARTUNE_MODE's, read at first use, or set_mode's
_memory = None  # the weight-memory policy: SPARTUNE_MEMORY's, read at first use, or set_memory_policy's


class Bindings:
    """The bound launches (`_bound`) of one weight's tuned calls, dropped together once its values
    change in place (an optimizer step, a load into the same tensors): each holds the packed
    layouts of the version it was bound with, which no launcher left uncalled should keep."""

    __slots__ = ("version", "tables")

    def __init__(self):
        self.version, self.tables = None, []

    def table(self) -> dict:
        table: dict = {}
        self.tables.append(table)
        return table

    def seen(self, version: tuple) -> None:
        if version != self.version:
            for table in self.tables:
                table.clear()
            self.version = version


class WeightState:
    """Everything dispatch keeps for one weight: (dtype, device, M, K), the launcher of every
    call key tuned so far, the (backend, config) chosen for it, and their bound launches."""

    __slots__ = ("meta", "launchers", "chosen", "bindings", "__weakref__")

    def __init__(self, A: SparseFormat):
        self.meta = (A.dtype, A.device, *A.shape)
        self.launchers: dict = {}
        self.chosen: dict = {}
        self.bindings = Bindings()


_states: "weakref.WeakKeyDictionary[SparseFormat, WeightState]" = weakref.WeakKeyDictionary()


def state(A: SparseFormat, check) -> WeightState:
    """A's dispatch state; `check(A)` (which raises on what is not a usable format) runs once,
    when A is first seen."""
    try:
        st = _states.get(A)
    except TypeError:  # not weak-referenceable: certainly not a format
        st = None
    if st is None:
        check(A)
        st = _states[A] = WeightState(A)
    return st


# --- the tuner of this process -----------------------------------------------------------------
def get_tuner():
    """With CUDA: a SQLite DB and the device's calibration; without, model-only ranking of our
    kernels (they run under the Triton interpreter)."""
    global _tuner
    if _tuner is None:
        from .tune.device import DeviceSpec
        from .tune.tuner import Tuner, load_or_calibrate

        if torch.cuda.is_available():
            db = _open_db()
            _tuner = Tuner(db, load_or_calibrate(db), mode=tuning_mode())
        else:
            _tuner = Tuner(None, DeviceSpec.h100(), mode="model")
    return _tuner


def _open_db():
    """The tuning DB, or None where its directory cannot hold one (read-only, a file in the way):
    a lost cache must never stop a model from running, so this process then tunes in memory."""
    import sqlite3
    import warnings

    from .tune.db import TuningDB, default_path

    try:
        return TuningDB()
    except (OSError, sqlite3.Error) as e:
        warnings.warn(f"spartune: no tuning DB at {default_path()} ({e}): this process tunes without one (its "
                      "choices are not kept; set SPARTUNE_CACHE_DIR to a writable directory)", RuntimeWarning,
                      stacklevel=3)
        return None


def tuning_mode() -> str:
    """The tuner mode calls are tuned under (see set_mode)."""
    global _mode
    if _mode is None:
        from .tune.tuner import MODES

        _mode = _from_env("SPARTUNE_MODE", "fast", MODES)
    return _mode


def _from_env(variable: str, default: str, allowed) -> str:
    """A setting's environment variable, checked (read once, at first use)."""
    value = os.environ.get(variable, default)
    if value not in allowed:
        raise ValueError(f"{variable} must be one of {allowed}, got {value!r}")
    return value


def set_mode(mode: str) -> None:
    """'fast' (default: measure the model's top k and the libraries), 'model' (no
    measurement), 'exhaustive' (measure everything). Forgets the choices of this process."""
    global _mode, _tuner
    from .tune.tuner import MODES

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _mode, _tuner = mode, None
    _forget()


def _forget() -> None:
    """Drop every weight's choices and bound launches (made again if chosen again)."""
    _states.clear()


def memory_policy() -> str:
    """The weight-memory policy calls are tuned under (see set_memory_policy)."""
    global _memory
    if _memory is None:
        _memory = _from_env("SPARTUNE_MEMORY", "speed", MEMORY_POLICIES)
    return _memory


def set_memory_policy(policy: str) -> None:
    """'speed' (default): each call runs the fastest candidate, whatever copy of the weight it
    keeps: where dense wins (a CSR weight at prefill), cuBLAS runs on a dense copy held for good;
    a library's conversion (cuSPARSE, cuSPARSELt) or a V:N:M weight's 2:4 copy may stay too.
    'lean': none of those; a sparse weight holds its format and our kernels' own layouts of it
    (each about the format's size), and where dense still wins it decompresses the weight on
    each call into memory the next layer reuses; torch.compile then runs sibling layers apart
    (their merged stack would be a second copy). For a model pruned to fit in memory.
    A change forgets the choices of this process (as set_mode) and, to lean, drops the copies
    lean leaves out. Set it before compiling or capturing CUDA graphs: a graph captured before a
    change to lean may read a dropped copy (capture again)."""
    global _memory
    if policy not in MEMORY_POLICIES:
        raise ValueError(f"memory policy must be one of {MEMORY_POLICIES}, got {policy!r}")
    if policy == memory_policy():
        return
    _memory = policy
    # the choices lean allows too (our kernels on no larger copy): their layouts stay
    kept = {A: [(k, c) for k, c in st.chosen.items()
                if (family := registry.by_name(c.backend)) is not None and not family.keeps_copy(c.config)]
            for A, st in list(_states.items())}
    _forget()
    if policy == "lean":
        for A, chosen in kept.items():
            _release(A, chosen)
        for A in list(_cast_holders):
            for key in [k for k in A.__dict__ if k.startswith(_CAST_KEY)]:
                del A.__dict__[key]


_CAST_KEY = "_autocast_"
_cast_holders: "weakref.WeakSet[SparseFormat]" = weakref.WeakSet()


def cast_copy(A: SparseFormat, dtype: torch.dtype) -> SparseFormat:
    """A's weight in `dtype`, for torch.autocast's inference under the speed policy (lean runs the
    weight in its own dtype: no copy). Kept on A, made again once A's values change; unlike
    autocast's own cache, which it empties when the region ends, for as long as A lives (an fp32
    weight holds half its values' bytes more). Built off the CUDA graph pools (cudagraph trees
    refuse a tensor kept from their warm-up), and dropped by the switch to lean."""
    def make():
        _cast_holders.add(A)
        return outside_graph_pools(lambda: A._with_values_trusted(A.values.to(dtype)), A.device)
    return memo(A, f"{_CAST_KEY}{dtype}", make)


def cast_bias(A: SparseFormat, bias, dtype: torch.dtype):
    """The bias of a layer on A in `dtype`, beside cast_copy(A, dtype) and kept as it is (a cast
    on every call would be one more kernel a layer), made again once the bias changes; None
    stays None."""
    if bias is None or bias.dtype == dtype:
        return bias

    def make():
        _cast_holders.add(A)
        return outside_graph_pools(lambda: bias.detach().to(dtype), bias.device)
    return memo(A, f"{_CAST_KEY}bias_{dtype}", make, source=bias)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        from .tune.device import device_name as cuda_name

        return cuda_name(device.index or 0)
    return INTERPRETER_DEVICE


def find_choice(A, n: int, dtype: str, op: str = "linear"):
    """The tuner's Choice for linear(x with n rows, A), or spmm(A, X with n columns), without an
    epilogue, made in this process, or None (reports show what was picked)."""
    layout = "spmm" if op == "spmm" and n > 1 else "linear"  # as _layout sees spmm's x = X.T
    return get_tuner().cached(linear_problem(A, n, dtype, layout).key())


def linear_problem(A, n: int, dtype: str, layout: str = "linear") -> Problem:
    """The tuner's Problem for linear(x with n rows, A) without an epilogue."""
    return problem_of("linear", A, A.shape[1], n, dtype, Epilogue(), layout)


def problem_of(op: str, A, k: int, n: int, dtype: str, epilogue: Epilogue, layout: str = "linear") -> Problem:
    """The tuner's Problem for `op` on A under this process's settings (the memory policy for
    linear; sddmm's and softmax's candidates keep no copy under either policy)."""
    return Problem(op, A.signature, A.shape[0], k, n, dtype, A.stats(), epilogue, device_name(A.device), layout,
                   memory=memory_policy() if op == "linear" else "speed")


def predicted_speedup(A, n: int, dtype=None) -> tuple[float, str]:
    """(dense seconds / best predicted seconds, the backend predicted best) for linear(x with n
    rows, A) on the tuner's device, by the cost model alone (nothing runs): what sparsify's dry
    run reports. Every family that serves A counts, whether or not it can run here."""
    from .tune.device import dtype_name

    dtype = dtype_name(dtype or (A.dtype if A.dtype != torch.float64 else torch.float32))
    problem = linear_problem(A, n, dtype)
    tuner = get_tuner()
    ours = {f: None for f in registry.families("linear", A)}
    times: dict[str, float] = {}
    for c in candidates(problem, ours, {"dense": None}, device=tuner.device):
        times[c.backend] = min(tuner.predicted(c, dtype), times.get(c.backend, float("inf")))
    best = min(times, key=times.get)
    # against the dense layer as the user's model runs it (under lean, dense decompresses per call)
    dense = _library_prior(dataclasses.replace(problem, memory="speed"), "dense", tuner.device)
    return dense / times[best], best


# --- linear and spmm ---------------------------------------------------------------------------
def linear_runs(A, x, out, bias=None, activation=None, residual=None, scale=1.0, prologue=None) -> tuple[dict, dict]:
    """(ours, library): every way to compute `out` = linear(x, A, ...), as {family: run(config)}
    for our kernel families and {name: run()} for the library backends."""
    args = (A, x, out, bias, activation, residual, scale, prologue)
    # one launcher per (backend, config) for the tuning's life: a CUDA family binds once, not on
    # every timed call (LOG, session 36)
    bound = functools.cache(lambda name, cfg: launcher(A, name, cfg))
    ours = {f: (lambda cfg, f=f: bound(f.name, cfg)(*args))
            for f in registry.families("linear", A) if f.available(A.device)}
    library = {name: (lambda name=name: bound(name, None)(*args)) for name in _libraries(A)}
    return ours, library


def launcher(A, backend: str, config, bindings: Bindings | None = None):
    """launch(A, x, out, bias, act, res, scale, prologue) for one backend (a family and its
    config, or a library): a prologue the backend does not apply while loading x runs first,
    as a pass of its own (kernels.prologue). A tuned call's launcher keeps its bound launches
    in the weight's `bindings`."""
    family = registry.by_name(backend)
    if family is None:
        fn = _libraries(A)[backend]
        run = lambda A, x, out, **epi: fn(A, x, out, **epi)  # noqa: E731
    elif family.bind is not None:
        run = _bound(A, family, config, bindings)
    else:
        fn = family.launch
        run = lambda A, x, out, **epi: fn(A, x, out, config, **epi)  # noqa: E731
    fused = family is not None and family.prologue

    def launch(A, x, out, bias, act, res, scale, prologue=None):
        if prologue is None:
            return run(A, x, out, bias=bias, activation=act, residual=res, scale=scale)
        if fused:
            return run(A, x, out, bias=bias, activation=act, residual=res, scale=scale, prologue=prologue)
        from .kernels import prologue as pass_

        return run(A, pass_.apply(x, *prologue), out, bias=bias, activation=act, residual=res, scale=scale)

    return launch


_BOUND_LAYOUTS = 16  # operand layouts bound per launcher before it starts over


def _bound(A0, family, config, bindings: Bindings | None = None):
    """A CUDA family's launch for weight A0, bound (family.bind) once per layout of the operands
    and their epilogue: a later call fills in the addresses and launches. The checks and
    set-up of a launch (its layouts, grid, descriptors) cost more host time than the driver's
    launch itself (benchmarks/LOG.md, session 28). A bound call reads the weight's layouts as
    packed then: a change of its values in place (an optimizer step) binds again, and drops
    every bound call of the weight's `bindings`."""
    bound: dict = bindings.table() if bindings is not None else {}
    bind, weight = family.bind, weakref.ref(A0)  # (A0's dispatch state holds this: no strong reference back)

    def run(A, x, out, bias=None, activation=None, residual=None, scale=1.0):
        if A is not weight():
            return family.launch(A, x, out, config, bias=bias, activation=activation, residual=residual, scale=scale)
        key = (x.shape, x.stride(), x.dtype, x.data_ptr() % 16, out.shape, out.stride(), out.data_ptr() % 16,
               out.dtype, None if bias is None else (bias.dtype, bias.stride()),
               None if residual is None else (residual.shape, residual.stride(), residual.dtype,
                                              residual.data_ptr() % 16),
               activation, scale)
        version = values_version(A.values)
        if bindings is not None:
            bindings.seen(version)
        hit = bound.get(key)
        if hit is None or hit[0] != version:
            if len(bound) >= _BOUND_LAYOUTS:
                bound.clear()
            hit = bound[key] = (version, bind(A, x, out, config, bias=bias, activation=activation,
                                              residual=residual, scale=scale), values_anchor(A.values))
        return hit[1](x, out, bias, residual)

    return run


def _libraries(A) -> dict:
    """The library backends for A by name (on the CPU, torch's dense product alone). Under the
    lean memory policy, dense alone, on a transient decompression: the libraries keep copies."""
    if memory_policy() == "lean":
        return {"dense": backends.transient_dense_linear}
    return backends.library_backends(A) if A.device.type == "cuda" else {"dense": backends.dense_linear}


def tune_linear(A, st: WeightState, key: tuple, x, out, bias, activation, residual, scale, prologue=None):
    """A call key seen for the first time: tune it, cache its launcher. A family may memoise
    layouts on the weight while the tuner measures (spmm_csr's banded ELL copy); its
    `release_unused` drops those that no config chosen for this weight reads."""
    if x.dtype == torch.float64:  # no kernel runs float64: torch's dense product (gradcheck, references)
        st.launchers[key] = launcher = _dense_launcher
        return launcher

    def tune_and_warm():
        launch = _tune_linear(A, st, key, x, out, bias, activation, residual, scale, prologue)
        launch(A, x, out, bias, activation, residual, scale, prologue)  # builds the chosen kernel's layouts here
        return launch

    return outside_graph_pools(tune_and_warm, A.device)


_worker = None


def _stand_in(t, gen):
    """Random values in t's layout (its strides, expanded dimensions included), for tuning where
    the user's operands leave nothing to check; randn_like where that layout cannot be rebuilt."""
    if t is None:
        return None
    base = [1 if stride == 0 else size for size, stride in zip(t.shape, t.stride())]
    try:
        out = torch.empty_strided(base, t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(torch.randn(base, generator=gen, device=t.device).to(t.dtype))
        return out.expand(t.shape)
    except RuntimeError:  # a layout overlapping itself otherwise (as_strided)
        return torch.randn(t.shape, generator=gen, device=t.device).to(t.dtype)


def outside_graph_pools(fn, device: torch.device):
    """fn() on a worker thread, on the caller's stream. While torch.compile's CUDA graphs
    (cudagraph trees) warm a graph up, every allocation of the calling thread goes to the
    graph's pool, and what tuning keeps (layouts, descriptors, packed weights) must not live
    there: cudagraph trees refuse untracked tensors in their pool."""
    global _worker
    if device.type != "cuda":
        return fn()
    import threading
    from concurrent.futures import ThreadPoolExecutor

    if threading.current_thread().name.startswith("spartune-tune"):
        return fn()
    if _worker is None:
        _worker = ThreadPoolExecutor(1, thread_name_prefix="spartune-tune")
    stream = torch.cuda.current_stream(device)

    def run():
        with torch.cuda.device(device), torch.cuda.stream(stream), torch.no_grad():
            return fn()

    return _worker.submit(run).result()


def _tune_linear(A, st: WeightState, key: tuple, x, out, bias, activation, residual, scale, prologue):
    from .tune.tuner import CheckInconclusive, Choice

    epilogue = Epilogue(bias is not None, activation, residual is not None, scale != 1.0, _prologue_name(prologue))

    def tune(x, bias, residual, prologue):
        ours, library = linear_runs(A, x, out, bias, activation, residual, scale, prologue)
        return choose("linear", A, A.shape[1], x.shape[0], x.dtype, epilogue, ours, library,
                      expected=lambda: reference.linear(x, A, bias, activation, residual, scale, prologue),
                      result=lambda y: y, layout=_layout(x), out_dtype=out.dtype,
                      rotated=rotated_timer(A, x, out, bias, activation, residual, scale, prologue)
                      if A.device.type == "cuda" else None)

    def stand_ins():  # the same layouts; a generator of their own (the user's random stream is left alone)
        gen = torch.Generator(x.device).manual_seed(0)
        return (_stand_in(x, gen), _stand_in(bias, gen), _stand_in(residual, gen),
                None if prologue is None else (_stand_in(prologue[0], gen), *prologue[1:]))

    choice = Choice("dense", None, None, None)  # nothing to check even on stand-ins: the weight's NaN rows
    for operands in (lambda: (x, bias, residual, prologue), stand_ins):  # stand-ins: e.g. a NaN in every token
        try:
            choice = tune(*operands())
            break
        except CheckInconclusive:
            continue
    st.chosen[key] = choice
    _release(A, st.chosen.items())
    launch = launcher(A, choice.backend, choice.config, st.bindings)
    st.launchers[key] = launch
    return launch


def _release(A, chosen) -> None:
    """Drop A's layouts and library copies that no choice in `chosen` ((call key, Choice) pairs)
    reads. Each linear family is given its own chosen configs and those of sddmm / softmax on
    the same pattern (a layout both ops read, CSR's bitmap, stays while either does); under the
    lean policy no library copy stays (its dense decompresses per call)."""
    chosen = list(chosen)
    linear = [c for k, c in chosen if k[0] not in VALUES_OPS]
    values = [c.config for k, c in chosen if k[0] in VALUES_OPS and c.config is not None]
    for family in registry.families("linear", A):
        family.release_unused(A, [c.config for c in linear if c.backend == family.name] + values)
    backends.release_unused(A, {c.backend for c in linear} if memory_policy() == "speed" else ())


def _prologue_name(prologue) -> str | None:
    """The prologue's part of the tuning key: "bias" or "bias+<activation>"."""
    if prologue is None:
        return None
    return "bias" if prologue[1] is None else f"bias+{prologue[1]}"


def _dense_launcher(A, x, out, bias, act, res, scale, prologue=None):
    if prologue is not None:
        x = apply_prologue(x, *prologue)
    return backends.dense_linear(A, x, out, bias=bias, activation=act, residual=res, scale=scale)


def _layout(x) -> str:
    """'linear' when x's K is contiguous (tokens x features), 'spmm' when its tokens are
    (x = X.T of a (K, N) matrix): kernels gather differently, so choices differ."""
    return "linear" if x.stride(-1) == 1 else "spmm"


# --- sddmm and sparse_softmax --------------------------------------------------------------------
def sddmm(st: WeightState, a, b, pattern, scale: float):
    key = ("sddmm", a.shape[1], a.dtype, scale != 1.0)
    return _values_op(st, "sddmm", pattern, key, a.shape[1], a.dtype,
                      run=lambda f, cfg: f.launch(a, b, pattern, cfg, scale=scale),
                      dense=lambda: backends.dense_sddmm(a, b, pattern, scale),
                      expected=lambda: reference.sddmm(a, b, pattern, scale)[pattern.mask()])


def sparse_softmax(st: WeightState, A, scale: float):
    key = ("softmax", scale != 1.0)
    return _values_op(st, "softmax", A, key, 1, A.dtype,
                      run=lambda f, cfg: f.launch(A, cfg, scale=scale),
                      dense=lambda: backends.dense_softmax(A, scale),
                      expected=lambda: reference.sparse_softmax(A, scale)[A.mask()])


VALUES_OPS = ("sddmm", "softmax")  # their call keys (sddmm, softmax) start with the op's name


def _values_op(st, op, pattern, key, n, dtype, run, dense, expected):
    """An op whose result is new values for `pattern`: its cached choice, or the tuner's. Its
    Problem is (m, k) = the pattern's shape and n = the shared dimension D (sddmm) or 1."""
    from .tune.tuner import CheckInconclusive

    if dtype == torch.float64:
        return pattern._with_values_trusted(dense())
    choice = st.chosen.get(key)
    if choice is None:
        ours = {f: (lambda cfg, f=f: run(f, cfg)) for f in registry.families(op, pattern) if f.available(pattern.device)}
        epilogue = Epilogue(scale=key[-1])
        try:
            choice = st.chosen[key] = outside_graph_pools(lambda: choose(
                op, pattern, pattern.shape[1], n, dtype, epilogue, ours, {"dense": dense}, expected=expected,
                result=lambda values: values.reshape(-1).double()[backends.value_order(pattern)]), pattern.device)
        except CheckInconclusive:  # no finite truth on this input: dense now, tuned on a later call
            return pattern._with_values_trusted(dense())
        _release(pattern, st.chosen.items())  # (the measurements' bitmap, where the choice reads none)
    family = registry.by_name(choice.backend)
    values = run(family, choice.config) if family is not None else dense()
    return pattern._with_values_trusted(values)


# --- the tuner call ------------------------------------------------------------------------------
def candidates(problem: Problem, ours: dict, library: dict, check=None, device=None, rotated=None) -> list:
    """Every candidate: our configs with their cost-model features, the library backends with a
    predicted time (a prior for ranking; fast mode measures every library backend anyway).
    `check(run)` -> a callable that runs and verifies a candidate, or None; `device`: the
    DeviceSpec of the prior (default: the tuner's); `rotated(backend, config, nbytes)` -> seconds
    on rotating weight copies (rotated_timer), given to our configs and dense (nbytes: what a call
    reads of the weight: a config's DRAM bytes less x and y, dense's whole weight)."""
    from .tune.problem import ELEMENT_BYTES
    from .tune.tuner import Candidate

    device = device or get_tuner().device
    timer = (lambda *args: functools.partial(rotated, *args)) if rotated else (lambda *args: None)
    io = problem.n * (problem.k + problem.m) * ELEMENT_BYTES[problem.dtype]  # x and y: shared by every copy
    out = []
    for family, run_cfg in ours.items():
        compiles = family.language == "cuda" and run_cfg is not None
        index = torch.cuda.current_device() if compiles else None  # (the prepare threads' device)
        for cfg in family.space(problem):
            run = lambda cfg=cfg, run_cfg=run_cfg: run_cfg(cfg)  # noqa: E731
            prepare = (lambda cfg=cfg, family=family: _precompile(family.instances(problem, cfg), index)) \
                if compiles else None
            features = family.features(problem, cfg)
            out.append(Candidate(family.name, cfg, features, run=run, check=check(run) if check else None,
                                 prepare=prepare, rotated=timer(family.name, cfg, max(features.dram_bytes - io, 1))))
    for name, run in library.items():
        out.append(Candidate(name, None, predicted=_library_prior(problem, name, device), run=run,
                             check=check(run) if check else None, library=True,
                             graph=False if name in backends.REPLAY_OWN_GRAPHS else None,
                             floor=_library_floor(problem, name, device),
                             rotated=timer(name, None, problem.m * problem.k * ELEMENT_BYTES[problem.dtype])
                             if name == "dense" and problem.op == "linear" else None))
    return out


ROTATED_COPIES = 32  # at most, for a rotated timing: a smaller weight is not timed so (tuner.ROTATE_MARGIN)


def rotated_timer(A, x, out, bias=None, activation=None, residual=None, scale=1.0, prologue=None):
    """rotated(backend, config, nbytes) -> seconds per call of that backend computing `out` on A
    and fresh copies of it called in turn (measure.rotated_replay; nbytes: what one call reads of
    its weight): how the tuner ranks our best against dense at a margin."""
    from .tune import measure

    def rotated(backend, config, nbytes):
        # one launcher a copy: a CUDA family binds to its weight
        bound = functools.cache(lambda W: launcher(W, backend, config))
        return measure.rotated_replay(lambda W: bound(W)(W, x, out, bias, activation, residual, scale, prologue),
                                      A, nbytes, most=ROTATED_COPIES)

    return rotated


def compile_space(A, n: int, dtype=None) -> int:
    """Compile every config of the CUDA families that serve linear(x with n rows, A), not only
    those the tuner would time (`spartune tune --compile-all`): a later shape then finds its
    kernels in the cubin cache and tunes in a fraction of a second. Returns the instances."""
    from .kernels import cuda
    from .tune.device import dtype_name

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (tokens) must be a positive int, got {n!r}")
    problem = linear_problem(A, n, dtype_name(dtype or A.dtype))
    insts = [inst for f in registry.families("linear", A) if f.language == "cuda" and f.available(A.device)
             for cfg in f.space(problem) for inst in f.instances(problem, cfg)]
    cuda.precompile(insts, A.device)
    return len(set(insts))


def _precompile(insts, device_index):
    from .kernels import cuda

    cuda.precompile(insts, device_index)


# cuSPARSELt's search picked an algorithm 0.74-1.04x as fast as algorithm 0 in every problem
# measured (7B-70B, N = 16 and 2048; benchmarks/LOG.md, "First use ... session 14"), and the
# search itself costs 0.5-0.9 s
CSLT_SEARCH_GAIN = 0.75


def _library_floor(problem: Problem, name: str, device):
    """Seconds a library call cannot beat (or a function of the best measured per backend),
    None when unknown. cuSPARSE's CSR SpMM (every format but whole blocks) runs on the CUDA
    cores: its nonzeros' flops at 2x the device's fp32 FMA rate (fp16 pairs), or its CSR's bytes
    (a 16-bit value, a 32-bit column) at 1.25x the device's copy bandwidth. cuSPARSELt's search
    pick: CSLT_SEARCH_GAIN x algorithm 0's time."""
    if name == "cusparselt_search":
        return lambda seen: CSLT_SEARCH_GAIN * seen["cusparselt"] if "cusparselt" in seen else None
    if name != "cusparse" or problem.op != "linear" or problem.fmt.startswith("block:"):
        return None
    nnz, n = problem.stats.nnz, problem.n
    return max(2.0 * nnz * n / (2 * device.fma), (6.0 * nnz + 2.0 * n * (problem.k + problem.m)) / (1.25 * device.dram_bw))


def _library_prior(problem: Problem, name: str, device) -> float:
    """A library backend's predicted seconds: cuBLAS's roofline for linear (other libraries
    taken 4x slower); for sddmm / softmax the dense product and a pass over its fp32 result."""
    from .tune.model import dense_gemm_seconds
    from .tune.problem import ELEMENT_BYTES

    m, k, n = problem.m, problem.k, problem.n
    if problem.op == "linear":
        gemm = dense_gemm_seconds(m, k, n, problem.dtype, device, layout=problem.layout) * (1 if name == "dense" else 4)
        if problem.memory == "lean":  # the weight decompressed first: zeroed, then scattered into
            gemm += 2 * m * k * ELEMENT_BYTES[problem.dtype] / device.dram_bw
        return gemm
    dense_out = m * (k if problem.op == "sddmm" else n)
    return 2 * m * k * n / device.matrix_rate(problem.dtype) + 3 * dense_out * 4 / device.dram_bw


def choose(op, A, k, n, dtype, epilogue, ours, library, expected, result, layout="linear", out_dtype=None,
           rotated=None):
    """The tuner's Choice for this problem. `expected()` is the float64 truth (computed once, and
    only if a tuning checks) and `result(output)` puts a candidate's output in the same shape, for
    the one check of the winner, held to the truth where an `out_dtype` result can be
    (reference.checkable; default: `dtype`); raises CheckInconclusive, before measuring, when
    nowhere."""
    tuner = get_tuner()
    dtype_name = str(dtype).removeprefix("torch.")
    problem = problem_of(op, A, k, n, dtype_name, epilogue, layout)
    tol = reference.tolerance(dtype_name)
    dense_err = []  # the dense library's own error on this input, measured when first needed
    expected = functools.cache(expected)
    limit = out_dtype if out_dtype is not None and out_dtype != torch.float64 else dtype
    mask = functools.cache(lambda: reference.checkable(expected(), limit))

    def checkable() -> bool:
        return expected().numel() == 0 or bool(mask().any())

    def check(run):
        def verify():
            expect = expected()
            if expect.numel() == 0:
                return True
            got = result(run())
            whole = bool(mask().all())

            def err_of(out):  # NaN (a non-finite output where the truth is finite) fails
                return reference.rel_err(out if whole else out[mask()], expect if whole else expect[mask()])

            err = err_of(got)
            if err <= tol:
                return True
            # An input at the edge of its dtype (values near the subnormals, cancellation) can put
            # PyTorch's own dense result past the tolerance: then a candidate is held to twice
            # dense's error, not to a bar nothing clears (the tuner would fail the call).
            if not dense_err:
                dense = library.get("dense")
                dense_err.append(err_of(result(dense())) if dense else float("nan"))
            return err <= 2 * dense_err[0]
        return verify

    def rebuild(backend: str, config: dict | None):
        """The stored choice as a config of today's space, or None (then tune again)."""
        if backend in library:
            return None if config is None else _STALE
        family = registry.by_name(backend)
        if family is None or family not in ours or config is None or config.get("type") != family.Config.__name__:
            return _STALE
        try:
            cfg = family.config_from_fields(config["fields"])
        except TypeError:
            return _STALE
        return cfg if cfg in family.space(problem) else _STALE

    return tuner.pick(problem, lambda: candidates(problem, ours, library, check, rotated=rotated), rebuild=rebuild,
                      stale=_STALE, checkable=checkable)


_STALE = object()  # rebuild's answer for a stored choice that today's space no longer holds
