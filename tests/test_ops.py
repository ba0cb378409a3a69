"""The public ops through the one dispatch point (spartune.ops), under Triton's interpreter.

linear / spmm / sddmm / sparse_softmax on every format against the float64 reference, fp32 and
fp16, with each backend forced in turn (our kernel family, the dense library fallback) and with
the CPU's own model-mode tuner; every epilogue, batched and strided x, out_dtype; outputs
allocated by torch.empty are poisoned with NaN so an element a kernel forgets shows up; the
choice is cached beside the weight (the tuner is not called again); bad inputs raise clear
errors before any kernel runs.
"""
import gc
import weakref

import pytest
import torch

import spartune as st
from spartune import backends, dispatch, ops
from spartune import reference as ref
from spartune.kernels import sddmm as sddmm_kernels
from spartune.kernels import sparse_softmax as softmax_kernels
from spartune.kernels import spmm_blocked, spmm_csr
from spartune.tune.device import H100
from spartune.tune.tuner import Tuner
import helpers
from helpers import block_weight, inf_column_reference, random_weight, rel_err

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
M, K = 40, 64  # M not a multiple of the 16-row units: partial block-rows and groups
FORMATS = ("csr", "block", "shfl", "2:4", "16:2:8")
OURS = {"csr": "csr", "block": "blocked", "shfl": "blocked"}  # formats with a kernel family of ours


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def make_format(kind, dtype=torch.float32, m=M, k=K, seed=0):
    """A small weight of `kind` whose first 16 rows are empty (an empty CSR row, block-row and
    Shfl-BW group: the kernels must still write act(bias) + residual there)."""
    g = _gen(seed)
    if kind == "block":
        w = block_weight(m, k, 16, 32, 0.5, gen=g)
    else:
        w = random_weight(m, k, 0.35, gen=g)
    w[:16] = 0
    w = w.to(dtype)
    if kind == "csr":
        return st.CSR.from_dense(w)
    if kind == "block":
        return st.BlockSparse.from_dense(w, (16, 32))
    if kind == "shfl":
        perm = torch.cat([torch.arange(16), 16 + torch.randperm(m - 16, generator=g)]).to(torch.int32)
        return st.ShuffledBlock.from_dense(w, 16, perm=perm)
    return st.sparsify_weight(torch.randn(m, k, generator=g).to(dtype), kind)


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fresh_dispatch(monkeypatch):
    """Every test starts with no tuner and no cached choices, and leaves none behind."""
    monkeypatch.setattr(dispatch, "_tuner", None)
    dispatch._states.clear()
    yield
    dispatch._states.clear()


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    """torch.empty / empty_like return NaN-filled floating tensors: an output element that no
    kernel writes stays NaN."""
    real_empty, real_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_like(*a, **k)))


def force(monkeypatch, backend):
    """Install a tuner that measures everything with a fake clock on which `backend` is fastest;
    among its configs the model's order decides. Returns the tuner."""
    tuner = Tuner(None, H100, measurer=lambda c, bound: 1e-6 if c.backend == backend else 1e-3, mode="exhaustive")
    monkeypatch.setattr(dispatch, "_tuner", tuner)
    return tuner


def chosen_backends(tuner):
    return {c.backend for c in tuner._memo.values()}


def backend_for(kind, which):
    return OURS[kind] if which == "ours" else "dense"


def check_close(out, expect, dtype, tol=None):
    assert not torch.isnan(out).any(), "an output element was never written"
    assert rel_err(out, expect) <= (tol or TOL[dtype]), rel_err(out, expect)


CASES = [(k, b) for k in FORMATS for b in (("ours", "dense") if k in OURS else ("dense",))]


# --- linear ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind,which", CASES)
def test_linear_each_format_and_backend(monkeypatch, kind, which, dtype):
    A = make_format(kind, dtype)
    tuner = force(monkeypatch, backend_for(kind, which))
    x = torch.randn(7, K, generator=_gen(1)).to(dtype)
    y = st.linear(x, A)
    assert y.shape == (7, M) and y.dtype == dtype
    assert chosen_backends(tuner) == {backend_for(kind, which)}
    check_close(y, ref.linear(x, A), dtype)


def _below_fp16_precision():
    """A CSR weight and an x so small that fp16 outputs sit among the subnormals: dense (PyTorch
    itself) misses the tolerance against the float64 reference."""
    A = make_format("csr", torch.float16)
    x = (torch.randn(7, K, generator=_gen(1)) * 2e-7).half()
    dense = torch.nn.functional.linear(x, A.to_dense())
    assert rel_err(dense, ref.linear(x, A)) > ref.tolerance("float16")  # the premise
    return A, x


@pytest.mark.parametrize("which", ["ours", "dense"])
def test_an_input_below_the_dtypes_precision_is_held_to_dense_not_to_the_tolerance(monkeypatch, which):
    """Every candidate, dense included, misses the tolerance here: the tuner holds each to twice
    dense's own error instead of failing the call."""
    A, x = _below_fp16_precision()
    tuner = force(monkeypatch, backend_for("csr", which))
    y = st.linear(x, A)
    assert chosen_backends(tuner) == {backend_for("csr", which)}
    assert rel_err(y, ref.linear(x, A)) <= 2 * rel_err(torch.nn.functional.linear(x, A.to_dense()), ref.linear(x, A))


def test_a_wrong_kernel_still_fails_on_such_an_input(monkeypatch):
    A, x = _below_fp16_precision()
    real = spmm_csr.launch

    def off_by_half(*args, **kwargs):
        out = real(*args, **kwargs)
        out.mul_(1.5)
        return out

    monkeypatch.setattr(spmm_csr, "launch", off_by_half)
    tuner = force(monkeypatch, "csr")
    st.linear(x, A)
    assert chosen_backends(tuner) == {"dense"}


@pytest.mark.parametrize("kind", FORMATS)
def test_linear_with_the_default_cpu_tuner(kind):
    A = make_format(kind, torch.float16)
    x = torch.randn(5, K, generator=_gen(1)).half()
    bias = torch.randn(M, generator=_gen(2)).half()
    y = st.linear(x, A, bias, "relu")
    check_close(y, ref.linear(x, A, bias, "relu"), torch.float16)
    assert ops.get_tuner().mode == "model"  # no GPU: ranking by the cost model only


