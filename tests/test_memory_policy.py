"""The lean memory policy: a sparse weight keeps no copy of itself larger than its format (no
dense copy, no library conversion, no V:N:M 2:4 copy), and dense, where it wins, runs on a
decompression made for the call."""
import dataclasses

import pytest
import torch

import spartune as st
from spartune import dispatch, ops
from spartune.backends import dense_linear, transient_dense_linear
from spartune.kernels import spmm_csr, spmm_nm
from spartune.tune.problem import KEY_FIELDS, Problem

HOPPER = "NVIDIA H100 80GB HBM3 sm_90"


@pytest.fixture
def policy(monkeypatch):
    """The policy as the test leaves it is forgotten afterwards (and every choice with it)."""
    monkeypatch.setattr(dispatch, "_memory", dispatch._memory)
    monkeypatch.delenv("SPARTUNE_MEMORY", raising=False)
    yield
    dispatch._forget()


def _csr(m=48, k=40, density=0.3):
    return st.sparsify_weight(torch.randn(m, k), "csr", 1 - density)


def _check_linear(A, n=5):
    x = torch.randn(n, A.shape[1])
    y = st.linear(x, A)
    want = x.double() @ A.to_dense().double().T
    assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-4)


def test_unknown_policies_are_refused(policy, monkeypatch):
    with pytest.raises(ValueError, match="memory policy must be one of"):
        st.set_memory_policy("small")
    monkeypatch.setattr(dispatch, "_memory", None)
    monkeypatch.setenv("SPARTUNE_MEMORY", "tiny")
    with pytest.raises(ValueError, match="SPARTUNE_MEMORY must be one of"):
        st.memory_policy()
    monkeypatch.setenv("SPARTUNE_MEMORY", "lean")
    assert st.memory_policy() == "lean"
    with pytest.raises(ValueError, match="memory must be one of"):
        Problem("linear", "csr", 8, 8, 1, "float16", _csr().stats(), memory="fast")


def test_the_policy_is_part_of_the_tuning_key():
    s = _csr().stats()
    speed, lean = (Problem("linear", "csr", 8, 8, 1, "float16", s, memory=p) for p in ("speed", "lean"))
    assert speed.key() != lean.key() and len(lean.key()) == len(KEY_FIELDS)
    assert lean.key()[KEY_FIELDS.index("memory")] == "lean"
    assert Problem("linear", "csr", 8, 8, 1, "float16", s).memory == "speed"  # the default


def test_lean_dense_keeps_no_copy_and_speed_keeps_one(policy):
    """On the CPU dense is the only backend: under speed it keeps its copy, under lean it
    decompresses for each call; outputs equal the float64 reference either way."""
    A = _csr()
    st.set_memory_policy("speed")
    _check_linear(A)
    assert "_backend_dense" in A.__dict__
    st.set_memory_policy("lean")  # drops the copy at once, not at the next call
    assert "_backend_dense" not in A.__dict__
    for n in (1, 7):
        _check_linear(A, n)
    assert "_backend_dense" not in A.__dict__
    assert dispatch._libraries(A) == {"dense": transient_dense_linear}


def test_transient_dense_equals_dense_with_every_epilogue(policy):
    A = _csr(32, 24)
    x, bias, res = torch.randn(6, 24), torch.randn(32), torch.randn(6, 32)
    for epi in (dict(), dict(bias=bias, activation="relu"), dict(residual=res), dict(bias=bias, scale=0.5)):
        want = dense_linear(A, x, torch.empty(6, 32), **epi, keep=False)
        got = transient_dense_linear(A, x, torch.empty(6, 32), **epi)
        assert torch.equal(got, want)
    assert "_backend_dense" not in A.__dict__


def test_lean_prices_dense_with_its_decompression():
    s = _csr().stats()
    speed, lean = (Problem("linear", "csr", 4096, 4096, 2048, "float16", s, memory=p) for p in ("speed", "lean"))
    device = dispatch.get_tuner().device
    assert dispatch._library_prior(lean, "dense", device) > dispatch._library_prior(speed, "dense", device)


