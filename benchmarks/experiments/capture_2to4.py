"""One-off probe (issue 18): which layer of the 2:4 Llama decode step (N = 8) breaks a CUDA
graph capture, and with what choice."""
import torch

from spartune import sparsify
from spartune.bench import e2e
from spartune.bench.picks import choice_dict
from spartune.dispatch import find_choice

model, call = e2e._llama(8, decode=True)(torch.float16, "cuda", False)
sparsify(model, "2:4")
with torch.no_grad():
    call(model)()
    torch.cuda.synchronize()
    h = torch.randn(1, 8, 4096, device="cuda", dtype=torch.float16)
    hi = torch.randn(1, 8, 11008, device="cuda", dtype=torch.float16)
    for name in ("q_proj", "o_proj", "gate_proj", "down_proj"):
        layer = getattr(model, name)
        x = hi if name == "down_proj" else h
        print(name, choice_dict(find_choice(layer.weight, 8, "float16")), flush=True)
        try:
            g = e2e.captured(lambda: layer(x), "cuda")
            g()
            torch.cuda.synchronize()
            print(name, "captured ok", flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "capture failed:", str(e).splitlines()[0], flush=True)
            break
