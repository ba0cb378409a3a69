"""Probe (session 20): how many clusters of c CTAs run at once (cuOccupancyMaxActiveClusters), for
csr_smem instances compiled with __cluster_dims__(1, c, 1), at a CTA's shared memory that fits 1 or 2
per SM."""
from cuda.bindings import driver

from spartune.kernels import spmm_csr_smem as K
from spartune.kernels import cuda


def slots(c: int, warps: int, smem: int) -> int:
    cfg = K.Config(8, 1024, warps, 1, 1, 4, c)
    kern = cuda.load(K._instance(cfg, __import__("torch").float16), 0)
    kern.allow_shared_memory(smem)
    err, fn = driver.cuKernelGetFunction(kern.kernel.handle)
    assert not err, err
    lc = driver.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = 1, c, 1
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = 32 * warps, 1, 1
    lc.sharedMemBytes = smem
    lc.numAttrs = 0
    err, n = driver.cuOccupancyMaxActiveClusters(fn, lc)
    assert not err, err
    return n


if __name__ == "__main__":
    import torch
    torch.zeros(1, device="cuda")
    for warps, smem in ((32, 120 * 1024), (16, 100 * 1024), (8, 60 * 1024), (8, 40 * 1024)):
        print(f"warps {warps} smem {smem // 1024} KB:",
              {c: slots(c, warps, smem) for c in (2, 3, 4, 5, 6, 7, 8)}, flush=True)
