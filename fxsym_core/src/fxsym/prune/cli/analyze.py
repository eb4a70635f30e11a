"""``fxsym analyze``: a model's searchable groups and its trace report, as a table or JSON, and
the ``--html``/``--dot`` pictures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .analysis_flags import analysis_options
from .failure import CliError, _one_line
from .models import _example_inputs, _input_shape, _load, check_spec


def cmd_analyze(args: argparse.Namespace) -> int:
    if args.model is not None and not Path(args.model).is_dir():  # before torch is imported
        check_spec(args.model)
    if args.input_shape:
        _input_shape(args.input_shape)
    from ... import analyze, load_plugins
    from ..console import print_table, status
    from ..demo import demo_model

    load_plugins()
    manifest = None
    if args.model is None:
        model, inputs = demo_model()
        label = "built-in demo (fxsym.prune.demo.DemoNet)"
    else:
        model, inputs, manifest = _load(args.model)
        label = args.model
    inputs = _example_inputs(args.input_shape, inputs, args.model)
    options = analysis_options(args, manifest)
    start = time.perf_counter()
    outputs: Any = args.outputs or None
    if outputs and outputs != "*":
        outputs = [int(k) if k.lstrip("-").isdigit() else k for k in outputs.split(",")]
    with status(f"analyzing {label}"):
        sm = analyze(model, example_inputs=inputs, outputs=outputs, **options)
    elapsed = time.perf_counter() - start
    _write_pictures(sm, label, args)
    groups = sm.groups()
    report = sm.trace_report.entries if args.verbose else list(sm.trace_report)
    if args.json:
        print(json.dumps({
            "model": label,
            "seconds": round(elapsed, 4),
            "output_contract": None if sm.output_contract is None else list(sm.output_contract),
            "analysis": sm.analysis_options,
            "groups": [{"name": g.name, "size": g.size, "unit": g.unit,
                        "sortable": g.is_sortable,
                        "routed": g.routed, "min_size": g.min_size,
                        "step": g.step, "step_reason": g.step_reason,
                        "members": [list(m) for m in g.members]} for g in groups],
            "trace_report": [{"kind": e.kind, "where": e.where, "message": e.message}
                             for e in report],
        }, indent=2))
        return 0
    print(f"{label}: {len(groups)} searchable groups ({elapsed:.2f} s)\n")
    stepped = [g for g in groups if g.step > 1]
    print_table([[g.name, g.size, g.unit, "yes" if g.is_sortable else "no",
                  f"yes, keeps >= {g.min_size}" if g.routed else "no",
                  *([g.step if g.step > 1 else ""] if stepped else []), len(g.members)]
                 for g in groups], ["group", "size", "unit", "sortable", "routed",
                                    *(["step"] if stepped else []), "members"])
    for g in stepped:
        print(f"  {g.name} keeps multiples of {g.step} units: {g.step_reason}")
    print()
    if report:
        print(f"trace report ({len(report)} entries: fallbacks, constant groups and why):")
        for e in report[: args.max_report]:
            print(f"  {e}")
        if len(report) > args.max_report:
            print(f"  ... {len(report) - args.max_report} more (--max-report N to see them)")
    else:
        print("trace report: nothing to report")
    return 0


def _write_pictures(sm: Any, label: str, args: argparse.Namespace) -> None:
    """``--html`` and ``--dot``: write the report files, and say so on stderr."""
    from ..report_html import write_dot, write_html

    for path, write in ((args.html, write_html), (args.dot, write_dot)):
        if path:
            start = time.perf_counter()
            try:
                write(sm, path, title=label, verbose=args.verbose)
            except OSError as exc:
                raise CliError(f"cannot write {path}: {_one_line(exc)}") from exc
            print(f"wrote {path} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
