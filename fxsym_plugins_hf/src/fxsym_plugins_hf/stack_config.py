"""``model.config`` after blocks of a depth group were dropped (the ``fxsym_after_depth`` hook).

Which config fields describe the stack is found by building the model on the meta device,
never from equal numbers or by their names (issue 19 §7, issue 29 §2):

* the **count**: the int field (``num_hidden_layers``, ``n_layer`` ...) whose value set one
  lower builds the stack one block shorter; it becomes the number of blocks kept;
* **per-layer lists** (``layer_types``, ``no_rope_layers``): a list of one entry per block,
  shown to be read per block: a config with one more block and the list as it is does not
  build or is refused by the class's own checks, with the list's last entry repeated it
  builds and is accepted. It keeps the entries of the kept blocks;
* **lists of block positions** (``mlp_only_layers``, ``attn_layer_indices``): ints below the
  count whose removal (an empty list: listing every block) changes the blocks the build makes.
  They keep the kept blocks' new positions.

The result is checked: a model built from the new config on the meta device has as many
blocks, each of the *kind* of the block it replaces (its modules' classes, their string, bool
and ``None`` attributes: ``layer_type``, ``sliding_window`` set or not; and, where the config
describes the widths, its parameters' shapes), and the class's own checks accept the config.
Where it does not (blocks of different kinds chosen by a rule on their position:
``first_k_dense_replace``, ``decoder_sparse_step``), the fields that choose the kinds are
searched: each list of block positions is set to hold the blocks that are of their kind when
listed and not when left out (two builds: every block listed, none), and each int field
whose change changes the kinds the build makes (a rule's parameter) is tried over
``0 .. K + 1`` for ``K`` blocks kept, the lists refitted each time, keeping a value that
leaves fewer differences (module classes and flags, over all blocks: Jamba's attention
offset and expert offset each set one of two), until every block is of its kind or no
value helps; then, where that fails and it takes at most :data:`PAIR_BUILDS` builds, pairs
of those fields over the same values (a period and its offset change together).
Where no config found so describes the kept blocks, the config records the stack as one it
cannot describe (``config.fxsym_nonuniform["blocks"]``: each kept block's position in the
stack the unpruned config builds), so that :func:`fxsym.save` writes fxsym's own checkpoint
type, whose loader replays the plan; a :class:`fxsym.ResizeWarning` names the first block
that differs and how. Where, besides, the blocks read values the model chooses by position
(``DepthGroup.varying_inputs``: a hybrid's masks), the depth is refused
(:class:`fxsym.ResizeError` naming both): those choices would not follow the blocks. No
field setting the count is refused too.
Per-module sizes the config records for a non-uniform plan follow the blocks' new names.

Where transformers' cache of the unpruned model works and the pruned one's would not (a
hybrid keeping none of its attention layers: ``generate`` would fail in transformers, as for
an unpruned config of linear layers only), the depth is refused (:class:`fxsym.ResizeError`);
:mod:`fxsym_plugins_hf.blockkinds` asks the same before anything is dropped, so that a plan
keeps such a layer. :func:`pruned_config` makes the config without changing the model, for
those questions.

The config is copied, never changed in place (every module holding it gets the copy), and
the config from before fxsym's first resize is kept as for a width resize.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fxsym import ResizeWarning
from fxsym.errors import ResizeError

from .configs import NONUNIFORM, UNPRUNED, config_accepted, meta_build

__all__ = ["Pruned", "cache_refusal", "kind", "pruned_config", "refusal", "uncached",
           "update_config_depth"]

#: the key of ``config.fxsym_nonuniform`` recording a stack the config cannot describe
BLOCKS = "blocks"


def update_config_depth(model: nn.Module, group: Any, kept: Sequence[int]) -> list[str] | None:
    """Give ``model`` a config describing the stack ``group`` once only the blocks ``kept``
    remain; the names of the per-layer fields it made follow the kept blocks (the count alone
    where none had to change and a build showed each kept block of its kind; ``None``
    without a config). A :class:`fxsym.ResizeError` for a choice :func:`refusal` refuses."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    if UNPRUNED not in vars(model):
        vars(model)[UNPRUNED] = copy.deepcopy(config)
    stack = model.get_submodule(group.container)
    pruned = pruned_config(model, group, kept, list(stack.children()))
    refused = refusal(model, pruned, group, kept)
    if refused is not None:
        raise ResizeError(refused)
    if pruned.undescribed is not None:
        _undescribed(model, pruned, group, kept, getattr(config, NONUNIFORM, None))
    for mod in model.modules():
        state = vars(mod)
        for key, value in list(state.items()):
            if id(value) in pruned.memo and hasattr(value, "to_dict"):
                state[key] = pruned.memo[id(value)]
    changed = [f for f in dict.fromkeys(pruned.followed) if f != pruned.count]
    # a config built to give every kept block its kind makes any choice by position follow,
    # even where no field but the count changed (Jamba's layers 0, 1: the period fits as is)
    return changed or ([pruned.count] if pruned.built_alike else [])


