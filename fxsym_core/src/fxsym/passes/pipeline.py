"""Running an ordered pipeline of passes, with verification and rollback.

``run_pipeline(gm, passes, ...)`` works on ``gm`` in place — :func:`fxsym.optimize` hands it
a working copy, so the caller's GraphModule is never touched. The outputs on the example
inputs are computed **once, before the first pass**: that is the reference every pass is
compared with, so small differences of successive passes cannot add up unnoticed. For each
pass, in order:

1. a :class:`~fxsym.passes.verify.Snapshot` is taken when the pass may have to be undone;
2. the pass runs; if it raises, :class:`~fxsym.errors.PassError` names it and its plugin
   (the working copy is dropped by ``optimize``, so the input stays unchanged);
3. if the pass reported a change, the graph is linted (a pass reporting none promised to leave
   it untouched) and:

   * with example inputs (and ``verify=True``), the graph runs on them and its outputs are
     compared with the reference — exact passes too, so a wrong promise is caught. A
     mismatch rolls the pass back and is reported as a :class:`~fxsym.passes.PassWarning`
     (``on_mismatch="warn"``) or a :class:`~fxsym.errors.PassError` (``"raise"``);
   * without example inputs, an exact pass (``Pass.exact``; a pattern pass whose patterns are
     all exact) is kept; any other pass is **refused**: rolled back, recorded as
     ``"refused"``, and listed in one ``PassWarning`` at the end. A pattern pass is then run
     again with its exact patterns only;
   * with ``verify=False`` every change is kept, unverified.

The report's ``verified`` (also ``gm.meta["fxsym_verified"]`` from :func:`fxsym.optimize`)
says whether every change kept is exact or matched the reference. The graph is recompiled
once, after the last pass, and only if something changed (with the cyclic garbage collector
paused: :func:`fxsym.passes.engine.recompile`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

from torch import fx

from ..errors import PassError, PassWarning
from .base import Pass, PassRecord, PipelineReport
from .catalog import PatternPass, all_passes, catalog, distribution, get_pass
from .engine import recompile as recompile_paused
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


def is_exact(p: Pass) -> bool:
    """Whether ``p`` never changes the values a model computes (a pattern pass: all of its
    patterns say so)."""
    if isinstance(p, PatternPass):
        return all(getattr(pattern, "exact", False) for pattern in p.patterns())
    return bool(p.exact)


def _exact_part(p: Pass) -> Pass | None:
    """The exact patterns of a pattern pass, as a pass of the same name (``None``: none)."""
    if not isinstance(p, PatternPass):
        return None
    exact = [pattern for pattern in p.patterns() if getattr(pattern, "exact", False)]
    if not exact:
        return None
    return PatternPass(p.name, exact, before=p.before, after=p.after, include_registered=False)


def _what_changed(p: Pass, changes: int) -> str:
    stats = getattr(p, "last_stats", None)
    if isinstance(p, PatternPass) and stats:
        return ", ".join(f"{name} x{n}" for name, n in sorted(stats.items()))
    return f"{changes} change{'s' * (changes != 1)}"


def _run_one(gm: fx.GraphModule, p: Pass, record: PassRecord) -> int:
    start = time.perf_counter()
    try:
        changes = p(gm)
        if changes:
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
        record.seconds += time.perf_counter() - start
    return changes


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
    before the first pass, when already known (else they are computed here, once).
    """
    report = PipelineReport()
    inputs = normalize_inputs(example_inputs) if example_inputs is not None else None
    checking = verify and inputs is not None
    expected = reference
    if checking and expected is None:
        expected = run_graph(gm, *inputs)  # type: ignore[misc]
    refused: list[str] = []
    changed = False
    for p in passes:
        record = PassRecord(p.name, _source(p))
        report.records.append(record)
        exact = is_exact(p)
        snapshot = Snapshot(gm) if checking or (verify and not exact) else None
        record.changes = _run_one(gm, p, record)
        if not record.changes:
            continue
        if checking:
            assert inputs is not None and snapshot is not None
            try:
                problem = compare_outputs(expected, run_graph(gm, *inputs), rtol, atol)
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
            record.verified = True
        elif exact:
            record.verified = True
        elif verify:  # nothing to compare with: only exact rewrites may stay
            assert snapshot is not None
            snapshot.restore()
            what = _what_changed(p, record.changes)
            record.status = "refused"
            record.message = f"may change the outputs and cannot be verified ({what})"
            refused.append(f"{p.name!r} ({what})")
            part = _exact_part(p)
            record.changes = _run_one(gm, part, record) if part is not None else 0
            if not record.changes:
                continue
            record.status, record.verified = "ok", True
            record.message += "; its exact patterns were applied"
        changed = True
    if refused:
        warnings.warn(
            f"without example inputs nothing can verify passes that may change the outputs; "
            f"refused: {', '.join(refused)}. Give example_inputs=... to verify and apply "
            "them, or verify=False to apply them unverified",
            PassWarning,
            stacklevel=3,
        )
    if changed and recompile:
        gm.delete_all_unused_submodules()
        recompile_paused(gm)
    return report
