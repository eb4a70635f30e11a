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

**Kinds a model needs** (:func:`needed_kinds`): the plugins' ``fxsym_depth_kinds`` name kinds
of blocks of which at least one must stay (a hybrid's attention layers: without any,
transformers' cache cannot be used and ``generate`` fails; the hf plugin finds them by
asking that cache, see :mod:`fxsym_plugins_hf.blockkinds`). Given the model, a count keeps,
for each kind its ranking left out, that kind's best-ranked block in place of the
lowest-ranked kept block not the last of another needed kind (:func:`top_blocks`; each swap
said in a note); positions keeping no block of a needed kind are a
:class:`~fxsym.errors.PlanError` naming the kind and its positions. :func:`depth_refusal`
asks the plugins (``fxsym_depth_refusal``) whether a choice of blocks would be refused when
dropped, without dropping anything (the search skips such depths).

**Names after** (:func:`renamed`): dropping blocks renames the parameters of the blocks that
move (``model.layers.3.mlp...`` becomes ``model.layers.2.mlp...``); a plan's parameter shapes
are given under the new names.

Imports from fxsym: errors, importance, plugins, symbols.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import PlanError
from ..plugins.calls import call_hook
from ..plugins.contracts import NeededBlocks
from ..symbols import DepthGroup, SymMap
from .importance import run_batch

__all__ = ["BlockKind", "DepthCriterion", "block_importance", "choose_blocks", "depth_refusal",
           "needed_kinds", "renamed", "top_blocks", "usable_blocks"]

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


@dataclass(frozen=True)
class BlockKind:
    """A kind of blocks of a depth group at least one of which must stay (a plugin's
    ``fxsym_depth_kinds``): what tells its blocks from the others, their positions in the
    stack, and why one must stay."""

    label: str
    positions: tuple[int, ...]
    reason: str


def needed_kinds(model: nn.Module, symmap: SymMap, group: DepthGroup) -> tuple[BlockKind, ...]:
    """The kinds of blocks of ``group`` of which ``model`` must keep one (every plugin's
    ``fxsym_depth_kinds``; see the module docstring)."""
    out: list[BlockKind] = []
    answers: list[Mapping[str, NeededBlocks] | None] = call_hook(
        "fxsym_depth_kinds", symmap.registry.plugin_manager, model=model, group=group)
    for found in answers:
        for label, (positions, why) in (found or {}).items():
            kept = tuple(sorted({int(i) for i in positions if 0 <= int(i) < group.size}))
            if kept and all(k.positions != kept for k in out):
                out.append(BlockKind(str(label), kept, str(why)))
    return tuple(out)


def depth_refusal(model: nn.Module, symmap: SymMap, group: DepthGroup,
                  kept: Sequence[int]) -> str | None:
    """Why keeping the blocks ``kept`` of ``group`` would be refused when they are dropped
    (the first plugin's ``fxsym_depth_refusal`` answer), or ``None``; nothing is dropped."""
    answers: list[str | None] = call_hook("fxsym_depth_refusal", symmap.registry.plugin_manager,
                                          model=model, group=group, kept=sorted(kept))
    for said in answers:
        if said:
            return str(said)
    return None


def choose_blocks(symmap: SymMap, layers: Any, scores: Mapping[str, Any] | None, *,
                  model: nn.Module | None = None, notes: list[str] | None = None
                  ) -> dict[str, list[int]]:
    """``{depth group name: positions kept}`` for ``layers`` (see the module docstring);
    ``scores`` rank blocks where a count is given. With ``model``, the kinds of blocks it
    needs (:func:`needed_kinds`) are kept: a count swaps in the best-ranked block of a
    missing kind (said in ``notes``), positions that lose one are a
    :class:`~fxsym.errors.PlanError`."""
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
        kinds = needed_kinds(model, symmap, group) if model is not None else ()
        out[name] = _kept(group, want, None if scores is None else scores.get(name), kinds,
                          notes if notes is not None else [])
    return out


def _kept(group: DepthGroup, want: Any, scores: Any, kinds: Sequence[BlockKind],
          notes: list[str]) -> list[int]:
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
        kept, said = top_blocks(group, k, s, kinds)
        notes.extend(said)
        return kept
    if isinstance(want, (str, bytes)) or not isinstance(want, Sequence):
        raise PlanError(f"layers must be a count, a list of blocks to keep or a mapping of "
                        f"them; got {want!r}")
    kept = list(want)
    if not kept or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                           for i in kept) or len(set(kept)) != len(kept) or any(
            not 0 <= i < group.size for i in kept):
        raise PlanError(f"layers: the blocks to keep of {group.container} must be distinct "
                        f"positions in [0, {group.size}); got {kept!r}")
    for kind in kinds:
        if not set(kept) & set(kind.positions):
            raise PlanError(f"layers: keeping the blocks {sorted(kept)} of {group.container} "
                            f"keeps no block of the kind {kind.label} (positions "
                            f"{list(kind.positions)}): {kind.reason}; keep one of them")
    return sorted(int(i) for i in kept)


def top_blocks(group: DepthGroup, k: int, scores: Any, kinds: Sequence[BlockKind] = ()
               ) -> tuple[list[int], list[str]]:
    """The ``k`` blocks of ``group`` of highest ``scores``, in order, with a block of each of
    ``kinds`` (see the module docstring), and a note for each swap that made; a
    :class:`~fxsym.errors.PlanError` where ``k`` is fewer than the kinds."""
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    if k >= group.size:
        return list(range(group.size)), []
    kept = {int(i) for i in torch.topk(s, k, sorted=False).indices}
    if len(kinds) > k:
        raise PlanError(f"layers={k}: {group.container} must keep a block of each of "
                        f"{len(kinds)} kinds ({'; '.join(x.label for x in kinds)}): keep at "
                        f"least {len(kinds)}")
    notes = []

    def rank(i: int) -> tuple[float, int]:
        return float(s[i]), -i

    for kind in kinds:
        if kept & set(kind.positions):
            continue
        best = max(kind.positions, key=rank)
        last = {i for other in kinds if other is not kind
                for i in kept & set(other.positions) if len(kept & set(other.positions)) == 1}
        victims = [i for i in kept if i not in last]
        if not victims:
            raise PlanError(f"layers={k}: no {k} blocks of {group.container} hold a block of "
                            f"each kind it must keep ({'; '.join(x.label for x in kinds)})")
        worst = min(victims, key=rank)
        kept = (kept - {worst}) | {best}
        notes.append(f"layers={k} keeps block {best} of {group.container} in place of block "
                     f"{worst} (the lowest-ranked kept): it is the best-ranked of the kind "
                     f"{kind.label} (positions {list(kind.positions)}), of which one must "
                     f"stay ({kind.reason})")
    return sorted(kept), notes


def usable_blocks(model: nn.Module, symmap: SymMap, group: DepthGroup, k: int, scores: Any
                  ) -> tuple[list[int] | None, str | None]:
    """The ``k`` blocks of ``group`` a count keeps (:func:`top_blocks`, the kinds the model
    needs kept) and ``None``; or ``None`` and why they cannot be kept: fewer blocks than
    needed kinds, or a plugin would refuse them (:func:`depth_refusal`: a config that cannot
    say them while the blocks read values chosen by position)."""
    try:
        kept, _ = top_blocks(group, k, scores, needed_kinds(model, symmap, group))
    except PlanError as exc:
        return None, str(exc)
    if len(kept) == group.size:
        return kept, None
    why = depth_refusal(model, symmap, group, kept)
    return (None, why) if why is not None else (kept, None)


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
