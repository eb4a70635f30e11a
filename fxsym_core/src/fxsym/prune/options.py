"""The rules of single pruning options, and how a caller spells the options.

What is searched (:func:`searches`), which values are out of range (:func:`check_param_ratio`,
:func:`check_amount_values`): each rule is written once, here, and checked before anything is
read, built or imported (this room imports no torch). :class:`fxsym.prune.request.PruneRequest`
(the request ``fxsym prune``, :func:`fxsym.prune_checkpoint` and :func:`fxsym.plan` build)
checks the options together with them; the plan of options already checked
(:func:`fxsym.prune.planning.solve`, the search's candidates) checks ``round_to`` and
``min_keep`` with :func:`check_amount_values` again. A message names the options as its
caller spells them (:class:`Spelling`: :data:`API`'s keyword arguments, the command line's
flags).

Imports from fxsym: errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError

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
    target_non_embedding_params: str = "target_non_embedding_params"
    sizes: str = "sizes"
    batches: str = "batches"
    input_shape: str = "input_shape"
    max_shard_size: str = "max_shard_size"
    shortlist: str = "shortlist"
    output: str = "output"
    force: str = "force=True"
    #: how an option a plugin declares is named (an analysis option, a size): a template of
    #: its ``{name}`` and its command-line ``{flag}`` (:meth:`named`)
    declared: str = "{name}"

    def named(self, name: str) -> str:
        """How the caller names the declared option ``name``."""
        return self.declared.format(name=name, flag="--" + name.replace("_", "-"))


#: :func:`fxsym.prune_checkpoint`'s (and :func:`fxsym.plan`'s) keyword arguments
API = Spelling(calibration="calibration text", importance="importance", layers="layers",
               scope="scope", search="search=True", no_search="search=False",
               target_active_params="target_active_params",
               calibration_tokens="calibration_tokens", seq_len="seq_len",
               param_ratio="param_ratio", target_params="target_params")


def searches(*, search: bool | None, target: bool, active: bool, sizes: bool,
             layers: int | Sequence[int] | Mapping[str, Any] | None,
             names: Spelling = API) -> bool:
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
    return not sizes and isinstance(layers, (int, type(None)))


def check_param_ratio(param_ratio: float | None, names: Spelling = API) -> None:
    """A fraction of parameters to remove is in [0, 1)."""
    if param_ratio is not None and not 0 <= param_ratio < 1:
        raise PlanError(f"{names.param_ratio} is the fraction of parameters to remove, in "
                        f"[0, 1); got {param_ratio}")


def check_search_layers(layers: int | Sequence[int] | Mapping[str, Any] | None, by: str,
                        names: Spelling = API) -> None:
    """The architecture search (asked by ``by``) takes a number of layers, not positions."""
    if not isinstance(layers, (int, type(None))):
        raise PlanError(f"{by} with {names.layers} takes a number of layers (a width-only "
                        "search at that depth), not positions of layers")


def check_amount_values(*, ratio: Any = None, target_params: Any = None,
                        target_macs: Any = None, round_to: Any = 1, min_keep: Any = 1,
                        target_non_embedding_params: Any = None,
                        target_active_params: Any = None, names: Spelling = API) -> None:
    """Each amount given a finite number (a NaN compares false with everything: unchecked, a
    bisection on it ends at the smallest model), a ratio in [0, 1), ``round_to`` and
    ``min_keep`` ints of at least 1 (:func:`fxsym.plan`'s rules, checked by the command line
    before it imports torch)."""
    for argument, value in ((names.ratio, ratio), (names.target_params, target_params),
                            (names.target_non_embedding_params, target_non_embedding_params),
                            (names.target_active_params, target_active_params),
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