EPILOGUES = {
    "bias": dict(bias=True),
    "relu": dict(activation="relu"),
    "gelu": dict(activation="gelu"),
    "gelu_tanh": dict(activation="gelu_tanh"),
    "silu": dict(activation="silu"),
    "residual": dict(residual=True),
    "scale": dict(scale=0.37),
    "all": dict(bias=True, activation="silu", residual=True, scale=-1.5),
}


@pytest.mark.parametrize("epi", list(EPILOGUES))
@pytest.mark.parametrize("kind,which", [("csr", "ours"), ("block", "ours"), ("shfl", "ours"), ("csr", "dense")])
def test_linear_epilogues(monkeypatch, kind, which, epi):
    dtype = torch.float32
    A = make_format(kind, dtype)
    tuner = force(monkeypatch, backend_for(kind, which))
    e = EPILOGUES[epi]
    g = _gen(3)
    x = torch.randn(6, K, generator=g)
    bias = torch.randn(M, generator=g) if e.get("bias") else None
    res = torch.randn(6, M, generator=g) if e.get("residual") else None
    act, scale = e.get("activation"), e.get("scale", 1.0)
    y = st.linear(x, A, bias, act, res, scale=scale)
    assert chosen_backends(tuner) == {backend_for(kind, which)}
    check_close(y, ref.linear(x, A, bias, act, res, scale), dtype)


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("kind,which", [("csr", "ours"), ("block", "ours"), ("shfl", "ours"), ("2:4", "dense"),
                                        ("block", "dense")])
def test_linear_input_prologue(monkeypatch, kind, which, layout, act):
    """x -> act(x + input_bias) first: fused into the load (blocked), or a pass of its own
    before the kernel (csr) or the library; the user's x is kept. K is padded in the block
    kernel's last step here (K = 72), where act(0 + 0) must stay 0."""
    k = 72
    A = make_format(kind, torch.float16, k=k) if kind != "block" else st.BlockSparse.from_dense(
        block_weight(M, k + 24, 16, 32, 0.5, gen=_gen(9))[:, :k].half(), (16, 32))
    tuner = force(monkeypatch, backend_for(kind, which))
    g = _gen(10)
    x = torch.randn(k, 9, generator=g).half().T if layout == "transposed" else torch.randn(9, k, generator=g).half()
    kept = x.clone()
    x_bias = torch.randn(k, generator=g).half()
    bias = torch.randn(M, generator=g).half()
    y = st.linear(x, A, bias, "silu", input_bias=x_bias, input_activation=act)
    assert chosen_backends(tuner) == {backend_for(kind, which)}
    check_close(y, ref.linear(x, A, bias, "silu", prologue=(x_bias, act)), torch.float16)
    assert torch.equal(x, kept)
    assert rel_err(y, ref.linear(x, A, bias, "silu")) > 0.05  # the prologue changed the result


@pytest.mark.parametrize("kind,which", [("csr", "ours"), ("block", "ours"), ("shfl", "ours"), ("2:4", "dense")])
def test_linear_batched_x(monkeypatch, kind, which):
    A = make_format(kind)
    force(monkeypatch, backend_for(kind, which))
    g = _gen(4)
    x = torch.randn(2, 3, K, generator=g)
    bias, res = torch.randn(M, generator=g), torch.randn(2, 3, M, generator=g)
    y = st.linear(x, A, bias, "gelu", res)
    assert y.shape == (2, 3, M)
    check_close(y, ref.linear(x, A, bias, "gelu", res), torch.float32)
    x1 = torch.randn(K, generator=g)  # a single vector, as F.linear allows
    y1 = st.linear(x1, A)
    assert y1.shape == (M,)
    check_close(y1, ref.linear(x1, A), torch.float32)


def _strided_xs(g):
    wide = torch.randn(5, 2 * K, generator=g)
    return {
        "row-padded": wide[:, :K],  # rows 2K apart
        "every-other": wide[:, ::2],  # stride 2 along K
        "transposed": torch.randn(K, 5, generator=g).T,  # spmm's layout: x = X.T
        "3d-permuted": torch.randn(3, 2, K, generator=g).transpose(0, 1),  # reshape must copy
    }


@pytest.mark.parametrize("layout", ["row-padded", "every-other", "transposed", "3d-permuted"])
@pytest.mark.parametrize("kind,which", [("csr", "ours"), ("block", "ours"), ("shfl", "ours"), ("block", "dense")])
def test_linear_strided_x(monkeypatch, kind, which, layout):
    A = make_format(kind)
    force(monkeypatch, backend_for(kind, which))
    x = _strided_xs(_gen(5))[layout]
    assert not x.is_contiguous()
    res = torch.randn(*x.shape[:-1], M, generator=_gen(6)).transpose(0, -1).contiguous().transpose(0, -1)
    y = st.linear(x, A, residual=res)
    check_close(y, ref.linear(x, A, residual=res), torch.float32)


@pytest.mark.parametrize("kind,which", [("shfl", "ours"), ("block", "ours"), ("csr", "ours"), ("block", "dense"),
                                        ("csr", "dense")])
def test_tokens_contiguous_layout_passes_from_layer_to_layer(monkeypatch, kind, which):
    """x = X.T of a (K, N) matrix gives out = Y.T of an (M, N) one, so a second layer reads the
    first one's output in the layout Shfl-BW gathers whole rows from; the values are F.linear's."""
    A1, A2 = make_format(kind), make_format(kind, m=48, k=M, seed=1)  # K -> M -> 48 features
    force(monkeypatch, backend_for(kind, which))
    x = torch.randn(K, 6, generator=_gen(40)).T
    h = st.linear(x, A1, activation="relu")
    check_close(h, ref.linear(x, A1, activation="relu"), torch.float32)
    assert h.stride() == (1, 6)  # dense too (cuBLAS writes Y = W X into out's memory)
    y = st.linear(h, A2)
    check_close(y, ref.linear(h, A2), torch.float32)
    assert y.stride() == (1, 6)
    yb = st.linear(h, A2, torch.randn(48, generator=_gen(41)))
    assert yb.stride() == (1, 6)
    assert st.linear(x[:1], A1).is_contiguous()  # one token: the usual layout


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind,which", [("csr", "ours"), ("block", "ours"), ("csr", "dense")])
def test_linear_out_dtype(monkeypatch, kind, which, dtype, out_dtype):
    A = make_format(kind, dtype)
    force(monkeypatch, backend_for(kind, which))
    x = torch.randn(4, K, generator=_gen(7)).to(dtype)
    bias = torch.randn(M, generator=_gen(8)).to(dtype)
    y = st.linear(x, A, bias, out_dtype=out_dtype)
    assert y.dtype == out_dtype
    check_close(y, ref.linear(x, A, bias), dtype, tol=max(TOL[dtype], TOL[out_dtype]))