@dataclass
class Pruned:
    """The config :func:`pruned_config` made, and how."""

    #: the new config (a copy: the old one is untouched)
    config: Any
    #: the field setting the number of blocks
    count: str
    #: every field it changed to follow the kept blocks (the count first)
    followed: list[str]
    #: ``copy.deepcopy``'s memo of the copy: the new object of each old one
    memo: dict[int, Any]
    #: where the config cannot describe the kept blocks: the first block a model built from it
    #: has of another kind, and how (``None``: it describes them)
    undescribed: str | None
    #: how the config is checked against the kept blocks
    check: _Check
    #: whether a model built from the config was seen to have every kept block, each of its
    #: kind in its new position
    built_alike: bool = False


def pruned_config(model: nn.Module, group: Any, kept: Sequence[int],
                  blocks: Sequence[nn.Module]) -> Pruned:
    """The config of ``model`` describing the stack ``group`` once only the blocks ``kept``
    (positions in the unpruned stack) remain, ``blocks`` the modules of those blocks (the
    stack once pruned, or the unpruned stack's at ``kept``); nothing of ``model`` changes.
    A :class:`fxsym.ResizeError` where no field sets the number of blocks."""
    config = model.config
    n, k = group.size, len(kept)
    count = _count_field(model, config, group.container, n)
    if count is None:
        raise ResizeError(f"no field of {type(config).__name__} sets the number of blocks of "
                          f"{group.container} (built on the meta device with each int field "
                          f"of value {n} lowered, none gave one block fewer)")
    memo: dict[int, Any] = {}
    new = copy.deepcopy(config, memo)
    setattr(new, count, k)
    followed = [count]
    for field in _per_layer_lists(model, config, count, n):
        setattr(new, field, type(getattr(config, field))(getattr(config, field)[i]
                                                          for i in kept))
        followed.append(field)
    positions = _position_lists(model, config, group.container, n)
    for field in positions:
        old = set(getattr(config, field))
        setattr(new, field, type(getattr(config, field))(
            j for j, i in enumerate(kept) if i in old))
        followed.append(field)
    nonuniform = getattr(config, NONUNIFORM, None)
    if nonuniform:
        setattr(new, NONUNIFORM, _renamed(nonuniform, group, kept))
    wanted = [kind(b, shapes=not nonuniform) for b in blocks]
    check = _Check(model, group.container, wanted)
    why = None
    # one build where the config describes the blocks; none compared where the class
    # cannot be built on meta at all
    differences = check.mismatches(new)
    if differences and _length(meta_build(model, config), group.container):
        followed += _search(check, config, new, count, positions, n, k)
        differences = check.mismatches(new)
        if differences:
            why = check.first_difference(new)
    return Pruned(new, count, followed, memo, why, check, differences == 0)


def cache_refusal(config: Any) -> str | None:
    """Why transformers' cache for a model of ``config`` cannot be used (``None`` if it
    can): the error its ``get_seq_length`` raises, as ``generate`` calls it."""
    import transformers

    try:
        transformers.DynamicCache(config=config).get_seq_length()
    except Exception as exc:  # whatever transformers refuses a cache of this config for
        return f"{type(exc).__name__}: {exc}"
    return None


