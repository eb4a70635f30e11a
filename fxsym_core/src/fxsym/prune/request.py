"""One prune, as asked: a typed, frozen request whose options are checked once, here.

``fxsym prune`` parses its flags into a :class:`PruneRequest` and does nothing else with them
before :meth:`PruneRequest.check`; :func:`fxsym.prune_checkpoint` builds the same request
from its keyword arguments and calls the same check, and so does :func:`fxsym.plan` (the
request of a model in memory, not searched: ``fxsym prune MODEL --no-search``). So every rule
of the pruning options that depends on the options alone (which go together, which one a way
of pruning would not use, which values are out of range, what is searched, where it writes)
exists once, with one message, raised as a typed error (:class:`~fxsym.errors.PlanError`,
:class:`~fxsym.errors.CheckpointError` or
:class:`~fxsym.errors.CalibrationError`) that names the options as the caller spells them
(:class:`~fxsym.prune.options.Spelling`: the API's keyword arguments or the command line's flags).

What is pruned decides some rules (:attr:`PruneRequest.checkpoint`): a checkpoint directory is
streamed and calibrated on text, a model in memory on random batches. For a model in memory
with a parameter target, whether the plan is the architecture search depends on the model (a
stack of residual blocks, found by analysis): :meth:`Checked.on_model` checks what remains
once that is known. Where the prune writes is part of the request (:attr:`PruneRequest.output`,
:attr:`PruneRequest.force`) and checked with the rest (:meth:`PruneRequest.check_output`): the
paths are looked at (what they are, whether the output holds anything), nothing is opened or
imported (no torch), so a usage error is answered before any work.

Imports from fxsym: declarations, errors, options, paths.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..declarations import declared
from ..errors import AnalysisError, CalibrationError, CheckpointError, PlanError
from .options import (
    API,
    CHECKPOINT_IMPORTANCE,
    Spelling,
    check_amount_values,
    check_param_ratio,
    searches,
)
from .paths import overlap

__all__ = ["LENIENT", "MODEL_IMPORTANCE", "Checked", "PruneRequest"]

#: the rankings of a model in memory (taylor and activation on random batches)
MODEL_IMPORTANCE = ("l1", "l2", "bn_scale", "taylor", "activation")
#: the options :func:`fxsym.prune_checkpoint` accepted where they were not used, before its
#: options were checked together (``scope``, ``calibration_tokens`` and ``seq_len`` had
#: defaults): there, such an option is left out with a :class:`DeprecationWarning`; and
#: ``force`` (an output holding files was replaced without it): replaced, with the warning
LENIENT = frozenset({"scope", "calibration_tokens", "seq_len", "force"})
#: the defaults of the options only some ways of pruning use (``None`` in a request, so one
#: given where it is not used is refused, never dropped)
CALIBRATION_TOKENS, SEQ_LEN, RANDOM_BATCHES = 8192, 512, 4
#: how many of the search's candidates are scored by their loss unless told otherwise
#: (:mod:`fxsym.prune.shortlist`)
SHORTLIST = 4


@dataclass(frozen=True)
class PruneRequest:
    """What a prune is asked to do; ``None`` is "not given" (the default filled in by
    :meth:`check`)."""

    #: a checkpoint directory (streamed, calibrated on text), else a model in memory
    checkpoint: bool = False
    #: how much (one of): a fraction of units, a fraction of parameters, counts to reach
    ratio: float | None = None
    param_ratio: float | None = None
    target_params: int | None = None
    #: parameters but the embedding tables (tied or not: :mod:`fxsym.prune.embeddings`)
    target_non_embedding_params: int | None = None
    #: parameters a token uses (:func:`fxsym.search.active_params`)
    target_active_params: int | None = None
    target_macs: int | None = None
    #: sizes by role (``{"hidden": 48, "ffn": 96}``: :func:`fxsym.search.sizes_for`)
    sizes: Mapping[str, int] | None = None
    #: blocks to keep: a count (ranked) or positions (or, :func:`fxsym.plan`'s, either by
    #: depth group)
    layers: int | tuple[int, ...] | Mapping[str, int | Sequence[int]] | None = None
    #: the architecture search on (``True``), off (``False``) or as the target decides
    search: bool | None = None
    scope: str | None = None
    importance: str | None = None
    #: calibration text (a file or the texts), and how much of it is run
    calibration: str | os.PathLike[str] | Sequence[str] | None = None
    calibration_tokens: int | None = None
    seq_len: int | None = None
    #: random batches of a model in memory, and the shape of its one input
    batches: int | None = None
    input_shape: tuple[int, ...] | None = None
    round_to: int = 1
    min_keep: int = 1
    exclude: tuple[str, ...] = ()
    describable: bool | None = None
    #: the analysis options (``{name: value}``), as the plugins declare them
    #: (``fxsym_analysis_options``, :func:`fxsym.declarations.declared`)
    analysis_options: Mapping[str, str] | None = None
    max_shard_size: int | None = None
    #: how many of the search's candidates are scored by their loss, ``"all"`` for every
    #: one (``None``: :data:`SHORTLIST`; the others are ranked by the damage estimate only)
    shortlist: int | str | None = None
    #: what is pruned, as named (a checkpoint directory, checked against the output)
    source: str | os.PathLike[str] | None = None
    #: the directory written (``None``: not checked here, e.g. :func:`fxsym.plan`'s)
    output: str | os.PathLike[str] | None = None
    #: replace an output that holds files, whole (``None``: not given, refused as ``False``)
    force: bool | None = None

    def amounts(self) -> dict[str, float | int]:
        """The amounts given, by field name."""
        return {k: v for k, v in (
            ("ratio", self.ratio), ("param_ratio", self.param_ratio),
            ("target_params", self.target_params),
            ("target_non_embedding_params", self.target_non_embedding_params),
            ("target_active_params", self.target_active_params),
            ("target_macs", self.target_macs)) if v is not None}

    def layer_list(self) -> int | list[int] | None:
        """``layers`` as a count or a list of positions (a mapping by depth group, which only
        :func:`fxsym.plan` takes, is refused by :meth:`check` elsewhere)."""
        layers = self.layers
        assert not isinstance(layers, Mapping), "checked: layers by depth group is fxsym.plan's"
        return list(layers) if isinstance(layers, tuple) else layers

    def counted(self, params: int) -> PruneRequest:
        """This request with its ``param_ratio`` made the ``target_params`` it means for a
        model of ``params`` parameters (the rest, rounded down): the one meaning of a fraction
        of parameters, for the command line, :func:`fxsym.prune_checkpoint` and
        :func:`fxsym.plan`."""
        if self.param_ratio is None:
            return self
        return replace(self, param_ratio=None,
                       target_params=int(params * (1 - self.param_ratio)))

    def parameter_target(self) -> bool:
        """Whether a count of parameters is asked (total, non-embedding, active or a
        fraction): what the architecture search meets."""
        return any(x is not None for x in (self.target_params, self.param_ratio,
                                           self.target_non_embedding_params,
                                           self.target_active_params))

    def check(self, names: Spelling = API, *, lenient: Collection[str] = ()) -> Checked:
        """Every rule of the options alone; the defaults filled in. Raises
        :class:`~fxsym.errors.PlanError` or :class:`~fxsym.errors.CalibrationError` naming
        the options as ``names`` spells them. An option of ``lenient`` (of :data:`LENIENT`)
        given where it is not used is left out instead, its refusal's message in
        :attr:`Checked.deprecated` (what :func:`fxsym.prune_checkpoint` accepted before its
        options were checked together: a :class:`DeprecationWarning` there)."""
        amounts = self.amounts()
        allowed = [getattr(names, k) for k in ("ratio", "param_ratio", "target_params",
                                               "target_non_embedding_params",
                                               "target_active_params", "target_macs")
                   if not (k == "target_macs" and self.checkpoint)
                   and not (k == "target_active_params" and self.search is False)]
        if len(amounts) > 1 or not (amounts or self.sizes or self.layers is not None):
            raise PlanError(f"give exactly one of {', '.join(allowed[:-1])} and {allowed[-1]}, "
                            f"or sizes ({names.sizes}, {names.layers})")
        if amounts and self.sizes:
            raise PlanError(f"give sizes ({names.sizes}) or an amount, not both")
        self._check_analysis_options(names)
        check_param_ratio(self.param_ratio, names)
        check_amount_values(ratio=self.ratio, target_params=self.target_params,
                            target_non_embedding_params=self.target_non_embedding_params,
                            target_active_params=self.target_active_params,
                            target_macs=self.target_macs, round_to=self.round_to,
                            min_keep=self.min_keep, names=names)
        if self.scope is not None and self.scope not in ("global", "uniform"):
            raise PlanError(f"{names.scope} is global or uniform, got {self.scope!r}")
        if self.shortlist is not None and self.shortlist != "all" and (
                isinstance(self.shortlist, bool) or not isinstance(self.shortlist, int)
                or self.shortlist < 1):
            raise PlanError(f"{names.shortlist} is how many of the search's candidates are "
                            f"scored by their loss (1 or more) or 'all', got {self.shortlist!r}")
        checked = (self._checkpoint(names, lenient) if self.checkpoint
                   else self._in_memory(names, lenient))
        return replace(checked, deprecated=checked.deprecated + self.check_output(
            names, lenient=lenient))

    def check_output(self, names: Spelling = API, *, lenient: Collection[str] = ()
                     ) -> tuple[str, ...]:
        """The rules of :attr:`output` (none without one), a
        :class:`~fxsym.errors.CheckpointError` naming it as ``names`` spells it: never the
        checkpoint directory pruned, inside it, holding it or holding a file it links to,
        even with :attr:`force` (:func:`fxsym.prune.paths.overlap`: real paths; the output is
        replaced whole); not a symbolic link nor a file; new or empty unless :attr:`force`.
        With ``"force"`` in ``lenient`` and :attr:`force` not given, an output holding files
        is accepted: the refusal's message is returned (a :class:`DeprecationWarning`)."""
        if self.output is None:
            return ()
        out, said = Path(self.output), f"{names.output} {self.output}"
        why = (overlap(self.source, self.output)
               if self.checkpoint and self.source is not None else None)
        if why is not None:
            raise CheckpointError(f"{names.output} {why}: the output is replaced whole, so it "
                                  "would destroy the checkpoint it is pruned from (also with "
                                  f"{names.force}); give a directory outside it")
        if out.is_symlink():
            raise CheckpointError(f"{said} is a symbolic link; give the directory itself")
        if out.exists() and not out.is_dir():
            raise CheckpointError(f"{said} exists and is not a directory; give a directory")
        if self.force or not out.is_dir() or not any(out.iterdir()):
            return ()
        refused = CheckpointError(f"{said} exists and is not empty; give a new or empty "
                                  f"directory, or {names.force} to replace it whole "
                                  "(everything in it is removed)")
        if self.force is None and "force" in lenient:
            return (str(refused),)
        raise refused

    def _check_analysis_options(self, names: Spelling) -> None:
        """Each analysis option given is one a plugin declares, with one of its values."""
        if not self.analysis_options:
            return
        options = declared()
        for name, value in self.analysis_options.items():
            option = options.analysis_option(name)
            if option is None:
                raise AnalysisError(
                    f"unknown analysis option {names.named(name)}: the plugins declare "
                    f"{', '.join(names.named(o.name) for o in options.analysis) or 'none'} "
                    "(fxsym_analysis_options)")
            if value not in option.values:
                raise AnalysisError(f"{names.named(name)} must be one of "
                                    f"{', '.join(map(repr, option.values))}, got {value!r}")

    def _check_streamed_options(self, names: Spelling) -> None:
        """A checkpoint directory is analyzed with the default of an option that says why
        not another (:attr:`~fxsym.declarations.AnalysisOption.checkpoint_refusal`)."""
        for name, value in (self.analysis_options or {}).items():
            option = declared().analysis_option(name)
            if option is not None and option.checkpoint_refusal and value != option.values[0]:
                raise PlanError(f"{names.named(name)} {value} is not available for a "
                                f"checkpoint directory: {option.checkpoint_refusal}")

    # -- a checkpoint directory ------------------------------------------------------------
    def _checkpoint(self, names: Spelling, lenient: Collection[str]) -> Checked:
        deprecated: list[str] = []
        if self.target_macs is not None:
            raise PlanError(f"{names.target_macs} is not available for a checkpoint directory; "
                            f"give {names.ratio}, {names.param_ratio} or {names.target_params}")
        if isinstance(self.layers, Mapping):
            raise PlanError(f"{names.layers} of a checkpoint directory is a number of its "
                            "blocks or their positions, not a mapping by depth group")
        self._check_streamed_options(names)
        for option, value in ((names.input_shape, self.input_shape),
                              (names.batches, self.batches)):
            if value is not None:
                raise PlanError(f"{option} is for an in-memory model's random inputs; a "
                                f"checkpoint directory is calibrated on text ({names.calibration}"
                                f", {names.calibration_tokens}, {names.seq_len})")
        if self.max_shard_size is not None and self.max_shard_size < 1:
            raise PlanError(f"{names.max_shard_size} must be at least one byte, got "
                            f"{self.max_shard_size}")
        calibration = self.calibration is not None
        used = {}
        for field, option in (("calibration_tokens", names.calibration_tokens),
                              ("seq_len", names.seq_len)):
            used[field] = getattr(self, field)
            if used[field] is not None and not calibration:
                refused = CalibrationError(f"{option} sizes the calibration run on "
                                           f"{names.calibration}; give {names.calibration}, "
                                           "or leave it out")
                if field not in lenient:
                    raise refused
                deprecated.append(str(refused))
                used[field] = None
        tokens = CALIBRATION_TOKENS if used["calibration_tokens"] is None else used[
            "calibration_tokens"]
        seq_len = SEQ_LEN if used["seq_len"] is None else used["seq_len"]
        given = self.importance
        importance = given or ("activation" if calibration else "l2")
        if importance not in CHECKPOINT_IMPORTANCE:
            raise PlanError(f"{names.importance} {importance!r}: a checkpoint is pruned with "
                            f"activation (with {names.calibration}), l1 or l2")
        if importance == "activation" and not calibration:
            raise CalibrationError(f"{names.importance} activation ranks units on calibration "
                                   f"text: give {names.calibration}")
        if tokens < 1 or seq_len < 1:
            raise CalibrationError(f"{names.calibration_tokens} ({tokens}) and "
                                   f"{names.seq_len} ({seq_len}) must be positive")
        active = self.target_active_params is not None
        searching = self._searches(names) and (calibration or self.search is True or active)
        if calibration and importance != "activation" and not searching and (
                not isinstance(self.layers, int)):
            raise PlanError(f"{names.calibration} with {names.importance} {importance!r} is "
                            "used only by the search and to rank a number of layers, and "
                            f"neither is asked: leave out {names.calibration}, or give "
                            f"{names.importance} activation")
        if searching:
            by = self._searched_by(names)
            if not calibration:
                raise CalibrationError(f"the architecture search ({by}) scores each candidate "
                                       f"by its loss on calibration text: give "
                                       f"{names.calibration}")
            if self.scope not in (None, "uniform"):
                raise PlanError(f"{names.scope} {self.scope}: the architecture search ({by}) "
                                f"plans uniform candidates; leave {names.scope} out, or ask "
                                f"for no search ({names.no_search}) for a global plan of "
                                "widths")
        else:
            self._unused_shortlist(names)
            unused = self._unused_scope(names, "layers")
            if unused is not None and "scope" not in lenient:
                raise unused
            deprecated += [] if unused is None else [str(unused)]
        if isinstance(self.layers, int) and not calibration:
            raise CalibrationError(f"keeping a number of layers ranks them on calibration text; "
                                   f"give {names.calibration}, or the positions of the layers "
                                   "to keep")
        warning = None
        if given is None and not calibration and (
                self.ratio is not None or self.sizes or self.parameter_target()):
            warning = (f"ranking units by weight magnitude ({names.importance} l2), as no "
                       f"{names.calibration} is given: on a pretrained LLM it removes far more "
                       f"quality than the activation ranking on calibration text; give "
                       f"{names.calibration}, or {names.importance} l2 to choose it")
        return Checked(self, names, importance, searching, self.scope or "uniform", tokens,
                       seq_len, 0, warning, deprecated=tuple(deprecated))

    # -- a model in memory -----------------------------------------------------------------
    def _in_memory(self, names: Spelling, lenient: Collection[str]) -> Checked:
        for option, value in ((names.calibration, self.calibration),
                              (names.calibration_tokens, self.calibration_tokens),
                              (names.seq_len, self.seq_len),
                              (names.max_shard_size, self.max_shard_size)):
            if value is not None:
                raise PlanError(f"{option} is for a checkpoint directory (what save_pretrained "
                                "writes), not a model in memory (calibrated on "
                                f"{names.batches} random batches of {names.input_shape})")
        if self.importance is not None and self.importance not in MODEL_IMPORTANCE:
            raise PlanError(f"{names.importance} {self.importance!r}: a model in memory is "
                            f"ranked by {', '.join(MODEL_IMPORTANCE)}")
        if self.batches is not None and self.batches < 1:
            raise PlanError(f"{names.batches} must be at least 1, got {self.batches}")
        self._searches(names)
        checked = Checked(self, names, self.importance or "l2", None, self.scope, 0, 0,
                          RANDOM_BATCHES if self.batches is None else self.batches, None,
                          lenient=frozenset(lenient))
        if not self.parameter_target():  # the way of pruning is known without the model
            return checked.on_model(stack=False)
        return checked

    # -- shared ----------------------------------------------------------------------------
    def _unused_shortlist(self, names: Spelling) -> None:
        """A :class:`~fxsym.errors.PlanError` for a shortlist given to a prune that does not
        search."""
        if self.shortlist is not None:
            raise PlanError(f"{names.shortlist} sizes the architecture search's shortlist, and "
                            f"this prune does not search; leave {names.shortlist} out")

    def _searches(self, names: Spelling) -> bool:
        """:func:`fxsym.prune.options.searches` of this request."""
        return searches(search=self.search, target=any(
            x is not None for x in (self.target_params, self.param_ratio,
                                    self.target_non_embedding_params)),
            active=self.target_active_params is not None, sizes=bool(self.sizes),
            layers=self.layers, names=names)

    def _searched_by(self, names: Spelling) -> str:
        return (names.target_active_params if self.target_active_params is not None
                else names.search)

    def _unused_scope(self, names: Spelling, blocks: str) -> PlanError | None:
        """A scope is an error where sizes set every kept size, or blocks alone are removed
        (no amount of units): that error, else ``None``."""
        units = (self.ratio, self.param_ratio, self.target_params,
                 self.target_non_embedding_params, self.target_macs)
        if self.scope is not None and (self.sizes or all(x is None for x in units)):
            return PlanError(f"{names.scope} {self.scope}: "
                            + (f"sizes ({names.sizes}) set every kept size" if self.sizes
                               else f"{names.layers} alone removes {blocks}, no units")
                            + f"; leave {names.scope} out")
        return None


