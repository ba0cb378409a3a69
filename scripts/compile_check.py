"""Compile spmm_nm's kernels (a case per path: register and ring mma, clusters, V:N:M gathers, wgmma
2:4 and V:N:M, residual instances) with NVRTC on a machine without a GPU: a syntax and ptxas check
before device time is spent. NVRTC and the CUDA headers come from NVIDIA's wheels, e.g.
    pip download --no-deps -d /tmp/wheels nvidia-cuda-nvrtc==13.0.* nvidia-cuda-runtime==13.0.* \
        nvidia-cuda-cccl==13.0.85
    pip install --no-deps --target /tmp/nvpkgs /tmp/wheels/*.whl
    LD_LIBRARY_PATH=/tmp/nvpkgs/nvidia/cu13/lib PYTHONPATH=/tmp/nvpkgs:$PWD python scripts/compile_check.py [N]
(N: only the first N cases)."""
import sys
import time

import torch

from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda import compiler as C
from spartune.kernels.cuda.compiler import SRC_DIR, program_options, read_sources

cases = [
    (K.Config(32, 8, 4, 2, stages=2), 0), (K.Config(32, 8, 4, 2, stages=3), 0),
    (K.Config(32, 16, 8, 4, stages=3, cluster_m=2), 0), (K.Config(32, 8, 16, 8, stages=3), 0),
    (K.Config(64, 8, 4, 1, stages=3), 2), (K.Config(64, 8, 4, 1, stages=3, x_whole=True), 3), (K.Config(64, 8, 4, 1, stages=3, x_whole=True), 4),
    (K.Config(64, 64, 4, stages=2), 1),
    (K.Config(128, 256, 12, variant="wgmma", stages=4), 0),
    (K.Config(256, 128, 12, variant="wgmma", stages=4, cluster_m=2), 0),
    (K.Config(128, 128, 12, variant="wgmma", stages=4), 1), (K.Config(128, 128, 12, variant="wgmma", stages=3), 2),
]
if len(sys.argv) > 1:
    cases = cases[: int(sys.argv[1])]
cases += [(c, g, True) for c, g in cases if c.variant == "wgmma"]  # the residual's instances
for config, gather, *res in cases:
    inst = K._instance(config, torch.float16, gather, 0, bool(res))
    arch = C.device_arch((9, 0), inst.arch_specific)
    opts = program_options(inst, arch)
    opts["include_path"] = [str(SRC_DIR)]
    t = time.time()
    try:
        cubin = C.nvrtc_compile(read_sources(inst.template)[inst.template], opts)
        print(f"ok {time.time() - t:5.1f}s {len(cubin):7d} B  gather {gather} res {bool(res)} {config}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAILED gather {gather} {config}\n{e}", flush=True)
