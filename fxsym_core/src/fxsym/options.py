"""The rules of the pruning options that depend on the options alone.

Which options go together, which one a way of pruning would not use, which values are out of
range: each rule is written once, here, and checked before anything is read, built or
imported (this room imports no torch). :func:`fxsym.prune_checkpoint` checks its keyword
arguments with :func:`checkpoint_request`, :func:`fxsym.plan` its amounts with
:func:`check_amount_values`; ``fxsym prune`` checks its flags with the same functions before
it imports torch, so a usage error is answered at once. A message names the options as its
caller spells them (:class:`Spelling`: :data:`API`'s keyword arguments, the command line's
flags).

Imports from fxsym: errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import CalibrationError, PlanError

#: the ways a checkpoint's units are ranked
CHECKPOINT_IMPORTANCE = ("activation", "l1", "l2")


@dataclass(frozen=True)
class Spelling:
    """How a caller names each option in a message."""

    calibration: str
    importance: str
    layers: str
    scope: str
    search: str
    no_search: str
    target_active_params: str
    calibration_tokens: str
    seq_len: str
    param_ratio: str
    target_params: str
    ratio: str = "ratio"
    target_macs: str = "target_macs"
    round_to: str = "round_to"
    min_keep: str = "min_keep"


#: :func:`fxsym.prune_checkpoint`'s (and :func:`fxsym.plan`'s) keyword arguments
API = Spelling(calibration="calibration text", importance="importance", layers="layers",
               scope="scope", search="search=True", no_search="search=False",
               target_active_params="target_active_params",
               calibration_tokens="calibration_tokens", seq_len="seq_len",
               param_ratio="param_ratio", target_params="target_params")


@dataclass(frozen=True)
class CheckpointRequest:
    """What the options ask for, once checked."""

    #: the ranking of units (the default filled in: activation with calibration text)
    importance: str
    #: whether the plan is the architecture search's (a parameter target searched)
    searching: bool
    #: why the ranking chosen for the caller may cost quality (``None``: nothing to say)
    warning: str | None = None


def checkpoint_request(
    *, calibration: bool, importance: str | None, ratio: float | None,
    target_params: int | None, param_ratio: float | None, target_active_params: int | None,
    search: bool | None, layers: int | Sequence[int] | None, sizes: bool, scope: str,
    calibration_tokens: int, seq_len: int, names: Spelling = API,
) -> CheckpointRequest:
    """Check the options of a checkpoint prune (:func:`fxsym.prune_checkpoint`'s meaning;
    ``calibration`` and ``sizes``: whether they are given) against each other; raise
    :class:`~fxsym.errors.PlanError` or :class:`~fxsym.errors.CalibrationError` naming them
    as ``names`` spells them."""
    given, importance = importance, importance or ("activation" if calibration else "l2")
    if importance not in CHECKPOINT_IMPORTANCE:
        raise PlanError(f"{names.importance} {importance!r}: a checkpoint is pruned with "
                        f"activation (with {names.calibration}), l1 or l2")
    if importance == "activation" and not calibration:
        raise CalibrationError(f"{names.importance} activation ranks units on calibration "
                               f"text: give {names.calibration}")
    check_param_ratio(param_ratio, names)
    if param_ratio is not None and target_params is not None:
        raise PlanError(f"give {names.param_ratio} or {names.target_params}, not both")
    if calibration_tokens < 1 or seq_len < 1:
        raise CalibrationError(f"{names.calibration_tokens} ({calibration_tokens}) and "
                               f"{names.seq_len} ({seq_len}) must be positive")
    searching = searches(
        search=search, target=target_params is not None or param_ratio is not None,
        active=target_active_params is not None, sizes=sizes, layers=layers, names=names
    ) and (calibration or search is True or target_active_params is not None)
    if calibration and importance != "activation" and not searching and (
            not isinstance(layers, int)):
        raise PlanError(f"{names.calibration} with {names.importance} {importance!r} is used "
                        "only by the search and to rank a number of layers, and neither is "
                        f"asked: leave out {names.calibration}, or give {names.importance} "
                        "activation")
    if searching:
        by = names.target_active_params if target_active_params is not None else names.search
        if not calibration:
            raise CalibrationError(f"the architecture search ({by}) scores each candidate by "
                                   f"its loss on calibration text: give {names.calibration}")
        if scope != "uniform":
            raise PlanError(f"{names.scope} {scope}: the architecture search ({by}) plans "
                            f"uniform candidates; leave {names.scope} out, or ask for no "
                            f"search ({names.no_search}) for a global plan of widths")
        check_search_layers(layers, by, names)
        if sizes or ratio is not None or (target_active_params is not None and (
                target_params is not None or param_ratio is not None)):
            raise PlanError("the architecture search picks the sizes of uniform candidates "
                            "for one parameter target; give no sizes, ratio or second target "
                            "with it")
    if isinstance(layers, int) and not calibration:
        raise CalibrationError(f"keeping a number of layers ranks them on calibration text; "
                               f"give {names.calibration}, or the positions of the layers to "
                               "keep")
    warning = None
    if given is None and not calibration and (ratio is not None or sizes or target_params
                                              is not None or param_ratio is not None):
        warning = (f"ranking units by weight magnitude ({names.importance} l2), as no "
                   f"{names.calibration} is given: on a pretrained LLM it removes far more "
                   f"quality than the activation ranking on calibration text; give "
                   f"{names.calibration}, or {names.importance} l2 to choose it")
    return CheckpointRequest(importance, searching, warning)


def searches(*, search: bool | None, target: bool, active: bool, sizes: bool,
             layers: int | Sequence[int] | None, names: Spelling = API) -> bool:
    """Whether the plan is the architecture search: the one meaning of each combination of
    options, the command line's and the API's alike. A parameter target (``target``: a count
    or fraction of parameters; ``active``: of the parameters a token uses) without sizes is
    searched, at the depth of a number of ``layers`` when one is given (a width-only search),
    unless ``search`` is ``False`` (a plan of widths to the target, and ``layers`` ranked);
    positions of ``layers`` are kept as given, with a plan of widths. ``search=True`` where
    nothing is searched, and an active-parameter target that is not searched, raise
    :class:`~fxsym.errors.PlanError`. Whether a search can run also depends on what it is
    scored with (calibration text, a stack of blocks): the caller's to check."""
    if active and search is False:
        raise PlanError(f"{names.target_active_params} is met by the architecture search "
                        f"only; leave out {names.no_search}")
    if not (target or active) or search is False:
        if search:
            raise PlanError(f"{names.search} searches candidates for a parameter count: give "
                            f"{names.target_params}, {names.param_ratio} or "
                            f"{names.target_active_params}, or no search")
        return False
    if search or active:
        check_search_layers(layers, names.target_active_params if active else names.search,
                            names)
        return True
    return not sizes and not isinstance(layers, Sequence)


