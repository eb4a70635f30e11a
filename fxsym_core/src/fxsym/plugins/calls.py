"""Calling plugin hooks through pluggy, with one failing plugin never breaking an analysis.

Every call goes through pluggy, so ``tryfirst``/``trylast``, hook wrappers (``wrapper=True``
and old-style ``hookwrapper=True``), tracing and hook-call monitoring all apply. The order is
pluggy's: wrappers around everything; inside them ``tryfirst`` implementations, then the
others, then ``trylast`` ones, each group latest-registered first.

* **Decision hooks** (``firstresult=True``: :func:`call_hook`, :func:`example_inputs`,
  :func:`leaf_vote`) are one pluggy call: the first non-``None`` answer wins and wrappers see
  and may replace it.
* **Collecting hooks** (``fxsym_register_*``, ``fxsym_trace_context``: :func:`call_each`) call
  each plugin through ``pm.subset_hook_caller`` holding that plugin and the plugins wrapping
  the hook: every contribution is attributed to its plugin, and each wrapper wraps each
  plugin's call.

A plugin's planned refusal, an :class:`~fxsym.errors.FxsymError` it raises on purpose (a
``CheckpointError`` for a directory it will not read, a ``ResizeError`` for a config that
cannot describe the kept blocks), is an answer, not a failure: it propagates to the caller as
it is and the plugin stays enabled (:func:`_refusal`). Any other exception of
:data:`~fxsym.plugins.manager.PLUGIN_ERRORS` a call raises is blamed on the
implementation deepest in the exception's traceback (:func:`blame`: the plain implementation
that raised, or the wrapper that raised its own error). That plugin is disabled
(:meth:`~fxsym.plugins.manager.PluginManager.disable`: blocked, recorded, reported once) and
the call made again without it. In strict mode (``FXSYM_STRICT_PLUGINS=1``) the
:class:`~fxsym.errors.PluginError` raised by ``disable`` propagates to the caller of
``fxsym.trace``/``fxsym.analyze`` as it is. An exception no implementation's frame carries
(raised by pluggy itself) propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from types import TracebackType
from typing import Any

from pluggy import HookImpl
from torch import nn

from ..errors import FxsymError
from .contracts import ForwardHook
from .hookroles import DerivedTensors
from .manager import PLUGIN_ERRORS, PluginManager, blame, get_plugin_manager


def _refusal(exc: BaseException) -> bool:
    """Whether ``exc``, raised in a plugin's hook, is a refusal the plugin made on purpose
    (a typed fxsym error), which propagates, rather than the plugin failing."""
    return isinstance(exc, FxsymError)


def call_hook(hook_name: str, pm: PluginManager | None = None, **kwargs: Any) -> Any:
    """Call hook ``hook_name`` through pluggy and return what pluggy returns; a plugin whose
    implementation raises is disabled and the hook called again without it."""
    pm = pm or get_plugin_manager()
    caller = getattr(pm.hook, hook_name)
    while True:
        try:
            return caller(**kwargs)
        except PLUGIN_ERRORS as exc:
            impl = blame(exc, caller.get_hookimpls())
            if impl is None or _refusal(exc):
                raise
            pm.disable(impl.plugin_name, exc, hook_name)


def implementations(pm: PluginManager, hook_name: str) -> list[HookImpl]:
    """The plain (non-wrapper) implementations of ``hook_name``, in pluggy's call order."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return [i for i in reversed(impls) if not (i.hookwrapper or i.wrapper)]


def call_each(
    pm: PluginManager, hook_name: str, kwargs_for: Callable[[str], dict[str, Any]]
) -> Iterator[tuple[str, Any]]:
    """Call each plugin's implementation of ``hook_name`` in pluggy's order, wrapped by the
    hook's wrappers, with the arguments ``kwargs_for(plugin_name)``; yield
    ``(plugin_name, result)``.

    A failing call disables the plugin :func:`blame` names (the callee, or a wrapper) and the
    plugins after it are still called (a refusal, :func:`_refusal`, propagates instead); the
    callee's call is not repeated. The caller finds the names disabled meanwhile with
    ``pm.is_blocked``.
    """
    caller = getattr(pm.hook, hook_name)
    wrapping = {i.plugin for i in caller.get_hookimpls() if i.hookwrapper or i.wrapper}
    for impl in implementations(pm, hook_name):
        if pm.is_blocked(impl.plugin_name):  # disabled by an earlier call of this loop
            continue
        others = [p for p in pm.get_plugins() if p is not impl.plugin and p not in wrapping]
        subset = pm.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            result = subset(**kwargs_for(impl.plugin_name))
        except PLUGIN_ERRORS as exc:
            if _refusal(exc):
                raise
            culprit = blame(exc, subset.get_hookimpls()) or impl
            pm.disable(culprit.plugin_name, exc, hook_name)
            continue
        if not (subset.spec is not None and subset.spec.opts.get("firstresult")):
            result = result[0] if result else None
        yield impl.plugin_name, result


