"""Running an ordered pipeline of passes, with verification and rollback.

``run_pipeline(gm, passes, ...)`` works on ``gm`` in place — :func:`fxsym.optimize` hands it
a working copy, so the caller's GraphModule is never touched. For each pass, in order:

1. with verification on, a :class:`~fxsym.passes.verify.Snapshot` is taken;
2. the pass runs; if it raises, :class:`~fxsym.errors.PassError` names it and its plugin
   (the working copy is dropped by ``optimize``, so the input stays unchanged);
3. the graph is linted; with verification on and a change reported, the graph runs on the
   example inputs and its outputs are compared with those before the pass. A mismatch rolls
   the pass back and is reported as a :class:`~fxsym.passes.PassWarning` (``on_mismatch=
   "warn"``) or a :class:`~fxsym.errors.PassError` (``"raise"``).

The graph is recompiled once, after the last pass, and only if something changed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

from torch import fx

from ..errors import PassError
from .base import Pass, PassRecord, PassWarning, PipelineReport
from .catalog import PatternPass, all_passes, catalog, distribution, get_pass
from .ordering import order_passes
from .pattern import Pattern
from .verify import Snapshot, compare_outputs, normalize_inputs, run_graph

PassSpec = str | Pass | Pattern
OnMismatch = Literal["warn", "raise"]


def default_pipeline() -> list[Pass]:
    """The passes :func:`fxsym.optimize` runs when ``passes`` is ``None``, in order."""
    return order_passes([p for p in all_passes() if p.default])


def resolve(passes: Sequence[PassSpec] | None) -> list[Pass]:
    """Turn names, passes and patterns into an ordered list of passes."""
    if passes is None:
        return default_pipeline()
    if isinstance(passes, (str, Pass, Pattern)):
        passes = [passes]
    out: list[Pass] = []
    for spec in passes:
        if isinstance(spec, str):
            out.append(get_pass(spec))
        elif isinstance(spec, Pass):
            out.append(spec)
        elif isinstance(spec, Pattern):
            out.append(
                PatternPass(
                    spec.name,
                    [spec],
                    after=("remove_noops",),
                    before=("dce",),
                    include_registered=False,
                )
            )
        else:
            raise PassError(f"cannot use {spec!r} as a pass: give a name, a Pass or a Pattern")
    return order_passes(out)


def _source(p: Pass) -> str:
    src = catalog().pass_sources.get(p.name)
    if src is None or catalog().passes.get(p.name) is not p:
        return "<user>"
    return src if src.startswith("<") else f"{src} ({distribution(src)})"


def run_pipeline(
    gm: fx.GraphModule,
    passes: Sequence[Pass],
    *,
    example_inputs: Any = None,
    reference: Any = None,
    verify: bool = True,
    on_mismatch: OnMismatch = "warn",
    rtol: float = 1e-4,
    atol: float = 1e-4,
    recompile: bool = True,
) -> PipelineReport:
    """Run ``passes`` (already ordered) on ``gm`` in place; see the module docstring.

    ``example_inputs`` as for :func:`fxsym.optimize`; ``reference`` the outputs on them
    before the first pass, when already known.
    """
    report = PipelineReport()
    inputs = normalize_inputs(example_inputs) if example_inputs is not None else None
    checking = verify and inputs is not None
    expected = reference
    if checking and expected is None:
        expected = run_graph(gm, *inputs)  # type: ignore[misc]
    changed = False
    for p in passes:
        record = PassRecord(p.name, _source(p))
        report.records.append(record)
        snapshot = Snapshot(gm) if checking else None
        start = time.perf_counter()
        try:
            record.changes = p(gm)
            gm.graph.lint()
        except PassError:
            raise
        except Exception as exc:
            raise PassError(
                f"pass {p.name!r} from {record.source} failed: {type(exc).__name__}: {exc}; "
                "the input GraphModule is unchanged (drop the pass with "
                "optimize(..., passes=[...]) to go on without it)"
            ) from exc
        finally:
            record.seconds = time.perf_counter() - start
        if not record.changes:
            continue
        if checking:
            assert inputs is not None and snapshot is not None
            try:
                actual = run_graph(gm, *inputs)
                problem = compare_outputs(expected, actual, rtol, atol)
            except Exception as exc:  # the rewritten graph no longer runs
                problem = f"the rewritten graph fails to run: {type(exc).__name__}: {exc}"
            if problem is not None:
                snapshot.restore()
                record.status = "rolled back"
                record.message = problem
                message = (
                    f"pass {p.name!r} from {record.source} changed the model's outputs and "
                    f"was rolled back: {problem}"
                )
                if on_mismatch == "raise":
                    raise PassError(message)
                warnings.warn(message, PassWarning, stacklevel=3)
                continue
            expected = actual
        changed = True
    if changed and recompile:
        gm.delete_all_unused_submodules()
        gm.recompile()
    return report
