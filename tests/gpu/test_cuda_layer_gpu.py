"""The CUDA layer on the GPU: NVRTC through cuda.core, the cubin cache across processes, launches
on torch's stream (CUDA graphs too), and the 2:4 sparse tensor-core tile against the float64
reference and the emulation of mma.sp."""
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
import torch

from spartune.kernels import cuda as C
from spartune.kernels.cuda import emulate as E
from spartune.kernels.cuda import runtime as R
from spartune.kernels.cuda import sparse_mma as S

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(private_cache):
    """A fresh cubin cache directory for this module (and the subprocess it starts)."""


def tile_instance(dtype, **extra):
    return C.instance("mma_sp_tile.cu", "mma_sp_tile", {"SPARTUNE_BF16": int(dtype == torch.bfloat16), **extra})


def random_2to4(rows, cols, dtype, gen):
    w = torch.randn(rows, cols, generator=gen)
    rank = torch.rand(rows, cols // 4, 4, generator=gen).argsort(-1).argsort(-1)
    keep = rank < torch.randint(0, 3, (rows, cols // 4, 1), generator=gen)
    return (w.reshape(rows, cols // 4, 4) * keep).reshape(rows, cols).to(dtype)


def run_tiles(inst, values, meta, b_nk):
    """d (tiles, 16, 8) = A_t @ B_t for every tile, one warp each; d is poisoned first."""
    tiles = values.shape[0]
    d = torch.full((tiles, 16, 8), float("nan"), device="cuda")
    C.launch(inst, tiles, 32, values, meta, b_nk, d, tiles)
    return d


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_available():
    assert C.available("cuda"), C.unavailable_reason()


def test_each_instance_is_loaded_once():
    inst = C.instance("arch_probe.cu", "arch_probe")
    first = C.load(inst)
    hits = R.default_cache().stats["disk_hits"] + R.default_cache().stats["compiles"]
    assert C.load(inst) is first and C.load(inst, "cuda") is first
    assert R.default_cache().stats["disk_hits"] + R.default_cache().stats["compiles"] == hits


@pytest.mark.parametrize("dtype", DTYPES)
def test_mma_sp_tile_matches_reference_and_emulation(dtype):
    gen = torch.Generator().manual_seed(11)
    tiles = 64
    w = random_2to4(16 * tiles, 32, dtype, gen)
    values, meta = (t[:, 0] for t in S.pack_dense(w))  # (tiles, 32, 8), (tiles, 32)
    b_nk = torch.randn(tiles, 8, 32, generator=gen).to(dtype)  # B column-major: (n, k)
    d = run_tiles(tile_instance(dtype), values.cuda(), meta.cuda(), b_nk.cuda())
    torch.cuda.synchronize()
    assert not d.isnan().any(), "some outputs were never written"
    b = b_nk.transpose(1, 2)
    ref = w.reshape(tiles, 16, 32).double() @ b.double()
    emulated = E.mma_sp_m16n8k32(values, meta, b)
    assert torch.allclose(emulated, ref, rtol=0, atol=1e-9)
    assert rel(d.cpu(), ref) < 1e-5  # fp32 accumulation of exact products


def test_metadata_layout_matches_the_hardware():
    """Finds, by experiment, which (row, group) each (lane, 4-bit field) of the metadata
    controls, and compares with the packer's layout. Every group keeps positions (0, 1) with
    values (1, 0); one tile per (lane, field) moves that field to positions (2, 3), and
    B[k, n] = k % 4 + 1 on group n's columns, so D[r, n] = 1 + the first kept position."""
    lanes, fields = 32, 8
    tiles = lanes * fields
    compressed = torch.zeros(16, 16, dtype=torch.float16)
    compressed[:, 0::2] = 1.0
    values, _ = S.pack_compressed(compressed, torch.tensor([0, 1]).repeat(16, 8))
    values = values[0, 0].expand(tiles, 32, 8).contiguous()
    base = 0x44444444  # every field 0b0100: positions (0, 1)
    meta = torch.full((tiles, 32), base, dtype=torch.int64)
    for lane in range(lanes):
        for q in range(fields):
            meta[lane * fields + q, lane] = (base & ~(0xF << 4 * q)) | (0b1110 << 4 * q)
    meta = torch.where(meta >= 2**31, meta - 2**32, meta).to(torch.int32)
    k = torch.arange(32)
    b_kn = torch.where(k.view(32, 1) // 4 == torch.arange(8).view(1, 8), (k % 4 + 1).view(32, 1), 0)
    b_nk = b_kn.T.to(torch.float16).expand(tiles, 8, 32).contiguous()
    d = run_tiles(tile_instance(torch.float16), values.cuda(), meta.cuda(), b_nk.cuda()).cpu()

    found, expected = {}, {}
    for lane in range(lanes):
        g, t = divmod(lane, 4)
        for q in range(fields):
            changed = torch.nonzero(d[lane * fields + q] != 1.0).tolist()
            found[(lane, q)] = [(r, n, d[lane * fields + q, r, n].item()) for r, n in changed]
            # the packer's layout (sparse_mma.py): lanes t = 0, 1 supply it (selector 0); the
            # low 16 bits hold row g, the high ones row g + 8; field q % 4 is group 4t + q % 4
            expected[(lane, q)] = [(g + 8 * (q // 4), 4 * t + q % 4, 3.0)] if t < 2 else []
    wrong = {key: (found[key], expected[key]) for key in found if found[key] != expected[key]}
    assert not wrong, f"{len(wrong)} (lane, field) differ; first: {sorted(wrong.items())[:6]}"


def test_graph_capture_and_replay():
    dtype = torch.bfloat16
    inst = tile_instance(dtype, SPARTUNE_GRAPH_TEST=1)  # a fresh instance: its first launch is captured
    C.load(inst)
    gen = torch.Generator().manual_seed(5)
    tiles = 8

    def inputs():
        w = random_2to4(16 * tiles, 32, dtype, gen)
        values, meta = (t[:, 0] for t in S.pack_dense(w))
        return w, values, meta, torch.randn(tiles, 8, 32, generator=gen).to(dtype)

    _, values, meta, b_nk = inputs()
    static = [values.cuda(), meta.cuda(), b_nk.cuda()]
    d = torch.full((tiles, 16, 8), float("nan"), device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C.launch(inst, tiles, 32, *static, d, tiles)
    for _ in range(2):
        w, values, meta, b_nk = inputs()
        for dst, src in zip(static, (values, meta, b_nk)):
            dst.copy_(src)
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = w.reshape(tiles, 16, 32).double() @ b_nk.transpose(1, 2).double()
        assert rel(d.cpu(), ref) < 1e-5


@pytest.mark.parametrize("arch_specific", [False, True])
def test_arch_and_dynamic_shared_memory_above_48kb(arch_specific):
    inst = C.instance("arch_probe.cu", "arch_probe", arch_specific=arch_specific)
    out = torch.zeros(3, dtype=torch.int32, device="cuda")
    words = 100 * 1024 // 4
    C.launch(inst, 1, 256, out, words, shmem=words * 4)
    major, minor = torch.cuda.get_device_capability()
    assert out.tolist() == [100 * major + 10 * minor, int(arch_specific and major == 9), words - 1]


def test_compile_error_names_the_instance_and_carries_nvrtc_log():
    with pytest.raises(C.CudaCompileError) as info:
        C.load(C.instance("mma_sp_tile.cu", "mma_sp_tile"))  # SPARTUNE_BF16 missing: #error
    assert "mma_sp_tile.cu:mma_sp_tile" in str(info.value)
    assert "SPARTUNE_BF16 must be defined" in info.value.log


def test_tensor_on_another_device_is_refused():
    with pytest.raises(ValueError, match="cuda:0"):
        C.launch(C.instance("arch_probe.cu", "arch_probe"), 1, 32, torch.zeros(3, dtype=torch.int32), 0)


def test_second_process_finds_the_cubin_in_the_cache():
    inst = tile_instance(torch.float16)
    C.load(inst)  # compiled (or read) by this process
    code = (
        "import json, torch\n"
        "from spartune.kernels import cuda as C\n"
        "from spartune.kernels.cuda import runtime as R\n"
        "inst = C.instance('mma_sp_tile.cu', 'mma_sp_tile', {'SPARTUNE_BF16': 0})\n"
        "C.load(inst)\n"
        "print(json.dumps(R.default_cache().stats))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["compiles"] == 0 and stats["disk_hits"] == 1, stats


def in_a_new_thread(fn):
    """fn() run as the first code of a new thread (its exception raised here), as the tuner's
    worker runs a launch on a tuning-DB hit."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def test_a_thread_whose_first_cuda_call_is_a_launch():
    """The driver API does not bind torch's context to a new thread as the runtime API does: the
    tuner's worker thread, on a tuning-DB hit, launched before any CUDA call of its own."""
    gen = torch.Generator().manual_seed(5)
    tiles, dtype = 8, torch.float16
    w = random_2to4(16 * tiles, 32, dtype, gen)
    values, meta = (t[:, 0].cuda() for t in S.pack_dense(w))
    b_nk = torch.randn(tiles, 8, 32, generator=gen).to(dtype)
    b_cuda = b_nk.cuda()
    d = torch.full((tiles, 16, 8), float("nan"), device="cuda")
    inst = tile_instance(dtype)
    C.load(inst)
    in_a_new_thread(lambda: (C.launch(inst, tiles, 32, values, meta, b_cuda, d, tiles), torch.cuda.synchronize()))
    ref = w.reshape(tiles, 16, 32).double() @ b_nk.transpose(1, 2).double()
    assert not d.isnan().any() and rel(d.cpu(), ref) < 1e-5


def test_a_thread_whose_first_cuda_call_encodes_a_tensor_map():
    """The same for the copy engine's descriptors: the wgmma kernels encode x's and out's tensor
    maps before their launch, so on a tuning-DB hit the worker thread's first driver call is
    cuTensorMapEncodeTiled (it failed with CUDA_ERROR_INVALID_CONTEXT)."""
    t = torch.randn(100, 64, device="cuda", dtype=torch.float16)
    encoded = in_a_new_thread(lambda: R._encode_tensor_map(t, 100, 64, 128, 64, 32))
    assert encoded == R._encode_tensor_map(t, 100, 64, 128, 64, 32)  # the same descriptor as here


def test_a_cache_directory_that_is_a_file_costs_two_warnings_and_nothing_else(tmp_path):
    """SPARTUNE_CACHE_DIR naming a file (the tuning DB and the cubins cannot live there): tuned
    CSR and 2:4 calls still compile, tune and compute right, with one warning for each cache."""
    blocked = tmp_path / "a-file"
    blocked.write_text("in the way")
    code = (
        "import torch, spartune as st\n"
        "torch.manual_seed(0)\n"
        "for pattern in ('csr', '2:4'):\n"
        "    w = torch.randn(512, 1024, device='cuda', dtype=torch.float16)\n"
        "    A = st.sparsify_weight(w, pattern, 0.9 if pattern == 'csr' else None)\n"
        "    for n in (1, 16):\n"
        "        x = torch.randn(n, 1024, device='cuda', dtype=torch.float16)\n"
        "        y = st.linear(x, A)\n"
        "        ref = x.double() @ A.to_dense().double().T\n"
        "        assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3, (pattern, n)\n"
        "print('computed')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=400,
                         env={**os.environ, "SPARTUNE_CACHE_DIR": str(blocked)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("computed")
    assert out.stderr.count("no tuning DB at") == 1, out.stderr
    assert out.stderr.count("cubin cache at") == 1, out.stderr
