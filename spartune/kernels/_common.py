"""What the kernel families share: Triton helpers (program order, Sputnik's row swizzle) and
the host side's power-of-two rounding, scratch buffers and the cached launch."""
import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver

INTERPRETED = knobs.runtime.interpret  # kernels run under Triton's interpreter (CPU tests)


def next_pow2(n) -> int:
    """The smallest power of two >= n (1 for n <= 1): tile sizes from problem sizes."""
    return triton.next_power_of_2(max(1, int(n)))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs follow torch's matmul setting (tf32 only when torch allows it)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


_LAUNCH_CACHE_SIZE = 256  # specialisations kept per cache (one weight's distinct call shapes)


class LaunchCache(dict):
    """launch_cached's memory, kept on a weight's format object: a copied or pickled format
    starts empty (compiled kernels belong to this process)."""

    def __reduce__(self):
        return LaunchCache, ()

    def __deepcopy__(self, memo):
        return LaunchCache()


def launch_cached(cache: LaunchCache, key, kernel, grid: tuple, args: tuple, constexprs) -> None:
    """kernel[grid](*args, **constexprs()), calling the compiled kernel directly once `kernel`
    has been launched with `key`. Triton re-derives every argument's specialisation on each
    launch: ~27 us of a ~37 us launch on the H100 machine's host, more than many of our kernels
    run (benchmarks/LOG.md). The caller knows which arguments can change, so `key` must fix
    every constexpr and launch option, every dtype, each pointer's 16-byte alignment and each
    int argument's value (Triton specialises ints equal to 1 or divisible by 16); the grid is
    not part of it. `constexprs()` gives the keyword arguments, launch options (num_warps,
    num_stages) last: it is called on a miss only, so a hit builds nothing. A direct launch
    skips what Triton checks per call beyond the arguments (pre-run hooks, changed globals,
    debug knobs), none of which spartune sets. The cache holds up to 256 specialisations and
    then starts over, so a stream of new token counts costs Triton's own launch, no more."""
    if INTERPRETED:
        kernel[grid](*args, **constexprs())
        return
    full_key = (driver.active.get_current_device(), kernel.fn, key)  # the plain function: an identity hash
    hit = cache.get(full_key)
    if hit is None:
        kwargs = constexprs()
        compiled = kernel[grid](*args, **kwargs)
        if compiled is None:  # a cache hook declined to compile: nothing to remember
            return
        if len(cache) >= _LAUNCH_CACHE_SIZE:
            cache.clear()
        tail = tuple(kwargs[name] for name in kernel.arg_names[len(args):])
        cache[full_key] = (compiled, tail)
        return
    compiled, tail = hit
    stream = driver.active.get_current_stream(full_key[0])
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _hooked(enter) or _hooked(exit_):  # a profiler's hooks see the launch as Triton's own would show it
        meta = compiled.launch_metadata(grid, stream, *args, *tail)
    else:
        enter = exit_ = meta = None
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, meta, enter, exit_, *args, *tail)


def _hooked(chain) -> bool:
    return chain is not None and bool(getattr(chain, "calls", True))


def align16(t: torch.Tensor) -> bool:
    """Whether Triton specialises t's pointer as 16-byte aligned (part of a launch_cached key)."""
    return t.data_ptr() % 16 == 0


def arg_key(args: tuple) -> tuple:
    """What Triton (NVIDIA backend) specialises on in a launch's arguments, for a launch_cached
    key: each tensor's dtype and 16-byte alignment, each int's value (Triton looks at == 1, % 16
    and whether it needs 64 bits), a bool apart from the int it equals, tuples as they are,
    floats not at all."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else float if type(a) is float
                 else (bool, a) if type(a) is bool else a for a in args)


def launch_cache(A, name: str) -> "LaunchCache":
    """The LaunchCache a family keeps on weight A (under `name`), made on first use."""
    cache = A.__dict__.get(name)
    if cache is None:
        cache = LaunchCache()
        object.__setattr__(A, name, cache)
    return cache


RETIRED: list = []  # buffers outgrown by a larger call: CUDA graphs captured earlier still use them


def grown(cache: dict, key, numel: int, make) -> torch.Tensor:
    """cache[key], replaced by make(numel) when smaller than numel. The buffer it replaces is
    kept alive (RETIRED), never handed back to the allocator: a graph captured before still
    reads and writes it on every replay. Growth at least doubles, so few are ever retired."""
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:
            RETIRED.append(buf)
            numel = max(numel, 2 * buf.numel())
        buf = cache[key] = make(numel)
    return buf


def scratch(cache: dict, device: torch.device, dtype: torch.dtype, numel: int, minimum: int = 0) -> torch.Tensor:
    """A buffer per (device, dtype) kept in `cache`, grown on demand (`grown`); whoever uses it
    rewrites what it reads, so nothing is cleared. Make the first call before a CUDA-graph
    capture (a capture must not allocate), and do not share one between launches on two streams."""
    return grown(cache, (device, dtype), numel,
                 lambda n: torch.empty(max(n, minimum), dtype=dtype, device=device))


@triton.jit
def grouped_order(pid, n_outer, n_inner, GROUP: tl.constexpr):
    """Tile (outer, inner) of program `pid` when GROUP consecutive outer indices sweep the
    inner range together: tiles that run at the same time share their operand panels in L2."""
    width = GROUP * n_inner
    first = (pid // width) * GROUP
    size = tl.minimum(n_outer - first, GROUP)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def swizzled_rows(block, order_ptr, crow_ptr, M, R: tl.constexpr):
    """The R rows of row block `block` in swizzled order (longest first): their indices,
    which are real, and where each starts and how long it is in the CSR arrays."""
    slot = block * R + tl.arange(0, R)
    valid = slot < M
    rows = tl.load(order_ptr + slot, mask=valid, other=0)
    start = tl.load(crow_ptr + rows, mask=valid, other=0)
    length = tl.load(crow_ptr + rows + 1, mask=valid, other=0) - start
    return rows, valid, start, length


@triton.jit
def row_chunk(s, start, length, BNNZ: tl.constexpr):
    """Nonzeros s .. s + BNNZ of each row: which exist (R, BNNZ) and where they are stored."""
    j = s + tl.arange(0, BNNZ)
    return j[None, :] < length[:, None], start[:, None] + j[None, :]


_COUNTERS: dict = {}


def arrival_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters for split-K fix-ups, one buffer per device: the last program of a
    tile counts the others in, then sets its counter back to zero, so one allocation serves every
    later call, CUDA-graph replays included (make the first call before capturing). Split-K
    launches on two streams at once must not share a device."""
    return grown(_COUNTERS, device, count,
                 lambda n: torch.zeros(max(n, 1024), dtype=torch.int32, device=device))