def test_linear_empty_batch():
    A = make_format("csr")
    y = st.linear(torch.randn(0, K), A, torch.randn(M))
    assert y.shape == (0, M)


# --- spmm --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind,which", CASES)
def test_spmm_each_format_and_backend(monkeypatch, kind, which, dtype):
    A = make_format(kind, dtype)
    tuner = force(monkeypatch, backend_for(kind, which))
    g = _gen(9)
    X = torch.randn(K, 9, generator=g).to(dtype)
    Y = st.spmm(A, X)
    assert Y.shape == (M, 9) and Y.dtype == dtype and Y.is_contiguous()
    assert chosen_backends(tuner) == {backend_for(kind, which)}
    check_close(Y, ref.spmm(A, X), dtype)
    Xt = torch.randn(9, K, generator=g).to(dtype).T  # a transposed view (the row-major x of linear)
    check_close(st.spmm(A, Xt, out_dtype=torch.float32), ref.spmm(A, Xt), dtype)


# --- sddmm -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind,which", [("csr", "sddmm"), ("block", "sddmm"), ("csr", "dense"), ("block", "dense")])
def test_sddmm(monkeypatch, kind, which, dtype):
    pattern = make_format(kind, dtype)
    tuner = force(monkeypatch, which)
    g = _gen(10)
    a = torch.randn(M, 2 * 24, generator=g).to(dtype)[:, ::2]  # strided a
    b = torch.randn(K, 24, generator=g).to(dtype)
    out = st.sddmm(a, b, pattern, scale=0.125)
    assert type(out) is type(pattern) and out.shape == pattern.shape and out.dtype == dtype
    assert torch.equal(out.mask(), pattern.mask())
    assert chosen_backends(tuner) == {which}
    assert not torch.isnan(out.values).any()
    check_close(out.to_dense(), ref.sddmm(a, b, pattern, 0.125), dtype)


# --- inputs without a right answer everywhere (NaN, inf, past fp16's range) --------------------
@pytest.mark.parametrize("kind", ["csr", "block"])
def test_a_nan_in_one_token_is_checked_on_the_others(monkeypatch, kind):
    """The tuner's check holds a candidate to the truth where the truth is finite: the first call
    neither fails nor falls back because the user's input holds a NaN."""
    A = make_format(kind)
    tuner = force(monkeypatch, OURS[kind])
    x = torch.randn(5, K, generator=_gen(11))
    x[0, 3] = float("nan")
    y = st.linear(x, A)
    assert chosen_backends(tuner) == {OURS[kind]}
    check_close(y[1:], ref.linear(x[1:], A), torch.float32)


@pytest.mark.parametrize("kind", ["csr", "block"])
def test_no_finite_truth_tunes_on_stand_ins(monkeypatch, kind):
    """One token holding an inf leaves no output to check: the tuner runs on stand-ins of the same
    layout, the call still computes the user's input, and the choice serves the next calls."""
    A = make_format(kind)
    tuner = force(monkeypatch, OURS[kind])
    x = torch.randn(1, K, generator=_gen(12))
    x[0, 5] = float("inf")
    given = x.clone()
    y = st.linear(x, A)
    assert torch.equal(x, given)
    assert chosen_backends(tuner) == {OURS[kind]}
    expect, hit = inf_column_reference(x, A, 0, 5)
    assert hit.any() and not hit.all()
    assert not y[0, hit].isfinite().any()
    assert rel_err(y[0, ~hit], expect[0, ~hit]) <= TOL[torch.float32]
    x2 = torch.randn(1, K, generator=_gen(13))
    check_close(st.linear(x2, A), ref.linear(x2, A), torch.float32)


