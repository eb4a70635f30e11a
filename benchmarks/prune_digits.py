"""Does fxsym prune well? A small CNN and a small ViT on scikit-learn's ``load_digits``.

Each model is trained to a stated accuracy, then pruned to 50 % of its parameters — with
fxsym (global scope, L2 and first-order Taylor importance) and, when installed, with
Torch-Pruning at the same parameter count and the same importance — then fine-tuned for the
same number of epochs. One table: accuracy before, right after pruning and after fine-tuning,
with parameters and MACs, per tool. Nothing is downloaded (the digits ship with scikit-learn).

Equal size: fxsym plans to half the parameters; Torch-Pruning's global ratio is bisected to
the model nearest fxsym's count (above or below); fxsym then plans again to Torch-Pruning's
count and keeps whichever of its two plans is nearer it. The tools move in different steps: on
the ViT, fxsym removes embedding width only by whole heads (``nn.MultiheadAttention`` ties the
residual width to ``heads * head_dim``), roughly 25,000 parameters a step, where Torch-Pruning
removes 4 channels at a time and lets the remaining channels regroup into heads.

Torch-Pruning is set up as its own examples set up torchvision's ViT: the class token and the
position embedding are declared as unwrapped parameters (pruned on their last dimension) and
widths are rounded to the number of heads, so the embedding width shrinks with the MLPs. Given
the heads through ``num_heads`` instead, it skips the embedding-width group of
``nn.MultiheadAttention`` (it looks for a ``qkv`` linear layer) and can only prune the MLPs,
which cannot remove half of the parameters.

    python benchmarks/prune_digits.py [--epochs 20] [--finetune 5] [--seed 0] [--cache DIR]

``--cache DIR`` keeps the trained unpruned models (weights only) so a second run skips training.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxsym
from fxsym import importance

Batch = tuple[torch.Tensor, torch.Tensor]


def digits(seed: int) -> tuple[Batch, Batch]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(data.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


class SmallViT(nn.Module):
    """torchvision's VisionTransformer on 8x8 digits (the gray channel repeated)."""

    def __init__(self) -> None:
        super().__init__()
        import torchvision

        self.vit = torchvision.models.VisionTransformer(
            image_size=8, patch_size=2, num_layers=3, num_heads=4, hidden_dim=64, mlp_dim=128,
            num_classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(x.expand(-1, 3, -1, -1))  # type: ignore[no-any-return]


def batches(data: Batch, size: int, seed: int) -> Iterable[Batch]:
    x, y = data
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    for i in range(0, len(y), size):
        yield x[order[i:i + size]], y[order[i:i + size]]


def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def train(model: nn.Module, data: Batch, epochs: int, lr: float, seed: int, label: str) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(epochs, 1))
    model.train()
    for epoch in progress(range(epochs), label):
        for batch in batches(data, 64, seed + epoch):
            opt.zero_grad()
            loss_fn(model, batch).backward()
            opt.step()
        sched.step()
    model.eval()


def progress(items: range, label: str) -> Iterable[int]:
    try:
        from rich.progress import track
    except ImportError:
        return items
    return track(items, description=label, transient=True)


@torch.no_grad()
def accuracy(model: nn.Module, data: Batch) -> float:
    model.eval()
    return float((model(data[0]).argmax(1) == data[1]).float().mean()) * 100