def trace_contexts(model: Any, example_inputs: Any, pm: PluginManager | None = None) -> Any:
    """A context manager entering every plugin's ``fxsym_trace_context`` for one trace.

    * a plugin whose hook or whose context's ``__enter__`` raises is disabled and the trace
      goes on without it. Its context is not exited: the protocol has no exit for a context
      that was never entered, so undoing what a failed ``__enter__`` did is that context's
      own job (``contextlib.contextmanager`` runs the generator's ``finally``);
    * a context whose ``__exit__`` raises is disabled; the contexts entered before it are
      still exited. When the trace itself raised, its exception is the one that propagates
      (the plugin's failure is then only warned, even in strict mode);
    * a context cannot swallow the trace's exception: its ``__exit__`` result is ignored;
    * in strict mode the ``PluginError`` of a failing ``__enter__`` propagates once the
      contexts already entered are exited.
    """
    return _TraceContexts(pm or get_plugin_manager(), model, example_inputs)


class _TraceContexts:
    def __init__(self, pm: PluginManager, model: Any, example_inputs: Any) -> None:
        self._pm = pm
        self._kwargs = {"model": model, "example_inputs": example_inputs}
        self._stack = ExitStack()

    def __enter__(self) -> _TraceContexts:
        with ExitStack() as stack:  # exits what was entered if a strict failure propagates
            calls = call_each(self._pm, "fxsym_trace_context", lambda _: self._kwargs)
            for name, ctx in calls:
                if ctx is None:
                    continue
                try:
                    exit_fn = type(ctx).__exit__
                    type(ctx).__enter__(ctx)
                except PLUGIN_ERRORS as exc:
                    if _refusal(exc):
                        raise
                    self._pm.disable(name, exc, "fxsym_trace_context")
                    continue
                stack.push(_guarded_exit(self._pm, name, ctx, exit_fn))
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(self._stack.__exit__(exc_type, exc, tb))


def _guarded_exit(
    pm: PluginManager, name: str, ctx: Any, exit_fn: Callable[..., Any]
) -> Callable[..., bool]:
    def exit_(
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            exit_fn(ctx, exc_type, exc, tb)
        except PLUGIN_ERRORS as err:
            if _refusal(err) and exc is None:
                raise
            if err is not exc and not _refusal(err):  # re-raising what it was given: no failure
                pm.disable(name, err, "fxsym_trace_context (exit)", raise_strict=exc is None)
        return False

    return exit_


def example_inputs(model: Any, pm: PluginManager | None = None) -> Any:
    """The plugins' default example inputs for ``model`` (``fxsym_example_inputs``), or
    ``None``."""
    return call_hook("fxsym_example_inputs", pm, model=model)


def hook_computes(module: nn.Module | None, hook: ForwardHook,
                  pm: PluginManager | None = None) -> bool | None:
    """The plugins' answer to ``fxsym_hook_computes``: ``True``/``False``, or ``None``."""
    vote: object = call_hook("fxsym_hook_computes", pm, module=module, hook=hook)
    return None if vote is None else bool(vote)


def derived_tensors(module: nn.Module, hook: ForwardHook,
                    pm: PluginManager | None = None) -> DerivedTensors | None:
    """The plugins' answer to ``fxsym_derived_tensors``: a
    :class:`~fxsym.plugins.hookroles.DerivedTensors`, or ``None``."""
    answer: object = call_hook("fxsym_derived_tensors", pm, module=module, hook=hook)
    return answer if isinstance(answer, DerivedTensors) else None


def leaf_vote(module: nn.Module, qualname: str, pm: PluginManager | None = None
              ) -> bool | None:
    """The plugins' answer to ``fxsym_leaf_module``: ``True``/``False``, or ``None``."""
    vote: object = call_hook("fxsym_leaf_module", pm, module=module, qualname=qualname)
    return None if vote is None else bool(vote)
