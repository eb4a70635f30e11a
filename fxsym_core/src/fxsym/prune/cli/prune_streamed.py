"""``fxsym prune CKPT_DIR``: :func:`fxsym.prune_checkpoint` run on the checked request,
streamed, its steps timed (:mod:`fxsym.phases`) and printed on stderr with ``--times``,
counted from when the command line's package was imported.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from ...errors import ImportanceWarning
from ..request import Checked
from .prune_text import _carried_text, _reached_text, _target_text

#: when the command line's module was imported: ``fxsym prune --times`` counts from here
_STARTED = time.perf_counter()


def _prune_checkpoint(args: argparse.Namespace, checked: Checked) -> int:
    """``fxsym prune CKPT_DIR``: :func:`fxsym.prune_checkpoint`, streamed, given the request
    checked (:func:`check_prune_options`); its steps timed (:mod:`fxsym.phases`), the times
    printed on stderr with ``--times``."""
    from ..phases import format_record, phase, recording

    req = checked.request
    with recording() as seconds:
        with phase("importing torch and fxsym"):
            from ..checkpoint import loading_note, prune_checkpoint
            from ..console import status
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImportanceWarning)  # said below, in the flags' words
            plan = prune_checkpoint(args.model, args.output, request=req, progress=True,
                                    status=status)
        with phase("saying how the output loads"):
            note = loading_note(args.model, args.output)
    if args.times:
        total = time.perf_counter() - _STARTED
        print(f"time by step ({total:.2f} s since the command started):\n"
              f"{format_record(seconds, total)}", file=sys.stderr)
    if checked.warning:  # said once the prune is done: a refused prune says its refusal
        print(f"fxsym: ImportanceWarning: {checked.warning}", file=sys.stderr)
    if args.json:
        print(plan.to_json())
        return 0
    rows = plan.extra.get("search")
    if rows:
        from ..search import table

        print(f"candidates for {_target_text(checked, plan)}:\n{table(rows)}\n")
    print(f"{plan.summary()}{_reached_text(checked, plan)}\n\nsaved to {args.output}\n"
          f"{_carried_text(plan)}{note}")
    return 0