def test_a_problem_tuned_before_computes_no_truth(monkeypatch):
    """The float64 truth (a dense copy of the weight) is built only when a tuning checks: a
    second weight of a tuned problem (a tuner or DB hit) never pays for it."""
    A = make_format("csr")
    force(monkeypatch, "csr")
    x = torch.randn(3, K, generator=_gen(18))
    st.linear(x, A)
    calls = []
    real = ref.linear
    monkeypatch.setattr(ref, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    check_close(st.linear(x, A.with_values(A.values.clone())), real(x, A), torch.float32)
    assert calls == []


def test_stand_ins_keep_the_operands_layout():
    g = torch.Generator().manual_seed(0)
    for t in (torch.randn(6, 20)[:, ::2], torch.randn(8, 4).T, torch.randn(6, 1).expand(6, 9)):
        s = dispatch._stand_in(t, g)
        assert s.shape == t.shape and s.stride() == t.stride() and s.isfinite().all()


def test_a_weight_without_a_finite_row_runs_dense(monkeypatch):
    """Nothing to check even on stand-ins: the layer computes what dense does, no error."""
    A = make_format("csr")
    A = A.with_values(torch.full_like(A.values, float("nan")))
    force(monkeypatch, "csr")
    x = torch.randn(3, K, generator=_gen(17))
    rng = torch.get_rng_state()
    y = st.linear(x, A)
    assert y.shape == (3, M) and y.isnan().any()
    assert torch.equal(torch.get_rng_state(), rng)  # stand-ins draw from their own generator


def test_an_fp16_output_past_its_range_does_not_fail_the_call(monkeypatch):
    A = make_format("block", torch.float16)
    tuner = force(monkeypatch, "blocked")
    x = torch.randn(4, K, generator=_gen(14)).half()
    x[0] = 3e4  # row 0's outputs overflow fp16
    y = st.linear(x, A)
    assert chosen_backends(tuner) == {"blocked"}
    check_close(y[1:], ref.linear(x[1:], A), torch.float16)


def test_sddmm_without_a_finite_truth_runs_dense_this_call(monkeypatch):
    pattern = make_format("csr")
    tuner = force(monkeypatch, "sddmm")
    a = torch.randn(M, 24, generator=_gen(15))
    b = torch.randn(K, 24, generator=_gen(16))
    a[:, 0] = float("nan")  # every sampled dot product is NaN
    out = st.sddmm(a, b, pattern)
    assert out.values.isnan().all() and not tuner._memo  # dense's answer; nothing chosen on it
    a[:, 0] = 1.0
    check_close(st.sddmm(a, b, pattern).to_dense(), ref.sddmm(a, b, pattern), torch.float32)
    assert chosen_backends(tuner) == {"sddmm"}


def test_softmax_with_a_nan_in_one_row_is_checked_on_the_others(monkeypatch):
    A = make_format("csr")
    tuner = force(monkeypatch, "softmax")
    values = A.values.clone()
    values[-1] = float("nan")  # the last stored entry: one row holds a NaN
    B = A.with_values(values)
    out = st.sparse_softmax(B, scale=0.5)
    assert chosen_backends(tuner) == {"softmax"}
    expect = ref.sparse_softmax(B, 0.5)
    rows = expect.isfinite().all(dim=1)
    assert not rows.all() and rel_err(out.to_dense()[rows], expect[rows]) <= TOL[torch.float32]


# --- sparse softmax ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind,which", [("csr", "softmax"), ("block", "softmax"), ("csr", "dense"), ("block", "dense")])
def test_sparse_softmax(monkeypatch, kind, which, dtype):
    A = make_format(kind, dtype)  # rows 0..15 are empty: they stay empty
    tuner = force(monkeypatch, which)
    out = st.sparse_softmax(A, scale=0.7)
    assert type(out) is type(A) and out.dtype == dtype and torch.equal(out.mask(), A.mask())
    assert chosen_backends(tuner) == {which}
    assert not torch.isnan(out.values).any()
    expect = ref.sparse_softmax(A, 0.7)
    check_close(out.to_dense(), expect, dtype)
    rows = out.to_dense().double().sum(1)
    assert torch.allclose(rows[16:], torch.ones(M - 16, dtype=torch.float64), atol=1e-2)


# --- the choice is cached beside the weight ----------------------------------------------------
def _count_tuning(monkeypatch):
    calls = []
    real_tune, tuner = dispatch.choose, ops.get_tuner()
    real_pick = tuner.pick

    def tune(*a, **k):
        calls.append("tune")
        return real_tune(*a, **k)

    def pick(*a, **k):
        calls.append("pick")
        return real_pick(*a, **k)

    monkeypatch.setattr(dispatch, "choose", tune)
    monkeypatch.setattr(tuner, "pick", pick)
    return calls


@pytest.mark.parametrize("kind", ["csr", "block", "shfl", "2:4"])
def test_linear_choice_is_cached(monkeypatch, kind):
    A = make_format(kind)
    calls = _count_tuning(monkeypatch)
    g = _gen(11)
    bias = torch.randn(M, generator=g)
    st.linear(torch.randn(5, K, generator=g), A, bias, "relu")
    assert calls == ["tune", "pick"]
    for _ in range(2):  # new inputs, same shapes: no tuning, and the launch uses the new tensors
        x, bias = torch.randn(5, K, generator=g), torch.randn(M, generator=g)
        check_close(st.linear(x, A, bias, "relu"), ref.linear(x, A, bias, "relu"), torch.float32)
    assert calls == ["tune", "pick"]
    st.linear(torch.randn(5, K, generator=g), A)  # another epilogue: another choice
    assert calls.count("tune") == 2
    st.linear(torch.randn(6, K, generator=g), A, bias, "relu")  # another N: another choice
    assert calls.count("tune") == 3


class BindingFamily:
    """A CUDA family's bind and launch, counted: the bound run computes the real product."""

    def __init__(self):
        self.binds, self.launches = [], 0

    def bind(self, A, x, out, config, *, bias=None, activation=None, residual=None, scale=1.0):
        self.binds.append((tuple(x.stride()), None if bias is None else bias.dtype, scale))
        weight = A.to_dense().double()  # (as a family's bound run, it holds no reference to A)

        def run(x, out, bias, residual):
            y = scale * (x.double() @ weight.T)
            y = y if bias is None else y + bias
            out.copy_(y if residual is None else y + residual)
            return out
        return run

    def launch(self, A, x, out, config, **epilogue):
        self.launches += 1
        return self.bind(A, x, out, config, **epilogue)(x, out, epilogue.get("bias"), epilogue.get("residual"))


def test_a_cuda_familys_tuned_call_is_bound_once_per_layout():
    """dispatch binds a CUDA family's launch per operand layout and reuses it with new tensors;
    another layout, epilogue dtype or scale, or the weight's values changed in place, bind again."""
    A = make_format("csr")
    family = BindingFamily()
    run = dispatch._bound(A, family, config=None)
    g = _gen(21)

    def call(x, bias=None, scale=1.0, weight=None):
        weight = A if weight is None else weight
        out = torch.empty(x.shape[0], M)
        check_close(run(weight, x, out, bias, None, None, scale), ref.linear(x, weight, bias, None, None, scale),
                    torch.float32)

    for _ in range(3):  # new tensors, one layout: one bind
        call(torch.randn(5, K, generator=g))
    assert len(family.binds) == 1
    call(torch.randn(K, 5, generator=g).T)  # x = X.T: another layout
    call(torch.randn(5, K, generator=g), bias=torch.randn(M, generator=g))
    call(torch.randn(5, K, generator=g), bias=torch.randn(M, generator=g).double())
    call(torch.randn(5, K, generator=g), scale=0.5)
    assert len(family.binds) == 5
    call(torch.randn(5, K, generator=g), scale=0.5)
    assert len(family.binds) == 5
    # a residual's 16-byte alignment is part of its layout (a kernel's copy engine may read it)
    wide = torch.randn(5, M + 8, generator=g)
    for res in (wide[:, :M], wide[:, 1:M + 1], wide[:, 4:M + 4]):  # aligned, misaligned, aligned again
        out = torch.empty(5, M)
        x = torch.randn(5, K, generator=g)
        check_close(run(A, x, out, None, None, res, 1.0), ref.linear(x, A, None, None, res, 1.0), torch.float32)
    assert len(family.binds) == 7
    with torch.no_grad():
        A.values.mul_(2)  # an optimizer step: the layouts bound before are stale
    call(torch.randn(5, K, generator=g), scale=0.5)
    assert len(family.binds) == 8
    call(torch.randn(5, K, generator=g), weight=make_format("csr"))  # another weight: launched, not bound
    assert family.launches == 1
    ref_A = weakref.ref(A)
    del A
    gc.collect()
    assert ref_A() is None  # the launcher (held by the weight's dispatch state) does not keep it alive


def test_the_tuners_runs_bind_each_config_once(monkeypatch):
    """The tuner times each candidate's run many times: a CUDA family's run must bind once per
    config, not on every call (a bind's host time, hundreds of us, made fast candidates time as
    slow ones: LOG, session 36)."""
    from types import SimpleNamespace

    from spartune.kernels import registry

    A = make_format("csr")
    counted = BindingFamily()
    class Counted(SimpleNamespace):  # (hashable, as a registry's Family)
        __hash__ = object.__hash__

    family = Counted(name="counted", bind=counted.bind, launch=counted.launch, prologue=False,
                     available=lambda device: True)
    monkeypatch.setattr(registry, "families", lambda op, A: (family,))
    monkeypatch.setattr(registry, "by_name", lambda name: family if name == "counted" else None)
    x, out = torch.randn(5, K, generator=_gen(22)), torch.empty(5, M)
    ours, library = dispatch.linear_runs(A, x, out)
    for config in ("a", "a", "a", "b", "b", "a"):
        out.fill_(float("nan"))  # every call writes the output again
        ours[family](config)
        check_close(out, ref.linear(x, A, None, None, None, 1.0), torch.float32)
    assert len(counted.binds) == 2 and counted.launches == 0
    with torch.no_grad():
        A.values.mul_(2)  # the weight changed in place mid-tuning: its bound launches are stale
    out.fill_(float("nan"))
    ours[family]("a")
    check_close(out, ref.linear(x, A, None, None, None, 1.0), torch.float32)
    assert len(counted.binds) == 3
    check_close(library["dense"](), ref.linear(x, A, None, None, None, 1.0), torch.float32)  # (its own tensor)


def test_a_weights_bound_calls_are_dropped_together_when_its_values_change():
    """Each bound call holds the packed layouts of the values it was bound with: once they change
    in place, the first call of any of the weight's launchers drops them all, not only its own."""
    A = make_format("csr")
    family, bindings = BindingFamily(), dispatch.Bindings()
    runs = [dispatch._bound(A, family, config=None, bindings=bindings) for _ in range(2)]
    x = torch.randn(5, K, generator=_gen(22))
    for run in runs:
        run(A, x, torch.empty(5, M))
    assert [len(t) for t in bindings.tables] == [1, 1]
    with torch.no_grad():
        A.values.mul_(2)
    runs[0](A, x, torch.empty(5, M))
    assert [len(t) for t in bindings.tables] == [1, 0] and len(family.binds) == 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp16_choices_are_kept_per_reduced_precision_setting(monkeypatch, dtype):
    """torch's fp16 reduced-precision flag changes cuBLAS's speed and csr_smem's sums: a choice
    tuned under one setting is neither served nor stored for the other; bf16 ignores the flag."""
    A = make_format("csr", dtype)
    calls = _count_tuning(monkeypatch)
    x = torch.randn(5, K, generator=_gen(12)).to(dtype)
    keys = set()
    for allowed in (True, False, True):
        with helpers.fp16_reduced_precision(allowed):
            check_close(st.linear(x, A), ref.linear(x, A), dtype)
            keys.add(dispatch.linear_problem(A, 5, str(dtype).removeprefix("torch.")).key())
    assert calls.count("tune") == len(keys) == (2 if dtype == torch.float16 else 1)


def test_prepare_tunes_ahead_of_the_first_call(monkeypatch):
    A = make_format("block")
    st.prepare(A, 6, bias=True, activation="gelu")
    calls = _count_tuning(monkeypatch)
    x, bias = torch.randn(6, K, generator=_gen(12)), torch.randn(M, generator=_gen(13))
    check_close(st.linear(x, A, bias, "gelu"), ref.linear(x, A, bias, "gelu"), torch.float32)
    assert calls == []


def test_sddmm_and_softmax_choices_are_cached(monkeypatch):
    pattern = make_format("csr")
    calls = _count_tuning(monkeypatch)
    g = _gen(14)
    for _ in range(3):
        a, b = torch.randn(M, 16, generator=g), torch.randn(K, 16, generator=g)
        check_close(st.sddmm(a, b, pattern).to_dense(), ref.sddmm(a, b, pattern), torch.float32)
    for _ in range(3):
        check_close(st.sparse_softmax(pattern).to_dense(), ref.sparse_softmax(pattern), torch.float32)
    assert calls == ["tune", "pick", "tune", "pick"]


@pytest.mark.parametrize("path", ["gather", "dense"])
def test_sddmm_keeps_the_bitmap_only_when_its_choice_reads_it(monkeypatch, path):
    """Its measurements build CSR's bitmap (the dense path's); the choice's release keeps it
    only for that path."""
    from spartune.kernels import _bitmap
    from spartune.tune.tuner import Choice

    pattern = make_format("csr")
    _bitmap.csr_bitmap(pattern)  # as the dense path's measurement leaves it
    chosen = Choice("sddmm", sddmm_kernels.Config(path, 16, 16, 16), None, None)
    monkeypatch.setattr(dispatch, "choose", lambda *a, **k: chosen)
    monkeypatch.setattr(sddmm_kernels, "launch", lambda a, b, p, cfg, scale: torch.zeros_like(p.values))
    st.sddmm(torch.randn(M, 16), torch.randn(K, 16), pattern)
    assert ("_spartune_csr_bitmap" in pattern.__dict__) == (path == "dense")


@pytest.mark.parametrize("kind", ["csr", "block"])
def test_sddmm_results_keep_the_pattern_without_revalidating_it(monkeypatch, kind):
    # sddmm -> sparse_softmax chains build a format per call: its pattern is the input's, so it
    # is not validated again (O(nnz) per call) and its memoised stats carry over
    pattern = make_format(kind)
    stats = pattern.stats()
    validated = []
    monkeypatch.setattr(type(pattern), "_validate", lambda self: validated.append(self))
    g = _gen(15)
    a, b = torch.randn(M, 16, generator=g), torch.randn(K, 16, generator=g)
    scores = st.sddmm(a, b, pattern)
    probs = st.sparse_softmax(scores)
    assert validated == []
    assert scores.stats() is stats and probs.stats() is stats
    assert all(getattr(probs, n) is getattr(pattern, n) for n in pattern._tensors() if n != "values")
    check_close(probs.to_dense(), ref.sparse_softmax(pattern.with_values(scores.values)), torch.float32)


def test_the_ell_copy_is_kept_only_while_a_choice_runs_on_it(monkeypatch):
    # measuring the ell path builds a banded ELL copy of the weight (a second copy): it stays only
    # while some call shape of this weight runs on it
    from spartune.kernels._ell import _ELL_KEY
    A = make_format("csr")
    fastest = {"path": "row"}
    tuner = Tuner(None, H100, mode="exhaustive", measurer=lambda c, bound: 1e-6 if c.backend == "csr"
                  and c.config.path == fastest["path"] else 1e-3)
    monkeypatch.setattr(dispatch, "_tuner", tuner)
    g = _gen(30)
    for n, path, kept in ((3, "row", False), (4, "ell", True), (5, "row", True)):
        fastest["path"] = path
        x = torch.randn(n, K, generator=g)
        check_close(st.linear(x, A), ref.linear(x, A), torch.float32)
        assert (_ELL_KEY in A.__dict__) == kept, (n, path)
    x = torch.randn(4, K, generator=g)  # the ell choice still runs
    check_close(st.linear(x, A), ref.linear(x, A), torch.float32)


def test_library_copies_stay_only_while_a_choice_reads_them(monkeypatch):
    # timing the baselines converts the weight (a dense copy, torch's CSR, ...): kept, a sparse
    # weight would hold several times its dense size; they stay only while a chosen backend reads them
    from spartune import backends
    A = make_format("csr")
    fastest = {"backend": "csr"}
    tuner = Tuner(None, H100, mode="exhaustive",
                  measurer=lambda c, bound: 1e-6 if c.backend == fastest["backend"] else 1e-3)
    monkeypatch.setattr(dispatch, "_tuner", tuner)
    backends.dense_weight(A)  # as the baselines' timing leaves it
    torch_csr = backends._common.cached(A, "cusparse", lambda: backends.cusparse.torch_sparse(A))
    assert torch_csr is not None
    g = _gen(31)
    for n, backend, kept in ((3, "csr", False), (4, "dense", True), (5, "csr", True)):
        fastest["backend"] = backend
        x = torch.randn(n, K, generator=g)
        check_close(st.linear(x, A), ref.linear(x, A), torch.float32)
        assert ("_backend_dense" in A.__dict__) == kept, (n, backend)
        assert "_backend_cusparse" not in A.__dict__


def test_cached_choices_are_dropped_with_the_weight():
    A = make_format("csr")
    st.linear(torch.randn(3, K), A)
    assert len(dispatch._states) == 1
    del A
    gc.collect()
    assert len(dispatch._states) == 0


def test_set_mode_forgets_choices_and_rejects_unknown_modes(monkeypatch):
    monkeypatch.setattr(dispatch, "_mode", dispatch._mode)
    A = make_format("block")
    st.linear(torch.randn(3, K), A)
    st.set_mode("model")  # (spartune.set_mode, beside set_memory_policy)
    assert len(dispatch._states) == 0 and dispatch._tuner is None
    with pytest.raises(ValueError, match="mode must be one of"):
        ops.set_mode("fastest")


# --- bad inputs: clear errors before any kernel runs ----------------------------------------------
@pytest.fixture
def no_kernels(monkeypatch):
    """Any kernel launch, library backend or tuning fails the test."""

    def boom(*a, **k):
        raise AssertionError("a kernel or the tuner ran before the inputs were checked")

    for mod in (spmm_blocked, spmm_csr, sddmm_kernels, softmax_kernels):
        monkeypatch.setattr(mod, "launch", boom)
    for name in ("dense_linear", "cusparse_linear", "cusparselt_linear"):
        monkeypatch.setattr(backends, name, boom)
    for name in ("dense_sddmm", "dense_softmax"):
        monkeypatch.setattr(backends, name, boom)
    monkeypatch.setattr(dispatch, "choose", boom)


A32 = make_format("csr")
A16 = make_format("csr", torch.float16)
NM32 = make_format("2:4")
x32 = torch.randn(5, K)

BAD_LINEAR = {
    "x last dim": (lambda: st.linear(torch.randn(5, K + 1), A32), ValueError, "last dimension 64"),
    "x 0-d": (lambda: st.linear(torch.tensor(1.0), A32), ValueError, "last dimension"),
    "x dtype": (lambda: st.linear(x32.half(), A32), TypeError, "dtype torch.float16 but the weight is torch.float32"),
    "x int": (lambda: st.linear(x32.long(), A32), TypeError, "dtype"),
    "x not a tensor": (lambda: st.linear(x32.tolist(), A32), TypeError, "x must be a torch.Tensor"),
    "x sparse": (lambda: st.linear(x32.to_sparse(), A32), TypeError, "dense"),
    "x device": (lambda: st.linear(torch.empty(5, K, device="meta"), A32), ValueError, "move one of them"),
    "bias length": (lambda: st.linear(x32, A32, torch.randn(M + 1)), ValueError, "bias must have last dimension 40"),
    "bias 2-D": (lambda: st.linear(x32, A32, torch.randn(1, M)), ValueError, "bias must be 1-D"),
    "bias not a tensor": (lambda: st.linear(x32, A32, 1.0), TypeError, "bias must be a torch.Tensor"),
    "residual shape": (lambda: st.linear(x32, A32, residual=torch.randn(5, M + 1)), ValueError, "residual must have shape"),
    "residual lead": (lambda: st.linear(x32.reshape(5, 1, K), A32, residual=torch.randn(5, M)), ValueError, "residual"),
    "activation": (lambda: st.linear(x32, A32, activation="tanh"), ValueError, "activation must be one of"),
    "A dense tensor": (lambda: st.linear(x32, torch.randn(M, K)), TypeError, "A must be a spartune format"),
    "out_dtype int": (lambda: st.linear(x32, A32, out_dtype=torch.int32), TypeError, "out_dtype"),
    "out_dtype fp64": (lambda: st.linear(x32, A32, out_dtype=torch.float64), TypeError, "out_dtype"),
    "out_dtype str": (lambda: st.linear(x32, A32, out_dtype="float16"), TypeError, "out_dtype"),
    "NM x dtype": (lambda: st.linear(x32.half(), NM32), TypeError, "dtype"),
    "scale str": (lambda: st.linear(x32, A32, scale="2"), TypeError, "scale must be a real number"),
    "scale None": (lambda: st.linear(x32, A32, scale=None), TypeError, "scale must be a real number"),
    "input_bias length": (lambda: st.linear(x32, A32, input_bias=torch.randn(K - 1)), ValueError,
                          "input_bias must have last dimension 64"),
    "input_bias 2-D": (lambda: st.linear(x32, A32, input_bias=torch.randn(1, K)), ValueError, "input_bias must be 1-D"),
    "input_bias int": (lambda: st.linear(x32, A32, input_bias=torch.ones(K, dtype=torch.long)), TypeError,
                       "input_bias must be one of"),
    "input_activation": (lambda: st.linear(x32, A32, input_bias=torch.randn(K), input_activation="tanh"), ValueError,
                         "activation must be one of"),
    "input_activation alone": (lambda: st.linear(x32, A32, input_activation="relu"), ValueError,
                               "input_activation needs input_bias"),
}

BAD_OTHERS = {
    "spmm rows": (lambda: st.spmm(A32, torch.randn(K + 2, 3)), ValueError, "X must have 64 rows"),
    "spmm 3-D": (lambda: st.spmm(A32, torch.randn(2, K, 3)), ValueError, "X must be 2-D"),
    "spmm dtype": (lambda: st.spmm(A16, torch.randn(K, 3)), TypeError, "dtype"),
    "spmm A": (lambda: st.spmm(torch.randn(M, K), torch.randn(K, 3)), TypeError, "A must be a spartune format"),
    "spmm out_dtype": (lambda: st.spmm(A32, torch.randn(K, 3), out_dtype=torch.int8), TypeError, "out_dtype"),
    "sddmm a rows": (lambda: st.sddmm(torch.randn(M + 1, 8), torch.randn(K, 8), A32), ValueError, "sddmm needs"),
    "sddmm b rows": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K - 1, 8), A32), ValueError, "sddmm needs"),
    "sddmm D": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K, 9), A32), ValueError, "sddmm needs"),
    "sddmm a 1-D": (lambda: st.sddmm(torch.randn(M), torch.randn(K, 8), A32), ValueError, "a must be 2-D"),
    "sddmm b dtype": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K, 8).half(), A32), TypeError, "dtype"),
    "sddmm int": (lambda: st.sddmm(torch.ones(M, 8, dtype=torch.long), torch.ones(K, 8, dtype=torch.long), A32),
                  TypeError, "float16, bfloat16, float32 or float64"),
    "sddmm pattern NM": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K, 8), NM32), TypeError, "CSR or BlockSparse"),
    "sddmm pattern dense": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K, 8), torch.ones(M, K)), TypeError,
                            "CSR or BlockSparse"),
    "softmax NM": (lambda: st.sparse_softmax(NM32), TypeError, "CSR or BlockSparse"),
    "softmax dense": (lambda: st.sparse_softmax(torch.randn(M, K)), TypeError, "CSR or BlockSparse"),
    "sddmm scale": (lambda: st.sddmm(torch.randn(M, 8), torch.randn(K, 8), A32, scale="a"), TypeError, "scale"),
    "softmax scale": (lambda: st.sparse_softmax(A32, scale=None), TypeError, "scale must be a real number"),
    "prepare n": (lambda: st.prepare(A32, 0), ValueError, "n \\(tokens\\) must be a positive int"),
    "prepare n float": (lambda: st.prepare(A32, 2.5), ValueError, "positive int"),
}


