"""Planning depth: how much each block of a depth group matters, and which blocks to keep.

**Block importance** (:func:`block_importance`) is ShortGPT's *block influence*, the
criterion Minitron ranks depth by: one minus the cosine similarity of a block's input and
output hidden states, over the calibration tokens (each token's vector along the stream's
feature dim, :attr:`DepthGroup.feature_dim`), averaged. A block that barely turns the
residual stream scores near 0 and is dropped first. The stream is caught with hooks on each
block: its output (the first tensor of a tuple) and, among its arguments, the tensor of the
output's shape (the first positional one, else a keyword one): the analysis proved the
output is that input plus the block's terms.

**Choosing** (:func:`choose_blocks`): ``layers`` is a count (keep the highest-scoring that
many blocks, in their order), a list of positions to keep, or ``{depth group: either}``.

**Names after** (:func:`renamed`): dropping blocks renames the parameters of the blocks that
move (``model.layers.3.mlp...`` becomes ``model.layers.2.mlp...``); a plan's parameter shapes
are given under the new names.

Imports from fxsym: errors, importance, symbols.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .errors import PlanError
from .importance import run_batch
from .symbols import DepthGroup, SymMap

__all__ = ["DepthCriterion", "block_importance", "choose_blocks", "renamed"]

#: ``criterion(model, symmap) -> {depth group name: one score per block}``
DepthCriterion = Any


def block_importance(batches: Iterable[Any], *, progress: bool = False) -> DepthCriterion:
    """The block-influence criterion over ``batches`` (see the module docstring):
    ``criterion(model, symmap) -> {depth group name: scores}``, higher kept first."""
    items = list(batches)
    if not items:
        raise PlanError("block importance needs at least one calibration batch")

    def criterion(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
        groups = symmap.depth_groups()
        sums = {g.name: torch.zeros(g.size, dtype=torch.float64) for g in groups}
        counts = {g.name: torch.zeros(g.size, dtype=torch.float64) for g in groups}
        handles = []
        for g in groups:
            for i, name in enumerate(g.blocks):
                block = model.get_submodule(name)
                handles.append(block.register_forward_hook(
                    _recorder(g, i, sums[g.name], counts[g.name]), with_kwargs=True))
        training = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                for batch in _shown(items, progress):
                    run_batch(model, batch)
        finally:
            for h in handles:
                h.remove()
            for m, mode in training:
                m.training = mode
        out = {}
        for g in groups:
            if bool((counts[g.name] == 0).any()):
                raise PlanError(f"block importance: a block of {g.container} never ran on the "
                                "calibration batches")
            out[g.name] = (sums[g.name] / counts[g.name]).float()
        return out

    criterion.__name__ = "block_influence"
    return criterion


def _shown(items: list[Any], progress: bool) -> Iterable[Any]:
    if not progress:
        return items
    from .console import track

    return track(items, total=len(items), description="block importance")


def _recorder(group: DepthGroup, i: int, sums: torch.Tensor, counts: torch.Tensor) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             output: Any) -> None:
        out = output if isinstance(output, torch.Tensor) else next(
            (o for o in output if isinstance(o, torch.Tensor)), None) if isinstance(
            output, (tuple, list)) else None
        if out is None:
            return
        candidates = [*args, *kwargs.values()]
        inp = next((a for a in candidates if isinstance(a, torch.Tensor)
                    and a.shape == out.shape and a.is_floating_point()), None)
        if inp is None:
            return
        d = group.feature_dim
        a = inp.detach().double().movedim(d, -1).reshape(-1, out.shape[d])
        b = out.detach().double().movedim(d, -1).reshape(-1, out.shape[d])
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        sums[i] += float((1 - cos).sum())
        counts[i] += cos.numel()

    return hook


def choose_blocks(symmap: SymMap, layers: Any, scores: Mapping[str, Any] | None
                  ) -> dict[str, list[int]]:
    """``{depth group name: positions kept}`` for ``layers`` (see the module docstring);
    ``scores`` rank blocks where a count is given."""
    groups = symmap.depth_groups()
    if not groups:
        reasons = [e.message for e in sorted(  # the outermost list's first
            (e for e in symmap.trace_report.entries if e.kind == "depth"),
            key=lambda e: e.where.count("."))]
        why = f" ({reasons[0]})" if reasons else ""
        raise PlanError(f"the model has no depth group: no stack of blocks was proven "
                        f"residual{why}")
    if isinstance(layers, Mapping):
        wanted = dict(layers)
    elif len(groups) == 1:
        wanted = {groups[0].name: layers}
    else:
        raise PlanError(f"the model has {len(groups)} depth groups "
                        f"({', '.join(g.name for g in groups)}); give layers as "
                        "{group name: count or blocks}")
    by_name = {g.name: g for g in groups}
    out = {}
    for name, want in wanted.items():
        group = by_name.get(name)
        if group is None:
            raise PlanError(f"{name!r} is not a depth group of the model "
                            f"({', '.join(by_name)})")
        out[name] = _kept(group, want, None if scores is None else scores.get(name))
    return out


def _kept(group: DepthGroup, want: Any, scores: Any) -> list[int]:
    if isinstance(want, numbers.Integral) and not isinstance(want, bool):
        k = int(want)
        if not 1 <= k <= group.size:
            raise PlanError(f"layers: {group.container} has {group.size} blocks; keep 1 to "
                            f"{group.size}, not {k}")
        if k == group.size:
            return list(range(k))
        if scores is None:
            raise PlanError(f"layers={k}: no block importance for {group.name}; give one "
                            "(fxsym.depth.block_importance(batches)) or the blocks to keep")
        s = torch.as_tensor(scores, dtype=torch.float64).flatten()
        if s.numel() != group.size or not bool(torch.isfinite(s).all()):
            raise PlanError(f"the block importance of {group.name} must be {group.size} "
                            "finite numbers")
        top = torch.topk(s, k, sorted=False).indices
        return sorted(int(i) for i in top)
    if isinstance(want, (str, bytes)) or not isinstance(want, Sequence):
        raise PlanError(f"layers must be a count, a list of blocks to keep or a mapping of "
                        f"them; got {want!r}")
    kept = list(want)
    if not kept or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                           for i in kept) or len(set(kept)) != len(kept) or any(
            not 0 <= i < group.size for i in kept):
        raise PlanError(f"layers: the blocks to keep of {group.container} must be distinct "
                        f"positions in [0, {group.size}); got {kept!r}")
    return sorted(int(i) for i in kept)


def renamed(name: str, groups: Sequence[DepthGroup], kept: Mapping[str, Sequence[int]]
            ) -> str | None:
    """The name of parameter (or module) ``name`` once the blocks ``kept`` remain: ``None``
    if it belongs to a dropped block."""
    for g in groups:
        positions = kept.get(g.name)
        if positions is None:
            continue
        for i, block in enumerate(g.blocks):
            if name == block or name.startswith(block + "."):
                if i not in positions:
                    return None
                j = list(positions).index(i)
                key = block.rpartition(".")[2]
                new = (f"{g.container}.{j}" if g.container else str(j)) if key.isdigit() \
                    and _numbered(g) else block
                return new + name[len(block):]
    return name


def _numbered(group: DepthGroup) -> bool:
    return [b.rpartition(".")[2] for b in group.blocks] == [str(i) for i in range(group.size)]
