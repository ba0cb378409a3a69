"""Block-sparse and Shfl-BW SpMM under the Triton interpreter, against the float64 reference."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from spartune.kernels import spmm_blocked as K
from spartune.tune.problem import Problem
from helpers import block_weight, random_weight, rel_err

TOL = {torch.float32: 1e-5, torch.float16: 1e-2}
ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def make(pattern, M, Kd, density, dtype, empty_rows=()):
    if pattern.startswith("block"):
        bm, bk = (int(v) for v in pattern.split(":")[1].split("x"))
        w = block_weight(M, Kd, bm, bk, density)
        for r in empty_rows:
            w[r * bm:(r + 1) * bm] = 0
        return st.BlockSparse.from_dense(w.to(dtype), (bm, bk))
    v = int(pattern.split(":")[1])
    w = random_weight(M, Kd, density)
    return st.ShuffledBlock.from_dense(w.to(dtype), v, torch.randperm(M).to(torch.int32))


def run(A, x, cfg, **epi):
    out = torch.full((x.shape[0], A.shape[0]), float("nan"), dtype=x.dtype)  # poisoned
    K.launch(A, x, out, cfg, **epi)
    assert not out.isnan().any(), "every output element must be written"
    return out


CONFIGS = {  # (pattern, config): the TMA and persistent paths, the pointer path, Shfl-BW chunks
    "block-ptr": ("block:16x32", K.Config(16, 32, 4, 2, 8)),
    "block-tma": ("block:16x32", K.Config(32, 32, 4, 3, 1, tma=True)),
    "block-persistent": ("block:16x32", K.Config(16, 32, 4, 3, 8, tma=True, persistent=True)),
    "shfl": ("shfl:16", K.Config(16, 32, 4, 2, 8)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M, Kd, N", [(70, 90, 7), (48, 64, 1), (33, 100, 77)])
def test_every_path_matches_reference(name, dtype, M, Kd, N):
    pattern, cfg = CONFIGS[name]
    A = make(pattern, M, Kd, 0.4, dtype, empty_rows=(1,))
    x = torch.randn(N, Kd).to(dtype)
    assert rel_err(run(A, x, cfg), ref.linear(x, A)) < TOL[dtype]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("name", ["block-tma", "shfl"])
def test_every_epilogue(act, name):
    pattern, cfg = CONFIGS[name]
    A = make(pattern, 40, 64, 0.5, torch.float32)
    x, bias, res = torch.randn(9, 64), torch.randn(40), torch.randn(9, 40)
    expect = ref.linear(x, A, bias, act, res, scale=0.75)
    assert rel_err(run(A, x, cfg, bias=bias, activation=act, residual=res, scale=0.75), expect) < 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dense_and_empty_weights(name):
    pattern, cfg = CONFIGS[name]
    x, bias = torch.randn(5, 50), torch.randn(30)
    full = make(pattern, 30, 50, 1.0, torch.float32)
    assert rel_err(run(full, x, cfg), ref.linear(x, full)) < 1e-5
    empty = make(pattern, 30, 50, 0.0, torch.float32)
    assert empty.nnz == 0
    out = run(empty, x, cfg, bias=bias, activation="relu")
    assert torch.allclose(out, torch.relu(bias).expand(5, 30))
    aligned = make(pattern, 32, 64, 0.0, torch.float32)  # TMA-eligible shapes, no stored block
    assert torch.equal(run(aligned, torch.randn(4, 64), cfg), torch.zeros(4, 32))


@pytest.mark.parametrize("name", ["block-ptr", "block-tma", "shfl"])
def test_strided_inputs_and_outputs_are_read_in_place(name):
    pattern, cfg = CONFIGS[name]
    A = make(pattern, 48, 40, 0.5, torch.float32)
    big = torch.randn(12, 80)
    x = big[:, ::2]  # K stride 2
    X = torch.randn(40, 12)  # spmm layout: x = X.T, out = Y.T
    res = torch.randn(48, 12).T  # transposed residual
    Y = torch.full((48, 12), float("nan"))
    K.launch(A, X.T, Y.T, cfg, residual=res)
    assert rel_err(Y.T, ref.linear(X.T, A, residual=res)) < 1e-5
    assert rel_err(run(A, x, cfg), ref.linear(x, A)) < 1e-5


@pytest.mark.parametrize("bk", [16, 32])
def test_shfl_chunks_hold_every_kept_column_once_and_pad_with_zeros(bk):
    """The kernel layout of Shfl-BW: groups of 0, bk (exactly one chunk), bk + 1 and more kept
    columns; scattered back, the chunks give the weight, and a padded lane repeats one of its
    group's kept columns under a zero value."""
    v, cols = 16, 3 * bk + 5
    counts = [0, bk, bk + 1, 3 * bk + 5, 1]
    slots = torch.zeros(len(counts) * v, cols)  # rows in group order
    for g, c in enumerate(counts):
        slots[g * v:(g + 1) * v, torch.randperm(cols)[:c]] = torch.randn(v, c)
    perm = torch.randperm(slots.shape[0])
    w = torch.empty_like(slots)
    w[perm] = slots
    A = st.ShuffledBlock.from_dense(w, v, perm.to(torch.int32))
    values, ptr, idx = K.chunked(A, bk)
    assert ptr.tolist() == [0, *torch.tensor([-(-c // bk) for c in counts]).cumsum(0).tolist()]
    assert values.shape == (ptr[-1], v, bk) and idx.shape == (ptr[-1], bk)
    grouped = torch.zeros(len(counts), v, cols)
    for g in range(len(counts)):
        kept = set(A.col[A.crow[g]:A.crow[g + 1]].tolist())
        for ch in range(ptr[g], ptr[g + 1]):
            assert set(idx[ch].tolist()) <= kept  # padding repeats a kept column
            grouped[g].index_add_(1, idx[ch].long(), values[ch])  # padded lanes add zeros
    dense = torch.empty_like(w)
    dense[A.perm.long()] = grouped.reshape(-1, cols)
    assert torch.equal(dense, A.to_dense())
    A.values.mul_(2)  # new values in place: the layout is built again
    assert torch.equal(K.chunked(A, bk)[0], 2 * values)
    K.chunked(A, 64)
    K.release_unused(A, [K.Config(16, bk, 4, 2)])  # only the chunks a chosen config reads stay
    assert [k for k in A.__dict__ if k.startswith("_shfl_chunks_")] == [f"_shfl_chunks_{bk}"]


def test_space_is_valid_and_features_are_sane():
    for pattern in ("block:64x64", "block:32x128", "shfl:64"):
        A = make(pattern, 256, 256, 0.2, torch.float16)
        for n in (1, 16, 2048):
            prob = Problem("linear", A.signature, 256, 256, n, "float16", A.stats())
            configs = K.space(prob)
            assert configs and len(set(configs)) == len(configs)
            for cfg in configs:
                f = K.features(prob, cfg)
                assert f.smem_bytes <= K.SMEM_BYTES and f.tiles >= 1 and f.mma_flops >= 0
                assert cfg.bn <= max(16, 2 ** (n - 1).bit_length())
    with pytest.raises(ValueError):
        K.space(Problem("linear", "csr", 8, 8, 8, "float16", A.stats()))


def test_wrong_format_is_refused():
    A = st.CSR.from_dense(torch.eye(8))
    with pytest.raises(TypeError, match="BlockSparse or ShuffledBlock"):
        K.launch(A, torch.randn(2, 8), torch.empty(2, 8), CONFIGS["block-ptr"][1])


def test_a_format_with_launches_cached_copies_and_pickles_without_them():
    """The direct-launch cache (compiled kernels, which cannot be copied) rides on the format
    object: a deep copy or a pickle of a layer that has run must still work, and start empty."""
    import copy
    import pickle
    import threading

    from spartune.kernels._common import LaunchCache

    layer = st.SparseLinear.from_linear(torch.nn.Linear(128, 64), "block:32", 0.5)
    cache = LaunchCache({("device", "key"): (threading.Lock(), ())})  # stands in for a CompiledKernel
    object.__setattr__(layer.weight, "_blocked_launches", cache)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone.weight.__dict__.get("_blocked_launches", LaunchCache()) == {}
        x = torch.randn(3, 128)
        torch.testing.assert_close(clone(x), layer(x))
    assert layer.weight.__dict__["_blocked_launches"] is cache and cache