def uncached(old: Any, new: Any) -> str | None:
    """Why ``generate`` fails on the pruned model of config ``new`` where it works on the
    unpruned one of ``old`` (``None`` if it does not): transformers' cache of the one can be
    used and of the other not (a hybrid keeping none of its attention layers: a cache of
    linear layers only has no sequence length, as for an unpruned config of linear layers
    only)."""
    if cache_refusal(old) is not None:
        return None
    why = cache_refusal(new)
    if why is None:
        return None
    return (f"transformers' cache of the pruned model cannot be used ({why}), so generate "
            "would fail (as it does for an unpruned config of such layers only); keep a "
            "block of each kind the cache needs (fxsym.plan's layers=K keeps one by itself)")


def _length(model: nn.Module | None, container: str) -> int | None:
    if model is None:
        return None
    try:
        return len(list(model.get_submodule(container).children()))
    except AttributeError:
        return None


def _count_field(model: nn.Module, config: Any, container: str, n: int) -> str | None:
    fields = [f for f, v in vars(config).items()
              if type(v) is int and v == n and not f.startswith("_")]
    for field in fields:
        probe = copy.deepcopy(config)
        setattr(probe, field, n - 1)
        _shorten_lists(probe, n, n - 1)
        if _length(meta_build(model, probe), container) == n - 1:
            return str(field)
    return None


def _shorten_lists(config: Any, n: int, m: int) -> None:
    """Cut (or lengthen, repeating the last entry) every list of ``n`` entries to ``m``: a
    probe changing the count must not fail on a list the class checks against it."""
    for field, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and n:
            items = list(value)[:m] + [value[-1]] * max(0, m - n)
            setattr(config, field, type(value)(items))


def _builds(model: nn.Module, config: Any) -> bool:
    """Whether the class builds from ``config`` on meta and its own checks accept it."""
    return meta_build(model, config) is not None and config_accepted(config)


def _per_layer_lists(model: nn.Module, config: Any, count: str, n: int) -> list[str]:
    lists = [f for f, v in vars(config).items()
             if isinstance(v, (list, tuple)) and len(v) == n and not f.startswith("_")]
    out = []
    for field in lists:
        longer = copy.deepcopy(config)
        setattr(longer, count, n + 1)
        _shorten_lists(longer, n, n + 1)  # every other list follows the count
        setattr(longer, field, getattr(config, field))
        if _builds(model, longer):
            continue  # neither the build nor the checks want an entry per block: not per block
        setattr(longer, field, type(getattr(config, field))(
            [*getattr(config, field), getattr(config, field)[-1]]))
        if _builds(model, longer):
            out.append(field)
    return out


def _position_lists(model: nn.Module, config: Any, container: str, n: int) -> list[str]:
    base: dict[str, Any] | None = None
    out = []
    for field, value in vars(config).items():
        if field.startswith("_") or not isinstance(value, (list, tuple)) or not all(
                type(i) is int and 0 <= i < n for i in value) or len(value) == n:
            continue
        if base is None:
            base = _signature(meta_build(model, config), container)
        probe = copy.deepcopy(config)
        setattr(probe, field, type(value)() if value else type(value)(range(n)))
        if base is not None and _signature(meta_build(model, probe), container) != base:
            out.append(field)
    return out


def _signature(model: nn.Module | None, container: str) -> dict[str, Any] | None:
    if model is None:
        return None
    stack = model.get_submodule(container)
    return {name: tuple(p.shape) for name, p in stack.named_parameters()}


def kind(block: nn.Module, *, shapes: bool) -> dict[str, Any]:
    """What makes ``block`` the block it is, beyond its weights' values: its modules'
    classes, their string, bool and ``None`` attributes, and its parameters' shapes if
    ``shapes``."""
    out: dict[str, Any] = {}
    for path, mod in block.named_modules():
        out[f"{path}:class"] = type(mod).__qualname__
        for name, value in vars(mod).items():
            if not name.startswith("_") and name != "training" and (
                    value is None or type(value) in (str, bool)):
                out[f"{path}.{name}"] = value
        if shapes:
            for name, p in mod.named_parameters(recurse=False):
                out[f"{path}.{name}:shape"] = tuple(p.shape)
    return out


