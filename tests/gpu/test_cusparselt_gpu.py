"""The cuSPARSELt 2:4 backend on the GPU: both algorithms, fp16 and bf16, against the float64
reference, the bias + relu epilogue, the clear error at N = 1, the caller's own graph capture,
and spartune.linear choosing among it and the others."""
import pytest
import torch
import torch.nn.functional as F

import helpers
import spartune as st
from spartune import backends
from spartune.backends import cusparselt as L

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_cache")]

DTYPES = [torch.float16, torch.bfloat16]
TOL = 1e-2
BACKENDS = {"cusparselt": L.cusparselt_linear, "cusparselt_search": L.cusparselt_search_linear}


def random_2to4(rows, cols, dtype, seed=0):
    return helpers.random_2to4(rows, cols, dtype, seed, least=2).cuda()


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def call(name, A, x, **epi):
    out = torch.empty(x.shape[0], A.shape[0], dtype=x.dtype, device=x.device)
    try:
        return BACKENDS[name](A, x, out, **epi)
    except L.CusparseltUnsupported as e:
        if "picked algorithm 0" in str(e):
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K", [(256, 512), (11008, 4096)])
@pytest.mark.parametrize("N", [16, 77, 2048])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_matches_the_reference(name, M, K, N, dtype):
    w = random_2to4(M, K, dtype)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(N, K, dtype=dtype, device="cuda")
    ref = x.double() @ w.double().T
    y = call(name, A, x)
    assert y.shape == (N, M) and rel_err(y, ref) <= TOL
    x2 = torch.randn(N, K, dtype=dtype, device="cuda")
    y2 = call(name, A, x2)  # y still held: another graph's output, y untouched
    assert y2.data_ptr() != y.data_ptr() and rel_err(y, ref) <= TOL
    assert rel_err(y2, x2.double() @ w.double().T) <= TOL
    bias = torch.randn(M, dtype=dtype, device="cuda")
    y = call(name, A, x, bias=bias, activation="relu")
    assert rel_err(y, F.relu(ref + bias.double())) <= TOL


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_out_and_strided_x(dtype):
    w = random_2to4(256, 512, dtype)
    A = st.NM.from_dense(w, 2, 4)
    X = torch.randn(512, 40, dtype=dtype, device="cuda")
    Y = torch.empty(256, 40, dtype=dtype, device="cuda")
    got = L.cusparselt_linear(A, X.T, Y.T)
    assert got.data_ptr() == Y.data_ptr()
    assert rel_err(Y, w.double() @ X.double()) <= TOL


def test_the_library_route_writes_a_row_major_out():
    """What the tuner measures and a model gets: F.linear's layout, the copy included."""
    w = random_2to4(256, 512, torch.float16)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(48, 512, dtype=torch.float16, device="cuda")
    out = torch.full((48, 256), float("nan"), dtype=torch.float16, device="cuda")
    y = L.cusparselt_linear(A, x, out)
    assert y is out and y.is_contiguous()
    assert rel_err(y, x.double() @ w.double().T) <= TOL


def test_held_outputs_are_never_overwritten():
    w = random_2to4(256, 512, torch.float16)
    A = st.NM.from_dense(w, 2, 4)
    xs = [torch.randn(32, 512, dtype=torch.float16, device="cuda") for _ in range(L.MAX_GRAPHS + 2)]
    ys = [L.cusparselt_linear(A, x, torch.empty(32, 256, dtype=torch.float16, device="cuda"), transposed_ok=True)
          for x in xs]
    for x, y in zip(xs, ys):
        assert rel_err(y, x.double() @ w.double().T) <= TOL
    ptr = ys[0].data_ptr()
    del ys
    y = L.cusparselt_linear(A, xs[0], torch.empty(32, 256, dtype=torch.float16, device="cuda"), transposed_ok=True)
    assert y.data_ptr() == ptr  # a graph whose output was dropped is replayed again
    assert rel_err(y, xs[0].double() @ w.double().T) <= TOL


@pytest.mark.parametrize("N", [1, 7])
def test_too_few_tokens_raise_a_clear_error(N):
    A = st.NM.from_dense(random_2to4(256, 512, torch.float16), 2, 4)
    x = torch.randn(N, 512, dtype=torch.float16, device="cuda")
    for fn in BACKENDS.values():
        with pytest.raises(L.CusparseltUnsupported, match="at least 8 tokens"):
            fn(A, x, torch.empty(N, 256, dtype=torch.float16, device="cuda"))


def test_inside_the_callers_graph():
    w = random_2to4(256, 512, torch.float16)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(64, 512, dtype=torch.float16, device="cuda")
    L.cusparselt_linear(A, x, torch.empty(64, 256, dtype=torch.float16, device="cuda"))  # warm
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = L.cusparselt_linear(A, x, torch.empty(64, 256, dtype=torch.float16, device="cuda"))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y, x.double() @ w.double().T) <= TOL


def test_offered_for_2to4_half_only():
    A = st.NM.from_dense(random_2to4(256, 512, torch.float16), 2, 4)
    assert {"cusparselt", "cusparselt_search"} <= set(backends.library_backends(A))
    A32 = st.NM.from_dense(random_2to4(256, 512, torch.float32), 2, 4)
    assert "cusparselt" not in backends.library_backends(A32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_spartune_linear_at_llama_shape(dtype):
    w = random_2to4(11008, 4096, dtype)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(2048, 4096, dtype=dtype, device="cuda")
    y = st.linear(x, A)
    assert y.shape == (2048, 11008) and rel_err(y, x.double() @ w.double().T) <= TOL
    y = st.linear(x, A)  # the cached launcher
    assert rel_err(y, x.double() @ w.double().T) <= TOL


@pytest.mark.parametrize("op", ["linear", "spmm"])
def test_bench_baseline_is_the_backend(op):
    from spartune.bench.baselines import prepare

    w = random_2to4(512, 1024, torch.float16)
    x = torch.randn(64, 1024, dtype=torch.float16, device="cuda")
    s = {"w": w, "A": st.NM.from_dense(w, 2, 4), "x": x, "xt": x.T.contiguous()}
    fn, as_nm = prepare("cusparselt", s, "2:4", op)
    assert rel_err(as_nm(fn()), x.double() @ w.double().T) <= TOL


def test_captured_on_a_thread_that_only_replayed():
    """Tuning runs on a worker thread; a thread whose calls were all graph replays must still
    capture its first eager call (torch makes a thread's cuSPARSELt handle on its first call)."""
    import threading

    w = random_2to4(256, 512, torch.float16)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(64, 512, dtype=torch.float16, device="cuda")
    L.cusparselt_linear(A, x, torch.empty(64, 256, dtype=torch.float16, device="cuda"))  # this thread: graphs
    torch.cuda.synchronize()
    found = {}

    def capture():
        try:
            L.cusparselt_linear(A, x, torch.empty(64, 256, dtype=torch.float16, device="cuda"))  # a replay
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                found["y"] = L.cusparselt_linear(A, x, torch.empty(64, 256, dtype=torch.float16, device="cuda"))
            x.copy_(torch.randn_like(x))
            g.replay()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            found["error"] = e

    t = threading.Thread(target=capture)
    t.start()
    t.join()
    assert "error" not in found, found.get("error")
    assert rel_err(found["y"], x.double() @ w.double().T) <= TOL