@dataclass(frozen=True)
class Checked:
    """A request once checked: the defaults filled in, what the plan is."""

    request: PruneRequest
    names: Spelling
    #: the ranking of units (the default filled in)
    importance: str
    #: whether the plan is the architecture search; ``None`` for a model in memory with a
    #: parameter target until :meth:`on_model` knows whether it has a stack of blocks
    searching: bool | None
    #: the scope of a plan of widths (``None``: a model in memory's, known by
    #: :meth:`on_model`)
    scope: str | None
    calibration_tokens: int
    seq_len: int
    batches: int
    #: why the ranking chosen for the caller may cost quality (``None``: nothing to say)
    warning: str | None = None
    #: whether the plan is made by depth and sizes or searched (a model in memory)
    architecture: bool = False
    #: the refusals of the ``lenient`` options given where they are not used (left out)
    deprecated: tuple[str, ...] = ()
    #: the options :meth:`PruneRequest.check` was told to leave out where they are not used
    #: (a model in memory's scope is known unused by :meth:`on_model`)
    lenient: frozenset[str] = frozenset()

    @property
    def shortlist(self) -> int | None:
        """How many of the search's candidates are scored by their loss (``None``: all)."""
        given = self.request.shortlist
        return SHORTLIST if given is None else None if given == "all" else int(given)

    @property
    def target(self) -> tuple[int | None, str]:
        """The parameter count asked and what it counts (``"params"``, ``"non_embedding"``,
        ``"active"``); ``param_ratio`` is a count of the model's, known with it."""
        r = self.request
        if r.target_active_params is not None:
            return r.target_active_params, "active"
        if r.target_non_embedding_params is not None:
            return r.target_non_embedding_params, "non_embedding"
        return r.target_params, "params"

    def on_model(self, *, stack: bool) -> Checked:
        """The rules of a model in memory that depend on whether it has a stack of residual
        blocks (``stack``: a depth group): the search plans candidates of one."""
        r, names = self.request, self.names
        if r.checkpoint:
            return self
        if r.search and not stack:
            raise PlanError(f"{names.search}: the architecture search plans candidates of a "
                            "model with a stack of residual blocks, and this one has none; "
                            f"leave {names.search} out")
        if r.target_active_params is not None and not stack:
            raise PlanError(f"{names.target_active_params} searches uniform architectures of a "
                            "model with a stack of residual blocks, and this one has none; "
                            f"give {names.target_params} or {names.ratio}")
        architecture = bool(r.sizes or r.layers is not None or (stack and r.parameter_target()))
        searching = architecture and r._searches(names)
        if searching and r.scope == "global":
            raise PlanError(f"{names.scope} global: the architecture search (a parameter "
                            "target on a model with a stack of residual blocks) plans uniform "
                            f"candidates; leave {names.scope} out, or give {names.ratio} or "
                            f"{names.target_macs} for a global plan of widths")
        if not searching:
            r._unused_shortlist(names)
        deprecated = self.deprecated
        if architecture and not searching:
            unused = r._unused_scope(names, "blocks")
            if unused is not None and "scope" not in self.lenient:
                raise unused
            if unused is not None and str(unused) not in deprecated:
                deprecated += (str(unused),)
        if r.batches is not None and not (searching or isinstance(r.layers, int)
                                           or self.importance in ("taylor", "activation")):
            raise PlanError(f"{names.batches}: random batches are used by {names.importance} "
                            f"taylor or activation, ranking {names.layers} K and the "
                            f"architecture search; this prune uses none (leave "
                            f"{names.batches} out)")
        return replace(self, searching=searching, architecture=architecture,
                       scope=r.scope or ("uniform" if architecture else "global"),
                       deprecated=deprecated)

