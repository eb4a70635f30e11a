"""The nn plugin's declarations, importing no torch (:mod:`fxsym.declarations`): its analysis
options (``fxsym_analysis_options``), which :mod:`.options` documents and its rules read, and
which the command line turns into ``--norm-groups`` and ``--routing-groups``. Named under the
``fxsym.declarations`` entry-point group, so that ``fxsym --help`` lists the flags without
loading the plugin; the plugin's hook answers the same objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxsym.declarations import AnalysisOption

NORM_GROUPS = AnalysisOption(
    "norm_groups", ("follow", "keep"),
    "how group norms change: a whole norm group at a time (follow) or as many channels of "
    "every norm group (keep)",
    help="how a group norm's channels change: follow (default), a whole norm group at a time "
    "and num_groups follows; keep, num_groups stays and every norm group loses as many "
    "channels (what a config with one norm_num_groups describes)",
    checkpoint_refusal="it is analyzed in the default mode (a causal language model of "
    "transformers has no group norm)")
ROUTING_GROUPS = AnalysisOption(
    "routing_groups", ("follow", "keep"),
    "how a router's routing groups change: a whole routing group at a time (follow) or the "
    "same expert positions of every routing group (keep)", keeps_picked_blocks="keep",
    help="how a router's routing groups change (DeepSeek's n_group): follow (default), "
    "experts go a whole routing group at a time and n_group follows; keep, n_group stays and "
    "every routing group keeps the same expert positions")

#: the options this plugin declares
OPTIONS = (NORM_GROUPS, ROUTING_GROUPS)


def fxsym_analysis_options() -> Sequence[AnalysisOption]:
    """The nn plugin's analysis options (the ``fxsym.declarations`` entry point's answer; the
    plugin's hook gives the same)."""
    return OPTIONS
