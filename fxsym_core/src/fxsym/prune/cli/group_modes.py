"""``--norm-groups`` and ``--routing-groups``, which ``fxsym analyze`` and ``fxsym prune`` both
take: the flags, and the mode used when one is left out (a saved directory's last plan's,
else ``"follow"``).
"""

from __future__ import annotations

import argparse
from typing import Any


def _norm_groups(args: argparse.Namespace, manifest: dict[str, Any] | None) -> str:
    """``--norm-groups``; left out, the mode a saved directory's last plan was analyzed in
    (its groups are those of that mode), else ``"follow"``."""
    if args.norm_groups is not None:
        return str(args.norm_groups)
    from ..planning import analysis_options

    recorded = {} if manifest is None else analysis_options(manifest["plan"])
    return recorded.get("norm_groups", "follow")


def _routing_groups(args: argparse.Namespace, manifest: dict[str, Any] | None) -> str:
    """``--routing-groups``; left out, the mode a saved directory's last plan was analyzed
    in, else ``"follow"``."""
    if args.routing_groups is not None:
        return str(args.routing_groups)
    from ..planning import analysis_options

    recorded = {} if manifest is None else analysis_options(manifest["plan"])
    return recorded.get("routing_groups", "follow")


def _add_norm_groups(p: argparse.ArgumentParser) -> None:
    """``--norm-groups``: the values of the nn plugin's ``norm_groups`` option (written
    out: importing fxsym.analysis would import torch for ``--help``)."""
    p.add_argument("--norm-groups", choices=("follow", "keep"), help="how a group norm's channels "
                   "change: follow (default), a whole norm group at a time and num_groups "
                   "follows; keep, num_groups stays and every norm group loses as many "
                   "channels (what a config with one norm_num_groups describes)")
    p.add_argument("--routing-groups", choices=("follow", "keep"), help="how a router's "
                   "routing groups change (DeepSeek's n_group): follow (default), experts go "
                   "a whole routing group at a time and n_group follows; keep, n_group stays "
                   "and every routing group keeps the same expert positions")
