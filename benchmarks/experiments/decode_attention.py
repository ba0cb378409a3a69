"""One-off probe (issue 18): the decode attention of the Llama layer (8 queries over a 2056-token
cache, 32 heads of 128), compiled and replayed from a CUDA graph, by several routes."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from spartune.bench import e2e

torch.manual_seed(0)
H, D, S, T = 32, 128, 2056, 8
q = torch.randn(1, H, T, D, device="cuda", dtype=torch.float16)
k = torch.randn(1, H, S, D, device="cuda", dtype=torch.float16)
v = torch.randn(1, H, S, D, device="cuda", dtype=torch.float16)
positions = torch.arange(S - T, S, device="cuda")


def masked(q, k, v):
    keys = torch.arange(S, device="cuda")
    mask = torch.zeros(T, S, dtype=q.dtype, device="cuda").masked_fill(keys[None] > positions[:, None], float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def lower_right(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))


def explicit(q, k, v):  # two batched matmuls and a softmax, fused by inductor
    keys = torch.arange(S, device="cuda")
    s = (q @ k.transpose(-1, -2)).float() * D ** -0.5
    s = s.masked_fill(keys[None] > positions[:, None], float("-inf"))
    return (s.softmax(-1).to(q.dtype) @ v)


def backend(fn, b):
    def run(q, k, v):
        with sdpa_kernel(b):
            return fn(q, k, v)
    return run


mask = torch.zeros(T, S, device="cuda", dtype=torch.double).masked_fill(
    torch.arange(S, device="cuda")[None] > positions[:, None], float("-inf"))
ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * D ** -0.5 + mask, -1) @ v.double()
routes = {"masked (default)": masked, "masked efficient": backend(masked, SDPBackend.EFFICIENT_ATTENTION),
          "lower_right": lower_right, "lower_right flash": backend(lower_right, SDPBackend.FLASH_ATTENTION),
          "lower_right efficient": backend(lower_right, SDPBackend.EFFICIENT_ATTENTION), "explicit": explicit}
for name, fn in routes.items():
    try:
        c = torch.compile(fn)
        g = e2e.captured(lambda: c(q, k, v), "cuda")
        out = g()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        print(f"{name:<24} {e2e.time_ms(g, 'cuda') * 1e3:7.1f} us  err {err:.1e}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name:<24} failed: {str(e).splitlines()[0][:150]}", flush=True)
