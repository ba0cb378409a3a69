"""What the cost model knows about a GPU: its resources, read from the device, and its rates,
measured by `calibrate()` (a few seconds, once per device; the tuner stores the result in the
DB). `DeviceSpec.h100()` holds the project's H100 as measured on 2026-11-22
(shared/PERF-NOTES.md): the CPU's stand-in for a device, and the tests' fixed one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import warnings
from dataclasses import dataclass

# The device part of the keys of problems run on the CPU, under Triton's interpreter.
INTERPRETER_DEVICE = "cpu-triton-interpreter"

_MATRIX_FIELD = {"float16": "mma_fp16", "bfloat16": "mma_bf16", "float32": "mma_tf32"}


def dtype_name(dtype) -> str:
    """'float16' from 'float16', 'torch.float16' or torch.float16."""
    name = str(dtype).removeprefix("torch.")
    if name not in _MATRIX_FIELD:
        raise ValueError(f"dtype must be one of {sorted(_MATRIX_FIELD)}, got {dtype!r}")
    return name


@dataclass(frozen=True)
class DeviceSpec:
    """What the model knows about a GPU: its resources (read from the device) and its rates
    (measured by `calibrate`, never datasheet numbers). Rates in flop/s and bytes/s."""

    name: str
    sms: int
    smem_per_sm: int  # bytes of shared memory per SM
    smem_per_program: int  # the most one program may allocate (opt-in limit)
    l2_bytes: int
    regs_per_sm: int
    mma_fp16: float  # dense matrix rate, fp16 operands (large cuBLAS GEMM)
    mma_bf16: float
    mma_tf32: float  # fp32 operands on the tensor cores (Triton's default for a float32 dot)
    fma: float  # fp32 FMA rate on the CUDA cores, counting 2 flops per FMA
    dram_bw: float  # device-to-device copy, bytes read + written per second
    l2_bw: float  # reads from an L2-resident buffer, all SMs together
    launch_s: float  # GPU time of an empty launch, back to back
    graph_launch_s: float  # the same inside a CUDA graph
    # a DRAM load's latency under load, dirty-line write-backs ahead of it (not calibrated: a model
    # constant, fitted with INDEX_CHAIN on benchmarks/data/h100-2026-11-22-run6)
    mem_latency_s: float = 0.8e-6
    # the same for an L2 hit (operands left in L2 by the previous graph replay), fitted with it:
    # Shfl-BW's serial x gathers at decode cost ~0.3 us each, cuBLAS's K steps ~0.1 us (3 in flight)
    l2_latency_s: float = 0.35e-6
    max_warps_per_sm: int = 64
    max_programs_per_sm: int = 32
    smem_reserved: int = 1024  # per program, taken by the runtime (Hopper)
    # (c, clusters of c CTAs that run at once with one CTA per SM, with two): cuOccupancyMaxActiveClusters
    # on the H100 (benchmarks/LOG.md, session 20): a cluster's CTAs share a GPC, and GPCs of 16-18
    # SMs hold 39 clusters of 3 (117 CTAs), not 44
    cluster_slots: tuple = ((2, 66, 132), (3, 39, 79), (4, 30, 62), (5, 22, 47), (6, 17, 39), (7, 15, 32),
                            (8, 15, 30))

    @classmethod
    def h100(cls) -> "DeviceSpec":
        """The H100 80GB HBM3 of the project, measured 2026-11-22 (shared/PERF-NOTES.md).
        bf16 is taken equal to fp16 and tf32 as half of it (the hardware's ratios)."""
        return cls(
            name="NVIDIA H100 80GB HBM3 sm_90",
            sms=132,
            smem_per_sm=228 * 1024,
            smem_per_program=227 * 1024,
            l2_bytes=50 * 1024 * 1024,
            regs_per_sm=65536,
            mma_fp16=750e12,
            mma_bf16=750e12,
            mma_tf32=375e12,
            fma=39e12,
            dram_bw=3.0e12,
            l2_bw=8.0e12,
            launch_s=3.5e-6,
            graph_launch_s=0.8e-6,
        )

    def cluster_ctas(self, cluster: int, programs_per_sm: int) -> int:
        """CTAs that run at once in clusters of `cluster` with `programs_per_sm` fitting an SM (the
        H100's measured table, scaled by SMs, past two per SM by the count; sizes not measured:
        as many as the SMs hold). 0 when not one cluster fits."""
        if cluster <= 1:
            return programs_per_sm * self.sms
        measured = next(((one, two) for c, one, two in self.cluster_slots if c == cluster), None)
        if measured is None:
            clusters = programs_per_sm * self.sms // cluster
        elif programs_per_sm == 1:
            clusters = measured[0] * self.sms // 132
        else:
            clusters = measured[1] * programs_per_sm // 2 * self.sms // 132
        return clusters * cluster

    def matrix_rate(self, dtype) -> float:
        return getattr(self, _MATRIX_FIELD[dtype_name(dtype)])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DeviceSpec":
        """Unknown keys are dropped and missing optional ones defaulted, so specs stored by an
        older or newer spartune still load. Model constants (`_MODEL_CONSTANTS`: not measured by
        calibrate()) always take this version's value, so a stored calibration never pins an old one."""
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)} - set(_MODEL_CONSTANTS)
        return cls(**{k: v for k, v in data.items() if k in names})


H100 = DeviceSpec.h100()
# DeviceSpec fields that are fitted model constants, not measured by calibrate(): a stored
# calibration never pins an old value.
_MODEL_CONSTANTS = ("mem_latency_s", "l2_latency_s", "cluster_slots")


