"""Correctness oracles for an analysis (see DESIGN.md).

* :func:`check_permutation` — permuting every sortable group's entries in all of its members
  at once must leave the model's outputs unchanged; on a mismatch each group is retried alone
  to name the culprit.
* :func:`check_shrink` — halving every group must give a model that runs and keeps its output
  shapes.

Both work on deep copies: the model passed in is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .analysis import analyze
from .resize import resize
from .symbols import SymMap


@dataclass
class OracleResult:
    """What an oracle checked and which groups failed it."""

    checked: int = 0
    failed: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failed and self.error is None


def run_model(model: nn.Module, example_inputs: Any) -> list[torch.Tensor]:
    """Run ``model`` on example inputs; the output's tensors, flattened."""
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            out = model(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            out = model(*example_inputs)
        else:
            out = model(example_inputs)
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _close(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], rtol: float, atol: float) -> bool:
    # summation order changes under a permutation: tolerate float error relative to the
    # output's scale (random-weight models can have large logits)
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(
            x.float(), y.float(), rtol=rtol, atol=atol * max(1.0, float(x.float().abs().max())))
        for x, y in zip(a, b)
    )


def _permuted(model: nn.Module, example_inputs: Any, names: Sequence[str],
              gen: torch.Generator) -> list[torch.Tensor]:
    clone = copy.deepcopy(model)
    sm = analyze(clone, example_inputs=example_inputs)
    sizes = {g.name: g.size for g in sm.groups()}
    resize(clone, sm, {n: torch.randperm(sizes[n], generator=gen) for n in names})
    return run_model(clone, example_inputs)


def check_permutation(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                      seed: int = 0, rtol: float = 1e-4, atol: float = 1e-4) -> OracleResult:
    """Permute every sortable group at once; on a mismatch, find the failing groups."""
    names = [g.name for g in symmap.groups() if g.is_sortable and g.size > 1]
    result = OracleResult(checked=len(names))
    if not names:
        return result
    model = model.eval()
    reference = run_model(model, example_inputs)
    gen = torch.Generator().manual_seed(seed)
    if _close(reference, _permuted(model, example_inputs, names, gen), rtol, atol):
        return result
    for name in names:
        if not _close(reference, _permuted(model, example_inputs, [name], gen), rtol, atol):
            result.failed.append(name)
    if not result.failed:
        result.error = "outputs changed with all groups permuted, but with none alone"
    return result


def check_shrink(model: nn.Module, symmap: SymMap, example_inputs: Any) -> OracleResult:
    """Halve every group; the model must run and keep its output shapes."""
    groups = symmap.groups()
    result = OracleResult(checked=len(groups))
    reference = run_model(model.eval(), example_inputs)
    clone = copy.deepcopy(model)
    sm = analyze(clone, example_inputs=example_inputs)
    resize(clone, sm, {g.name: max(1, g.size // 2) for g in sm.groups()})
    try:
        out = run_model(clone, example_inputs)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if [t.shape for t in out] != [t.shape for t in reference]:
        result.error = f"output shapes changed: {[tuple(t.shape) for t in out]}"
    return result


def coverage(symmap: SymMap) -> float:
    """The share of modules with an OUTGOING symbol whose output belongs to a searchable group.

    For a CNN this is the share of convs and linears that can be pruned; the head (whose
    output is the model's output) always counts against it.
    """
    producers = {(name, s) for name, syms in symmap.named_sym_dicts()
                 for s, sym in syms.items() if sym.is_outgoing}
    if not producers:
        return 0.0
    modules = {name for name, _ in producers}
    live = {name for g in symmap.groups() for name, s in g.members if (name, s) in producers}
    return len(live) / len(modules)


__all__ = ["OracleResult", "check_permutation", "check_shrink", "coverage", "run_model"]
