"""The 2:4 sparse tensor-core family on the CPU: the packed weight against the emulation of
mma.sp, space/features sanity, availability, registry and the dense fallback."""
import dataclasses

import pytest
import torch
from helpers import mma_registers, random_2to4

import spartune as st
from spartune.kernels import registry
from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda import emulate as E
from spartune.tune.problem import Epilogue, Problem


def registers_of(values, meta):
    """The packing as the mma kernel reads it: register order (tiles, K steps, 32, 8) and the
    metadata word each lane reads."""
    mt, kt = values.shape[:2]
    lane = torch.arange(32)
    return mma_registers(values.reshape(mt, kt, 256)), meta[..., 2 * (lane // 4) + lane % 2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, cols", [(16, 32), (100, 72), (7, 5), (33, 130), (1, 1), (300, 328)])
def test_packing_round_trips_through_the_emulation(dtype, rows, cols):
    """What the mma kernel reads of the one packing is what mma.sp decodes into the weight."""
    w = random_2to4(rows, cols, dtype, seed=rows * 1000 + cols)
    A = st.NM.from_dense(w, 2, 4)
    values, meta, mt, kt = K.packed(A)
    assert values.shape == (mt, kt, 2, 2, 8, 8) and meta.shape == (mt, kt, 16)
    assert meta.dtype == torch.int32 and mt == -(-rows // 16) and kt % 4 == 0 and kt * 32 >= cols > (kt - 4) * 32
    regs, lane_meta = registers_of(values, meta)
    dense = E.decode_matrix(regs, lane_meta)
    assert torch.equal(dense[:rows, :cols], w.double())
    assert not dense[rows:].any() and not dense[:, cols:].any()
    assert K.packed(A) is K.packed(A)  # memoised on the weight


def test_packing_refuses_other_nm():
    A = st.NM.from_dense(torch.zeros(16, 16, dtype=torch.float16), 1, 4)
    with pytest.raises(ValueError, match="2:4"):
        K.packed(A)


def problem(m, k, n, dtype="float16", fmt="2:4"):
    A = st.NM.from_dense(random_2to4(m, k, torch.float32), 2, 4)
    return Problem("linear", fmt, m, k, n, dtype, A.stats())


@pytest.mark.parametrize("n", [1, 7, 16, 77, 2048])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_space_and_features(n, dtype):
    prob = problem(256, 256, n, dtype)
    configs = K.space(prob)
    assert configs
    assert all(c.bn <= max(8, 1 << (n - 1).bit_length()) for c in configs)
    dense_flops = 2.0 * 256 * 256 * n
    for c in configs:
        assert K._warp_grid(c) is not None
        f = K.features(prob, c)
        assert f.tiles > 0 and f.mma_flops > 0 and f.dram_bytes > 0 and f.l2_bytes >= f.dram_bytes - 256 * n * 2
        smem_cap = K.SMEM_BYTES if c.stages == 2 else K.PIPE_SMEM  # static, or the cp.async ring's dynamic
        # (trips: chunks of ksteps K steps a warp)
        assert f.steps_max == -(-256 // 32 // (c.warps_k * c.ksteps)) and 0 < f.smem_bytes <= smem_cap and f.num_warps == c.num_warps
        assert f.num_stages == c.stages
        if n % c.bn == 0:
            assert f.mma_flops < dense_flops  # the sparse tensor cores do half the math


def test_space_is_empty_where_mma_sp_cannot_run():
    assert K.space(problem(64, 64, 16, "float32")) == []
    assert K.space(problem(64, 64, 16, "float16", fmt="1:4")) == []


def test_unavailable_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not K.available(torch.device("cpu"))
    A = st.NM.from_dense(random_2to4(16, 32, torch.float16), 2, 4)
    fam = registry.by_name("nm")
    assert not fam.available(A.device)


def test_registry_lists_the_family():
    fam = registry.by_name("nm")
    assert fam is not None and fam.language == "cuda" and fam.op == "linear"
    A = st.NM.from_dense(random_2to4(16, 32, torch.float16), 2, 4)
    assert fam in registry.families("linear", A)
    assert st.NM in registry.served_formats("linear")


def test_linear_on_the_cpu_falls_back():
    w = random_2to4(48, 40, torch.float32)
    A = st.NM.from_dense(w, 2, 4)
    x = torch.randn(5, 40)
    torch.testing.assert_close(st.linear(x, A), x @ w.T, rtol=1e-4, atol=1e-4)


# ---- the wgmma variant's host side ----

@pytest.mark.parametrize("bm", [128, 256])
@pytest.mark.parametrize("rows, cols", [(16, 32), (100, 72), (300, 328), (7, 5)])
def test_packing_puts_each_value_where_the_wgmma_tensor_cores_read_it(rows, cols, bm):
    """A stage's 3-D boxes (`a_maps`: bm / 16 tiles x 2 K steps, zeros past the tiles) land as
    (K step, tile); each (K step, m64 block) 2 KB block is then 64 x 16 kept values K-major in
    8 x 8 core matrices (8-row groups 256 B apart, the two K core matrices 128 B), as wgmma.sp's
    descriptor reads them, and the metadata (K step, tile, 16 words)."""
    w = random_2to4(rows, cols, torch.float16, seed=rows + cols)
    A = st.NM.from_dense(w, 2, 4)
    values, meta, mt, kt = K.packed(A)
    tiles = bm // 16
    blocks = -(-mt // tiles)
    kept = torch.zeros(blocks * bm, kt * 16, dtype=A.values.dtype)
    kept[:rows, : A.values.shape[1]] = A.values
    units = torch.zeros(blocks * tiles, kt, 256, dtype=values.dtype)
    units[:mt] = values.reshape(mt, kt, 256)
    words = torch.zeros(blocks * tiles, kt, 16, dtype=meta.dtype)
    words[:mt] = meta
    for mb in range(blocks):
        for ks in range(kt // 2):
            box = units[mb * tiles:(mb + 1) * tiles, 2 * ks: 2 * ks + 2].transpose(0, 1)  # (K step, tile, unit)
            stage = box.reshape(2, tiles // 4, 8, 2, 8, 8)  # (K step, m64 block, 8-row group, K core, row, value)
            kk, j, g, kc, r, e = torch.meshgrid(*[torch.arange(n) for n in stage.shape], indexing="ij")
            row, col = mb * bm + j * 64 + g * 8 + r, (2 * ks + kk) * 16 + kc * 8 + e
            assert torch.equal(stage, kept[row, col])
            e_box = words[mb * tiles:(mb + 1) * tiles, 2 * ks: 2 * ks + 2].transpose(0, 1)
            held = min(tiles, mt - mb * tiles)  # (past the weight: zeros, rows never stored)
            assert torch.equal(e_box[:, :held], meta[mb * tiles: mb * tiles + held, 2 * ks: 2 * ks + 2].transpose(0, 1))
    assert (meta[:, -1] == 0x44444444).all() or cols > (kt - 1) * 32  # K's padding: valid metadata


def test_wgmma_space_is_hopper_only():
    hopper = Problem("linear", "2:4", 4096, 4096, 2048, "float16", problem(64, 64, 1).stats,
                     device="NVIDIA H100 80GB HBM3 sm_90")
    wg = [c for c in K.space(hopper) if c.variant == "wgmma"]
    assert wg and all(K._wgmma_smem_bytes(c, 0) <= K.SMEM_LIMIT_HOPPER for c in wg)
    mma = [c for c in K.space(hopper) if c.variant == "mma"]
    # at equal tiles the model's work for wgmma.sp is the smaller (its instruction is faster)
    assert min(K.features(hopper, c).mma_flops for c in wg) < min(K.features(hopper, c).mma_flops for c in mma)
    ampere = Problem(**{**hopper.__dict__, "device": "NVIDIA A100-SXM4-80GB sm_80"})
    assert not [c for c in K.space(ampere) if c.variant == "wgmma"]
    odd_k = Problem(**{**hopper.__dict__, "k": 4100})  # TMA needs 16-byte rows
    assert not [c for c in K.space(odd_k) if c.variant == "wgmma"]
    for n in (1, 16, 32):  # decode is the mma variant's (a wgmma tile is 64 tokens wide)
        decode = Problem(**{**hopper.__dict__, "n": n})
        assert {c.variant for c in K.space(decode)} == {"mma"}
        ring = [c for c in K.space(decode) if c.stages == 3]  # the cp.async ring: narrow tiles only
        assert ring and all(c.bn <= 16 for c in ring)
        spmm = Problem(**{**decode.__dict__, "layout": "spmm"})  # x = X.T: no 16-byte rows to copy
        assert all(c.stages == 2 for c in K.space(spmm))


def test_vnm_decode_tiles_run_on_the_ring_only():
    """Off the ring a V:N:M tile gathers x element by element (GATHER 1), ~10x slower at 16 tokens
    than the ring where both run, which the model does not see: the space offers it only for tiles
    wider than the ring's 16 tokens."""
    hopper = "NVIDIA H100 80GB HBM3 sm_90"
    for layout in ("linear", "spmm"):
        for n in (1, 8, 16, 32):
            p = Problem("linear", "64:2:8", 4096, 11008, n, "float16", problem(64, 64, 1).stats, device=hopper,
                        layout=layout)
            mma = [c for c in K.space(p) if c.variant == "mma"]
            assert mma and all(c.stages == 3 for c in mma if c.bn <= 16)
            assert all(K.mma_gather(c, n) >= 2 for c in mma if c.bn <= 16)
            assert (n == 32) == any(c.stages == 2 for c in mma)  # (32-token tiles: element by element)


# ---- V:N:M on the same kernel: the 2:4 matrix over the kept columns, x gathered through a map ----

@pytest.mark.parametrize("v, m", [(16, 8), (32, 16), (64, 8), (128, 32), (16, 4)])
@pytest.mark.parametrize("rows, cols", [(100, 72), (64, 256), (130, 300)])
def test_vnm_packing_and_column_map_rebuild_the_weight(v, m, rows, cols):
    g = torch.Generator().manual_seed(rows + cols + v + m)
    A = st.sparsify_weight(torch.randn(rows, cols, generator=g).half(), f"{v}:2:{m}")
    values, meta, mt, kt = K.packed(A)
    cmap = K.column_map(A)
    assert cmap.shape == (A.row_blocks, kt * 32) and cmap.dtype == torch.int32
    assert cmap.max() < cols and cmap.min() >= -1
    gathered = E.decode_matrix(*registers_of(values, meta))[: mt * 16]  # (mt*16, kt*32)
    dense = torch.zeros(mt * 16, cols + 1, dtype=torch.float64)
    col = cmap.long().repeat_interleave(v, 0)[: mt * 16]
    dense.scatter_add_(1, torch.where(col < 0, cols, col), gathered)  # -1 lands in a spare column
    assert torch.equal(dense[:rows, :cols], A.to_dense().double())
    assert not dense[:, cols].any()  # nothing stored behind a padding column
    # the mma variant's map: the format's own offsets, each column found as spmm_nm.cu's col_of does
    offsets = K.column_offsets(A)
    assert offsets is A.cols and offsets.dtype == torch.uint8
    odd = torch.empty(A.cols.numel() + 1, dtype=torch.uint8)[1:].view_as(A.cols).copy_(A.cols)
    B = dataclasses.replace(A, cols=odd)  # offsets at an odd address: a copy (GATHER 4 loads two at once)
    assert B.cols.data_ptr() % 2 == 1 and K.column_offsets(B) is not odd
    assert K.column_offsets(B).data_ptr() % 2 == 0 and torch.equal(K.column_offsets(B), A.cols)
    k = torch.arange(kt * 32)
    pitch = A.col_blocks * 4
    found = (k // 4) * m + offsets.reshape(A.row_blocks, -1).long()[:, k.clamp(max=pitch - 1)]
    found = torch.where((k < pitch) & (found < cols), found, -1)
    assert torch.equal(found, cmap.long())


def test_vnm_space_keeps_tiles_inside_a_row_block():
    A = st.sparsify_weight(torch.randn(256, 256), "32:2:8")
    prob = Problem("linear", A.signature, 256, 256, 16, "float16", A.stats(), device="NVIDIA H100 80GB HBM3 sm_90")
    configs = K.space(prob)
    assert configs and all(32 % c.bm == 0 and c.variant == "mma" for c in configs)
    assert K.space(Problem(**{**prob.__dict__, "dtype": "float32"})) == []
    fam = registry.by_name("nm")
    assert fam in registry.families("linear", A)
    dense_work = 2.0 * 256 * 256 * 16
    assert all(K.features(prob, c).mma_flops < dense_work * 0.5 for c in configs)  # a quarter of K is kept


def test_launch_refuses_bad_input_before_any_kernel():
    A = st.NM.from_dense(random_2to4(64, 64, torch.float16), 2, 4)
    out = torch.empty(4, 64, dtype=torch.float16)
    with pytest.raises(TypeError, match="float16"):
        K.launch(A, torch.randn(4, 64), out, K.Config(16, 8, 4, 4))  # x in fp32, the weight fp16
    V = st.sparsify_weight(torch.randn(64, 64).half(), "32:2:8")
    x = torch.randn(4, 64).half()
    with pytest.raises(ValueError, match="one block of 32 rows"):
        K.launch(V, x, out, K.Config(64, 8, 4, 1))  # a tile across two V-row blocks
    with pytest.raises(ValueError, match="one block of 32 rows or two halves"):
        K.launch(V, x, out, K.Config(128, 64, 12, variant="wgmma", stages=4))  # V < BM / 2
    with pytest.raises(ValueError, match=r"x must be \(N, 64\)"):
        K.launch(V, x[:, :40], out, K.Config(128, 64, 12, variant="wgmma", stages=4))  # x narrower than K
    for cfg, weight in ((K.Config(16, 8, 4, 4, stages=3, cluster_m=3), A), (K.Config(16, 8, 4, 4, cluster_m=2), A),
                        (K.Config(32, 8, 4, 2, stages=3, cluster_m=2), V)):  # a cluster of 3; off the ring; V:N:M
        with pytest.raises(ValueError, match="mma cluster of 2, 4 or 8"):
            K.launch(weight, x, out, cfg)


# ---- V:N:M on the wgmma variant: x^T's rows gathered by the producer ----

def test_vnm_wgmma_space_covers_one_block_or_two_halves():
    hopper = "NVIDIA H100 80GB HBM3 sm_90"
    for v, m, bms in ((64, 8, {128}), (128, 8, {128, 256}), (64, 16, {128}), (32, 8, set())):
        A = st.sparsify_weight(torch.randn(256, 256), f"{v}:2:{m}")
        prob = Problem("linear", A.signature, 4096, 4100, 2048, "float16", A.stats(), device=hopper)  # K % 8 != 0 is fine
        wg = [c for c in K.space(prob) if c.variant == "wgmma" and not c.as_24]
        assert {c.bm for c in wg} == bms, (v, m)
        kept = -(-4100 // m) * 4  # the work is that of the kept columns: 4 of every m, in stage pairs
        k_pad = -(-kept // 128) * 128
        for c in wg:
            assert K.wgmma_boxes(c, v) == (1 if v % c.bm == 0 else 2)
            tiles = -(-4096 // c.bm) * -(-2048 // c.bn)
            expect = 2.0 * tiles * c.bm * c.bn * k_pad * K.DENSE_PEAK / K.WGMMA_SP_PEAK
            assert K.features(prob, c).mma_flops == pytest.approx(expect)
        assert not [c for c in K.space(Problem(**{**prob.__dict__, "n": 32})) if c.variant == "wgmma"]


def test_vnm_wgmma_column_map_pads_row_blocks():
    A = st.sparsify_weight(torch.randn(130, 300), "64:2:8")  # 3 row blocks; 128-row tiles cover 4
    values, meta, mt, kt = K.packed(A)
    cmap, full = K.wgmma_column_map(A, 128)
    base = K.column_map(A)
    assert cmap.shape == (4, kt * 32) and cmap.dtype == torch.int32 and cmap.is_contiguous()
    assert torch.equal(cmap[:3], base) and (cmap[3] == -1).all()
    assert full == 0  # the padding block has no column: every stage is checked
    assert K.wgmma_column_map(A, 128)[0] is cmap
    B = st.sparsify_weight(torch.randn(256, 1000), "64:2:8")  # 125 column blocks: 500 kept, K' pads to 512
    bmap, bfull = K.wgmma_column_map(B, 128)
    assert bfull == 7 and (bmap[:, : 7 * 64] >= 0).all() and (bmap[:, 7 * 64:] < 0).any()


def test_tokens_major_reads_spmm_layout_in_place_and_copies_otherwise():
    """x^T as the kernels read it, and its pitch known before any copy is made (a bound launch
    copies x once per call, not when it is bound)."""
    def tokens_major(x):
        in_place, ldx, n_alloc = K._tokens_major_pitch(x)
        xt = K._tokens_major(x, in_place)
        assert in_place == (xt.data_ptr() == x.data_ptr()) and xt.stride(0) == ldx and xt.shape[1] >= n_alloc
        return xt, ldx, n_alloc

    X = torch.randn(72, 40).half()  # spmm's X (K, N): x = X.T is tokens-contiguous
    xt, ldx, n_alloc = tokens_major(X.t())
    assert xt.data_ptr() == X.data_ptr() and (ldx, n_alloc) == (40, 40)
    x = torch.randn(37, 72).half()  # linear's x (N, K): one copy, tokens padded to 8 with zeros
    xt, ldx, n_alloc = tokens_major(x)
    assert xt.shape == (72, 40) and (ldx, n_alloc) == (40, 40)
    assert torch.equal(xt[:, :37], x.t()) and not xt[:, 37:].any()
    odd = torch.randn(72, 37).half()  # tokens not a multiple of 8: copied
    xt, _, n_alloc = tokens_major(odd.t())
    assert xt.data_ptr() != odd.data_ptr() and n_alloc == 40 and torch.equal(xt[:, :37], odd)


@pytest.mark.parametrize("triton_tiles", [False, True])  # (decode-sized x goes through torch's copy)
@pytest.mark.parametrize("N, Kd", [(1, 1), (70, 130), (64, 64), (3, 200)])
def test_tokens_major_transposes_any_strides(N, Kd, triton_tiles, monkeypatch):
    from spartune.kernels import transpose
    from spartune.kernels.transpose import tokens_major

    if triton_tiles:
        monkeypatch.setattr(transpose, "TORCH_COPY_MAX", 0)
    x = torch.randn(N, 2 * Kd).half()[:, ::2]  # strided
    xt = tokens_major(x, 8)
    pad = -(-N // 8) * 8
    assert xt.shape == (Kd, pad) and xt.is_contiguous()
    assert torch.equal(xt[:, :N], x.t()) and not xt[:, N:].any()


def test_instances_are_what_each_config_loads():
    """The tuner compiles `instances(problem, config)` ahead of timing: the kernel each config's
    launch loads, gather and dtype included (2:4: none; V:N:M: the mma gather, or the wgmma
    boxes), one per config of the space, shared by configs that differ in tile order only."""
    hopper = "NVIDIA H100 80GB HBM3 sm_90"
    for pattern, dtype in (("2:4", "float16"), ("64:2:8", "bfloat16"), ("128:2:8", "float16")):
        A = st.sparsify_weight(torch.randn(256, 256), pattern)
        prob = Problem("linear", A.signature, 4096, 4096, 2048, dtype, A.stats(), device=hopper)
        for c in K.space(prob):
            (inst,) = K.instances(prob, c)
            defines = dict(inst.defines)
            gather = 0 if pattern == "2:4" or c.as_24 else K.wgmma_boxes(c, A.v) if c.variant == "wgmma" \
                else 3 if c.x_whole else 2 if c.stages >= 3 else 1
            assert defines["GATHER"] == gather and defines["SPARTUNE_BF16"] == (dtype == "bfloat16")
            assert inst == K._instance(c, getattr(torch, dtype), gather)
        wg = [c for c in K.space(prob) if c.variant == "wgmma"]
        assert len({K.instances(prob, c)[0] for c in wg}) == len({(c.bm, c.bn, c.stages, c.cluster_m, c.as_24 or pattern == "2:4")
                                                                  for c in wg})
        # the epilogue's activation is compiled in (one per instance), in both variants
        gelu = Problem("linear", A.signature, 4096, 4096, 2048, dtype, A.stats(), Epilogue(activation="gelu"), hopper)
        for c in K.space(prob)[:3] + wg[:1]:
            assert dict(K.instances(gelu, c)[0].defines)["SPARTUNE_ACT"] == 2
            assert dict(K.instances(prob, c)[0].defines)["SPARTUNE_ACT"] == 0
        # a residual: wgmma instances of their own (the copy engine loads it), the mma ones the same
        res = Problem("linear", A.signature, 4096, 4096, 2048, dtype, A.stats(), Epilogue(residual=True), hopper)
        for c in K.space(prob)[:3] + wg[:1]:
            assert dict(K.instances(res, c)[0].defines).get("SPARTUNE_RES", 0) == (c.variant == "wgmma")


def test_compile_space_without_a_gpu_compiles_nothing():
    from spartune import dispatch

    assert dispatch.compile_space(st.sparsify_weight(torch.randn(64, 64), "2:4"), 16) == 0


def test_vnm_decode_takes_the_ring_with_rows_of_x_transposed():
    """V:N:M at decode: ring configs (GATHER 2: x^T rows by cp.async) in either layout, their
    k-major x tile sized at an odd number of 16-byte units per row (8 tokens: 16 B, 16: 48 B)."""
    A = st.sparsify_weight(torch.randn(256, 256), "64:2:8")
    for layout in ("linear", "spmm"):
        prob = Problem("linear", A.signature, 4096, 4100, 16, "float16", A.stats(), device="H100 sm_90", layout=layout)
        ring = [c for c in K.space(prob) if c.stages >= 3]
        assert ring and all(c.bn <= 16 and 64 % c.bm == 0 and K.mma_gather(c) == (3 if c.x_whole else 2) for c in ring)
        assert any(c.x_whole for c in ring) == (layout == "linear")  # (spmm's X is x^T already: no copy to spare)
    cfg = K.Config(32, 16, 4, 2, 4, stages=3)
    kc, frags = 32 * 4 * 2, 4 * 1 * 4 * 32  # K per chunk; A fragments: warps x (bm / 16 / warps_m) x ksteps x lanes
    assert K._smem_bytes(cfg, 2) == 3 * (kc * 24 * 2 + frags * 20)
    assert K._smem_bytes(cfg, 1) == 3 * (16 * (kc + 8) * 2 + frags * 20)


def test_x_whole_stages_the_tokens_rows_behind_the_ring_and_spares_the_copy():
    """x_whole (GATHER 3; 4 for one token, its chunks' kept columns in one row of 2 bytes each):
    shared memory = the ring + min(bn, N) rows of K rounded up to 8 halves; the model counts no
    x^T copy but each CTA's read of its rows; too large a K leaves it out."""
    A = st.sparsify_weight(torch.randn(256, 256), "64:2:8")
    cfg = K.Config(32, 8, 4, 2, 4, stages=3)
    whole = dataclasses.replace(cfg, x_whole=True)
    assert K._mma_smem_bytes(whole, True, 1, 4100) == K._smem_bytes(cfg, 4) + 1 * 4104 * 2
    assert K._mma_smem_bytes(whole, True, 37, 4100) == K._smem_bytes(cfg, 3) + 8 * 4104 * 2
    kc, frags = 32 * 4 * 2, 4 * 2 // 2 * 1 * 4 * 32  # (2 warps along M, a 16-row slice each)
    assert K._smem_bytes(cfg, 4) == 3 * (kc * 2 + frags * 20) < K._smem_bytes(cfg, 3)
    assert [K.mma_gather(whole, n) for n in (1, 2, 8)] == [4, 3, 3]
    assert K.mma_gather(dataclasses.replace(whole, bn=16), 1) == 3  # (GATHER 4 is an 8-token tile's)
    prob = Problem("linear", A.signature, 4096, 4100, 1, "float16", A.stats(), device="H100 sm_90")
    f, fw = K.features(prob, cfg), K.features(prob, whole)
    x_bytes = 4100 * 2
    assert f.dram_bytes - fw.dram_bytes == 2 * x_bytes  # the copy's write and read
    chunk_tiles = 4096 // 32 * cfg.bn * 2176 * 2  # GATHER 2: each CTA reads x^T rows of the 2052 kept columns (68 K steps: in fours)
    assert fw.l2_bytes - f.l2_bytes == 4096 // 32 * 4104 * 2 - chunk_tiles - 2 * x_bytes  # 128 CTAs read x's row
    assert (f.launches, fw.launches) == (2, 1)  # the x^T copy is a kernel of its own
    assert whole in K.space(prob) and dict(K.instances(prob, whole)[0].defines)["GATHER"] == 4
    two = dataclasses.replace(prob, n=2)
    assert dict(K.instances(two, whole)[0].defines)["GATHER"] == 3
    wide = Problem("linear", A.signature, 4096, 60000, 16, "float16", A.stats(), device="H100 sm_90")
    assert not any(c.x_whole for c in K.space(wide))  # 8 or 16 rows of 60000 halves: past the ring's budget
    assert K.mma_gather(dataclasses.replace(whole, stages=2)) == 1  # (the launch refuses x_whole off the ring)


def test_decode_clusters_share_x_chunks_on_hopper_only():
    """2:4 ring configs with several tokens come in clusters of 1, 2 and 4 row blocks on sm_90 (x's
    chunks multicast to the cluster): the model reads x once per cluster and rounds the row blocks
    up to whole clusters, the x chunks' mbarriers add 8 bytes a stage; none at N = 1, for V:N:M or
    off Hopper; their instances are sm_90a and name the cluster."""
    A = st.NM.from_dense(random_2to4(256, 256, torch.float32), 2, 4)
    prob = Problem("linear", "2:4", 1000, 4096, 16, "float16", A.stats(), device="H100 sm_90")
    ring = [c for c in K.space(prob) if c.variant == "mma" and c.stages >= 3]
    assert {c.cluster_m for c in ring} == {1, 2, 4}
    base = next(c for c in ring if c.cluster_m == 1 and c.bm == 16 and c.bn == 16)
    f = K.features(prob, base)
    x_per_tile = 16 * 4096 * 2  # one token strip: bn tokens of K
    for cm in (2, 4):
        cl = dataclasses.replace(base, cluster_m=cm)
        assert cl in ring and K._smem_bytes(cl) == K._smem_bytes(base) + 8 * base.stages
        fc = K.features(prob, cl)
        row_tiles = -(-63 // cm) * cm  # 63 row tiles of 16, whole clusters
        assert fc.tiles == row_tiles and f.tiles == 63
        assert f.l2_bytes - fc.l2_bytes == (63 - row_tiles // cm) * x_per_tile
        (inst,) = K.instances(prob, cl)
        assert dict(inst.defines)["CLUSTER_M"] == cm and inst.arch_specific
    assert "CLUSTER_M" not in dict(K.instances(prob, base)[0].defines)
    assert not any(c.cluster_m > 1 for c in K.space(dataclasses.replace(prob, n=1)))
    assert not any(c.cluster_m > 1 for c in K.space(dataclasses.replace(prob, device="")))
    vnm = st.sparsify_weight(torch.randn(256, 256), "64:2:8")
    assert not any(c.cluster_m > 1 and c.variant == "mma"
                   for c in K.space(Problem("linear", vnm.signature, 1024, 4096, 16, "float16", vnm.stats(),
                                            device="H100 sm_90")))


def test_one_cta_an_sm_configs_only_where_their_ctas_fit_one_wave():
    """16-warp ring configs (the ring past the two-CTA cap) on sm_90 only, where their CTAs (row
    blocks in whole clusters, times token strips) fit the H100 in one wave (7B down, not 7B up);
    within Hopper's shared memory."""
    A = st.NM.from_dense(random_2to4(256, 256, torch.float32), 2, 4)

    def wide(m, n=16, device="H100 sm_90"):
        prob = Problem("linear", "2:4", m, 11008, n, "float16", A.stats(), device=device)
        return [c for c in K.space(prob) if c.num_warps > 8]

    for n in (1, 16):
        configs = wide(4096, n)
        assert configs and all(c.bm == 32 and c.num_warps == 16 and c.stages == 3 for c in configs)
        assert all(K._mma_smem_bytes(c, False, n, 11008) <= K.SMEM_LIMIT_HOPPER for c in configs)
        assert any(K._mma_smem_bytes(c, False, n, 11008) > K.PIPE_SMEM for c in configs)
    assert not wide(11008) and not wide(4096, device="") and wide(32 * 132) and not wide(32 * 132 + 1)
    # at 16 tokens: no 8-token strips (256 CTAs), no clusters of 4 (the GPCs place 30 of them: 120 CTAs)
    assert {(c.bn, c.cluster_m) for c in wide(4096)} == {(16, 1), (16, 2)}
    assert {c.cluster_m for c in wide(3840)} == {1, 2, 4}


def test_the_one_wave_rule_counts_the_local_devices_sms(monkeypatch):
    """An H100 PCIe (114 SMs) runs 7B down's 128 row blocks of 32 in two waves: no 16-warp
    configs there; the device's SM count comes from the local device of the problem's name."""
    from spartune.tune import device as D

    A = st.NM.from_dense(random_2to4(256, 256, torch.float32), 2, 4)
    pcie, sxm = "NVIDIA H100 PCIe sm_90", "NVIDIA H100 80GB HBM3 sm_90"
    monkeypatch.setattr(D, "_local_sms", lambda: {pcie: 114, sxm: 132})
    D.spec_of.cache_clear()
    try:
        assert D.spec_of(pcie).sms == 114 and D.spec_of(sxm) is D.H100 and D.spec_of("elsewhere sm_90") is D.H100
        wide = lambda m, device: [c for c in K.space(  # noqa: E731
            Problem("linear", "2:4", m, 11008, 16, "float16", A.stats(), device=device)) if c.num_warps > 8]
        assert wide(4096, sxm) and not wide(4096, pcie) and wide(32 * 114, pcie)
    finally:
        D.spec_of.cache_clear()


def test_compile_space_rejects_bad_input():
    from spartune import dispatch

    A = st.sparsify_weight(torch.randn(64, 64), "2:4")
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            dispatch.compile_space(A, n)
    with pytest.raises(ValueError, match="dtype must be one of"):
        dispatch.compile_space(A, 16, "int8")


@pytest.mark.parametrize("pattern", ["64:2:8", "128:2:8", "64:2:16", "32:2:32"])
def test_vnm_as_24_is_the_same_matrix_and_runs_2to4_configs(pattern):
    """A V:N:M weight's 2:4 copy (its 2 nonzeros in M columns fit 2:4 over all of K) holds the same
    matrix; the space offers it the 2:4 wgmma tiles (as_24), with 2:4's features and kernels."""
    A = st.sparsify_weight(torch.randn(200, 328, dtype=torch.float16), pattern)
    assert torch.equal(A.as_2to4().to_dense(), A.to_dense())
    hopper = "NVIDIA H100 80GB HBM3 sm_90"
    prob = Problem("linear", A.signature, 4096, 4096, 2048, "float16", A.stats(), device=hopper)
    as_24 = [c for c in K.space(prob) if c.as_24]
    plain = Problem("linear", "2:4", 4096, 4096, 2048, "float16", A.stats(), device=hopper)
    assert as_24 == [dataclasses.replace(c, as_24=True) for c in K.space(plain) if c.variant == "wgmma"]
    for c in as_24[:3]:
        assert K.features(prob, c) == K.features(plain, dataclasses.replace(c, as_24=False))
        assert K.instances(prob, c) == K.instances(plain, dataclasses.replace(c, as_24=False))
    values, meta, mt, kt = K.packed_as_24(A)  # from a 2:4 copy that is not kept
    plain_values, plain_meta, plain_mt, plain_kt = K.packed(A.as_2to4())
    assert torch.equal(values, plain_values) and torch.equal(meta, plain_meta) and (mt, kt) == (plain_mt, plain_kt)
    assert [k for k in A.__dict__ if k.startswith("_nm_")] == ["_nm_as24_packed"]
    K.release_unused(A, [])
    assert not [k for k in A.__dict__ if k.startswith("_nm_")]


@pytest.mark.parametrize("pattern", ["2:4", "64:2:8"])
def test_release_keeps_exactly_what_chosen_configs_read(pattern):
    """The tuner packs a weight for every variant it times (one packing for both, V:N:M's maps and
    as_24 copy beside it); release_unused keeps only what the chosen configs read."""
    A = st.sparsify_weight(torch.randn(192, 256, dtype=torch.float16), pattern)
    nm = lambda: sorted(k for k in A.__dict__ if k.startswith("_nm_"))  # noqa: E731
    mma = K.Config(32, 8, 4, 2, stages=3)
    wgmma = K.Config(128, 256, 12, variant="wgmma", stages=4, cluster_m=2)
    K.packed(A)
    maps = []
    if pattern != "2:4":
        K.column_map(A), K.wgmma_column_map(A, 128), K.packed_as_24(A)
        maps = ["_nm_wgmma_map_128"]  # (the mma variant reads the format's own column offsets)
    K.release_unused(A, [mma, wgmma])
    assert nm() == sorted(["_nm_packed", *maps])
    K.release_unused(A, [mma])
    assert nm() == ["_nm_packed"]
    K.release_unused(A, [])
    assert nm() == []


def test_as_24_needs_m_a_multiple_of_4():
    """With M = 6 a group of 4 columns can straddle two M-blocks and hold 3 or 4 nonzeros: no
    as_24 configs, and a direct conversion says why."""
    A = st.VNM.from_dense(torch.tensor([[0.0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]] * 64).half(), v=64, m=6)
    hopper = "NVIDIA H100 80GB HBM3 sm_90"
    prob = Problem("linear", A.signature, 4096, 4096, 2048, "float16", A.stats(), device=hopper)
    assert K.space(prob) and not [c for c in K.space(prob) if c.as_24]
    with pytest.raises(ValueError, match="straddle"):
        A.as_2to4()


def test_as_24_refuses_a_2to4_weight():
    A = st.sparsify_weight(torch.randn(64, 64, dtype=torch.float16), "2:4")
    cfg = K.Config(128, 256, 12, variant="wgmma", stages=5, as_24=True)
    x = torch.randn(8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="as_24"):
        K.launch(A, x, torch.empty(8, 64, dtype=torch.float16), cfg)
