"""Loading cubins and launching their kernels on torch's current stream.

A process loads each (instance, device) once. A launch passes tensors by `data_ptr()` and
Python ints as int32, allocates nothing, never synchronises, and goes on
`torch.cuda.current_stream()`, so it can be captured in a CUDA graph like any torch op.
"""
from __future__ import annotations

import ctypes
import functools
import operator
import os
import struct
import threading

import numpy as np
import torch

from .cache import CubinCache
from .compiler import Instance, device_arch, nvrtc_version

DEFAULT_SHMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in

_lock = threading.Lock()
_loaded: dict[tuple[Instance, int], "LoadedKernel"] = {}
_cache: CubinCache | None = None


_cache_lock = threading.Lock()  # (not _lock: load() holds that while it reads the cache)


def default_cache() -> CubinCache:
    """The process's cubin cache (in the spartune cache directory at first use; one even when
    the tuner's compile threads ask for it first at once)."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                _cache = CubinCache()
    return _cache


def set_cache(cache: CubinCache | None) -> None:
    """Use another cache (tests); forgets every loaded kernel."""
    global _cache
    with _lock:
        _cache = cache
        _loaded.clear()


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"CUDA kernels run on a CUDA device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def load(inst: Instance, device=None) -> "LoadedKernel":
    """The instance's kernel on `device` (default: the current one), compiled or read from the
    cubin cache at first use. Raises CudaCompileError when it does not compile."""
    index = _device_index(device)
    kernel = _loaded.get((inst, index))
    if kernel is None:
        with _lock:
            kernel = _loaded.get((inst, index))
            if kernel is None:
                kernel = _loaded[(inst, index)] = _load(inst, index)
    return kernel


def precompile(insts, device=None, workers: int | None = None) -> None:
    """Compile the instances missing from the cubin cache, several at once (NVRTC runs without
    the GIL): the tuner's first use of a shape compiles the configs it is about to time this
    way instead of one after the other. Errors are left for `load` to raise."""
    from concurrent.futures import ThreadPoolExecutor

    insts = list(dict.fromkeys(insts))
    if not insts:
        return
    index = _device_index(device)
    todo = [inst for inst in insts if (inst, index) not in _loaded]
    if not todo:
        return
    capability, version, cache = torch.cuda.get_device_capability(index), nvrtc_version(), default_cache()

    def compile_one(inst):
        try:
            cache.get(inst, device_arch(capability, inst.arch_specific), version)
        except Exception:  # noqa: BLE001 (load raises it again, where the caller records it)
            pass

    workers = workers or min(len(todo), os.cpu_count() or 1, 8)
    if workers <= 1 or len(todo) == 1:
        for inst in todo:
            compile_one(inst)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="spartune-nvrtc") as pool:
        list(pool.map(compile_one, todo))


def _load(inst: Instance, index: int) -> "LoadedKernel":
    from cuda.core import ObjectCode

    arch = device_arch(torch.cuda.get_device_capability(index), inst.arch_specific)
    cubin = default_cache().get(inst, arch, nvrtc_version())
    code = ObjectCode.from_cubin(cubin, name=inst.describe())
    return LoadedKernel(inst, index, code, code.get_kernel(inst.kernel))


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher reads


def _current_stream_handle(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


# How each kind of argument is passed: (struct code, size, alignment). Tensors go by address,
# Python ints and bools as int32 (a bare int must not become a pointer), floats as fp32, bytes
# (a TMA descriptor from `tensor_map_2d`) as a 128-byte struct by value; numpy scalars as typed.
_KINDS = {int: ("i", 4, 4), bool: ("i", 4, 4), float: ("f", 4, 4), bytes: ("128s", 128, 64),
          np.int32: ("i", 4, 4), np.uint32: ("I", 4, 4), np.int64: ("q", 8, 8), np.uint64: ("Q", 8, 8),
          np.float32: ("f", 4, 4)}
_POINTER = ("Q", 8, 8)


@functools.lru_cache(maxsize=256)
def _signature_layout(signature: tuple[type, ...]) -> tuple:
    """(struct, each argument's offset, the tensors' indices, the descriptors', size in bytes)."""
    fmt, offsets, end = "=", [], 0
    for kind in signature:
        if issubclass(kind, torch.Tensor):
            code, size, align = _POINTER
        else:
            base = kind if kind in _KINDS else next((k for k in (bool, int, float) if issubclass(kind, k)), None)
            if base is None:
                raise TypeError(f"unsupported kernel argument {kind.__name__}")
            code, size, align = _KINDS[base]
        pad = -end % align
        fmt += f"{pad}x{code}" if pad else code
        offsets.append(end + pad)
        end += pad + size
    tensors = tuple(i for i, kind in enumerate(signature) if issubclass(kind, torch.Tensor))
    structs = tuple(i for i, kind in enumerate(signature) if kind is bytes)
    return struct.Struct(fmt), tuple(offsets), tensors, structs, end


class KernelParams:
    """The `kernelParams` of one argument signature: a buffer holding every argument at its
    natural alignment and the array of pointers into it that cuLaunchKernel reads. The driver
    copies the arguments before the launch returns, so a buffer serves every launch of its
    PreparedLaunch (one at a time: the launch releases the GIL)."""

    def __init__(self, signature: tuple[type, ...]):
        self.struct, self.offsets, self.tensors, self.structs, end = _signature_layout(signature)
        self._buffer = ctypes.create_string_buffer(end + 64)
        base = ctypes.addressof(self._buffer)
        base += -base % 64  # the descriptors' alignment, for the buffer's start too
        self._view = (ctypes.c_char * max(end, 1)).from_address(base)
        self.pointers = (ctypes.c_void_p * max(len(self.offsets), 1))(*[base + o for o in self.offsets])

    def values(self, args, device_index: int) -> list:
        """What the launch packs: tensors by address (on the kernel's device), the rest as given."""
        values = list(args)
        for i in self.tensors:
            t = values[i]
            if t.get_device() != device_index:
                raise ValueError(f"a tensor argument is on {t.device}, the kernel on cuda:{device_index}")
            values[i] = t.data_ptr()
        for i in self.structs:
            if len(values[i]) != 128:
                raise ValueError(f"a struct passed by value must be a 128-byte TMA descriptor, got {len(values[i])} bytes")
        return values

    def pack(self, values: list) -> None:
        try:
            self.struct.pack_into(self._view, 0, *values)
        except struct.error as e:
            raise OverflowError(f"a kernel argument does not fit its C type (int32 for Python ints): {e}") from None

    def unpack(self) -> tuple:
        return self.struct.unpack_from(self._view, 0)


DIM_LIMIT = 1 << 31


def _dim3(v) -> tuple[int, int, int]:
    """A grid or block given as an int or 1-3 ints, as the driver's three dimensions (checked:
    ctypes would wrap a value past 32 bits into a smaller grid without a word)."""
    if type(v) is tuple and len(v) == 3 and 0 < min(v) <= max(v) < DIM_LIMIT:  # every launch's case
        return v
    v = (operator.index(v),) if not isinstance(v, (tuple, list)) else tuple(map(operator.index, v))
    if not 1 <= len(v) <= 3 or not all(0 < d < DIM_LIMIT for d in v):
        raise ValueError(f"a grid or block has 1 to 3 dimensions, each 1 to 2**31 - 1, got {v}")
    return v + (1,) * (3 - len(v))


_launch_kernel = None
CUDA_ERROR_INVALID_CONTEXT = 201


def _bind_primary_context(index: int) -> bool:
    """Make the device's primary context (torch's) current on a thread that has none (the driver
    API does not bind it lazily as the runtime API does); False when the thread has one."""
    from cuda.bindings import driver

    err, current = driver.cuCtxGetCurrent()
    _check(err, "cuCtxGetCurrent")
    if int(current) != 0:
        return False
    err, dev = driver.cuDeviceGet(index)
    _check(err, "cuDeviceGet")
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)  # torch holds it too: never released here
    _check(err, "cuDevicePrimaryCtxRetain")
    (err,) = driver.cuCtxSetCurrent(ctx)
    _check(err, "cuCtxSetCurrent")
    return True


