"""PackedNM and PackedVNM: 2:4 and V:N:M weights stored in the sparse tensor cores' tile order (CPU)."""
import pytest
import torch

import spartune as st
from spartune.formats import NM, VNM, PackedNM, PackedVNM
from spartune.kernels import spmm_nm


def random_nm(rows, cols, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return st.sparsify_weight(torch.randn(rows, cols, generator=g).to(dtype), "2:4")


@pytest.mark.parametrize("rows, cols", [(16, 32), (37, 70), (5, 4), (200, 520), (64, 1030)])
def test_round_trips_and_reads_as_nm(rows, cols):
    A = random_nm(rows, cols, seed=rows + cols)
    P = PackedNM.pack(A)
    assert torch.equal(P.to_dense(), A.to_dense())
    assert torch.equal(P.mask(), A.mask())
    assert (P.nnz, P.signature, P.shape) == (A.nnz, A.signature, A.shape)
    back = P.unpack()
    assert torch.equal(back.values, A.values) and torch.equal(back.idx, A.idx)
    g = torch.randn(rows, cols)
    assert torch.equal(P._rows(P.gather(g)), A.gather(g))  # the weight gradient's adjoint
    assert torch.equal(PackedNM.from_dense(A.to_dense()).values, P.values)


@pytest.mark.parametrize("rows, cols", [(16, 32), (37, 70), (200, 520)])
def test_the_kernels_read_the_values_in_place_as_they_read_nms_packing(rows, cols):
    A = random_nm(rows, cols, torch.float16, seed=cols)
    P = PackedNM.pack(A)
    va, ma, *tiles_a = spmm_nm.packed(A)
    vp, mp, *tiles_p = spmm_nm.packed(P)
    assert torch.equal(va, vp) and torch.equal(ma, mp) and tiles_a == tiles_p
    assert vp.data_ptr() == P.values.data_ptr()  # no copy of the values
    spmm_nm.release_unused(P, [spmm_nm.Config(bm=64, bn=8, num_warps=4)])
    assert "_nm_packed_meta" in P.__dict__


def test_refuses_what_it_cannot_hold():
    A = random_nm(32, 64)
    with pytest.raises(ValueError, match="2:4"):
        PackedNM.pack(st.sparsify_weight(torch.randn(32, 64), "1:4"))
    P = PackedNM.pack(A)
    with pytest.raises(ValueError, match="values must have shape"):
        PackedNM(shape=P.shape, n=2, m=4, values=P.values[:-1].contiguous(), idx=P.idx)
    padded = P.values.clone()
    padded[-1, -1] = 1.0  # a tile past K's last step
    with pytest.raises(ValueError, match="padding"):
        PackedNM(shape=P.shape, n=2, m=4, values=padded, idx=P.idx)
    odd = PackedNM.pack(random_nm(20, 64))
    v = odd.values.clone()
    v.view(-1)[odd._all_rows(torch.arange(v.numel(), dtype=torch.float64).reshape(v.shape))[25, 0].long()] = 1.0
    with pytest.raises(ValueError, match="padding"):  # row 25 of a 20-row weight
        PackedNM(shape=odd.shape, n=2, m=4, values=v, idx=odd.idx)


def nm_model(seed=0):
    """Two SparseLinear layers over 2:4 NM weights (as a checkpoint saved before PackedNM gives)."""
    g = torch.Generator().manual_seed(seed)
    layers = [st.nn.SparseLinear(st.sparsify_weight(torch.randn(o, i, generator=g), "2:4"), torch.randn(o, generator=g))
              for i, o in ((64, 96), (96, 40))]
    return torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1])


def test_sparsify_keeps_2to4_weights_packed_unless_the_tiles_pad_them():
    model = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40),
                                torch.nn.Linear(40, 256))
    st.nn.sparsify(model, {"0": "2:4", "2": ("csr", 0.5), "3": "2:4"})
    assert type(model[0].weight) is PackedNM and type(model[2].weight) is st.CSR
    assert type(model[3].weight) is NM  # K = 40 would store 128 columns' worth: 3.2x


def test_pack_weights_keeps_outputs_gradients_and_state():
    torch.manual_seed(0)
    model = nm_model()
    x = torch.randn(5, 64)
    expect = model(x).detach()
    model[0].weight_values.requires_grad_(True)
    model(x).square().sum().backward()
    grad = model[0].weight_values.grad.clone()
    assert st.nn.pack_weights(model) is model
    assert all(type(model[i].weight) is PackedNM for i in (0, 2))
    assert model[0].weight_values.requires_grad and not model[2].weight_values.requires_grad
    assert torch.equal(model(x), expect)
    model(x).square().sum().backward()
    assert torch.allclose(model[0].weight._rows(model[0].weight_values.grad), grad, atol=1e-5)
    fresh = nm_model(seed=1)
    fresh.load_state_dict(model.state_dict())  # a packed checkpoint into canonical layers
    assert type(fresh[0].weight) is NM and torch.equal(fresh(x), expect)  # the same weight, in the layer's layout
    alone = st.nn.SparseLinear.from_state_dict(model.state_dict(), "2.")
    assert torch.equal(alone.weight.to_dense(), model[2].weight.to_dense())
    with pytest.raises(TypeError):
        st.nn.pack_weights(model[0].weight)


