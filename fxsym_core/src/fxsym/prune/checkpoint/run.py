"""``fxsym.prune_checkpoint``: the steps of a streamed prune, in order (the package's
docstring, :mod:`fxsym.prune.checkpoint`, says what each does).

The options are checked together first (:class:`~fxsym.prune.request.PruneRequest`), the
output is checked and locked (:mod:`.output`), the checkpoint opened (:mod:`.reader`), its
headers checked against the meta model (:mod:`.tensors`), then analysis, importance
(:mod:`.scores`), planning or the search (scored by :mod:`.losses`), the plan applied to the
meta model, and the weights (:mod:`.writing`) and other files written into a directory put in
place atomically (:func:`fxsym.prune.persist.replace_directory`).

Imports from fxsym: analysis, collector, depth, errors, importance, memo, persist, phases,
planning, request, search.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Literal

import torch
from torch import nn

from ...analysis import analyze
from ...analysis.options import checked_options
from ...errors import (
    CalibrationError,
    CheckpointError,
    ImportanceWarning,
    PlanError,
    ResizeWarning,
)
from ...memo import one_run
from ...plugins.analysis_options import declared_options
from ..collector import old_objects_frozen
from ..depth import choose_blocks, renamed
from ..importance import layout
from ..paths import writing
from ..persist import FORMAT, MANIFEST, plugin_files, replace_directory
from ..phases import phase
from ..planning import Plan, solve
from ..request import LENIENT, SHORTLIST, Checked, PruneRequest
from ..search import candidates, sizes_for, target_record
from ..search import search as architecture_search
from .calibration import calibration_bytes, read_calibration_text
from .cuts import first_names, kept_positions
from .losses import stream_losses
from .output import carried_files, copy_file
from .reader import open_checkpoint
from .scores import stream_activations, weight_scores
from .tensors import Tensors, load_buffers
from .writing import DEFAULT_SHARD_BYTES, tied_aliases, write_weights

#: :func:`prune_checkpoint`'s options left as they are when not given (the others: ``None``)
_UNGIVEN: dict[str, Any] = {"round_to": 1, "min_keep": 1, "exclude": ()}
#: the note of a plan made without the sizes the config describes, which reached no target
_UNDESCRIBED = ("no sizes the checkpoint's config can describe meet the target ({}); planned "
                "without them, so the output may be fxsym's own model type")


@one_run  # the plugins' probes asked again in the run answered once (fxsym.memo)
def prune_checkpoint(
    directory: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    calibration: str | os.PathLike[str] | Sequence[str] | None = None,
    calibration_tokens: int | None = None,
    seq_len: int | None = None,
    importance: str | None = None,
    ratio: float | None = None,
    target_params: int | None = None,
    param_ratio: float | None = None,
    target_active_params: int | None = None,
    search: bool | None = None,
    layers: int | Sequence[int] | None = None,
    sizes: Mapping[str, int] | None = None,
    scope: str | None = None,
    round_to: int = 1,
    min_keep: int = 1,
    exclude: Sequence[str] = (),
    describable: bool | None = None,
    max_shard_size: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
    status: Callable[[str], Any] | None = None,
    analysis_options: Mapping[str, str] | None = None,
    target_non_embedding_params: int | None = None,
    request: PruneRequest | None = None,
    shortlist: int | Literal["all"] | None = SHORTLIST,
    force: bool | None = None,
    **deprecated: str,
) -> Plan:
    """Prune the checkpoint in ``directory`` into ``output`` (the steps:
    :mod:`fxsym.prune.checkpoint`); return the plan.

    ``calibration`` is a text file (:func:`read_calibration_text`) or the texts themselves;
    ``importance`` is ``"activation"`` (the default with calibration text: Minitron's, on the
    consumers' inputs), ``"l1"`` or ``"l2"`` (the default without, with an
    :class:`~fxsym.errors.ImportanceWarning` where units are ranked: weight magnitude is far
    worse on a pretrained LLM). ``param_ratio`` is the
    fraction of parameters to remove (a ``target_params`` of the rest). ``layers`` keeps that
    many decoder layers (ranked by the block importance of the calibration run: calibration
    text needed) or the layers at those positions (:func:`fxsym.plan`'s ``layers``); the
    tensors of the layers kept are renamed as the layers are renumbered. ``sizes`` gives
    architecture sizes by role instead of an amount (``{"hidden": 48, "experts": 3}``; roles
    ``hidden``, ``ffn``, ``expert_ffn``, ``shared_ffn``, ``heads``, ``kv_heads``, ``experts``:
    :func:`fxsym.search.sizes_for`),
    each group keeping its units of highest importance. A parameter target with calibration
    text (``target_params`` or ``param_ratio``; or ``target_active_params``, parameters a
    token uses: :func:`fxsym.search.active_params`) is searched unless ``search`` is
    ``False`` (:func:`fxsym.options.searches`, the command line's meaning too): the plan is
    the best of a few uniform candidate architectures meeting the target
    (:func:`fxsym.search.search`), each scored by its next-token loss on the calibration text
    computed layer by layer on its pruned tensors (:func:`stream_loss`); a number of
    ``layers`` with it fixes the candidates' depth (a width-only search); the candidates are
    recorded as ``plan.extra["search"]`` (:meth:`fxsym.search.SearchResult.rows`). Only the
    ``shortlist`` candidates the calibration pass estimates least damaged
    (:func:`fxsym.shortlist.damage`) are scored by their loss (``None`` or ``"all"``: every
    candidate; ``fxsym prune --shortlist K|all``), in
    one streamed run (:func:`stream_losses`); the rows of the others say ``scored`` false.
    ``plan.extra["read"]`` gives the bytes of tensor data read from the checkpoint
    (``bytes``: the calibration run, the search's scoring run and the writing each read what
    they use) and the bytes it holds (``checkpoint``).
    ``ratio``, ``target_params``, ``scope``, ``round_to``, ``min_keep`` and ``exclude`` are
    :func:`fxsym.plan`'s (the search gives ``exclude`` and ``min_keep`` to every candidate: an
    excluded group keeps its size in all of them). ``describable`` (default: for a uniform
    plan) keeps the sizes the checkpoint's config can describe (:func:`fxsym.plan`'s
    ``describable``: Llama's hidden size a multiple of its heads), so the output loads with
    the library's own reader; where no such sizes meet the target, the plan is made without
    and ``plan.extra["notes"]`` says so (the output is then fxsym's own model type).
    ``target_non_embedding_params`` counts every parameter but the embedding tables (tied
    or not, :mod:`fxsym.embeddings`; the count model cards quote), searched or planned as
    ``target_params`` is. ``analysis_options`` are :func:`fxsym.analyze`'s keywords
    (``{name: value}``, the options the plugins declare: ``fxsym_analysis_options``); such an
    option given as a keyword of its own (``name=value``, as before) is taken with a
    :class:`DeprecationWarning`.
    ``status(message)`` (a context manager factory, e.g. a spinner) is entered around each
    step. Raises
    :class:`~fxsym.errors.CheckpointError` /
    :class:`~fxsym.errors.CalibrationError` on bad input and
    :class:`~fxsym.errors.PlanError` for a target the model cannot meet (sizes no group can
    take, more layers than it has, a parameter target no candidate reaches: found before the
    calibration runs) or an argument nothing would use (``search`` without a parameter
    target; calibration text that neither the importance, the search nor a number of
    ``layers`` reads), before ``output`` is touched. ``output`` is checked with the options
    (:meth:`~fxsym.prune.request.PruneRequest.check_output`: never the input, inside it or
    holding it, even with ``force``; not a file or a link; new or empty unless ``force``:
    then replaced whole; an output holding files without ``force`` given is still replaced,
    with a :class:`DeprecationWarning`) and locked for the whole run
    (:func:`fxsym.paths.writing`: a second prune into it is refused at once, naming the
    process writing it).

    The options are checked together before anything is read
    (:meth:`fxsym.request.PruneRequest.check`, the rules and messages ``fxsym prune`` uses);
    ``request`` (a :class:`~fxsym.request.PruneRequest` with ``checkpoint=True``) gives them
    all at once instead of the keyword arguments (``calibration_tokens`` 8192, ``seq_len``
    512 and ``scope`` ``"uniform"`` when left out; one given without what uses it is
    refused).
    """
    options: dict[str, Any] = dict(
        calibration=calibration, calibration_tokens=calibration_tokens, seq_len=seq_len,
        importance=importance, ratio=ratio, target_params=target_params,
        param_ratio=param_ratio, target_non_embedding_params=target_non_embedding_params,
        target_active_params=target_active_params, search=search,
        layers=tuple(layers) if isinstance(layers, Sequence) else layers, sizes=sizes,
        scope=scope, round_to=round_to, min_keep=min_keep, exclude=tuple(exclude),
        describable=describable,
        analysis_options=_moved_options(analysis_options, deprecated),
        max_shard_size=None if max_shard_size == DEFAULT_SHARD_BYTES else max_shard_size,
        shortlist=None if shortlist == SHORTLIST else "all" if shortlist is None else shortlist,
        force=force)
    checked = _checked(directory, output, request, options)
    with writing(output, error=CheckpointError), old_objects_frozen():
        return _prune(directory, output, checked, progress=progress, status=status)


def _moved_options(options: Mapping[str, str] | None, keywords: Mapping[str, str]
                   ) -> Mapping[str, str] | None:
    """``analysis_options`` with the analysis options given as keywords of their own (a
    :class:`DeprecationWarning` each); any other keyword is a :class:`TypeError`, as Python's."""
    if not keywords:
        return options
    declared = declared_options()
    for name in keywords:
        if name not in declared:
            raise TypeError(f"prune_checkpoint() got an unexpected keyword argument {name!r}")
        warnings.warn(f"prune_checkpoint({name}=...) is deprecated: give "
                      f"analysis_options={{{name!r}: ...}}", DeprecationWarning, stacklevel=4)
    return {**keywords, **(options or {})}


def _checked(directory: str | os.PathLike[str], output: str | os.PathLike[str],
             request: PruneRequest | None, options: Mapping[str, Any]) -> Checked:
    """The request of :func:`prune_checkpoint`, from its keyword arguments or given, checked
    (:meth:`PruneRequest.check`, the output too), before anything is read or locked; the
    options it accepted before, unused, left out (accepted) with a
    :class:`DeprecationWarning`."""
    if request is not None and not request.checkpoint:
        raise PlanError("the request is a model in memory's (checkpoint=False); a checkpoint "
                        "directory is pruned by a request with checkpoint=True")
    if request is None:
        request = PruneRequest(checkpoint=True, source=directory, output=output, **options)
        checked = request.check(lenient=LENIENT)
    elif also := [k for k, v in options.items() if v != _UNGIVEN.get(k)]:
        raise PlanError(f"give the request or its options ({', '.join(also)}), not both")
    else:
        for field, value in (("source", directory), ("output", output)):
            given = getattr(request, field)
            if given is not None and os.fspath(given) != os.fspath(value):
                raise PlanError(f"the request's {field} is {os.fspath(given)!r} and "
                                f"prune_checkpoint was given {os.fspath(value)!r}: give one")
        checked = replace(request, source=directory, output=output).check()
    for unused in checked.deprecated:
        warnings.warn(f"{unused} (accepted for now; refused in a later version, as fxsym "
                      "prune and a PruneRequest refuse it)", DeprecationWarning, stacklevel=4)
    return checked


def _prune(directory: str | os.PathLike[str], output: str | os.PathLike[str],
           checked: Checked, *, progress: bool, status: Callable[[str], Any] | None) -> Plan:
    """:func:`prune_checkpoint` of the checked request, its output locked."""
    import contextlib

    told = status or (lambda message: contextlib.nullcontext())

    @contextlib.contextmanager
    def step(message: str, name: str) -> Iterator[None]:
        with told(message), phase(name):
            yield

    request = checked.request
    options: dict[str, Any] = checked_options(**(request.analysis_options or {}))
    calibration, importance, searching = request.calibration, checked.importance, \
        bool(checked.searching)
    calibration_tokens, seq_len, scope = checked.calibration_tokens, checked.seq_len, \
        checked.scope or "uniform"
    ratio, target_params = request.ratio, request.target_params
    target_active_params, sizes = request.target_active_params, request.sizes
    target_non_embedding_params = request.target_non_embedding_params
    layers = request.layer_list()
    round_to, min_keep, exclude = request.round_to, request.min_keep, request.exclude
    describable = request.describable
    max_shard_size = request.max_shard_size or DEFAULT_SHARD_BYTES
    shortlist = checked.shortlist
    reader = open_checkpoint(directory)
    if checked.warning:
        warnings.warn(checked.warning, ImportanceWarning, stacklevel=4)
    texts: Sequence[str] | None = None
    if calibration is not None:
        with phase("reading the calibration text"):
            texts = (read_calibration_text(calibration,
                                           limit=calibration_bytes(max(calibration_tokens, 1)))
                     if isinstance(calibration, (str, os.PathLike)) else list(calibration))
        if not texts or not any(t.strip() for t in texts):
            raise CalibrationError("the calibration text is empty")
    with step(f"building {directory} on the meta device", "building on meta"):
        model = reader.build()
        stored = reader.stored(model)
        held = reader.tensor_files()
        ignored = reader.ignored(model, list(held))
        if stored is not None:  # what the model is made of is never ignored
            ignored -= {*stored.renamed.values(), *(n for v in stored.fused.values() for n in v)}
        tensors = Tensors(reader.directory, held, stored, sorted(ignored))
        tensors.check(model)
        buffers = load_buffers(model, tensors)
    with phase("tokenising"):
        batches = (reader.calibration(texts, tokens=calibration_tokens, seq_len=seq_len)
                   if texts is not None and (importance == "activation" or searching
                                             or isinstance(layers, int)) else None)
    if batches is not None and not batches:
        raise CalibrationError("the calibration text gave no tokens")
    target_params = request.counted(sum(p.numel() for p in model.parameters())).target_params
    whole = sum(p.numel() for p in model.parameters())
    if target_params is not None and target_params > whole:
        raise PlanError(f"target_params {target_params:,} is above the checkpoint's {whole:,} "
                        f"parameters: nothing to prune; give a target under {whole:,}")
    with step("analyzing", "analysing"):
        sm = analyze(model, **options)
    with phase("roles and sizes"):
        sized = None if sizes is None else sizes_for(sm, **sizes)
    if layers is not None:
        choose_blocks(sm, layers, {g.name: torch.zeros(g.size) for g in sm.depth_groups()},
                      model=model)  # refused before any read: positions losing a needed kind
    target, counted = checked.target
    target, non_embedding = target_params if counted == "params" else target, \
        counted == "non_embedding"
    depths = None if not isinstance(layers, int) else (layers,)
    describe = describable if describable is not None else scope == "uniform"
    notes: list[str] = []
    if searching:
        assert target is not None
        meeting = partial(candidates, model, sm, target_params=target, round_to=round_to,
                          active=target_active_params is not None,
                          non_embedding=non_embedding, depths=depths, exclude=exclude,
                          min_keep=min_keep)
        try:
            meeting(describable=describe)
        except PlanError as refused:
            if not describe:
                raise
            meeting()
            describe = False
            notes.append(_UNDESCRIBED.format(refused))
    with step("mapping the groups onto the parameters", "layout"):
        lay = layout(model, sm)
    extra: dict[str, Any] = {}
    depth_scores: dict[str, torch.Tensor] | None = None
    if batches is not None:
        with phase("calibration pass"):
            streamed = stream_activations(model, sm, tensors, batches, progress=progress)
        extra = {"blocks": streamed.blocks, "block_importance": streamed.block_importance}
        extra.update(streamed.usage)
        depth_scores = {g.name: torch.tensor(streamed.block_importance, dtype=torch.float64)
                        for g in sm.depth_groups() if g.container == streamed.blocks}
    if batches is not None and importance == "activation":
        scores = streamed.scores
    else:
        with phase("weight scores"):
            scores = weight_scores(model, sm, tensors, importance, lay, progress=progress)

    def given(m: nn.Module, s: Any) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = importance
    first = first_names(model)
    if searching:
        assert target is not None and batches is not None
        with phase("search"):
            found = architecture_search(
                model, sm, target_params=target, active=target_active_params is not None,
                non_embedding=non_embedding, round_to=round_to, importance=given,
                block_scores=depth_scores or {},
                evaluate_all=lambda plans: stream_losses(model, sm, tensors, lay, plans,
                                                         batches, progress=progress),
                depths=depths, describable=describe, exclude=exclude, min_keep=min_keep,
                progress=progress, shortlist=shortlist)
        chosen = found.plan
        extra["search"] = found.rows()
        notes += [f"the search skipped {why}" for why in found.skipped]
    else:
        with step("planning", "planning"):
            chosen, note = _describable_plan(
                describe, model, sm, ratio=ratio, target_params=target_params,
                target_non_embedding_params=target_non_embedding_params, importance=given,
                scope=scope, round_to=round_to, min_keep=min_keep, exclude=exclude,
                layers=layers, depth_importance=depth_scores, sizes=sized)
        notes += [note] if note else []
        if target is not None:
            extra["target"] = target_record(
                target, False, chosen.extra["non_embedding"]["after"] if non_embedding
                else chosen.params_after, non_embedding=non_embedding)
    if notes:
        extra["notes"] = notes
    if extra:
        from ..planning import with_extra

        chosen = with_extra(chosen, **extra)
    with phase("resizing the meta model"):
        cuts = kept_positions(lay, chosen.choices())
        depth_groups = sm.depth_groups()
        blocks = {d.name: list(d.keep) for d in chosen.depth}
        names = {n: renamed(n, depth_groups, blocks) for unit in tensors.units() for n in unit}
        chosen = apply_with_notes(chosen, model, sm)
        files = plugin_files(model, chosen)
    aliases = tied_aliases(model, {n for n in names.values() if n is not None})
    carried, left_out = carried_files(reader, files)
    from ..planning import with_extra

    chosen = with_extra(chosen, carried=carried, left_out=left_out)
    manifest = {"fxsym": FORMAT, "source": None, "aliases": aliases, "files": sorted(files),
                "history": [], "plan": chosen.to_dict()}
    with phase("putting the output in place"), replace_directory(output) as tmp:
        with phase("writing the weights"):
            write_weights(tmp, tensors, names, first, cuts, model, buffers, max_shard_size,
                           progress)
        chosen = with_extra(chosen, read={"bytes": tensors.bytes_read,
                                          "checkpoint": tensors.stored_bytes()})
        manifest["plan"] = chosen.to_dict()
        with phase("writing the other files"):
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            for name in carried:
                copy_file(reader.directory / name, tmp / name)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return chosen


def _describable_plan(describable: bool, model: nn.Module, symmap: Any, **kwargs: Any
                      ) -> tuple[Plan, str | None]:
    """:func:`fxsym.plan` of the checked request (:func:`~fxsym.prune.planning.solve`)
    keeping the sizes the model's config describes if ``describable``;
    where that plan cannot be made (no such sizes reach the target), the plan without, and a
    note saying so."""
    if not describable:
        return solve(model, symmap, **kwargs), None
    try:
        return solve(model, symmap, describable=True, **kwargs), None
    except PlanError as refused:
        why = str(refused)
    return solve(model, symmap, **kwargs), _UNDESCRIBED.format(why)


def apply_with_notes(chosen: Plan, model: nn.Module, symmap: Any) -> Plan:
    """Apply ``chosen`` to ``model``; return it with what the resize warned (a plugin's
    :class:`~fxsym.errors.ResizeWarning`: the model's config cannot describe the result, and
    why) added to ``extra["notes"]``, so the summary and the saved plan say it. Every warning
    goes on as it was issued too."""
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        chosen.apply(model, symmap)
    said = [str(w.message) for w in issued if issubclass(w.category, ResizeWarning)]
    for w in issued:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if not said:
        return chosen
    from ..planning import with_extra

    return with_extra(chosen, notes=[*(chosen.extra.get("notes") or ()), *said])