def _cu_launch_kernel():
    """libcuda's cuLaunchKernel through ctypes: a few microseconds a launch from Python, where
    cuda.core's launch (each argument converted through its own objects) took ~20."""
    global _launch_kernel
    if _launch_kernel is None:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _launch_kernel = fn
    return _launch_kernel


class LoadedKernel:
    """A kernel ready to launch: `kernel(grid, block, *args, shmem=bytes)`."""

    def __init__(self, inst: Instance, device_index: int, code, kernel):
        self.instance = inst
        self.device_index = device_index
        self.code = code  # keeps the module loaded
        self.kernel = kernel
        self._handle = int(kernel.handle)  # a CUkernel, which cuLaunchKernel takes for a CUfunction
        self._shmem_limit = DEFAULT_SHMEM_LIMIT

    def __call__(self, grid, block, *args, shmem: int = 0) -> None:
        """Launch once on the current stream (the families' repeated launches are prepared once:
        `prepare`)."""
        self.prepare(grid, block, *args, shmem=shmem)()

    def prepare(self, grid, block, *args, shmem: int = 0, slots: tuple[int, ...] = (),
                reads: tuple[torch.Tensor, ...] = ()) -> "PreparedLaunch":
        """This launch with its arguments packed once; a call fills the arguments at `slots`.
        reads: tensors that fixed descriptors among the arguments point into (held as the
        fixed tensor arguments are)."""
        return PreparedLaunch(self, grid, block, args, shmem, slots, reads)

    def _reserve(self, shmem: int) -> None:
        if shmem > self._shmem_limit:
            self.allow_shared_memory(shmem)

    def _launch(self, launch_args: tuple, pointers) -> None:
        """cuLaunchKernel((kernel, grid, block, shmem), the current stream, `pointers`)."""
        stream = _current_stream_handle(self.device_index)
        launch = _cu_launch_kernel()
        err = launch(*launch_args, stream, pointers, None)
        if err == CUDA_ERROR_INVALID_CONTEXT and _bind_primary_context(self.device_index):
            # a thread whose first CUDA call this is (the tuner's worker on a DB hit)
            err = launch(*launch_args, stream, pointers, None)
        if err:
            from cuda.bindings import driver

            _check(driver.CUresult(err), f"launching {self.instance.describe()}")

    def allow_shared_memory(self, nbytes: int) -> None:
        """Raise the kernel's dynamic shared memory limit (needed above 48 KB)."""
        from cuda.bindings import driver

        err, dev = driver.cuDeviceGet(self.device_index)
        _check(err, "cuDeviceGet")
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        handle = self.kernel.handle
        if isinstance(handle, driver.CUkernel):
            (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, dev)
        else:
            (err,) = driver.cuFuncSetAttribute(handle, attr, nbytes)
        _check(err, f"setting {nbytes} bytes of dynamic shared memory for {self.instance.describe()}")
        self._shmem_limit = nbytes