@pytest.mark.parametrize("case", list(BAD_LINEAR))
def test_linear_rejects_bad_inputs(no_kernels, case):
    call, exc, match = BAD_LINEAR[case]
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("case", list(BAD_LINEAR))
def test_linear_rejects_bad_inputs_where_autograd_records(no_kernels, monkeypatch, case):
    """The operator's route (x requires grad) checks what the eager route does, with the same
    errors: no broadcast residual, no int32 out_dtype, no string scale slips through."""
    monkeypatch.setitem(globals(), "x32", x32.clone().requires_grad_())
    call, exc, match = BAD_LINEAR[case]
    with pytest.raises(exc, match=match):
        call()


def test_linear_rejects_a_broadcast_residual_both_routes(no_kernels):
    for x in (x32, x32.clone().requires_grad_()):
        with pytest.raises(ValueError, match="residual must have shape"):
            st.linear(x, A32, residual=torch.randn(1, M))


@pytest.mark.parametrize("case", list(BAD_OTHERS))
def test_other_ops_reject_bad_inputs(no_kernels, case):
    call, exc, match = BAD_OTHERS[case]
    with pytest.raises(exc, match=match):
        call()


def test_other_ops_check_the_same_where_autograd_records(no_kernels):
    A = A32.with_values(A32.values.clone().requires_grad_())
    a, b = torch.randn(M, 8, requires_grad=True), torch.randn(K, 8)
    with pytest.raises(TypeError, match="out_dtype"):
        st.spmm(A, torch.randn(K, 3), out_dtype=torch.int8)
    with pytest.raises(ValueError, match="X must have 64 rows"):
        st.spmm(A, torch.randn(K + 2, 3))
    with pytest.raises(TypeError, match="scale must be a real number"):
        st.sddmm(a, b, A32, scale="x")
    with pytest.raises(TypeError, match="b has dtype torch.float16 but a is torch.float32"):
        st.sddmm(a, b.half(), A32)
    with pytest.raises(TypeError, match="scale must be a real number"):
        st.sparse_softmax(A, scale="x")