# --- calibration (CUDA only) -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def spec_of(name: str) -> DeviceSpec:
    """The H100's spec with the SM count of the local device called `name` (an H100 PCIe has 114
    SMs, the SXM 132), or the H100's own where no local device has that name (the CPU, a problem
    from elsewhere): what the kernel families size their grids and waves by."""
    sms = _local_sms().get(name)
    return H100 if sms in (None, H100.sms) else dataclasses.replace(H100, name=name, sms=sms)


def _local_sms() -> dict[str, int]:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {device_name(i): torch.cuda.get_device_properties(i).multi_processor_count
            for i in range(torch.cuda.device_count())}


def device_name(device_index: int = 0) -> str:
    """'<name> sm_<major><minor>': the device part of every DB key."""
    import torch

    p = torch.cuda.get_device_properties(device_index)
    return f"{p.name} sm_{p.major}{p.minor}"


_KERNELS = None


def _calibration_kernels():
    """The Triton microbenchmarks, built on first use so that importing this module stays cheap."""
    global _KERNELS
    if _KERNELS is None:
        import triton
        import triton.language as tl

        @triton.jit
        def fma_kernel(out_ptr, a, b, ITERS: tl.constexpr, BLOCK: tl.constexpr):
            # four independent chains per thread keep the FMA pipes busy
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x0 = offs.to(tl.float32) * 1e-7
            x1 = x0 + 1.0
            x2 = x0 + 2.0
            x3 = x0 + 3.0
            for _ in range(ITERS):
                x0 = x0 * a + b
                x1 = x1 * a + b
                x2 = x2 * a + b
                x3 = x3 * a + b
            tl.store(out_ptr + offs, x0 + x1 + x2 + x3)

        @triton.jit
        def read_kernel(src_ptr, out_ptr, chunks, REPS: tl.constexpr, BLOCK: tl.constexpr):
            # each rep reads the chunks in a different rotation, so no load can be hoisted
            pid = tl.program_id(0)
            nprog = tl.num_programs(0)
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for r in range(REPS):
                for c in range(pid, chunks, nprog):
                    chunk = (c + r * 7) % chunks
                    acc += tl.load(src_ptr + chunk * BLOCK + tl.arange(0, BLOCK))
            tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)

        @triton.jit
        def empty_kernel(ptr):
            pass

        _KERNELS = fma_kernel, read_kernel, empty_kernel
    return _KERNELS


def calibrate(device_index: int = 0) -> DeviceSpec:
    """Measure a DeviceSpec on a CUDA device: large torch.mm in fp16/bf16/tf32, a
    device-to-device copy, reads from an L2-resident buffer, a Triton FMA loop and an empty
    launch. Takes a few seconds; the tuner stores the result in the DB per device."""
    import torch

    from .measure import time_callable

    if not torch.cuda.is_available():
        raise RuntimeError("calibrate() needs a CUDA device; use DeviceSpec.h100() or a stored spec on the CPU")
    dev = torch.device("cuda", device_index)
    props = torch.cuda.get_device_properties(dev)
    fma_kernel, read_kernel, empty_kernel = _calibration_kernels()
    sms = props.multi_processor_count
    l2 = props.L2_cache_size
    with torch.cuda.device(dev):
        n = 8192
        rates = {}
        for field, dt in (("mma_fp16", torch.float16), ("mma_bf16", torch.bfloat16), ("mma_tf32", torch.float32)):
            a = torch.randn(n, n, device=dev, dtype=dt)
            b = torch.randn(n, n, device=dev, dtype=dt)
            c = torch.empty(n, n, device=dev, dtype=dt)
            with _tf32(dt == torch.float32):
                rates[field] = 2.0 * n**3 / time_callable(lambda: torch.mm(a, b, out=c))
            del a, b, c

        src = torch.randn(2**27, device=dev)  # 512 MiB, far beyond any L2
        dst = torch.empty_like(src)
        dram_bw = 2.0 * src.numel() * 4 / time_callable(lambda: dst.copy_(src))
        del src, dst

        block, reps = 1024, 16
        buf = torch.randn(max(block, l2 // 4 // 4 // block * block), device=dev)  # a quarter of L2
        programs = sms * 4
        acc = torch.empty(programs * block, device=dev)
        l2_bw = reps * buf.numel() * 4 / time_callable(
            lambda: read_kernel[(programs,)](buf, acc, buf.numel() // block, REPS=reps, BLOCK=block, num_warps=8),
            cold=False)

        iters, fblock, fprog = 4096, 1024, sms * 16
        out = torch.empty(fprog * fblock, device=dev)
        fma = 2.0 * 4 * iters * out.numel() / time_callable(
            lambda: fma_kernel[(fprog,)](out, 0.999, 1e-3, ITERS=iters, BLOCK=fblock, num_warps=8))

        tiny = torch.empty(1, device=dev)
        launch = time_callable(lambda: empty_kernel[(1,)](tiny), graph=False)
        graph_launch = time_callable(lambda: empty_kernel[(1,)](tiny), graph=True, cold=False)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    return DeviceSpec(
        name=device_name(device_index),
        sms=sms,
        smem_per_sm=smem_sm,
        smem_per_program=getattr(props, "shared_memory_per_block_optin", smem_sm - 1024),
        l2_bytes=l2,
        regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        dram_bw=dram_bw,
        l2_bw=l2_bw,
        fma=fma,
        launch_s=launch,
        graph_launch_s=graph_launch,
        max_warps_per_sm=getattr(props, "max_threads_per_multi_processor", 2048) // 32,
        **rates,
    )


@contextlib.contextmanager
def _tf32(on: bool):
    """Let float32 matmuls use the tensor cores for the duration (restored on exit)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # allow_tf32 is deprecated in favour of fp32_precision
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = on or saved
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32 = saved