_POINTER_SLOT, _STRUCT_SLOT = struct.Struct("=Q"), struct.Struct("=128s")


class PreparedLaunch:
    """One kernel's launch with its grid, block and arguments packed once, the arguments at
    `slots` filled on each call: what a bound call changes (tensors' addresses, a TMA
    descriptor). The caller vouches that those tensors are on the kernel's device and laid out
    as the ones prepared with (dispatch keys its bound calls by that layout). A slot takes a
    tensor, None (a null pointer) or, where bytes were prepared, a 128-byte descriptor."""

    def __init__(self, kernel: LoadedKernel, grid, block, args: tuple, shmem: int, slots: tuple[int, ...],
                 reads: tuple[torch.Tensor, ...] = ()):
        kernel._reserve(shmem)
        params = KernelParams(tuple(map(type, args)))
        params.pack(params.values(args, kernel.device_index))  # (checks every tensor's device once)
        for i in slots:
            if not (type(args[i]) is bytes or isinstance(args[i], (torch.Tensor, np.uint64))):
                raise TypeError(f"slot {i} holds a pointer or a descriptor, got {type(args[i]).__name__}")
        self._kernel, self._params = kernel, params
        # the tensors it reads at fixed addresses (a weight's packed layouts, a workspace) live as
        # long as it does, whatever their owner drops
        self._holds = [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in slots] + list(reads)
        self._launch_args = (kernel._handle, *_dim3(grid), *_dim3(block), shmem)
        self._slots = tuple((params.offsets[i], _STRUCT_SLOT if type(args[i]) is bytes else _POINTER_SLOT)
                            for i in slots)
        self._lock = threading.Lock()  # one buffer: a call on another thread waits for the driver to copy it

    def __call__(self, *values) -> None:
        with self._lock:
            view = self._params._view
            for (offset, slot), v in zip(self._slots, values, strict=True):
                slot.pack_into(view, offset, v if slot is _STRUCT_SLOT else 0 if v is None else v.data_ptr())
            self._kernel._launch(self._launch_args, self._params.pointers)