class _Check:
    """How far a config is from describing the stack ``container`` whose blocks are of the
    kinds ``wanted``."""

    def __init__(self, model: nn.Module, container: str, wanted: list[dict[str, Any]]) -> None:
        self.model, self.container, self.wanted = model, container, wanted
        self.shapes = any(key.endswith(":shape") for kind in wanted for key in kind)

    def built(self, config: Any) -> list[dict[str, Any]] | None:
        """The kinds of the blocks a model built from ``config`` has; ``None`` if it cannot be
        built, the class's checks refuse the config or the count differs."""
        if not config_accepted(config):
            return None
        built = meta_build(self.model, config)
        if built is None or _length(built, self.container) != len(self.wanted):
            return None
        return [kind(b, shapes=self.shapes)
                for b in built.get_submodule(self.container).children()]

    def mismatches(self, config: Any) -> int:
        """How far the blocks of a model built from ``config`` are from the wanted kinds: the
        entries of their kinds that differ, over all blocks (a block of attention where a
        mixer is wanted and of a dense MLP where experts are wanted counts twice, so that a
        change setting one of the two right is progress); ``sys.maxsize`` where it cannot be
        built or has another count."""
        kinds = self.built(config)
        if kinds is None:
            return sys.maxsize
        return sum(a.get(key) != b.get(key) for a, b in zip(kinds, self.wanted, strict=True)
                   for key in {**a, **b})

    def first_difference(self, config: Any) -> str:
        """The first block a model built from ``config`` has of another kind, and how."""
        kinds = self.built(config)
        if kinds is None:
            return (f"the config with these blocks' fields is refused by "
                    f"{type(config).__name__}'s own checks or does not build")
        for j, (theirs, mine) in enumerate(zip(kinds, self.wanted, strict=True)):
            if theirs == mine:
                continue
            keys = sorted(set(theirs) | set(mine), key=lambda key: (
                not key.endswith(":class"), key.count("."), key))
            key = next(key for key in keys if theirs.get(key) != mine.get(key))
            return (f"block {j} of {self.container} built from it has {key} "
                    f"{theirs.get(key)!r}, the block kept there {mine.get(key)!r}")
        return "the blocks differ"


#: the most meta builds the search of pairs of rule fields may take (``(K + 2)**2`` a pair)
PAIR_BUILDS = 1024


def _search(check: _Check, old: Any, new: Any, count: str, positions: list[str], n: int,
            k: int) -> list[str]:
    """Change, in ``new``, the fields that choose the blocks' kinds until a model built from
    it has the wanted kinds (see the module docstring); the fields changed (none where no
    value found does it: they stay as renumbered)."""
    rules = _rule_fields(check, old, count, positions, n)
    fields = [*positions, *rules]
    start = {f: getattr(new, f) for f in fields}

    def fitted() -> int:
        for field in positions:
            _fit(check, new, field, k)
        return check.mismatches(new)

    best = fitted()
    kept = {f: getattr(new, f) for f in fields}

    def tried(values: dict[str, int]) -> bool:
        """Whether ``values`` (the lists refitted) leave fewer differences; kept if so."""
        nonlocal best, kept
        for f, v in values.items():
            setattr(new, f, v)
        now = fitted()
        if now < best:
            best, kept = now, {f: getattr(new, f) for f in fields}
            return True
        for f, v in kept.items():
            setattr(new, f, v)
        return False

    improved = True
    while best and improved:
        improved = False
        for field in rules:
            for value in range(k + 2):
                improved = tried({field: value}) or improved
                if not best:
                    break
            if not best:
                break
    pairs = [(a, b) for i, a in enumerate(rules) for b in rules[i + 1:]]
    if best and len(pairs) * (k + 2) ** 2 <= PAIR_BUILDS:  # a period and its offset
        for a, b in pairs:
            for x in range(k + 2):
                for y in range(k + 2):
                    tried({a: x, b: y})
                    if not best:
                        break
                if not best:
                    break
            if not best:
                break
    for f, v in (kept if not best else start).items():  # no partial answer: as renumbered
        setattr(new, f, v)
    return [f for f in fields if getattr(new, f) != start[f]]


def _fit(check: _Check, new: Any, field: str, k: int) -> None:
    """Set the list of block positions ``field`` of ``new`` to hold the blocks that are of
    their wanted kind when listed, not when left out (each entry read for its own block)."""
    value = getattr(new, field)
    setattr(new, field, type(value)(range(k)))
    listed = check.built(new)
    setattr(new, field, type(value)())
    unlisted = check.built(new)
    setattr(new, field, value)
    if listed is None or unlisted is None:
        return

    def listed_here(j: int) -> bool:
        inside, outside = listed[j] == check.wanted[j], unlisted[j] == check.wanted[j]
        return j in value if inside == outside else inside

    setattr(new, field, type(value)(j for j in range(k) if listed_here(j)))


