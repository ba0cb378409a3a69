"""The CUDA layer's host side, on the CPU: the cubin cache (key, atomic write, corrupt entries)
with a fake compiler, compile errors, availability, and the 2:4 packing for mma.sp against the
pure-torch emulation of the instruction and a float64 dense product."""
import os
import subprocess
import sys
import weakref

import pytest
import torch
from helpers import mma_registers

from spartune.kernels import cuda as C
from spartune.kernels.cuda import cache as CA
from spartune.kernels.cuda import compiler as K
from spartune.kernels.cuda import emulate as E
from spartune.kernels.cuda import sparse_mma as S

DTYPES = [torch.float16, torch.bfloat16]


class FakeCompiler:
    """Counts compiles; the 'cubin' is derived from the source and options, or it fails."""

    def __init__(self, fail_with: str | None = None):
        self.calls = []
        self.fail_with = fail_with

    def __call__(self, source, options):
        self.calls.append((source, options))
        if self.fail_with is not None:
            raise K.CompilerFailed(self.fail_with)
        return f"cubin of {len(source)} chars for {options['arch']} {options.get('define_macro')}".encode()


@pytest.fixture
def src(tmp_path):
    """A template directory: kernel.cu includes a.cuh, which includes b.cuh."""
    d = tmp_path / "src"
    d.mkdir()
    (d / "kernel.cu").write_text('#include "a.cuh"\nextern "C" __global__ void k(int* x) { x[0] = VALUE; }\n')
    (d / "a.cuh").write_text('#pragma once\n#include "b.cuh"\n#include <cuda_fp16.h>\n')
    (d / "b.cuh").write_text("#pragma once\n// b\n")
    return d


def make_cache(tmp_path, src, compiler):
    return CA.CubinCache(tmp_path / "cubin", compiler=compiler, src_dir=src)


# --- the cache key ---------------------------------------------------------------------------

def test_read_sources_follows_local_includes_only(src):
    (src / "b.cuh").write_text('#pragma once\n#include "cute/tensor.hpp"\n')  # from the include path
    assert set(K.read_sources("kernel.cu", src)) == {"kernel.cu", "a.cuh", "b.cuh"}
    with pytest.raises(FileNotFoundError, match="missing.cu"):
        K.read_sources("missing.cu", src)


def test_cache_key_is_stable(tmp_path, src):
    cache = make_cache(tmp_path, src, FakeCompiler())
    a = C.instance("kernel.cu", "k", {"VALUE": 3, "OTHER": "x"}, max_register_count=64)
    b = C.instance("kernel.cu", "k", {"OTHER": "x", "VALUE": 3}, max_register_count=64)
    assert a == b and hash(a) == hash(b)
    assert cache.path(a, "sm_90", "13.0") == cache.path(b, "sm_90", "13.0")
    assert cache.path(a, "sm_90", "13.0") == make_cache(tmp_path, src, None).path(a, "sm_90", "13.0")


def test_cache_key_changes_with_each_ingredient(tmp_path, src):
    cache = make_cache(tmp_path, src, FakeCompiler())
    inst = C.instance("kernel.cu", "k", {"VALUE": 3})
    base = cache.path(inst, "sm_90", "13.0")
    variants = {
        "define": cache.path(C.instance("kernel.cu", "k", {"VALUE": 4}), "sm_90", "13.0"),
        "option": cache.path(C.instance("kernel.cu", "k", {"VALUE": 3}, max_register_count=64), "sm_90", "13.0"),
        "arch-specific": cache.path(C.instance("kernel.cu", "k", {"VALUE": 3}, arch_specific=True), "sm_90a", "13.0"),
        "arch": cache.path(inst, "sm_100", "13.0"),
        "nvrtc": cache.path(inst, "sm_90", "13.1"),
    }
    (src / "b.cuh").write_text("#pragma once\n// b, edited\n")  # a header two levels down
    variants["header"] = cache.path(inst, "sm_90", "13.0")
    (src / "kernel.cu").write_text((src / "kernel.cu").read_text() + "// edited\n")
    variants["source"] = cache.path(inst, "sm_90", "13.0")
    paths = [base, *variants.values()]
    assert len(set(paths)) == len(paths), variants
    assert all(p.parent == tmp_path / "cubin" and p.name.startswith("kernel-") for p in paths)


