"""``fxsym.optimize``: trace if needed, copy, run the pipeline, hand back a new GraphModule.

Nothing the caller owns is modified: an ``nn.Module`` is traced (tracing does not mutate it)
and a GraphModule is copied (:func:`~fxsym.passes.copying.working_copy`); every pass then
edits that copy. With example inputs, shapes and dtypes are recorded on the nodes first
(``meta['tensor_meta']``) — several rewrites need them to prove they are safe — and the
outputs of that run are the one reference every pass is verified against. Without example
inputs (given, or supplied by a plugin for the model's family), only exact passes may change
the graph; the others are refused with a :class:`~fxsym.passes.PassWarning` (see
:mod:`fxsym.passes.pipeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx, nn

from ..errors import PassError
from .pipeline import OnMismatch, PassSpec, resolve, run_pipeline
from .verify import normalize_inputs, propagate_shapes


def _to_graph_module(model: nn.Module, example_inputs: Any = None) -> fx.GraphModule:
    """Trace ``model`` with fxsym's tracer when available, else with torch.fx."""
    if isinstance(model, fx.GraphModule):
        return model
    try:
        from ..tracer import trace
    except ImportError:
        return fx.symbolic_trace(model)
    return trace(model, example_inputs=example_inputs)


def _default_inputs(model: nn.Module) -> Any:
    """The plugins' default example inputs (a failing plugin is disabled and reported)."""
    from ..plugins.calls import example_inputs

    return example_inputs(model)


def optimize(
    model_or_gm: nn.Module,
    passes: Sequence[PassSpec] | PassSpec | None = None,
    example_inputs: Any = None,
    verify: bool = True,
    *,
    on_mismatch: OnMismatch = "warn",
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> fx.GraphModule:
    """Rewrite a model's graph with a pipeline of passes; return a new GraphModule.

    ``passes``: ``None`` for the default pipeline, or names / :class:`Pass` /
    :class:`Pattern` objects (ordered by their constraints, ties kept in the given order).
    ``example_inputs``: a tuple of args, a dict of kwargs or one tensor; with
    ``verify=True`` each pass that changes something is checked on them against the original
    model's outputs and rolled back if it changes them (``on_mismatch`` chooses a warning or
    a :class:`PassError`). Without them, ``verify=True`` refuses every pass that is not
    exact (with a :class:`PassWarning`); ``verify=False`` applies everything unverified.
    The result carries the per-pass report in ``gm.meta["fxsym_passes"]`` and, in
    ``gm.meta["fxsym_verified"]``, whether every change kept is exact or was verified.
    """
    if not isinstance(model_or_gm, nn.Module):
        raise PassError(
            f"optimize takes an nn.Module or a GraphModule, not {type(model_or_gm).__name__}"
        )
    if on_mismatch not in ("warn", "raise"):
        raise ValueError(f"on_mismatch must be 'warn' or 'raise', not {on_mismatch!r}")
    from .copying import working_copy

    pipeline = resolve(passes)  # type: ignore[arg-type]
    if example_inputs is None and not isinstance(model_or_gm, fx.GraphModule):
        example_inputs = _default_inputs(model_or_gm)
    gm = working_copy(_to_graph_module(model_or_gm, example_inputs))
    inputs = normalize_inputs(example_inputs) if example_inputs is not None else None
    reference = None
    if inputs is not None:
        try:
            reference = propagate_shapes(gm, *inputs)
        except Exception as exc:
            raise PassError(
                f"the traced model fails on the example inputs ({type(exc).__name__}: {exc}); "
                "check example_inputs (a tuple of args, a dict of kwargs or one tensor)"
            ) from exc
    report = run_pipeline(
        gm,
        pipeline,
        example_inputs=example_inputs,
        reference=reference,
        verify=verify,
        on_mismatch=on_mismatch,
        rtol=rtol,
        atol=atol,
    )
    gm.meta["fxsym_passes"] = report
    gm.meta["fxsym_verified"] = report.verified
    return gm
