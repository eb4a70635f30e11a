"""The analysis options' flags, which ``fxsym analyze`` and ``fxsym prune`` both take: one flag
for each option the plugins declare (``fxsym_analysis_options``, read without torch:
:func:`fxsym.declarations.declared`; the nn plugin's ``--norm-groups`` and ``--routing-groups``),
and the value used when one is left out (a saved directory's last plan's, else the default).
"""

from __future__ import annotations

import argparse
from typing import Any

from ...declarations import declared


def add_analysis_flags(p: argparse.ArgumentParser) -> None:
    """A flag for each analysis option declared: its values the choices, its help."""
    for option in declared().analysis:
        p.add_argument(option.flag, dest=option.name, choices=option.values,
                       help=option.help or option.what)


def given_options(args: argparse.Namespace) -> dict[str, str]:
    """``{name: value}`` of the analysis options given on the command line."""
    return {o.name: str(v) for o in declared().analysis
            if (v := getattr(args, o.name, None)) is not None}


def analysis_options(args: argparse.Namespace, manifest: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """``{name: value}`` of every analysis option declared: as given; left out, the value a
    saved directory's last plan was analyzed with (its groups are those of that value), else
    the option's default."""
    recorded: dict[str, Any] = {}
    if manifest is not None:
        from ..planning import analysis_options as of_plan

        recorded = of_plan(manifest["plan"])
    given = given_options(args)
    return {o.name: given.get(o.name, str(recorded.get(o.name, o.values[0])))
            for o in declared().analysis}
