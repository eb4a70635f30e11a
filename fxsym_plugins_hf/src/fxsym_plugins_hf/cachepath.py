"""The cached path ``generate`` runs, tried after a trial resize (the ``fxsym_untraced_paths``
hook).

fxsym traces a transformers model with ``use_cache=False`` (:mod:`.context`: a cache object
cannot be a graph value), but ``generate`` runs the other path: a prefill with
``use_cache=True``, then decode steps that read the cache. What that path reads and the trace
never ran can disagree with a resize: RWKV's recurrent state is allocated from
``config.hidden_size`` and written with the attention's own width; xLSTM's cache is sized by
``v_dim``, a value its config computes from ``hidden_size`` (rounded up to 64) while the layers
hold theirs. The analysis cannot prove such a group safe, so it is tried:

* copies of the model whose parameters and buffers are meta tensors (nothing real is copied)
  run the cached path as ``generate`` does: the prefill (``prepare_inputs_for_generation`` of
  the example inputs, a forward with ``use_cache=True``), then one decode step (the cache the
  prefill returned, one more token, ``next_sequence_length=1``);
* one trial: every searchable group resized to a fraction of its size between a quarter and
  three quarters, another for each group in turn (:func:`_apart`: sizes equal before end
  unequal and ratios change, since RWKV's hidden size and attention widths each break its
  cache alone but not together), rounded down to :attr:`fxsym.SymGroup.step`, not under
  ``min_size``;
* a finding is about the cache only where the forward without a cache, run on the resized
  copy (the mask builders skipping their checks of values, as in the trace:
  :func:`.masks.meta_counts_as_traced`), runs with the same sizes. A size it refuses too (an
  odd width a complex view splits in pairs, which breaks every path) is replaced by the
  group's next trial size that runs (:func:`_runnable`); a group none of whose trial sizes
  runs is left out, not pinned, and a report line names it as not tried; groups that fail the
  cached path only together, where that forward fails with them together too, are not pinned
  and a report line gives both errors;
* where the forward without a cache cannot run on the unresized meta copy at all (an
  ``.item()``, a branch on values: meta tensors hold none), no size can be shown to be the
  forward's own refusal (:func:`_in_doubt`): a report line gives that forward's error; a group
  is pinned only where each of its trial sizes, resized alone, fails the cached path (which
  runs unresized: at no size tried does ``generate`` run, whoever refuses it), its reason
  saying the size may break every path; a size that fails where another of the group runs,
  and groups failing only together, are said in that line, not pinned. In doubt, the trial
  says what it could not tell rather than pin a group for a failure that may not be the
  cache's;
* the trials run under a manager of their own holding the same plugins
  (:func:`_trial_manager`): a plugin whose hook fails on a copy is never disabled for the
  caller;
* where it fails, the unresized copy runs the path: where it cannot either (a kernel with no
  meta implementation), nothing is pinned and a report line says the path was not tried;
  else each group is resized alone to its size of the trial, and each group whose own trial
  fails is pinned, the failure in its reason; groups that fail only together are all pinned
  (but see above); a joint failure that does not recur when tried again (a plugin's hook
  failed on the first copy, disabled since) pins nothing and is said.

What the trial could not check is one report line of the model (``<model>``, the key
:data:`NOT_TRIED`), its parts joined by ``; ``.

A trial sees what fails (a shape the cache disagrees with, a check that raises); it does not
compare values, so a cached path that reads a stale size and still runs is not seen, nor a
group that breaks only at sizes not tried. Only decoder-only models that can generate,
analyzed with ``input_ids``, are tried. The trials run on the meta device with the trace's
kernel choices (:func:`.context.traceable_kernels`): when nothing fails, one copy, one
resize and two forwards on meta tensors per analysis. The answers of the last trials are
remembered by what decides them (:mod:`.trialkey`): a model analyzed again as it was, or
another of the same build, reuses its answer (a copy) instead of running the trials again.
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import fxsym

from .context import model_configs, traceable_kernels
from .masks import meta_counts_as_traced
from .trialkey import trial_key

#: the keyword under which ``untraced_paths`` says what the trial could not check
NOT_TRIED = ""


def untraced_paths(model: nn.Module, symmap: Any, example_inputs: Any) -> dict[str, str]:
    """``{group name: reason}`` for each searchable group of ``symmap`` whose trial resize
    breaks ``model``'s cached path (see the module docstring), and ``NOT_TRIED: why`` when what
    the trial could not check is to be said: the unresized model cannot run that path on meta
    tensors, nor its forward without a cache, or some groups were not tried."""
    ids = _input_ids(model, example_inputs)
    groups = [g for g in symmap.groups() if g.size >= 2]
    if ids is None or not groups:
        return {}
    current = fxsym.plugins.get_plugin_manager()
    plugins = [p for _, p in current.list_name_plugin() if p is not None]
    keyed = trial_key(model, symmap, groups, example_inputs, plugins)
    if keyed is not None:
        with _LOCK:
            known = _ANSWERS.get(keyed[0])
            if known is not None:
                _ANSWERS.move_to_end(keyed[0])
                return dict(known[0])
    with fxsym.use_plugins(_trial_manager()):
        found = _untraced(model, symmap, groups, ids, example_inputs)
    if keyed is not None:
        with _LOCK:
            _ANSWERS[keyed[0]] = (dict(found), keyed[1])
            while len(_ANSWERS) > _REMEMBERED:
                _ANSWERS.popitem(last=False)
    return found


#: how many answers are remembered (each holds what its key names by identity)
_REMEMBERED = 64
_ANSWERS: OrderedDict[Hashable, tuple[dict[str, str], list[Any]]] = OrderedDict()
_LOCK = threading.Lock()


def _trial_manager() -> fxsym.PluginManager:
    """A manager of the plugins in use, the same objects: the trials' resizes call their
    hooks (``fxsym_after_resize`` brings the copy's config along, as a real resize would),
    and a plugin whose hook fails on a throw-away meta copy is disabled in this manager
    only, never in the caller's."""
    current = fxsym.plugins.get_plugin_manager()
    trial = fxsym.PluginManager()
    for name, plugin in current.list_name_plugin():
        if plugin is not None:
            trial.register(plugin, name=name)
    return trial


def _untraced(model: nn.Module, symmap: Any, groups: Sequence[Any], ids: torch.Tensor,
              example_inputs: Any) -> dict[str, str]:
    """:func:`untraced_paths` under the trial manager."""
    # the mask's values are data a meta tensor lacks (transformers asks whether it is all
    # ones); the path's shapes are the same without it
    others = {k: v for k, v in example_inputs.items() if k not in ("input_ids", "attention_mask")}
    sizes = _apart(groups)
    if not sizes or (joint := _try(model, symmap, sizes, ids, others)) is None:
        return {}
    failure = _try(model, symmap, {}, ids, others)
    if failure is not None:
        return {NOT_TRIED: f"the cached path (use_cache=True, one decode step, as generate "
                           f"runs it) does not run on meta tensors ({failure}): no resize "
                           "was tried on it"}
    plain = _try(model, symmap, {}, ids, others, cached=False)
    if plain is not None:
        return _in_doubt(model, symmap, groups, sizes, ids, others, plain)
    notes: list[str] = []
    if _try(model, symmap, sizes, ids, others, cached=False) is not None:
        runnable = _runnable(model, symmap, groups, sizes, ids, others)
        untried = [name for name in sizes if name not in runnable]
        if untried:
            notes.append(f"{_CACHED} was not tried for {', '.join(untried)}: the forward "
                         "without a cache fails on a meta copy at each of their trial sizes; "
                         "they are not pinned")
        sizes = runnable
        if not sizes or (joint := _try(model, symmap, sizes, ids, others)) is None:
            return _said(notes)
    size_of = {g.name: g.size for g in groups}
    found: dict[str, str] = {}
    for name, size in sizes.items():
        failure = _try(model, symmap, {name: size}, ids, others)
        if failure is not None:
            found[name] = (f"resized from {size_of[name]} to {size} units (a trial on a meta "
                           f"copy), {_CACHED} fails: {failure}")
    if found:
        return {**_said(notes), **found}
    # each one runs alone, not all of them together
    together = ", ".join(f"{name} to {size}" for name, size in sizes.items())
    failure = _try(model, symmap, sizes, ids, others)
    if failure is None:  # a plugin whose hook failed on the first copy is disabled since
        notes.append(f"{_CACHED} failed with {together} units ({joint}), not when tried "
                     "again: nothing is pinned")
        return _said(notes)
    refused = _try(model, symmap, sizes, ids, others, cached=False)
    if refused is not None:
        notes.append(f"with {together} units, {_CACHED} fails ({failure}) and so does the "
                     f"forward without a cache on the meta copy ({refused}): no finding about "
                     "the cache; each alone runs the cached path, nothing is pinned")
        return _said(notes)
    return {**_said(notes), **{
        name: (f"resized from {size_of[name]} to {size} units with every group resized (a "
               f"trial on a meta copy), {_CACHED} fails: {failure}")
        for name, size in sizes.items()}}


def _in_doubt(model: nn.Module, symmap: Any, groups: Sequence[Any], sizes: Mapping[str, int],
              ids: torch.Tensor, others: Mapping[str, Any], plain: str) -> dict[str, str]:
    """The trial where the forward without a cache cannot run on the unresized meta copy
    (``plain``, its error): no size can be shown to be one the forward refuses on every path.
    A group is pinned where each of its trial sizes, alone, fails the cached path (which runs
    unresized: whatever it is, that size breaks ``generate``); where one size fails and
    another runs, and where groups fail only together, it is said, not pinned."""
    notes = [f"the model's forward without a cache does not run on meta tensors ({plain}): "
             f"the trial cannot tell a size the forward refuses on every path from one "
             f"{_CACHED} disagrees with; a group is pinned only where each of its trial sizes "
             "fails the cached path"]
    found: dict[str, str] = {}
    ran: dict[str, int] = {}
    for g in groups:
        if g.name not in sizes:
            continue
        tried = _trial_sizes(g, sizes[g.name])
        failure = _try(model, symmap, {g.name: tried[0]}, ids, others)
        if failure is None:
            ran[g.name] = tried[0]
            continue
        size = next((s for s in tried[1:]
                     if _try(model, symmap, {g.name: s}, ids, others) is None), None)
        if size is None:
            found[g.name] = (f"resized from {g.size} to each of {_listed(tried)} units (trials "
                             f"on a meta copy), {_CACHED} fails: {failure} (the forward "
                             "without a cache cannot run on meta tensors here: each size may "
                             "break every path, not only the cached one)")
        else:
            notes.append(f"{g.name} resized from {g.size} to {tried[0]} units fails {_CACHED} "
                         f"({failure}), not at {size}: not pinned, the size may be one the "
                         "forward refuses on every path")
            ran[g.name] = size
    if len(ran) > 1 and (failure := _try(model, symmap, ran, ids, others)) is not None:
        notes.append(f"with {', '.join(f'{n} to {s}' for n, s in ran.items())} units, "
                     f"{_CACHED} fails ({failure}) while each alone runs it: not pinned, the "
                     "sizes together may break every path")
    return {**_said(notes), **found}


def _said(notes: Sequence[str]) -> dict[str, str]:
    """The ``<model>`` report line of what the trial could not check, if anything."""
    return {NOT_TRIED: "; ".join(notes)} if notes else {}


def _listed(sizes: Sequence[int]) -> str:
    return ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}" if len(sizes) > 1 else str(
        sizes[0])


