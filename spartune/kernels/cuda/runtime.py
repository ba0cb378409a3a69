"""Loading cubins and launching their kernels on torch's current stream.

A process loads each (instance, device) once. A launch passes tensors by `data_ptr()` and
Python ints as int32, allocates nothing, never synchronises, and goes on
`torch.cuda.current_stream()`, so it can be captured in a CUDA graph like any torch op.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import torch

from .cache import CubinCache
from .compiler import Instance, device_arch, nvrtc_version

DEFAULT_SHMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in

_lock = threading.Lock()
_loaded: dict[tuple[Instance, int], "LoadedKernel"] = {}
_streams: dict[int, object] = {}  # torch stream handle -> cuda.core Stream
_cache: CubinCache | None = None


def default_cache() -> CubinCache:
    """The process's cubin cache (in the spartune cache directory at first use)."""
    global _cache
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


def _stream(handle: int):
    stream = _streams.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = _streams[handle] = Stream.from_handle(handle)
    return stream


def _argument(value, device_index: int):
    if isinstance(value, torch.Tensor):
        if value.get_device() != device_index:
            raise ValueError(f"a tensor argument is on {value.device}, the kernel on cuda:{device_index}")
        return value.data_ptr()
    if isinstance(value, (bool, int)):  # a bare Python int would be passed as a pointer
        return np.int32(value)
    if isinstance(value, float):
        return np.float32(value)
    return value  # numpy scalars and the like, as given


class LoadedKernel:
    """A kernel ready to launch: `kernel(grid, block, *args, shmem=bytes)`."""

    def __init__(self, inst: Instance, device_index: int, code, kernel):
        from cuda.core import LaunchConfig, launch

        self.instance = inst
        self.device_index = device_index
        self.code = code  # keeps the module loaded
        self.kernel = kernel
        self._shmem_limit = DEFAULT_SHMEM_LIMIT
        self._config_type = LaunchConfig
        self._configs: dict[tuple, object] = {}  # (grid, block, shmem) -> LaunchConfig
        self._launch = launch

    def __call__(self, grid, block, *args, shmem: int = 0) -> None:
        """Launch on the current stream. Host time matters (PERF-NOTES.md): a launch is a few
        dict lookups and cuda.core's launch, nothing more. An argument given as `bytes` is a
        struct passed by value (a TMA descriptor from `tensor_map_2d`): such launches go through
        the driver directly, since cuda.core passes scalars and pointers only."""
        if any(isinstance(a, bytes) for a in args):
            return self._launch_by_value(grid, block, args, shmem)
        config = self._configs.get((grid, block, shmem))
        if config is None:
            config = self._config(grid, block, shmem)
        stream = _stream(_current_stream_handle(self.device_index))
        self._launch(stream, config, self.kernel, *[_argument(a, self.device_index) for a in args])

    def _launch_by_value(self, grid, block, args, shmem: int) -> None:
        from cuda.bindings import driver

        if shmem > self._shmem_limit:
            self.allow_shared_memory(shmem)
        held = [_by_value(a, self.device_index) for a in args]  # alive until the launch returns
        params = (ctypes.c_void_p * len(held))(*[ctypes.addressof(h) for h in held])
        stream = driver.CUstream(_current_stream_handle(self.device_index))
        (err,) = driver.cuLaunchKernel(self.kernel.handle, *grid, *block, shmem, stream, ctypes.addressof(params), 0)
        _check(err, f"launching {self.instance.describe()}")

    def _config(self, grid, block, shmem: int):
        if shmem > self._shmem_limit:
            self.allow_shared_memory(shmem)
        if len(self._configs) > 4096:  # grids that follow the shapes: keep the dict bounded
            self._configs.clear()
        config = self._configs[(grid, block, shmem)] = self._config_type(grid=grid, block=block, shmem_size=shmem)
        return config

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

    @property
    def registers(self) -> int:
        return self.kernel.attributes.num_regs


def _by_value(value, device_index: int):
    """A kernel argument as the ctypes object whose bytes the driver copies."""
    if isinstance(value, bytes):
        return (ctypes.c_ubyte * len(value)).from_buffer_copy(value)
    if isinstance(value, torch.Tensor):
        return ctypes.c_uint64(_argument(value, device_index))
    if isinstance(value, (bool, int)):
        return ctypes.c_int32(value)
    if isinstance(value, float):
        return ctypes.c_float(value)
    if isinstance(value, np.uint64):
        return ctypes.c_uint64(int(value))
    raise TypeError(f"unsupported kernel argument {type(value).__name__}")


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


def _encode_tensor_map(t: torch.Tensor, rows: int, cols: int, pitch: int, box_cols: int, box_rows: int) -> bytes:
    from cuda.bindings import driver

    kinds = {torch.float16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             torch.bfloat16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}
    if t.dtype not in kinds or t.stride(1) != 1 or pitch % 16 or t.data_ptr() % 16:
        raise ValueError("tensor_map_2d needs an fp16/bf16 tensor with unit column stride, 16-byte aligned rows")
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        kinds[t.dtype], 2, t.data_ptr(), [u64(cols), u64(rows)], [u64(pitch)], [u32(box_cols), u32(box_rows)],
        [u32(1), u32(1)], driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    _check(err, "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)


def _check(err, what: str) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def launch(inst: Instance, grid, block, *args, shmem: int = 0, device=None) -> None:
    """Load (once) and launch `inst` on the current stream of `device`."""
    load(inst, device)(grid, block, *args, shmem=shmem)