def counts(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    with FlopCounterMode(display=False) as fc:
        model(example)
    return sum(p.numel() for p in model.parameters()), int(fc.get_total_flops()) // 2


# -- the tools ------------------------------------------------------------------------------
def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def prune_fxsym(model: nn.Module, example: torch.Tensor, target: int, kind: str,
                calib: list[Batch]) -> nn.Module:
    """fxsym, global scope: the smallest cut reaching ``target`` parameters."""
    sm = fxsym.analyze(model, example_inputs=(example,))
    crit: Any = "l2" if kind == "l2" else importance.taylor(loss_fn, calib)
    plan = fxsym.plan(model, sm, target_params=target, importance=crit, scope="global")
    plan.apply(model, sm)
    return model


def prune_tp(model: nn.Module, example: torch.Tensor, target: int, kind: str,
             calib: list[Batch]) -> nn.Module:
    """Torch-Pruning, global, its pruning ratio bisected to the model nearest ``target``
    parameters (the largest not above it, or the smallest above it if nearer)."""
    import torch_pruning as tp

    def run(ratio: float) -> nn.Module:
        m = copy.deepcopy(model)
        imp = (tp.importance.GroupMagnitudeImportance(p=2) if kind == "l2"
               else tp.importance.GroupTaylorImportance())
        last = [mod for mod in m.modules() if isinstance(mod, nn.Linear)][-1]
        attention = [mod for mod in m.modules() if isinstance(mod, nn.MultiheadAttention)]
        vit = getattr(m, "vit", None)
        extra: dict[str, Any] = {}
        if vit is not None:
            extra["unwrapped_parameters"] = [(vit.class_token, 2),
                                             (vit.encoder.pos_embedding, 2)]
        if attention:
            extra["round_to"] = attention[0].num_heads
        pruner = tp.pruner.MetaPruner(m, example, importance=imp, global_pruning=True,
                                      pruning_ratio=ratio, ignored_layers=[last], **extra)
        if kind == "taylor":
            m.zero_grad()
            for batch in calib:
                loss_fn(m, batch).backward()
        pruner.step()
        m.zero_grad()
        for mod in attention:  # what torchvision reads back from the module
            mod.head_dim = mod.embed_dim // mod.num_heads
        if vit is not None:
            vit.hidden_dim = vit.class_token.shape[-1]
        return m

    lo, hi = 0.0, 0.95
    below = above = None
    for _ in range(14):
        mid = (lo + hi) / 2
        m = run(mid)
        if n_params(m) <= target:
            hi, below = mid, m
        else:
            lo, above = mid, m
    below = below if below is not None else run(hi)
    if above is not None and n_params(above) - target < target - n_params(below):
        return above
    return below


TOOLS: dict[str, Callable[[nn.Module, torch.Tensor, int, str, list[Batch]], nn.Module]] = {
    "fxsym": prune_fxsym,
    "torch-pruning": prune_tp,
}


def equal_size(base: nn.Module, example: torch.Tensor, target: int, kind: str,
               calib: list[Batch], tools: list[str]) -> dict[str, Any]:
    """Each tool's pruned copy of ``base`` and the seconds its last pruning took, at one
    parameter count: fxsym to ``target``, Torch-Pruning to fxsym's count, fxsym again to
    Torch-Pruning's (a tool that fails gives its error message instead)."""
    out: dict[str, Any] = {}

    def prune(tool: str, goal: int) -> None:
        start = time.perf_counter()
        try:
            model = TOOLS[tool](copy.deepcopy(base), example, goal, kind, calib)
        except Exception as exc:
            out[tool] = f"{type(exc).__name__}: {str(exc)[:60]}"
            return
        out[tool] = (model, time.perf_counter() - start)

    prune("fxsym", target)
    if "torch-pruning" in tools and not isinstance(out["fxsym"], str):
        first = out["fxsym"]
        prune("torch-pruning", n_params(first[0]))
        if not isinstance(out["torch-pruning"], str):
            goal = n_params(out["torch-pruning"][0])
            prune("fxsym", goal)
            # a step of fxsym can be large (a ViT's width goes by whole heads): keep the
            # plan nearer Torch-Pruning's count
            if (not isinstance(out["fxsym"], str)
                    and abs(n_params(out["fxsym"][0]) - goal) > abs(n_params(first[0]) - goal)):
                out["fxsym"] = first
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--finetune", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=None,
                        help="directory keeping the trained unpruned models")
    args = parser.parse_args()
    try:
        import torch_pruning  # noqa: F401

        tools = list(TOOLS)
    except ImportError:
        tools = ["fxsym"]
    fxsym.load_plugins()
    train_set, test_set = digits(args.seed)
    example = train_set[0][:1]
    calib = list(batches(train_set, 64, args.seed))[:4]
    rows: list[list[str]] = []
    for name, build, lr in (("CNN", SmallCNN, 3e-3), ("ViT", SmallViT, 1e-3)):
        torch.manual_seed(args.seed)
        base = build()
        start = time.perf_counter()
        cached = (args.cache / f"{name}-e{args.epochs}-s{args.seed}.pt"
                  if args.cache is not None else None)
        if cached is not None and cached.is_file():
            base.load_state_dict(torch.load(cached, weights_only=True))
            base.eval()
        else:
            train(base, train_set, args.epochs, lr, args.seed, f"training {name}")
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                torch.save(base.state_dict(), cached)
        params, macs = counts(base, example)
        acc = accuracy(base, test_set)
        rows.append([name, "-", "unpruned", f"{params:,}", f"{macs:,}", f"{acc:.1f}", "", "",
                     f"{time.perf_counter() - start:.1f}"])
        for kind in ("l2", "taylor"):
            pruned = equal_size(base, example, params // 2, kind, calib, tools)
            for tool in tools:
                if isinstance(pruned[tool], str):  # a tool that cannot prune this model
                    rows.append([name, tool, kind, "failed", "", "", "", "", str(pruned[tool])])
                    continue
                model, seconds = pruned[tool]
                p, m = counts(model, example)
                after = accuracy(model, test_set)
                train(model, train_set, args.finetune, lr / 3, args.seed + 1,
                      f"fine-tuning {name} ({tool}, {kind})")
                tuned = accuracy(model, test_set)
                rows.append([name, tool, kind, f"{p:,}", f"{m:,}", f"{acc:.1f}", f"{after:.1f}",
                             f"{tuned:.1f}", f"{seconds:.1f}"])
    header = ["model", "tool", "importance", "params", "MACs", "acc before", "acc pruned",
              "acc fine-tuned", "seconds (train | prune)"]
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"load_digits, {args.epochs} epochs of training, 50 % of parameters pruned, "
          f"{args.finetune} epochs of fine-tuning (test accuracy, %)")
    for i, row in enumerate(cells):
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