def test_float64_runs_the_dense_product_and_no_kernel(monkeypatch):
    """float64 (gradcheck, references) has no kernel: every op runs torch's dense product,
    exact to the float64 reference, and never asks the tuner."""

    def boom(*a, **k):
        raise AssertionError("a kernel ran")

    for mod in (spmm_blocked, spmm_csr, softmax_kernels):
        monkeypatch.setattr(mod, "launch", boom)
    monkeypatch.setattr(dispatch, "choose", boom)
    for kind in ("csr", "block"):
        A = make_format(kind, torch.float64)
        x = torch.randn(3, K, dtype=torch.float64, generator=_gen(40))
        bias = torch.randn(M, dtype=torch.float64, generator=_gen(41))
        torch.testing.assert_close(st.linear(x, A, bias, "gelu"), ref.linear(x, A, bias, "gelu"), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(st.spmm(A, x.T.contiguous()), ref.spmm(A, x.T), rtol=1e-12, atol=1e-12)
        a = torch.randn(M, 5, dtype=torch.float64, generator=_gen(42))
        b = torch.randn(K, 5, dtype=torch.float64, generator=_gen(43))
        torch.testing.assert_close(st.sddmm(a, b, A).to_dense(), ref.sddmm(a, b, A), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(st.sparse_softmax(A).to_dense(), ref.sparse_softmax(A), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["2:4", "csr"])
def test_bias_of_another_dtype_is_consistent(monkeypatch, kind):
    """Either rejected up front (a TypeError naming bias) or accepted by every backend alike."""
    A = make_format(kind, torch.float16)
    tuner = force(monkeypatch, "dense")
    x = torch.randn(4, K, generator=_gen(15)).half()
    bias = torch.randn(M, generator=_gen(16))  # float32 with an fp16 weight
    try:
        y = st.linear(x, A, bias)
    except TypeError as e:
        assert "bias" in str(e)
        return
    assert chosen_backends(tuner) == {"dense"}
    check_close(y, ref.linear(x, A, bias), torch.float16)


def test_a_strided_bias_is_read_as_given_and_left_unchanged():
    """The epilogues read bias at unit stride: a strided view is copied, the user's left as is."""
    A = make_format("csr", torch.float32)
    x = torch.randn(3, K, generator=_gen(50))
    wide = torch.randn(M, 2, generator=_gen(51))
    bias = wide[:, 1]  # stride 2
    before = wide.clone()
    check_close(st.linear(x, A, bias), ref.linear(x, A, bias), torch.float32)
    assert torch.equal(wide, before)


def test_a_float64_bias_or_residual_on_a_16_bit_weight_is_refused():
    A = make_format("csr", torch.float16)
    x = torch.randn(3, K, generator=_gen(52)).half()
    with pytest.raises(TypeError, match="bias"):
        st.linear(x, A, torch.randn(M, dtype=torch.float64))
    with pytest.raises(TypeError, match="residual"):
        st.linear(x, A, residual=torch.randn(3, M, dtype=torch.float64))


# --- a tuning-DB hit rebuilds the stored config -------------------------------------------------
@pytest.mark.parametrize("kind", ["csr", "block"])
def test_a_db_hit_rebuilds_the_stored_config_without_ranking_the_space(monkeypatch, tmp_path, kind):
    """A new process (fresh tuner, no per-weight state) on a tuned problem: the stored config
    runs without any config space being ranked (no features()) or measured."""
    from spartune.kernels import registry
    from spartune.tune.db import TuningDB

    family = registry.by_name(OURS[kind])
    path, versions = tmp_path / "t.sqlite3", {"torch": "t"}
    measured = []
    fake_clock = lambda c, bound: measured.append(c) or (1e-6 if c.backend == family.name else 1e-3)  # noqa: E731
    monkeypatch.setattr(dispatch, "_tuner", Tuner(TuningDB(path, versions=versions), H100, measurer=fake_clock))
    A, g = make_format(kind), _gen(40)
    x = torch.randn(6, K, generator=g)
    st.linear(x, A)
    first = dispatch.get_tuner().cached(next(iter(dispatch.get_tuner()._memo)))
    assert first.backend == family.name and measured

    dispatch._states.clear()  # a new process
    monkeypatch.setattr(dispatch, "_tuner", Tuner(TuningDB(path, versions=versions), H100, measurer=fake_clock))
    measured.clear()

    def no_features(*a, **k):
        raise AssertionError("a DB hit ranked the config space")

    monkeypatch.setattr(family.module, "features", no_features)
    A2 = A.with_values(torch.randn(A.values.shape, generator=g) * (A.values != 0))  # a new weight, same problem
    check_close(st.linear(x, A2), ref.linear(x, A2), torch.float32)
    again = dispatch.get_tuner().cached(next(iter(dispatch.get_tuner()._memo)))
    assert (again.backend, again.config) == (first.backend, first.config) and not measured


def test_a_db_entry_that_todays_space_lacks_is_tuned_again(monkeypatch, tmp_path):
    import dataclasses as dc
    import json

    from spartune.tune.db import TuningDB

    path, versions = tmp_path / "t.sqlite3", {"torch": "t"}
    clock = lambda c, bound: 1e-6 if c.backend == "csr" else 1e-3  # noqa: E731
    db = TuningDB(path, versions=versions)
    monkeypatch.setattr(dispatch, "_tuner", Tuner(db, H100, measurer=clock))
    A, g = make_format("csr"), _gen(42)
    x = torch.randn(6, K, generator=g)
    st.linear(x, A)
    (key,) = db._conn.execute("SELECT problem FROM best").fetchone()
    stored = json.loads(db._conn.execute("SELECT config FROM best").fetchone()[0])
    stored["fields"]["block_m"] = 3  # no config of the space has it
    with db._conn:
        db._conn.execute("UPDATE best SET config = ? WHERE problem = ?", (json.dumps(stored), key))
    dispatch._states.clear()
    tuner = Tuner(TuningDB(path, versions=versions), H100, measurer=clock)
    monkeypatch.setattr(dispatch, "_tuner", tuner)
    check_close(st.linear(x, A), ref.linear(x, A), torch.float32)
    choice = next(iter(tuner._memo.values()))
    assert choice.backend == "csr" and dc.asdict(choice.config)["block_m"] != 3


def test_a_dtype_mismatch_under_autocast_says_what_to_do():
    """torch.autocast casts a dense layer's output, not a sparse weight: the error says so."""
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="torch.autocast does not cast"):
        st.linear(x32.bfloat16(), A32)
    with pytest.raises(TypeError) as outside:
        st.linear(x32.bfloat16(), A32)
    assert "autocast" not in str(outside.value)
