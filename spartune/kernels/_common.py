"""What the kernel families share: Triton helpers (program order, Sputnik's row swizzle) and
the host side's power-of-two rounding and scratch buffers."""
import torch
import triton
import triton.language as tl


def next_pow2(n) -> int:
    """The smallest power of two >= n (1 for n <= 1): tile sizes from problem sizes."""
    return triton.next_power_of_2(max(1, int(n)))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs follow torch's matmul setting (tf32 only when torch allows it)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


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
