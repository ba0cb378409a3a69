"""Probe (issue 14, 2:4 decode): how fast can a cold 48-250 MB weight be streamed, and does the
grid's shape matter? A plain read-and-sum kernel, L2 flushed before every call (do_bench), with
G programs each reading one contiguous slab, beside cuBLAS's dense GEMV on the same bytes."""
import torch, triton, triton.language as tl
from triton.testing import do_bench


@triton.jit
def slab_sum(ptr, out, per_prog, total, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_prog
    end = tl.minimum(start + per_prog, total)
    acc = tl.zeros([BLOCK], tl.int32)
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        acc += tl.load(ptr + idx, mask=idx < end, other=0)
    tl.store(out + pid, tl.sum(acc))


def t(fn):
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3


for mb, (M, K) in ((47.8, (11008, 4096 // 2 + 4096 // 16)), (90.2, (11008, 4096)), (250, (28672, 8192 // 2 + 8192 // 16))):
    buf = torch.randint(0, 100, (M * K // 2,), device="cuda", dtype=torch.int32)
    nbytes = buf.numel() * 4
    out = torch.empty(8192, device="cuda", dtype=torch.int32)
    w = torch.randn(M, K, device="cuda", dtype=torch.float16)
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    dense = t(lambda: torch.nn.functional.linear(x, w))
    print(f"{nbytes / 1e6:.1f} MB: cuBLAS GEMV on ({M}, {K}) fp16 {dense * 1e6:.1f} us = {nbytes / dense / 1e12:.2f} TB/s")
    for block, warps in ((2048, 4), (4096, 8), (8192, 8)):
        row = []
        for g in (132, 264, 396, 528, 1056, 2112, 4224):
            per = triton.cdiv(triton.cdiv(buf.numel(), g), block) * block
            grid = triton.cdiv(buf.numel(), per)
            s = t(lambda: slab_sum[(grid,)](buf, out, per, buf.numel(), BLOCK=block, num_warps=warps))
            row.append(f"G={grid}: {s * 1e6:.1f} us {nbytes / s / 1e12:.2f}")
        print(f"  block {block} w{warps}: " + " | ".join(row), flush=True)