def check_param_ratio(param_ratio: float | None, names: Spelling = API) -> None:
    """A fraction of parameters to remove is in [0, 1)."""
    if param_ratio is not None and not 0 <= param_ratio < 1:
        raise PlanError(f"{names.param_ratio} is the fraction of parameters to remove, in "
                        f"[0, 1); got {param_ratio}")


def check_search_layers(layers: int | Sequence[int] | None, by: str,
                        names: Spelling = API) -> None:
    """The architecture search (asked by ``by``) takes a number of layers, not positions."""
    if not isinstance(layers, (int, type(None))):
        raise PlanError(f"{by} with {names.layers} takes a number of layers (a width-only "
                        "search at that depth), not positions of layers")


def check_amount_values(*, ratio: Any = None, target_params: Any = None,
                        target_macs: Any = None, round_to: Any = 1, min_keep: Any = 1,
                        names: Spelling = API) -> None:
    """Each amount given a finite number (a NaN compares false with everything: unchecked, a
    bisection on it ends at the smallest model), a ratio in [0, 1), ``round_to`` and
    ``min_keep`` ints of at least 1 (:func:`fxsym.plan`'s rules, checked by the command line
    before it imports torch)."""
    for argument, value in ((names.ratio, ratio), (names.target_params, target_params),
                            (names.target_macs, target_macs)):
        if value is None:
            continue
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(
                value):
            raise PlanError(f"{argument} must be a finite number, got {value!r}")
    if ratio is not None and not 0 <= ratio < 1:
        raise PlanError(f"{names.ratio} is the fraction of units to remove, in [0, 1); got "
                        f"{ratio}")
    for argument, value in ((names.round_to, round_to), (names.min_keep, min_keep)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{argument} must be an int of at least 1, got {value!r}")
