"""Choices between sound descriptions of one module family, made for one analysis.

Some families can change in two ways, each exact in its own sense, that one group table
cannot hold at once. A group norm of ``G`` groups over ``C`` channels is the first:

* ``norm_groups="follow"`` (the default): channels go a whole norm group (``C // G``
  channels) at a time, ``num_groups`` follows the norm groups kept. Every other norm group's
  statistics are untouched, so dropping a norm group equals zeroing it where it is read.
* ``norm_groups="keep"``: ``num_groups`` stays and every norm group loses as many channels,
  at the same places in each (a unit of the group is one channel of every norm group). This
  is what a config with one ``norm_num_groups`` for every norm can describe. The kept
  channels are normalised over their smaller norm group, so a shrink is *not* the model with
  the dropped channels zeroed: the value oracle leaves such groups unchecked.

Routing groups (DeepSeek-V3's router viewing ``E`` experts' scores as ``n_group`` groups of
``E // n_group``) are the second:

* ``routing_groups="follow"`` (the default): the experts go a whole routing group at a time,
  ``n_group`` follows the routing groups kept.
* ``routing_groups="keep"``: ``n_group`` stays and every routing group keeps the experts at
  the same positions in it (a unit of the group is one expert position of every routing
  group; ``n_routed_experts`` becomes ``n_group`` times the kept positions). The view that
  splits the experts into routing groups takes its *blocks* reading (the alternative of
  :meth:`OpContext.offer_alternative`) wherever the group it would keep is routed.

:func:`fxsym.analyze` sets the choice for the analysis it runs (SymInfo factories and op
rules read it with :func:`norm_groups`); the SymMap keeps it
(:attr:`fxsym.SymMap.analysis_options`) so a plan records it and a saved plan is replayed the
same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..errors import AnalysisError

#: the values of ``norm_groups``
NORM_GROUPS = ("follow", "keep")

_NORM_GROUPS: ContextVar[str] = ContextVar("fxsym_norm_groups", default="follow")

#: the values of ``routing_groups``
ROUTING_GROUPS = ("follow", "keep")

_ROUTING_GROUPS: ContextVar[str] = ContextVar("fxsym_routing_groups", default="follow")


def norm_groups() -> str:
    """How group norms change in the analysis running now: ``"follow"`` or ``"keep"``."""
    return _NORM_GROUPS.get()


def routing_groups() -> str:
    """How routing groups change in the analysis running now: ``"follow"`` or ``"keep"``."""
    return _ROUTING_GROUPS.get()


def checked_options(norm_groups: str = "follow", routing_groups: str = "follow"
                    ) -> dict[str, Any]:
    """The analysis options, checked; only those that differ from the defaults."""
    out: dict[str, Any] = {}
    for name, value, allowed in (("norm_groups", norm_groups, NORM_GROUPS),
                                 ("routing_groups", routing_groups, ROUTING_GROUPS)):
        if value not in allowed:
            raise AnalysisError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                f"got {value!r}")
        if value != allowed[0]:
            out[name] = value
    return out


@contextmanager
def options_set(options: Mapping[str, Any]) -> Iterator[None]:
    """Run an analysis with ``options`` (as :func:`checked_options` returns them)."""
    token = _NORM_GROUPS.set(str(options.get("norm_groups", "follow")))
    routing = _ROUTING_GROUPS.set(str(options.get("routing_groups", "follow")))
    try:
        yield
    finally:
        _ROUTING_GROUPS.reset(routing)
        _NORM_GROUPS.reset(token)
