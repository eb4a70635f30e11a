"""What tracing may not do: write into the model, run the user's hooks, race another trace.

Tracing runs the model's Python code with Proxies in place of tensors, so every
``self.cache[key] = ...``, ``self.window_size = x.shape[1]`` or ``self._flat_weights = [...]``
a forward performs would leave graph objects inside the model, and the tracer itself puts
graph values where sizes are read. A trace therefore runs a *shadow* of the module tree
(:mod:`fxsym.tracer.shadow`): the user's modules are never written, not even for the duration
of the trace, and the user's hooks, which the shadows do not hold, do not run (those a plugin
declares part of the computation, ``fxsym_hook_computes``, or deriving a tensor,
``fxsym_derived_tensors`` such as ``torch.nn.utils.weight_norm``'s pre-hook, do; the groups
the others could change are pinned, :mod:`fxsym.tracer.hooksites`). Global hooks
(``register_module_forward_hook``) are process-wide and stay as they are.

:class:`ModuleGuard` is the safety net around that: it takes a snapshot
(:class:`~fxsym.modstate.ModuleTreeState`) of every submodule's ``__dict__`` — and,
recursively, of the contents of the dicts, lists and sets it holds — and on exit puts back
whatever now holds a graph value (a Proxy or a Node) as it was (the same objects, so parameter
identity and the identity of the containers are kept). Since the trace writes nothing, it
finds nothing to put back; other changes, such as a cache another thread running the model
filled meanwhile, are that thread's and stay.

Concurrency: torch.fx patches process-wide state while it traces (``nn.Module.__call__``,
``nn.Module.__getattr__``, the functions registered with ``torch.fx.wrap``), and fxsym adds
``torch``'s size-taking factories. Two traces at once would record into each other's graphs
and unpatch each other. :data:`TRACE_LOCK`, a reentrant process-wide lock, serialises every
trace and analysis; the patched entry points pass calls from other threads straight to the
original (see :func:`tracing_here`), and those threads run the user's modules, which the
trace leaves alone, so other threads may keep running models meanwhile.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from torch import nn
from torch.fx import Node, Proxy
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from ..modstate import ModuleTreeState

#: held by every ``fxsym.trace`` / ``fxsym.analyze`` call (reentrant: plugins may trace)
TRACE_LOCK = threading.RLock()

_local = threading.local()

_F = TypeVar("_F", bound=Callable[..., Any])


def serialised(fn: _F) -> _F:
    """Run ``fn`` holding :data:`TRACE_LOCK` (``fxsym.analyze`` reads shared registry caches
    and SymInfo factories between traces; one analysis at a time keeps them consistent)."""

    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with TRACE_LOCK:
            return fn(*args, **kwargs)

    return locked  # type: ignore[return-value]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (it runs as usual afterwards).

    A trace and an analysis allocate several objects per node while the model, torch and the
    growing graph stay alive, so the collections they trigger traverse those again and again
    and find next to nothing to free: on a 200-module CNN, next to the ~400k objects a process
    with torch and torchvision holds, a full collection costs about as much as the analysis.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def tracing_here() -> bool:
    """Whether the current thread is inside an fxsym trace (patched entry points ask this)."""
    return getattr(_local, "depth", 0) > 0


@contextmanager
def tracing_thread() -> Iterator[None]:
    """Mark the current thread as tracing for the duration of the block."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


_FORWARD_HOOKS = ("_forward_hooks", "_forward_pre_hooks")


def forward_hooked(mod: nn.Module) -> bool:
    """Whether hooks run around ``mod``'s forward: its own forward and pre-forward hooks
    (of a shadow: those declared part of the computation) or global ones
    (``register_module_forward_hook``)."""
    state = vars(mod)
    return bool(any(state.get(name) for name in _FORWARD_HOOKS)
                or _global_forward_hooks or _global_forward_pre_hooks)


class ModuleGuard:
    """Snapshot every submodule's state on entry (:class:`~fxsym.modstate.ModuleTreeState`)
    and restore whatever changed on exit.

    Used as a context manager around one trace; see the module docstring for what is kept
    and why.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._state: ModuleTreeState | None = None

    def __enter__(self) -> ModuleGuard:
        self._state = ModuleTreeState(self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back what holds a graph value now (a Proxy or a Node, also inside a tuple,
        list or dict); a change holding none (another thread's) stays."""
        if self._state is not None:
            self._state.restore_leaked(_graph_value)


def _graph_value(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or holds (three levels deep), a torch.fx Proxy or Node."""
    if isinstance(value, (Proxy, Node)):
        return True
    if depth < 3 and type(value) in (tuple, list):
        return any(_graph_value(v, depth + 1) for v in value)
    if depth < 3 and type(value) is dict:
        return any(_graph_value(v, depth + 1) for v in value.values())
    return False