def test_cache_dir_follows_spartune_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARTUNE_CACHE_DIR", str(tmp_path))
    assert CA.default_dir() == tmp_path / "cubin"
    assert CA.CubinCache().directory == tmp_path / "cubin"


# --- compiling once, from disk afterwards ----------------------------------------------------

def test_compiles_once_then_reads_from_disk(tmp_path, src):
    fake = FakeCompiler()
    inst = C.instance("kernel.cu", "k", {"VALUE": 3})
    first = make_cache(tmp_path, src, fake)
    cubin = first.get(inst, "sm_90", "13.0")
    assert len(fake.calls) == 1 and first.stats["compiles"] == 1
    source, options = fake.calls[0]
    assert source == (src / "kernel.cu").read_text()
    assert options["arch"] == "sm_90" and options["define_macro"] == [("VALUE", "3")]
    assert options["include_path"][0] == str(src)

    second = make_cache(tmp_path, src, fake)  # another process, in effect
    assert second.get(inst, "sm_90", "13.0") == cubin
    assert len(fake.calls) == 1 and second.stats == {**second.stats, "compiles": 0, "disk_hits": 1}

    second.get(C.instance("kernel.cu", "k", {"VALUE": 4}), "sm_90", "13.0")
    assert len(fake.calls) == 2


def test_instances_compile_in_parallel_and_one_entry_once(tmp_path, src):
    """Threads compiling different instances overlap (the tuner compiles the configs it will
    time at once); threads asking for the same one wait for a single compile."""
    import threading
    import time

    running, most, lock = [0], [0], threading.Lock()

    class Slow(FakeCompiler):
        def __call__(self, source, options):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.2)
            with lock:
                running[0] -= 1
            return super().__call__(source, options)

    fake = Slow()
    cache = make_cache(tmp_path, src, fake)
    insts = [C.instance("kernel.cu", "k", {"VALUE": v}) for v in (1, 2, 3, 1, 1)]
    threads = [threading.Thread(target=cache.get, args=(i, "sm_90", "13.0")) for i in insts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] >= 2 and len(fake.calls) == 3
    assert cache.stats["compiles"] == 3 and cache.stats["disk_hits"] == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_recompiled_and_replaced(tmp_path, src, damage):
    fake = FakeCompiler()
    inst = C.instance("kernel.cu", "k", {"VALUE": 3})
    cubin = make_cache(tmp_path, src, fake).get(inst, "sm_90", "13.0")
    path = make_cache(tmp_path, src, fake).path(inst, "sm_90", "13.0")
    blob = path.read_bytes()
    broken = {"truncate": blob[:-5], "flip": blob[:-1] + bytes([blob[-1] ^ 1]), "garbage": b"not a cubin" * 9,
              "empty": b""}[damage]
    path.write_bytes(broken)

    cache = make_cache(tmp_path, src, fake)
    assert cache.get(inst, "sm_90", "13.0") == cubin
    assert len(fake.calls) == 2 and cache.stats["corrupt"] == 1
    assert CA.decode_entry(path.read_bytes()) == cubin  # replaced by an intact entry
    make_cache(tmp_path, src, fake).get(inst, "sm_90", "13.0")
    assert len(fake.calls) == 2


def test_entry_header_detects_damage():
    blob = CA.encode_entry(b"payload")
    assert blob.startswith(CA.MAGIC) and CA.decode_entry(blob) == b"payload"
    assert CA.decode_entry(blob + b"x") is None
    assert CA.decode_entry(blob[:10]) is None


