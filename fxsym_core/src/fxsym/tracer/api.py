""":func:`trace` and :func:`trace_deferred`: a model traced, never written.

:func:`trace` loads plugins, fills default example inputs from the ``fxsym_example_inputs``
hook (:func:`resolve_example_inputs`), binds them to the forward's parameters (tensors become
placeholders with meta values, other values and the parameters not given are fixed to their
defaults: :func:`_bind`), enters every ``fxsym_trace_context``, traces with
:class:`~fxsym.tracer.FxsymTracer` and returns a ``GraphModule`` (:mod:`.assembly`, after
:mod:`.finish`) with a ``trace_report``.

It runs a shadow of the model's module tree (:mod:`.shadow`), so it never writes into the
model; the shadows answer ``hash``, ``==`` and ``id()`` as the user's modules for the model's
code (:mod:`.identity`), and a trace whose model code reaches a user's module itself is
refused (:mod:`.escapes`). Around it (:func:`_guarded`): one trace at a time
(:data:`~fxsym.tracer.guard.TRACE_LOCK`), the collector paused, the model put back as it was
(:class:`~fxsym.tracer.guard.ModuleGuard`). A shadow whose dicts of derived tensors are given
empty is traced first; if that fails, or falls back to a leaf, while such a dict stayed empty,
the model is traced again with them as they are (:func:`_trace`).

Imports from fxsym: errors, plugins.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch import nn

from ..errors import ModelError, PluginError, TraceError
from ..plugins import calls as plugin_calls
from ..plugins.manager import active_plugins
from .assembly import _graph_module
from .deferred import DeferredGraphModule
from .finish import _check_code_names, _drop_concretization_checks
from .guard import TRACE_LOCK, ModuleGuard, gc_paused, tracing_thread
from .identity import identity_kept
from .meta import to_meta
from .report import TraceReport
from .shadow import ShadowTree
from .tracer import FxsymTracer
from .unknown import _MODEL_RAISED

ExampleInputs = tuple[Any, ...] | dict[str, Any]


def normalize_example_inputs(example_inputs: Any) -> ExampleInputs | None:
    if example_inputs is None:
        return None
    if isinstance(example_inputs, dict):
        return dict(example_inputs)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if isinstance(example_inputs, tuple):
        return example_inputs
    return (example_inputs,)


def resolve_example_inputs(model: nn.Module, example_inputs: Any) -> ExampleInputs | None:
    """The given example inputs, or a plugin's defaults for the model's family."""
    if example_inputs is None:
        example_inputs = plugin_calls.example_inputs(model)
    return normalize_example_inputs(example_inputs)


def _bind(
    model: nn.Module, example_inputs: ExampleInputs | None, concrete_args: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any], set[str]]:
    """Placeholder values by name, the concrete args to trace with, and the auto-concretized."""
    sig = inspect.signature(model.forward)  # follows decorators; a bound method has no self
    params = sig.parameters
    concrete = dict(concrete_args or {})
    values: dict[str, Any] | None = None
    given: set[str] = set(concrete)
    if example_inputs is not None:
        try:
            if isinstance(example_inputs, dict):
                bound = sig.bind_partial(**example_inputs)
            else:
                bound = sig.bind_partial(*example_inputs)
        except TypeError as exc:
            raise TraceError(
                f"example_inputs do not match {type(model).__name__}.forward{sig}: {exc}"
            ) from exc
        values = {}
        for name, val in bound.arguments.items():
            kind = params[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise TraceError(
                    f"example input {name!r} lands in *args/**kwargs of "
                    f"{type(model).__name__}.forward; pass it by a named parameter"
                )
            if isinstance(val, torch.Tensor):
                values[name] = to_meta(val)
            else:
                concrete[name] = val
            given.add(name)
    auto: set[str] = set()
    for name, p in params.items():
        if name in given:
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            concrete["**" + name] = {}
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            concrete["*" + name] = ()
        elif example_inputs is not None and p.default is not inspect.Parameter.empty:
            concrete[name] = p.default
            auto.add(name)
    return values, concrete, auto


def trace(
    model: nn.Module,
    *,
    example_inputs: Any = None,
    concrete_args: dict[str, Any] | None = None,
) -> torch.fx.GraphModule:
    """Trace ``model`` into a ``GraphModule`` carrying a ``trace_report``.

    ``example_inputs`` is a tuple of positional arguments, a dict of keyword arguments, or a
    single tensor. With them every node carries its meta value and shape questions resolve at
    trace time; parameters not given are fixed to their defaults. Without them (and without
    plugin defaults) tracing is plain torch.fx with robust leaf fallback.

    The model is never written: a shadow of its module tree is traced (``shadow.py``), with
    :class:`ModuleGuard` as the safety net; its hooks do not run, and traces are serialised
    by :data:`TRACE_LOCK` (see ``guard.py``). ``gm.derived_state`` holds the derived state the
    trace found (:meth:`~fxsym.tracer.shadow.ShadowTree.derived_state`), ``gm.derived_writes``
    the nodes of the values the forward set attributes to (:meth:`~.ShadowTree.written`).
    """
    with _guarded(model):
        return _trace(model, example_inputs, concrete_args, torch.fx.GraphModule)


def trace_deferred(
    model: nn.Module,
    *,
    example_inputs: Any = None,
    concrete_args: dict[str, Any] | None = None,
) -> DeferredGraphModule:
    """:func:`trace`, returning a :class:`DeferredGraphModule` (its Python code generated on
    first use) for callers that only read the graph and the module tree."""
    with _guarded(model):
        gm = _trace(model, example_inputs, concrete_args, DeferredGraphModule)
    assert isinstance(gm, DeferredGraphModule)
    return gm


@contextlib.contextmanager
def _guarded(model: nn.Module) -> Iterator[None]:
    """What surrounds every trace: one at a time (:data:`TRACE_LOCK`), the collector paused,
    this thread marked as tracing, and ``model`` put back as it was (:class:`ModuleGuard`)."""
    if not isinstance(model, nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(model).__name__}")
    with TRACE_LOCK, gc_paused(), tracing_thread(), ModuleGuard(model):
        yield


def _trace(
    model: nn.Module, example_inputs: Any, concrete_args: dict[str, Any] | None,
    graph_module_cls: type[torch.fx.GraphModule],
) -> torch.fx.GraphModule:
    """Trace a shadow of ``model`` (:class:`~fxsym.tracer.shadow.ShadowTree`) with its dicts
    of derived tensors given empty; if that fails, or a module fell back to a leaf, while such
    a dict stayed empty, the forward may need it: trace again with it as it is."""
    pm = active_plugins()
    vote = functools.partial(plugin_calls.hook_computes, pm=pm)
    derives = functools.partial(plugin_calls.derived_tensors, pm=pm)
    inputs = resolve_example_inputs(model, example_inputs)
    values, concrete, auto = _bind(model, inputs, concrete_args)
    shadows = ShadowTree(model, vote=vote, derives=derives)
    try:
        gm = _trace_tree(model, shadows, inputs, values, concrete, auto, graph_module_cls)
    except Exception:
        if not shadows.unfilled():
            raise
        gm = None
    if gm is None or (shadows.unfilled() and any(
            e.kind == "leaf-fallback" for e in gm.trace_report.entries)):  # type: ignore[union-attr]
        shadows = ShadowTree(model, empty_derived=False, vote=vote, derives=derives)
        gm = _trace_tree(model, shadows, inputs, values, concrete, auto, graph_module_cls)
    written = shadows.written()
    gm.derived_state = shadows.derived_state(written)  # type: ignore[assignment]
    gm.derived_writes = written  # type: ignore[assignment]
    return gm


def _trace_tree(
    model: nn.Module, shadows: ShadowTree, inputs: ExampleInputs | None,
    values: dict[str, Any] | None, concrete: dict[str, Any], auto: set[str],
    graph_module_cls: type[torch.fx.GraphModule],
) -> torch.fx.GraphModule:
    """One trace of the shadow tree; the GraphModule holds the user's modules."""
    report = TraceReport()
    for name, hooks in shadows.hidden_hooks.items():
        for kind, line in hooks:
            report.add(kind, name or type(model).__name__, line)
    tracer = FxsymTracer(values, report, defaults=auto)
    tracer.shadows = shadows
    with shadows.live(), identity_kept(shadows), plugin_calls.trace_contexts(shadows.root, inputs):
        shadows.rehash()
        try:
            graph = tracer.trace(shadows.root, concrete_args=concrete or None)
        except (TraceError, PluginError):
            raise
        except _MODEL_RAISED as exc:
            if inputs is None:
                raise _trace_error(model, exc, inputs) from exc
            raise ModelError(
                f"{type(model).__name__} raised on the example inputs: "
                f"{type(exc).__name__}: {exc}. Check that example_inputs have the shapes "
                "and dtypes the model expects."
            ) from exc
        except Exception as exc:
            if tracer.escaped is not None:  # the model's code caught it and went on
                raise tracer.escaped from exc
            raise _trace_error(model, exc, inputs) from exc
        if tracer.escaped is not None:
            raise tracer.escaped
        _check_code_names(graph)
        _drop_concretization_checks(graph, auto)  # before the GraphModule compiles its code
        gm = _graph_module(graph_module_cls, graph, type(model).__name__, shadows)
    tracer.release()
    gm.trace_report = report  # type: ignore[assignment]
    gm.hook_sites = tracer.hook_sites  # type: ignore[assignment]
    gm.example_inputs = inputs  # type: ignore[assignment]
    return gm


def _trace_error(model: nn.Module, exc: Exception, inputs: Any) -> TraceError:
    """A trace that cannot proceed; example inputs are suggested only when none were given."""
    hint = ("Pass example_inputs so that shape-dependent code resolves, or make "
            "the failing module a leaf" if inputs is None else "Make the failing module a leaf")
    return TraceError(f"tracing {type(model).__name__} failed: {type(exc).__name__}: {exc}. "
                      f"{hint} (a leaf policy or SymMap.register).")