_tensor_maps: dict[tuple, bytes] = {}  # (address, geometry, dtype, box) -> descriptor


def tensor_map_2d(t: torch.Tensor, box_cols: int, box_rows: int) -> bytes:
    """The TMA descriptor (CUtensorMap, 128 bytes) of a 2-D fp16/bf16 tensor with unit column
    stride, read in boxes of box_cols x box_rows elements with 128-byte swizzle (box_cols * 2
    must be 128) and zeros out of bounds. The kernel takes it as a `__grid_constant__` struct.
    A descriptor holds only the address and the geometry, so one is encoded per distinct
    (address, shape, pitch, dtype, box): repeated calls on the same buffers cost a dict lookup."""
    rows, cols = t.shape
    pitch = t.stride(0) * 2 if rows > 1 else -(-cols * 2 // 16) * 16  # one row: its stride means nothing
    key = (t.data_ptr(), rows, cols, pitch, t.dtype, box_cols, box_rows)
    desc = _tensor_maps.get(key)
    if desc is None:
        if len(_tensor_maps) > 4096:  # addresses follow the allocator: keep the dict bounded
            _tensor_maps.clear()
        desc = _tensor_maps[key] = _encode_tensor_map(t, rows, cols, pitch, box_cols, box_rows)
    return desc


# the tensor copy engine's element types that the kernels read (CUtensorMapDataType's names)
_TMA_DTYPES = {torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16", torch.int32: "INT32"}


def tensor_map_3d(t: torch.Tensor, box: tuple[int, int, int]) -> bytes:
    """The TMA descriptor of a 3-D tensor t (d0, d1, d2), d2 contiguous, read in boxes of
    box = (along d2, d0, d1) elements, no swizzle, zeros out of bounds: the box lands in shared
    memory d2 fastest, then d0, then d1 (a (tile, K step, unit) packing read as (K step, tile))."""
    size = t.element_size()
    strides = [t.stride(0) * size, t.stride(1) * size]
    if t.dim() != 3 or t.dtype not in _TMA_DTYPES or t.stride(2) != 1 or t.data_ptr() % 16 \
            or any(s % 16 for s in strides):
        raise ValueError("tensor_map_3d needs a 3-D fp16/bf16/int32 tensor, its last dimension contiguous, "
                         "16-byte aligned strides")
    d0, d1, d2 = t.shape
    return _encode_tiled(t, [d2, d0, d1], strides, box, swizzle_128=False)


def _encode_tensor_map(t: torch.Tensor, rows: int, cols: int, pitch: int, box_cols: int, box_rows: int) -> bytes:
    if t.dtype not in (torch.float16, torch.bfloat16) or t.stride(1) != 1 or pitch % 16 or t.data_ptr() % 16:
        raise ValueError("tensor_map_2d needs an fp16/bf16 tensor with unit column stride, 16-byte aligned rows")
    return _encode_tiled(t, [cols, rows], [pitch], (box_cols, box_rows), swizzle_128=True)


def _encode_tiled(t: torch.Tensor, dims: list[int], strides: list[int], box, swizzle_128: bool) -> bytes:
    """cuTensorMapEncodeTiled of t (dims innermost first, byte strides of the outer ones), zeros
    out of bounds; bound to torch's primary context where a new thread's first call needs it."""
    from cuda.bindings import driver

    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    kind = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMA_DTYPES[t.dtype]}")
    swizzle = driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle_128 else \
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE

    def encode():
        return driver.cuTensorMapEncodeTiled(
            kind, len(dims), t.data_ptr(), [u64(d) for d in dims], [u64(s) for s in strides], [u32(b) for b in box],
            [u32(1)] * len(dims), driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)

    err, tmap = encode()
    if int(err) == CUDA_ERROR_INVALID_CONTEXT and _bind_primary_context(t.device.index):
        err, tmap = encode()  # a thread whose first CUDA call this is (the tuner's worker on a DB hit)
    _check(err, "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)


def _check(err, what: str) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def launch(inst: Instance, grid, block, *args, shmem: int = 0, device=None) -> None:
    """Load (once) and launch `inst` on the current stream of `device`."""
    load(inst, device)(grid, block, *args, shmem=shmem)