_CACHED = ("the model's cached forward (use_cache=True then one decode step, as generate runs "
           "it; not traced)")
#: fractions kept by the trial, one per group in turn (the first group halved): sizes equal
#: before the resize end unequal, and ratios between sizes change
_FRACTIONS = (1 / 2, 3 / 8, 5 / 8, 1 / 4, 3 / 4, 7 / 16, 9 / 16, 5 / 16, 11 / 16)


def _apart(groups: Sequence[Any]) -> dict[str, int]:
    """Each group resized to another fraction of its size (groups of one same-size class to
    one size), so that a path needing two sizes equal, or in a ratio, fails: two groups of
    one size never get the same new size where another is possible."""
    out: dict[str, int] = {}
    given: dict[int, set[int]] = {}
    for i, g in enumerate(groups):
        tied = [out[n] for n in g.same_size if n in out]
        if tied:
            out[g.name] = tied[0]
            continue
        used = given.setdefault(g.size, set())
        sizes = [s for k in range(len(_FRACTIONS))
                 if (s := _rounded(g, round(g.size * _FRACTIONS[(i + k) % len(_FRACTIONS)])))
                 is not None]
        fresh = [s for s in sizes if s not in used]
        if fresh or sizes:
            out[g.name] = (fresh or sizes)[0]
            used.add(out[g.name])
    return out