@pytest.mark.parametrize("pattern", ["64:2:8", "16:2:4", "128:2:32", "32:2:16"])
@pytest.mark.parametrize("rows, cols", [(100, 72), (130, 300), (64, 256)])
def test_vnm_round_trips_and_the_kernels_read_it_in_place(pattern, rows, cols):
    g = torch.Generator().manual_seed(rows + cols)
    A = st.sparsify_weight(torch.randn(rows, cols, generator=g).half(), pattern)
    P = PackedVNM.pack(A)
    assert torch.equal(P.to_dense(), A.to_dense()) and P.nnz == A.nnz and P.signature == A.signature
    back = P.unpack()
    assert type(back) is VNM and all(torch.equal(a, b) for a, b in zip(back.tensor_list(), A.tensor_list()))
    w = torch.randn(rows, cols, generator=g).half()
    assert torch.equal(P._rows(P.gather(w)), A.gather(w))
    va, ma, *ta = spmm_nm.packed(A)
    vp, mp, *tp = spmm_nm.packed(P)
    assert torch.equal(va, vp) and torch.equal(ma, mp) and ta == tp and vp.data_ptr() == P.values.data_ptr()
    assert torch.equal(spmm_nm.packed_as_24(P)[0], spmm_nm.packed_as_24(A)[0])  # prefill's 2:4 copy
    with pytest.raises(ValueError, match="PackedVNM packs VNM"):
        PackedVNM.pack(st.sparsify_weight(torch.randn(32, 64), "2:4"))


def test_sparsify_and_pack_weights_pack_vnm_layers():
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    st.nn.sparsify(model, "64:2:8")
    assert type(model[0].weight) is PackedVNM  # K = 256: 32 column blocks, a 2:4 matrix of 128 columns
    assert type(model[2].weight) is VNM  # K = 128: its 64 columns would pad to 128
    layer = st.nn.SparseLinear(st.sparsify_weight(torch.randn(64, 40), "16:2:8"))
    x = torch.randn(3, 40)
    expect = layer(x)
    st.nn.pack_weights(layer)
    assert type(layer.weight) is PackedVNM and torch.allclose(layer(x), expect)
    sd = layer.state_dict()
    assert torch.equal(st.nn.SparseLinear.from_state_dict(sd).weight.to_dense(), layer.weight.to_dense())


def test_refuses_misaligned_values_and_bad_static_fields_clearly():
    P = PackedNM.pack(random_nm(32, 256, torch.float16))
    buf = torch.zeros(P.values.numel() + 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        P.with_values(buf[4:].view(P.values.shape))
    V = PackedVNM.pack(st.sparsify_weight(torch.randn(64, 256), "64:2:8"))
    for bad in (dict(v=0), dict(m=0), dict(v=3), dict(v="64")):
        with pytest.raises(ValueError, match="v |V:N:M needs|block"):
            PackedVNM(**{**dict(shape=V.shape, v=V.v, m=V.m, cols=V.cols, values=V.values, idx=V.idx), **bad})
    with pytest.raises(ValueError, match="N:M needs"):
        PackedNM(shape=P.shape, n="2", m=4, values=P.values, idx=P.idx)


def test_loading_across_the_layout_keeps_the_parameter_and_ties():
    """A canonical checkpoint into a packed model (and back) loads into the layer's own Parameter:
    an optimizer built before still trains it; pack_weights keeps tied layers tied."""
    canonical = nm_model(seed=2)
    packed = st.nn.pack_weights(nm_model(seed=3))
    packed.requires_grad_(True)
    param = packed[0].weight_values
    opt = torch.optim.SGD(packed.parameters(), lr=0.1)
    packed.load_state_dict(canonical.state_dict())
    assert packed[0].weight_values is param and type(packed[0].weight) is PackedNM
    x = torch.randn(4, 64)
    assert torch.allclose(packed(x), canonical(x))
    before = packed[0].weight.to_dense().clone()
    packed(x).square().sum().backward()
    opt.step()
    assert not torch.equal(before, packed[0].weight.to_dense())
    back = nm_model(seed=4)
    kept = back[0].weight_values
    back.load_state_dict(packed.state_dict())
    assert back[0].weight_values is kept and type(back[0].weight) is NM
    assert torch.allclose(back(x), packed(x))
    layer = st.nn.SparseLinear(st.sparsify_weight(torch.randn(64, 256), "2:4"), torch.randn(64))
    tied = torch.nn.Sequential(layer, layer.tied_copy(torch.randn(64)))
    st.nn.pack_weights(tied)
    assert tied[0].weight_values is tied[1].weight_values and type(tied[1].weight) is PackedNM
    assert len(list(tied.parameters())) == 3