def test_atomic_write_leaves_old_file_or_new_one(tmp_path, monkeypatch):
    path = tmp_path / "d" / "entry.cubin"
    CA.write_atomic(path, b"old")
    CA.write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["entry.cubin"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(CA.os, "replace", broken_replace)
    with pytest.raises(OSError):
        CA.write_atomic(path, b"newer")
    assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["entry.cubin"]  # no temp file left


def test_unwritable_cache_still_returns_the_cubin(tmp_path, src, monkeypatch):
    fake = FakeCompiler()
    monkeypatch.setattr(CA, "write_atomic", lambda path, data: (_ for _ in ()).throw(OSError("read-only")))
    cubin = make_cache(tmp_path, src, fake).get(C.instance("kernel.cu", "k", {"VALUE": 3}), "sm_90", "13.0")
    assert cubin.startswith(b"cubin")


def test_a_read_only_cache_is_still_read(tmp_path, src, monkeypatch, caplog):
    """A warmed cache on a read-only mount: after the first write fails, the entries it holds are
    still read (only the missing ones compile), with one warning."""
    fake = FakeCompiler()
    cache = make_cache(tmp_path, src, fake)
    stored = cache.get(C.instance("kernel.cu", "k", {"VALUE": 0}), "sm_90", "13.0")
    monkeypatch.setattr(CA, "write_atomic", lambda path, data: (_ for _ in ()).throw(OSError(30, "read-only")))
    cache = make_cache(tmp_path, src, fake)  # another process
    with caplog.at_level("WARNING", logger="spartune.cuda"):
        for v in (1, 2, 0):
            got = cache.get(C.instance("kernel.cu", "k", {"VALUE": v}), "sm_90", "13.0")
    assert got == stored and cache.stats["disk_hits"] == 1 and cache.stats["compiles"] == 2
    assert len(caplog.records) == 1


def test_a_file_in_place_of_the_cache_costs_one_warning(tmp_path, src, caplog):
    """SPARTUNE_CACHE_DIR naming a file: every instance still compiles and returns its cubin; the
    process warns once, not twice per instance."""
    (tmp_path / "cubin").write_text("not a directory")
    fake = FakeCompiler()
    cache = make_cache(tmp_path, src, fake)
    with caplog.at_level("WARNING", logger="spartune.cuda"):
        cubins = [cache.get(C.instance("kernel.cu", "k", {"VALUE": v}), "sm_90", "13.0") for v in range(4)]
        cubins.append(cache.get(C.instance("kernel.cu", "k", {"VALUE": 0}), "sm_90", "13.0"))
    assert len(set(cubins)) == 4 and cubins[0] == cubins[-1] and len(fake.calls) == 5
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "cannot hold new entries" in message and str(tmp_path / "cubin") in message


def test_compile_error_names_the_instance_and_carries_the_log(tmp_path, src):
    log = 'kernel.cu(2): error: identifier "VALUE" is undefined'
    cache = make_cache(tmp_path, src, FakeCompiler(fail_with=log))
    inst = C.instance("kernel.cu", "k", {"OTHER": 1})
    with pytest.raises(C.CudaCompileError) as info:
        cache.get(inst, "sm_90", "13.0")
    err = info.value
    assert err.instance == inst and err.log == log
    assert "kernel.cu" in str(err) and ":k(" in str(err) and "OTHER=1" in str(err) and log in str(err)
    assert not (tmp_path / "cubin").exists() or not os.listdir(tmp_path / "cubin")  # nothing stored


def test_instance_rejects_bad_defines():
    with pytest.raises(ValueError, match="define"):
        C.instance("kernel.cu", "k", {"not an identifier": 1})
    with pytest.raises(ValueError, match="define"):
        C.instance("kernel.cu", "k", {"X": 1.5})


def test_launch_arguments_are_pointers_int32_and_descriptors():
    """What cuLaunchKernel reads: each argument at its C type and natural alignment."""
    import ctypes
    import struct

    import numpy as np

    from spartune.kernels.cuda import runtime as R

    t = torch.zeros(4)
    desc = bytes(range(128))
    args = (t, 7, True, 0.5, np.uint64(2**40), desc, -3, np.float64(0.25))
    params = R.KernelParams(tuple(map(type, args)))
    params.pack(params.values(args, -1))  # -1: the CPU, as torch's get_device() says
    assert params.unpack() == (t.data_ptr(), 7, 1, 0.5, 2**40, desc, -3, 0.25)
    pointers = [params.pointers[i] for i in range(len(args))]
    # each pointer holds its argument's bytes: 8-byte pointer, int32s, fp32, the 64-aligned struct
    assert ctypes.c_uint64.from_address(pointers[0]).value == t.data_ptr()
    assert [ctypes.c_int32.from_address(pointers[i]).value for i in (1, 2, 6)] == [7, 1, -3]
    assert ctypes.c_float.from_address(pointers[3]).value == 0.5
    assert ctypes.string_at(pointers[5], 128) == desc and pointers[5] % 64 == 0
    assert struct.unpack("=f", ctypes.string_at(pointers[7], 4))[0] == 0.25
    with pytest.raises(ValueError, match="cuda:0"):
        params.values(args, 0)
    with pytest.raises(ValueError, match="128-byte"):
        params.values((t, 7, True, 0.5, np.uint64(1), b"abc", -3, 0.25), -1)
    with pytest.raises(OverflowError, match="int32"):
        R.KernelParams((int,)).pack([2**31])
    with pytest.raises(TypeError, match="str"):
        R.KernelParams((str,))


def test_device_arch():
    assert K.device_arch((9, 0), False) == "sm_90"
    assert K.device_arch((9, 0), True) == "sm_90a"
    assert K.device_arch((8, 6), False) == "sm_86"


# --- availability ----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_unavailable_without_a_gpu():
    assert not C.available()
    assert not C.available("cuda")
    assert C.unavailable_reason() == "no CUDA device"


def test_unavailable_on_cpu_device_or_without_cuda_core(monkeypatch):
    assert not C.available("cpu")
    C.unavailable_reason.cache_clear()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setitem(sys.modules, "cuda.core", None)  # as if cuda-core were not installed
        assert not C.available("cuda")
        assert "cuda.core" in C.unavailable_reason()
    finally:
        C.unavailable_reason.cache_clear()


def test_package_imports_without_cuda_core():
    code = ("import sys; sys.modules['cuda'] = None; sys.modules['cuda.core'] = None\n"
            "import spartune.kernels.cuda as C\n"
            "assert C.available() in (False, True)\n"
            "print(C.unavailable_reason())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no CUDA device" or "Error" in out.stdout


# --- 2:4 packing for mma.sp m16n8k32 and its emulation ----------------------------------------

def random_2to4(rows, cols, dtype, gen, zeros_per_group=None):
    """A random 2:4 matrix; each group of 4 keeps 0, 1 or 2 nonzeros (at random positions)."""
    w = torch.randn(rows, cols, generator=gen)
    w = torch.where(w == 0, torch.ones(()), w)
    groups = w.reshape(rows, cols // 4, 4)
    rank = torch.rand(rows, cols // 4, 4, generator=gen).argsort(-1).argsort(-1)  # a random order
    kept = torch.randint(0, 3, (rows, cols // 4, 1), generator=gen) if zeros_per_group is None else \
        torch.full((rows, cols // 4, 1), 4 - zeros_per_group)
    keep = rank < kept
    return (groups * keep).reshape(rows, cols).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(16, 32), (48, 96), (32, 256)])
def test_packing_round_trips(dtype, rows, cols):
    gen = torch.Generator().manual_seed(rows * cols)
    for zeros in (None, 2, 4):
        w = random_2to4(rows, cols, dtype, gen, zeros)
        values, meta = S.pack_dense(w)
        assert values.shape == (rows // 16, cols // 32, 32, 8) and values.dtype == dtype
        assert meta.shape == (rows // 16, cols // 32, 32) and meta.dtype == torch.int32
        assert torch.equal(E.decode_matrix(values, meta), w.double())


@pytest.mark.parametrize("dtype", DTYPES)
def test_emulation_matches_float64_dense_product(dtype):
    gen = torch.Generator().manual_seed(7)
    tiles = 20
    w = random_2to4(16 * tiles, 32, dtype, gen)
    a = w.reshape(tiles, 16, 32)
    b = torch.randn(tiles, 32, 8, generator=gen).to(dtype)
    c = torch.randn(tiles, 16, 8, generator=gen)
    values, meta = S.pack_dense(w)  # (tiles, 1, 32, 8)
    got = E.mma_sp_m16n8k32(values[:, 0], meta[:, 0], b, c)
    ref = a.double() @ b.double() + c.double()
    assert torch.allclose(got, ref, rtol=0, atol=1e-9)
    assert not torch.allclose(got, c.double())  # the product is not trivially zero


def test_register_layout_follows_the_ptx_isa():
    """Spot checks written out by hand from the ISA's fragment tables."""
    w = torch.zeros(16, 32)
    w[9, 20 + 1], w[9, 20 + 3] = 5.0, 6.0  # row 9, group 5 (columns 20..23): positions 1 and 3
    w[2, 8 + 0], w[2, 8 + 2] = 7.0, 8.0  # row 2, group 2: positions 0 and 2
    values, meta = S.pack_dense(w.half())
    values, meta = values[0, 0].float(), meta[0, 0]
    # compressed (row 9, cols 10, 11) = group 5's values: lane 4*1 + 1 (g=1, t=1), halves 6, 7
    # (bottom-right quadrant: row g + 8, columns 2t + 8 + (0, 1))
    assert values[5, 6] == 5.0 and values[5, 7] == 6.0
    # compressed (row 2, cols 4, 5): lane 4*2 + 2 (g=2, t=2), halves 0, 1 (top-left quadrant)
    assert values[10, 0] == 7.0 and values[10, 1] == 8.0
    # metadata: row 9 = row g + 8 of g=1, group 5 -> lane 4*1 + 1, bits 16 + 4*1: 1 | 3 << 2
    assert (int(meta[5]) >> 20) & 0xF == 0b1101
    # row 2, group 2 -> lane 4*2 + 0, bits 4*2: 0 | 2 << 2
    assert (int(meta[8]) >> 8) & 0xF == 0b1000
    # lanes t = 2, 3 repeat t = 0, 1
    assert torch.equal(meta.view(8, 4)[:, 2:], meta.view(8, 4)[:, :2])
    # empty groups keep positions 0 and 1 (nibble 0b0100)
    assert int(meta[0]) & 0xF == 0b0100


def test_packing_rejects_bad_input():
    w = torch.zeros(16, 32, dtype=torch.float16)
    w[3, 4:7] = 1.0  # three nonzeros in group 1 of row 3
    with pytest.raises(ValueError, match="row 3, columns 4..7"):
        S.pack_dense(w)
    with pytest.raises(ValueError, match="multiple"):
        S.pack_dense(torch.zeros(8, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        S.pack_dense(torch.zeros(16, 32))
    values, idx = S.compress(torch.zeros(16, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="increasing"):
        S.pack_compressed(values, torch.zeros_like(idx))


def test_emulation_rejects_invalid_metadata():
    values, meta = S.pack_dense(torch.zeros(16, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="metadata"):
        E.decode(values[0, 0], torch.zeros_like(meta[0, 0]))  # positions (0, 0) everywhere


def test_emulation_selector_one_reads_lanes_two_and_three():
    gen = torch.Generator().manual_seed(3)
    w = random_2to4(16, 32, torch.float16, gen)
    values, meta = S.pack_dense(w)
    assert torch.equal(E.decode(values[0, 0], meta[0, 0], selector=1), w.double())


# --- the real NVRTC, where it exists (compiles only; no GPU needed) --------------------------

def _nvrtc_ready():
    try:
        K.nvrtc_version()
        K.cuda_include_dirs()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ready(), reason="needs NVRTC and the CUDA headers")


@needs_nvrtc
def test_nvrtc_compiles_the_tile_kernel(tmp_path):
    cache = CA.CubinCache(tmp_path)
    for bf16 in (0, 1):
        inst = C.instance("mma_sp_tile.cu", "mma_sp_tile", {"SPARTUNE_BF16": bf16})
        cubin = cache.get(inst, "sm_90", K.nvrtc_version())
        assert cubin[:4] == b"\x7fELF"
    assert cache.stats["compiles"] == 2


@needs_nvrtc
def test_nvrtc_error_names_the_instance(tmp_path):
    inst = C.instance("mma_sp_tile.cu", "mma_sp_tile")  # SPARTUNE_BF16 missing: #error
    with pytest.raises(C.CudaCompileError) as info:
        CA.CubinCache(tmp_path).get(inst, "sm_90", K.nvrtc_version())
    assert "mma_sp_tile.cu:mma_sp_tile" in str(info.value)
    assert "SPARTUNE_BF16 must be defined" in info.value.log


def test_grid_and_block_dimensions():
    """An int or 1-3 ints become the driver's three; a value past 31 bits is refused (ctypes would
    wrap it into a smaller grid without a word)."""
    import numpy as np

    from spartune.kernels.cuda import runtime as R

    assert R._dim3(5) == (5, 1, 1) and R._dim3(np.int64(4)) == (4, 1, 1)
    assert R._dim3((2, 3)) == (2, 3, 1) and R._dim3([2, 3, 4]) == (2, 3, 4)
    for bad in (0, -1, 2**32 + 5, (1, 2, 3, 4), ()):
        with pytest.raises(ValueError, match="dimensions"):
            R._dim3(bad)


def test_prepared_launch_packs_once_and_fills_its_slots(monkeypatch):
    """A bound call's launch: every argument packed when prepared, then only the slots change
    (a tensor's address, None as a null pointer, a descriptor), on each call's current stream."""
    import ctypes

    import numpy as np

    from spartune.kernels.cuda import runtime as R

    seen = []

    def fake_launch(handle, gx, gy, gz, bx, by, bz, shmem, stream, pointers, extra):
        p = ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p))
        seen.append(((handle, gx, gy, gz, bx, by, bz, shmem, stream),
                     ctypes.c_uint64.from_address(p[0]).value, ctypes.c_int32.from_address(p[1]).value,
                     ctypes.c_uint64.from_address(p[2]).value, ctypes.string_at(p[3], 128)))
        return 0

    monkeypatch.setattr(R, "_launch_kernel", fake_launch)
    monkeypatch.setattr(R, "_current_stream_handle", lambda index: 77)
    kernel = R.LoadedKernel.__new__(R.LoadedKernel)
    kernel.device_index, kernel._handle, kernel._shmem_limit = -1, 5, R.DEFAULT_SHMEM_LIMIT
    a, b, c = torch.zeros(4), torch.zeros(8), torch.zeros(2)
    desc = bytes(range(128))
    prepared = kernel.prepare((3, 1, 1), 128, a, 9, np.uint64(0), desc,
                              shmem=1024, slots=(0, 2, 3))
    prepared(b, c, bytes(128))
    prepared(a, None, desc)
    assert seen == [((5, 3, 1, 1, 128, 1, 1, 1024, 77), b.data_ptr(), 9, c.data_ptr(), bytes(128)),
                    ((5, 3, 1, 1, 128, 1, 1, 1024, 77), a.data_ptr(), 9, 0, desc)]
    with pytest.raises(ValueError):  # as many values as slots
        prepared(a, None)
    # what a fixed descriptor points into is held as long as the launch is (a weight's packing)
    weight = torch.zeros(16)
    ref = weakref.ref(weight)
    held = kernel.prepare(1, 1, a, 9, np.uint64(0), desc, slots=(0,), reads=(weight,))
    del weight
    assert ref() is not None
    del held
    assert ref() is None
    with pytest.raises(TypeError, match="slot 1"):  # an int is the kernel's, not a pointer to fill
        kernel.prepare(1, 1, a, 9, slots=(1,))
    with pytest.raises(ValueError, match="cuda:0"):  # tensors are checked once, when prepared
        kernel.device_index = 0
        kernel.prepare(1, 1, a, 9, slots=(0,))


def test_tensor_map_3d_refuses_what_the_copy_engine_cannot_read():
    """A 3-D descriptor (the wgmma producer's boxes of the packed weight) needs the last dimension
    contiguous and 16-byte strides: anything else is refused before the driver is asked."""
    from spartune.kernels.cuda import runtime as R

    for t in (torch.zeros(4, 4, dtype=torch.float16),  # not 3-D
              torch.zeros(2, 3, 8, dtype=torch.float64),  # a dtype it does not take
              torch.zeros(2, 8, 3, dtype=torch.float16).transpose(1, 2),  # last dimension strided
              torch.zeros(2, 3, 4, dtype=torch.float16)):  # 8-byte rows
        with pytest.raises(ValueError, match="tensor_map_3d needs"):
            R.tensor_map_3d(t, (4, 1, 1))


def test_core_matrix_packing_holds_the_register_packings_values():
    """The two packers agree: lane (g, t)'s registers are rows g, g + 8 x columns 2t, 8 + 2t of the
    core matrices (the words the mma kernel loads), and the metadata is the same."""
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(48, 96, generator=g) * torch.tensor([1.0, 0, 1, 0]).repeat(24)).half()
    values, idx = S.compress(w)
    regs, meta = S.pack_compressed(values, idx)
    cores, meta_cores = S.pack_core_matrices(values, idx)
    assert cores.shape == (3, 3, 2, 2, 8, 8) and torch.equal(meta, meta_cores)
    assert torch.equal(mma_registers(cores.reshape(3, 3, 256)), regs)