def _runnable(model: nn.Module, symmap: Any, groups: Sequence[Any], sizes: Mapping[str, int],
              ids: torch.Tensor, others: Mapping[str, Any]) -> dict[str, int]:
    """``sizes`` with each size the uncached forward itself refuses (a size the analysis
    allows that breaks the forward whichever path runs, such as an odd width a complex view
    splits in pairs: no finding about the cached path) replaced by the group's next trial size
    that runs, the group left out of the trial where none does."""
    out: dict[str, int] = {}
    for g in groups:
        if g.name not in sizes:
            continue
        for size in _trial_sizes(g, sizes[g.name]):
            if _try(model, symmap, {g.name: size}, ids, others, cached=False) is None:
                out[g.name] = size
                break
    return out


def _trial_sizes(group: Any, first: int) -> list[int]:
    """``first``, then the group's other trial sizes (each fraction of its size, rounded)."""
    return list(dict.fromkeys([first] + [s for f in _FRACTIONS
                                         if (s := _rounded(group, round(group.size * f)))
                                         is not None]))


def _input_ids(model: nn.Module, example_inputs: Any) -> torch.Tensor | None:
    """The token ids a decoder-only generative model is analyzed with, else ``None``."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return None
    config = getattr(model, "config", None)
    if (not isinstance(model, GenerationMixin) or not isinstance(example_inputs, Mapping)
            or getattr(config, "is_encoder_decoder", False)):
        return None
    can_generate = getattr(model, "can_generate", None)
    try:
        if not callable(can_generate) or not can_generate():
            return None
    except Exception:  # a model that cannot say: it is not tried
        return None
    ids = example_inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    return ids


def _rounded(group: Any, size: int) -> int | None:
    """``size`` rounded down to the group's step, or ``None`` below its least size."""
    step = max(1, group.step)
    size -= size % step
    return size if size >= max(1, group.min_size) and size < group.size else None


