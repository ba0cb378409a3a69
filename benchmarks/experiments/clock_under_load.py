"""Probe (session 16): the SM clock and power while 2:4 prefill (128 x 256 wgmma, 70B up, N = 8192)
and cuBLAS dense run back to back for ~3 s each (nvidia-smi sampled every 100 ms)."""
import subprocess
import time

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

M, Kd, N = 28672, 8192, 8192
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
A = sparsify_weight(w, "2:4")
wd = A.to_dense()
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
cfg = K.Config(128, 256, 12, variant="wgmma", stages=5, group_m=8)
for name, fn in (("spmm_nm wgmma 128x256", lambda: K.launch(A, x, out, cfg)), ("cuBLAS", lambda: F.linear(x, wd))):
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    start, calls = time.time(), 0
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.time() - start < 3.0:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    ev1.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = smi.stdout.read().strip().splitlines()
    print(name, f"{ev0.elapsed_time(ev1) / calls * 1e3:.0f} us a call;", "samples (clock, power, reasons):")
    for line in samples[5::5]:
        print("  ", line)
