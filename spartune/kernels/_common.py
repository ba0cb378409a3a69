"""Triton helpers shared by the kernel families: program order and Sputnik's row swizzle."""
import triton
import triton.language as tl


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