@pytest.mark.parametrize("pattern", ["64:2:8", "64:2:16"])
def test_lean_leaves_out_the_vnm_2to4_copy(pattern):
    A = st.sparsify_weight(torch.randn(128, 256, dtype=torch.float16), pattern)
    speed, lean = (Problem("linear", A.signature, 4096, 4096, 2048, "float16", A.stats(), device=HOPPER, memory=p)
                   for p in ("speed", "lean"))
    fast, small = spmm_nm.space(speed), spmm_nm.space(lean)
    assert any(c.as_24 for c in fast) and not any(c.as_24 for c in small)
    assert small == [c for c in fast if not c.as_24]  # nothing else changes


def test_switching_to_lean_forgets_choices_and_drops_only_the_copies(policy):
    """To lean: every choice forgotten, the library copies dropped, our kernels' layouts kept
    (a CUDA graph captured before may read them); the same policy again changes nothing."""
    from spartune.kernels._ell import banded_ell
    from spartune.tune.tuner import Choice

    A = _csr()
    st.set_memory_policy("speed")
    _check_linear(A)
    A.__dict__["_backend_cusparse"] = (A.values._version, "a library's copy")  # as the GPU's tuner leaves it
    banded_ell(A)  # a layout of an ell pick
    dispatch.state(A, None).chosen[(99,)] = Choice("csr", spmm_csr.Config("ell", 16, 16, 32), None, None)
    st.set_memory_policy("speed")  # unchanged: nothing forgotten or dropped
    assert dispatch._states.get(A) is not None and "_backend_dense" in A.__dict__
    st.set_memory_policy("lean")
    assert dispatch._states.get(A) is None
    assert not [k for k in A.__dict__ if k.startswith("_backend_")]
    assert "_spartune_banded_ell" in A.__dict__  # lean allows the ell pick: its layout stays
    assert ops.memory_policy() == "lean"
    _check_linear(A)
    st.set_memory_policy("speed")  # back: forgets, drops nothing
    assert dispatch._states.get(A) is None


def test_lean_never_reuses_a_dense_copy_left_by_speed(policy):
    """A weight whose choices were forgotten before the switch (set_mode) keeps no dense copy
    once lean tunes it, and lean's dense decompresses (never reads the copy)."""
    A = _csr()
    st.set_memory_policy("speed")
    _check_linear(A)
    assert "_backend_dense" in A.__dict__
    ops.set_mode(dispatch.tuning_mode())  # forgets the weight: the switch below cannot reach it
    st.set_memory_policy("lean")
    assert "_backend_dense" in A.__dict__
    A.__dict__["_backend_dense"] = (A.values._version, torch.zeros(A.shape))  # a stale copy lean must not read
    _check_linear(A)  # right only if dense decompressed
    assert "_backend_dense" not in A.__dict__


def test_sddmm_and_softmax_problems_ignore_the_policy(policy):
    st.set_memory_policy("lean")
    A = _csr()
    p = dispatch.problem_of("sddmm", A, 8, 16, "float16", dispatch.Epilogue())
    assert p.memory == "speed" and dispatch.linear_problem(A, 4, "float16").memory == "lean"


def test_dry_run_speedup_is_against_the_dense_layer_as_run(policy):
    A = st.sparsify_weight(torch.randn(512, 512, dtype=torch.float16), "csr", 0.5)
    st.set_memory_policy("speed")
    speed = dispatch.predicted_speedup(A, 1)
    st.set_memory_policy("lean")
    lean = dispatch.predicted_speedup(A, 1)
    assert lean[0] <= speed[0] * 1.0001  # lean never looks faster than dense than speed does


def test_lean_choices_are_stored_apart(policy, tmp_path):
    """A DB row tuned under one policy is not served under the other."""
    from spartune.tune.db import TuningDB

    db = TuningDB(tmp_path / "t.sqlite3", versions={"spartune": "test"})
    A = _csr()
    speed, lean = (dataclasses.replace(dispatch.linear_problem(A, 4, "float16"), memory=p) for p in ("speed", "lean"))
    assert db.key(speed) != db.key(lean)
