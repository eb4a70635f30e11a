"""Which blocks a depth prune must keep, and which choices of blocks it refuses, asked before
any block is dropped (the ``fxsym_depth_kinds`` and ``fxsym_depth_refusal`` hooks).

**Kinds** are found by probing, never by a family's name: the blocks of the unpruned stack
are grouped by what makes each the block it is (:func:`fxsym_plugins_hf.stack_config.kind`: its
modules' classes and their string, bool and ``None`` attributes; Jamba's Mamba and attention
layers, Qwen3-Next's linear and full attention, Gemma 2's sliding and full layers). A kind
is **needed** where the model pruned of every block of that kind could not be used as the
unpruned one is: the config describing the remaining blocks is made exactly as the prune
would make it (:func:`fxsym_plugins_hf.stack_config.pruned_config`: count, per-layer lists, the
rule fields searched) and transformers' cache is built from it as ``generate`` builds it
(``DynamicCache(config=...)``, then ``get_seq_length``, the first thing ``generate`` asks).
Today that finds the attention layers of every hybrid (a cache of linear, Mamba or
convolution layers only has no sequence length, for an unpruned config of such layers too),
and finds nothing needed where every kind holds attention (sliding and full windows,
dense and MoE layers). The probe asks transformers' own cache, not a rule about layer types,
so a kind a later transformers needs (or stops needing) is found as it is. It is one cache
construction and one config per kind (a few meta builds, more where rule fields are searched:
under a second for the tiny hybrids); a generate on a model built at tiny widths would see
more, but the widths of an arbitrary config cannot be shrunk safely by probing alone, and
the cache is where a kept set of kinds decides whether ``generate`` runs. Where the unpruned
model's cache cannot be used either, nothing is needed.

**Refusals** (:func:`refused`) are the plugin's ``fxsym_after_depth`` refusals, found on the
unpruned model without changing it: a config that cannot describe the kept blocks while they
read values the model chooses by position, or a pruned model whose cache cannot be used. The
architecture search skips candidates so refused instead of failing the whole prune.

Both answers are kept per model while its config is the same object (every resize binds a
new one): the search asks them for each candidate.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from torch import nn

from fxsym.errors import ResizeError
from fxsym.plugins.contracts import NeededBlocks

from .stack_config import cache_refusal, kind, pruned_config, refusal

__all__ = ["needed_kinds", "refused"]

_T = TypeVar("_T")

#: per model, ``{question: (the config it was asked with, the answer)}``
_ANSWERS: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, tuple[Any, Any]]] = \
    weakref.WeakKeyDictionary()


def _remembered(model: nn.Module, question: Hashable, answer: Callable[[], _T]) -> _T:
    """``answer()``, kept for ``model`` while its config is the same object."""
    config = getattr(model, "config", None)
    known = _ANSWERS.setdefault(model, {})
    held = known.get(question)
    if held is not None and held[0] is config:
        return held[1]  # type: ignore[no-any-return]
    value = answer()
    known[question] = (config, value)
    return value


def _blocks(model: nn.Module, group: Any) -> list[nn.Module] | None:
    """The blocks of ``group`` in ``model`` (``None`` if it holds another number of them:
    a stale analysis)."""
    try:
        blocks = list(model.get_submodule(group.container).children())
    except AttributeError:
        return None
    return blocks if len(blocks) == group.size else None


def _config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    return config if config is not None and hasattr(config, "to_dict") else None


def needed_kinds(model: nn.Module, group: Any) -> dict[str, NeededBlocks] | None:
    """``{kind: NeededBlocks(its positions, why one must stay)}`` for each kind of blocks of
    ``group`` that ``model`` must keep one block of (see the module docstring); ``None`` where
    there is nothing to say."""
    return _remembered(model, ("kinds", group.container, group.size),
                       lambda: _needed_kinds(model, group))


def _needed_kinds(model: nn.Module, group: Any) -> dict[str, NeededBlocks] | None:
    config, blocks = _config(model), _blocks(model, group)
    if config is None or blocks is None or cache_refusal(config) is not None:
        return None
    kinds: list[tuple[dict[str, Any], list[int]]] = []
    for i, block in enumerate(blocks):
        k = kind(block, shapes=False)
        same = next((positions for other, positions in kinds if other == k), None)
        if same is None:
            kinds.append((k, [i]))
        else:
            same.append(i)
    if len(kinds) < 2:
        return None
    out: dict[str, NeededBlocks] = {}
    for k, positions in kinds:
        rest = [i for i in range(group.size) if i not in positions]
        try:
            pruned = pruned_config(model, group, rest, [blocks[i] for i in rest])
        except ResizeError:  # no field sets the count: the prune itself says so
            return None
        why = cache_refusal(pruned.config)
        if why is not None:
            others = [o for o, _ in kinds if o is not k]
            out[label(k, others)] = NeededBlocks(
                positions, f"without one, transformers' cache of the pruned model cannot be "
                           f"used ({why}), so generate would fail")
    return out or None


def label(mine: dict[str, Any], others: Sequence[dict[str, Any]]) -> str:
    """What tells blocks of the kind ``mine`` from those of the kinds ``others``: the block's
    class where it differs, else the outermost modules' classes or flags that differ (two at
    most), e.g. ``self_attn Qwen3NextAttention``."""
    differing = [key for key in mine if any(o.get(key) != mine[key] for o in others)]
    if ":class" in differing:
        return str(mine[":class"])
    if not differing:
        return "blocks"
    differing.sort(key=lambda key: (not key.endswith(":class"), key.count("."), key))
    depth = differing[0].count(".")
    shown = [key for key in differing if key.count(".") == depth][:2]
    return ", ".join(f"{key.removesuffix(':class')} {mine[key]}" if key.endswith(":class")
                     else f"{key.lstrip('.')}={mine[key]!r}" for key in shown)


def refused(model: nn.Module, group: Any, kept: Sequence[int]) -> str | None:
    """Why the plugin's ``fxsym_after_depth`` would refuse keeping the blocks ``kept`` of
    ``group`` (``None`` if it would not), found without changing ``model``."""
    return _remembered(model, ("refused", group.container, group.size, tuple(kept)),
                       lambda: _refused(model, group, kept))


def _refused(model: nn.Module, group: Any, kept: Sequence[int]) -> str | None:
    config, blocks = _config(model), _blocks(model, group)
    if config is None or blocks is None or len(kept) == group.size:
        return None
    try:
        pruned = pruned_config(model, group, kept, [blocks[i] for i in kept])
    except ResizeError as exc:
        return str(exc)
    return refusal(model, pruned, group, kept)
