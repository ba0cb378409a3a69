"""Prune a trained MLP with spartune, then fine-tune the sparse model to win back what pruning cost.

A dense MLP (64 -> 256 -> 256 -> 256 -> 10) first learns a fixed synthetic classification task
(labels: the argmax of a random tanh network of Gaussian inputs; fixed seeds, fresh batches every
step). Its two hidden 256x256 layers are then pruned by magnitude with `spartune.sparsify`: 90%
unstructured ("csr"), 90% in 16x16 blocks ("block:16"), and 2:4 at its fixed 50%. The input layer
and the 10-way head stay dense, as is usual. Each pruned model is then fine-tuned with Adam,
by default distilling the dense model's predictions (`--objective task`: on the labels). Only the
stored values train: the pattern (each format's index tensors) stays fixed.

Prints, per pattern, the held-out cross-entropy of the dense model, of the pruned model and of the
fine-tuned one, and the fraction of the loss lost to pruning that fine-tuning won back:
(pruned - tuned) / (pruned - dense).

    python examples/finetune_recovery.py [--dense-steps 600] [--tune-steps 300] [--objective distill]

Runs on the CPU in seconds (torch's dense product serves every layer there); on a GPU spartune's
sparse kernels run.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

import spartune as st

D_IN, HIDDEN, CLASSES = 64, 256, 10
PATTERNS = (("csr", 0.9), ("block:16", 0.9), ("2:4", None))


class Task:
    """Inputs x ~ N(0, I); label = argmax of a fixed random two-layer tanh network of x."""

    TEST = 4096

    def __init__(self, seed: int = 0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.w1 = (torch.randn(D_IN, 32, generator=g) / D_IN**0.5).to(device)
        self.w2 = (torch.randn(32, CLASSES, generator=g) / 32**0.5).to(device)
        self.device = device
        self.test = self.sample(self.TEST, torch.Generator().manual_seed(seed + 1))  # every loss below is on it

    def sample(self, n: int, gen: torch.Generator):
        x = torch.randn(n, D_IN, generator=gen).to(self.device)
        return x, (torch.tanh(x @ self.w1) @ self.w2).argmax(1)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


@torch.no_grad()
def test_loss(model, task) -> float:
    x, y = task.test
    return F.cross_entropy(model(x), y).item()


def train(model, task, steps: int, lr: float, batch: int, seed: int, teacher=None) -> None:
    """Adam on fresh batches of the task: cross-entropy with the labels, or with `teacher`
    the KL divergence to its predictions (distillation)."""
    gen = torch.Generator().manual_seed(seed)
    model.train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    for _ in range(steps):
        x, y = task.sample(batch, gen)
        if teacher is None:
            loss = F.cross_entropy(model(x), y)
        else:
            with torch.no_grad():
                target = F.log_softmax(teacher(x), -1)
            loss = F.kl_div(F.log_softmax(model(x), -1), target, log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()


def index_tensors(model) -> dict[str, torch.Tensor]:
    """The pattern of every sparse layer: its format's index tensors (buffers), copied."""
    return {name: b.clone() for name, b in model.named_buffers()}


def hidden(name: str, module) -> bool:
    """The layers pruned: the hidden-to-hidden ones. The input layer (64 features: 16x16 blocks
    at 90% would cut whole groups of inputs off) and the 10-way head stay dense, as is usual."""
    return module.in_features == module.out_features == HIDDEN


def run(dense_steps: int = 600, tune_steps: int = 300, *, lr: float = 2e-3, tune_lr: float = 2e-3,
        batch: int = 256, seed: int = 0, objective: str = "distill", patterns=PATTERNS,
        device="cpu") -> tuple[float, list[dict]]:
    """Train the dense teacher, then prune and fine-tune a copy per pattern (`objective`:
    "distill" to the dense model's predictions, or "task" on the labels). Returns the dense test
    loss and a row per pattern (losses, recovery, the tuned model and its pattern before
    fine-tuning)."""
    if objective not in ("distill", "task"):
        raise ValueError(f"objective must be 'distill' or 'task', got {objective!r}")
    torch.manual_seed(seed)
    task = Task(seed, device)
    dense = mlp().to(device)
    train(dense, task, dense_steps, lr, batch, seed + 2)
    dense.requires_grad_(False)
    dense_loss = test_loss(dense, task)
    rows = []
    for pattern, sparsity in patterns:
        model = copy.deepcopy(dense)
        reports = st.sparsify(model, pattern, sparsity, filter_fn=hidden)
        model.requires_grad_(True)  # SparseLinear's values train like any Parameter (the pattern stays)
        pruned_loss = test_loss(model, task)
        before = index_tensors(model)
        start = time.perf_counter()
        train(model, task, tune_steps, tune_lr, batch, seed + 3, teacher=dense if objective == "distill" else None)
        tuned_loss = test_loss(model, task)
        lost = pruned_loss - dense_loss
        pruned = [r for r in reports.values() if r.pattern]
        rows.append(dict(
            pattern=pattern,
            sparsity=sum(r.sparsity * r.shape[0] * r.shape[1] for r in pruned) / sum(r.shape[0] * r.shape[1] for r in pruned),
            dense=dense_loss, pruned=pruned_loss, tuned=tuned_loss,
            recovered=(pruned_loss - tuned_loss) / lost if lost > 0 else float("nan"),
            seconds=time.perf_counter() - start, model=model, index_before=before,
        ))
    return dense_loss, rows


def table(rows) -> str:
    lines = [f"{'pattern':<10} {'sparsity':>8} {'dense':>8} {'pruned':>8} {'tuned':>8} {'recovered':>9} {'tune s':>7}"]
    for r in rows:
        lines.append(f"{r['pattern']:<10} {r['sparsity']:>8.2f} {r['dense']:>8.4f} {r['pruned']:>8.4f} "
                     f"{r['tuned']:>8.4f} {r['recovered']:>9.1%} {r['seconds']:>7.1f}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dense-steps", type=int, default=600, help="Adam steps training the dense teacher")
    ap.add_argument("--tune-steps", type=int, default=300, help="Adam steps fine-tuning each pruned model")
    ap.add_argument("--objective", choices=("distill", "task"), default="distill",
                    help="fine-tune towards the dense model's predictions (default) or the task's labels")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch's CPU threads (these matrices are small: 1 is as fast, and robust on a busy machine)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    _, rows = run(args.dense_steps, args.tune_steps, batch=args.batch, seed=args.seed, objective=args.objective,
                  device=args.device)
    print(f"cross-entropy on {Task.TEST} held-out samples; dense teacher trained {args.dense_steps} steps; "
          f"hidden layers pruned, then fine-tuned {args.tune_steps} steps ({args.objective}):")
    print(table(rows))
    print(f"total {time.perf_counter() - start:.1f} s")
    return rows


if __name__ == "__main__":
    main()
