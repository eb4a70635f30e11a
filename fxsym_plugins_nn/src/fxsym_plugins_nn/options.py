"""The analysis options the nn plugin's rules read (``fxsym_analysis_options``).

* ``norm_groups`` (:data:`NORM_GROUPS`): how a group norm of ``G`` groups over ``C``
  channels changes. ``"follow"`` (the default): channels go a whole norm group (``C // G``
  channels) at a time, ``num_groups`` follows the norm groups kept; every other norm group's
  statistics are untouched, so dropping a norm group equals zeroing it where it is read.
  ``"keep"``: ``num_groups`` stays and every norm group loses as many channels, at the same
  places in each (a unit of the group is one channel of every norm group), what a config with
  one ``norm_num_groups`` for every norm can describe. The kept channels are normalised over
  their smaller norm group, so a shrink is *not* the model with the dropped channels zeroed:
  the value oracle leaves such groups unchecked. Read by the group norm's SymInfo and
  ``F.group_norm``'s rule (:func:`norm_groups`).
* ``routing_groups`` (:data:`ROUTING_GROUPS`): how a router viewing ``E`` experts' scores as
  ``n_group`` routing groups of ``E // n_group`` (DeepSeek-V3) changes. ``"follow"`` (the
  default): the experts go a whole routing group at a time, ``n_group`` follows.
  ``"keep"``: ``n_group`` stays and every routing group keeps the experts at the same
  positions (``n_routed_experts`` becomes ``n_group`` times the kept positions). This is the
  kernel's picked-blocks mechanism (``keeps_picked_blocks``,
  :func:`fxsym.analysis.options.picked_blocks_kept`), which the view and size rules of this
  plugin read too.

The declarations themselves are in :mod:`.declarations` (no torch: the command line's flags).
"""

from __future__ import annotations

from fxsym.analysis.options import analysis_option

from .declarations import NORM_GROUPS, OPTIONS, ROUTING_GROUPS

__all__ = ["NORM_GROUPS", "OPTIONS", "ROUTING_GROUPS", "norm_groups"]


def norm_groups() -> str:
    """How group norms change in the analysis running now: ``"follow"`` or ``"keep"``."""
    return analysis_option(NORM_GROUPS.name) or NORM_GROUPS.values[0]