def _try(model: nn.Module, symmap: Any, sizes: Mapping[str, int], ids: torch.Tensor,
         others: Mapping[str, Any], *, cached: bool = True) -> str | None:
    """Resize a meta copy of ``model`` to ``sizes`` (units kept from the first) and run its
    cached path (``cached``) or one forward without a cache; what failed, or ``None``."""
    clone, clone_map = _meta_copy(model, symmap)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the configs of a throw-away copy
            if sizes:
                fxsym.resize(clone, clone_map, {name: torch.arange(n)
                                                for name, n in sizes.items()})
            with traceable_kernels(model_configs(clone)):
                if cached:
                    _cached_path(clone, ids.to("meta"), _to_meta(dict(others)))
                else:  # the mask builders skip their checks of values, as in the trace
                    with torch.no_grad(), meta_counts_as_traced():
                        clone(input_ids=ids.to("meta"), use_cache=False,
                              **_to_meta(dict(others)))
    except Exception as exc:  # what the path raised is the answer
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _cached_path(model: Any, ids: torch.Tensor, others: dict[str, Any]) -> None:
    """Prefill then one decode step, as ``generate`` does (its own input preparation)."""
    kwargs: dict[str, Any] = {**others, "use_cache": True}
    with torch.no_grad():
        inputs = model.prepare_inputs_for_generation(ids, is_first_iteration=True, **kwargs)
        out = model(**inputs, return_dict=True)
        kwargs = model._update_model_kwargs_for_generation(out, kwargs)
        token = out.logits[:, -1:].argmax(-1).to(ids.dtype)
        ids = torch.cat([ids, token], dim=1)
        inputs = model.prepare_inputs_for_generation(ids, next_sequence_length=1, **kwargs)
        model(**inputs, return_dict=True)


def _meta_copy(model: nn.Module, symmap: Any) -> tuple[nn.Module, Any]:
    """A deep copy of ``model`` and ``symmap`` together whose parameters and buffers are meta
    tensors (none of the model's data is copied), the copy's SymMap on the registry of the
    manager in use (the trials' own: its resize calls their hooks)."""
    from fxsym.registry import get_registry

    memo: dict[int, Any] = {id(symmap.registry): get_registry()}
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) in memo:
            continue
        meta = tensor.detach().to("meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    clone: tuple[nn.Module, Any] = copy.deepcopy((model, symmap), memo)
    return clone


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "(no message)"