def _rule_fields(check: _Check, config: Any, count: str, positions: list[str], n: int
                 ) -> list[str]:
    """The int fields of ``config`` (the count and lists aside) between 0 and ``n`` whose
    change by one, up or down, changes which kinds of blocks, in which order, a model built
    from it has."""
    base = _kinds(check, config)
    if base is None:
        return []
    out = []
    for field, value in vars(config).items():
        if field.startswith("_") or field == count or field in positions or type(
                value) is not int or not 0 <= value <= n:
            continue
        for other_value in (value + 1, value - 1):  # a bound may change the kinds one way
            probe = copy.deepcopy(config)
            setattr(probe, field, other_value)
            other = _kinds(check, probe) if other_value >= 0 else None
            if other is not None and other != base:
                out.append(field)
                break
    return out


def _kinds(check: _Check, config: Any) -> list[dict[str, Any]] | None:
    """The kinds (classes and flags, no shapes) of the blocks built from ``config``."""
    built = meta_build(check.model, config)
    if built is None:
        return None
    return [kind(b, shapes=False) for b in built.get_submodule(check.container).children()]


def refusal(model: nn.Module, pruned: Pruned, group: Any, kept: Sequence[int]) -> str | None:
    """Why dropping the blocks of ``group`` but ``kept`` is refused (``None`` if it is not):
    a config that cannot describe the kept blocks while they read values the model chooses
    by position (``group.varying_inputs``), or a pruned model whose cache cannot be used
    (:func:`uncached`)."""
    if pruned.undescribed is not None and group.varying_inputs:
        return (f"{type(model).__name__}.config cannot describe the blocks of "
                f"{group.container} kept ({list(kept)}): the search found no values of the "
                "fields that choose each block's kind giving them in this order "
                f"({pruned.undescribed}), and the blocks read values the model chooses by "
                f"position ({group.varying_inputs[0]}), which would not follow them; keep "
                "blocks whose kinds the config can give in order")
    why = uncached(model.config, pruned.config)
    if why is not None:
        return f"{type(model).__name__} keeping the blocks {list(kept)} of {group.container}: {why}"
    return None


def _undescribed(model: nn.Module, pruned: Pruned, group: Any, kept: Sequence[int],
                 nonuniform: dict[str, dict[str, int]] | None) -> None:
    """Record on the pruned config that it cannot describe the stack (see the module
    docstring)."""
    new = pruned.config
    earlier = (nonuniform or {}).get(BLOCKS, {})
    record = dict(getattr(new, NONUNIFORM, None) or {})
    entries = {q: v for q, v in record.get(BLOCKS, {}).items()
               if not any(q == b or q.startswith(b + ".") for b in group.blocks)}
    for j, i in enumerate(kept):
        entries[f"{group.container}.{j}"] = earlier.get(group.blocks[i], i)
    record[BLOCKS] = entries
    setattr(new, NONUNIFORM, record)
    warnings.warn(
        f"{type(model).__name__}.config cannot describe the blocks of {group.container} kept "
        f"({list(kept)}): the search found no values of the fields that choose each block's "
        f"kind giving them in this order ({pruned.undescribed}); "
        f"config.{NONUNIFORM}[{BLOCKS!r}] gives each block's position in the unpruned stack, "
        "and fxsym.save writes fxsym's own checkpoint type, whose loader replays the plan",
        ResizeWarning, stacklevel=2)


def _renamed(nonuniform: dict[str, dict[str, int]], group: Any,
             kept: Sequence[int]) -> dict[str, dict[str, int]]:
    new_name = {group.blocks[i]: f"{group.container}.{j}" for j, i in enumerate(kept)}
    out: dict[str, dict[str, int]] = {}
    for field, where in nonuniform.items():
        entries: dict[str, int] = {}
        for qualname, size in where.items():
            block = next((b for b in group.blocks if qualname == b or qualname.startswith(
                b + ".")), None)
            if block is None:
                entries[qualname] = size
            elif block in new_name:
                entries[new_name[block] + qualname[len(block):]] = size
        out[field] = entries
    return out
