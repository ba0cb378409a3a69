"""Probe (session 35): the cold-read floor per size, both eviction methods. A streaming read of
B bytes (a Triton kernel: 16-byte loads, grid-stride, one value kept per program) timed by
measure.cold_replay (write of 2x L2 before) and by measure.rotated_replay (copies in turn), for
the byte counts of the decode cases (CSR 90% qkv / 7B, 64:2:8 7B, 2:4 7B / 13B, dense 7B)."""
import json
import os

import torch
import triton
import triton.language as tl

from spartune.tune.measure import cold_replay, rotated_replay


@triton.jit
def _stream(src, sink, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    base = pid * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < n, other=0, cache_modifier=".cg")
    tl.store(sink + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def reader(block, iters, warps):
    def call(buf):
        n = buf.numel()
        grid = triton.cdiv(n, block * iters)
        sink = SINKS.setdefault(grid, torch.empty(grid, dtype=torch.int32, device="cuda"))
        _stream[(grid,)](buf, sink, n, BLOCK=block, ITERS=iters, num_warps=warps)
    return call


SINKS = {}
SIZES = {"csr90 qkv": 6.7e6, "csr90 7B": 18.0e6, "64:2:8 7B": 25.4e6, "2:4 7B": 50.7e6, "2:4 13B": 75.2e6,
         "dense 7B": 90.2e6, "2:4 70B": 249.6e6}


def main():
    rows = []
    for name, nbytes in SIZES.items():
        buf = torch.randint(0, 1 << 30, (int(nbytes) // 4,), dtype=torch.int32, device="cuda")
        best = None
        for block, iters, warps in ((2048, 4, 8), (4096, 4, 8), (1024, 8, 4), (2048, 8, 8), (4096, 2, 16)):
            fn = reader(block, iters, warps)
            w = cold_replay(lambda: fn(buf))
            r = rotated_replay(fn, buf, nbytes)
            row = dict(case=name, bytes=nbytes, block=block, iters=iters, warps=warps, write_s=w, rotated_s=r,
                       write_tbs=nbytes / w / 1e12, rotated_tbs=nbytes / r / 1e12)
            rows.append(row)
            if best is None or r < best["rotated_s"]:
                best = row
        bw = min(x["write_s"] for x in rows if x["case"] == name)
        print(f"{name:10} {nbytes/1e6:6.1f} MB  write {bw*1e6:6.1f} us ({nbytes/bw/1e12:.2f} TB/s)  "
              f"rotated {best['rotated_s']*1e6:6.1f} us ({best['rotated_tbs']:.2f} TB/s)", flush=True)
        del buf
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "read_floor_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
