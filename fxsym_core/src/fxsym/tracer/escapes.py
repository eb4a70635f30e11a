"""The user's modules stay out of the trace: reaching one is refused.

A trace runs a shadow of the module tree (:mod:`.shadow`): attributes, containers, bound
methods, ``functools.partial`` objects, closures and weak references the tree holds are
redirected to the shadows. A module reached some other way — a global, a closure of a
function the tree does not hold, an object of another kind holding it — is the user's module
itself. Calling it would run the user's code on the user's module (its hooks, its
``self.log.append(...)``: a write into the model); comparing it with ``is`` to a shadow gives
another answer than the model gets (:mod:`.identity` answers ``==``, hashes and ``id``, not
``is``). Either way the trace would not be the program the model runs, so it is refused with
:class:`UserModuleReached` (a :class:`~fxsym.errors.TraceError`) naming the module and how it
was reached:

* a **call** of the user's module (``nn.Module.__call__``, seen by the tracer's
  ``call_module``) and a **read** through ``nn.Module.__getattr__`` (its parameters, buffers,
  submodules: what a direct ``module.forward(x)`` reads), both while the model's code runs
  (:func:`reads_watched`; fxsym's own calls given the user's modules — leaf votes, value
  rules — are not the model's code);
* a **global or closure** holding one, read by the code of a class whose forward is traced
  (:func:`reached_from_code`): the ``is`` no runtime check can see.

What is not seen: a user's module reached from outside the tree whose forward the model calls
directly and which reads nothing through ``__getattr__`` (no parameter, buffer or submodule),
and globals read by functions that are not methods of a traced class.

Imports from fxsym: errors.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn

from ..errors import TraceError


class UserModuleReached(TraceError):
    """The traced code reached one of the user's modules instead of its traced copy."""


def reached(where: str, name: str, module: nn.Module, how: str) -> UserModuleReached:
    """The refusal of a trace in which ``where``'s code reached the user's module ``name``."""
    inside = f"the forward of {where!r}" if where else "the model's forward"
    return UserModuleReached(
        f"{inside} reached the user's module {name or '(the root)'} "
        f"({type(module).__name__}) itself, not the copy of the module tree fxsym traces "
        f"({how}): tracing on would run the user's module (writing into the model) or take "
        "another branch than the model. Hold the module as an attribute of the model (or in a "
        "list, dict, functools.partial or closure the model holds), not in a global, or make "
        f"{where or 'the module'!r} a leaf (a leaf policy or SymMap.register)")


@contextlib.contextmanager
def reads_watched(classes: Iterable[type],
                  check: Callable[[nn.Module, str], None]) -> Iterator[None]:
    """Call ``check(module, attribute)`` before every ``nn.Module.__getattr__`` of a module
    of one of ``classes`` for the block (the tracer's patched one, run inside
    ``torch.fx.Tracer.trace``), set on those classes (not on ``nn.Module``, whose every
    subclass an assignment updates); a class with a ``__getattr__`` of its own keeps it."""
    installed = nn.Module.__getattr__

    def watched(mod: nn.Module, attr: str) -> Any:
        check(mod, attr)
        return installed(mod, attr)

    done: list[type] = []
    for cls in classes:
        if next(k for k in cls.__mro__ if "__getattr__" in vars(k)) is nn.Module:
            cls.__getattr__ = watched  # type: ignore[attr-defined]
            done.append(cls)
    try:
        yield
    finally:
        for cls in done:
            delattr(cls, "__getattr__")


def reached_from_code(cls: type, is_user_module: Callable[[Any], bool]
                      ) -> tuple[str, nn.Module] | None:
    """How the code of ``cls`` (its methods and those of its bases outside torch) reaches a
    user's module (``is_user_module``) through a global or a closure it reads, and that
    module; or ``None``. A global or closure holding a list, tuple or dict whose values hold
    one counts; a set or a ``WeakSet`` does not (membership is answered by hash and ``==``,
    which :mod:`.identity` keeps)."""
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "torch" or klass.__module__.startswith(
                "torch."):
            continue
        for attr, value in vars(klass).items():
            func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if not isinstance(func, types.FunctionType) or func.__module__.startswith(
                    "fxsym."):  # fxsym's own, installed for the trace (:mod:`.identity`)
                continue
            for name in _globals_read(func.__code__):
                found = _held(func.__globals__.get(name), is_user_module)
                if found is not None:
                    return f"{klass.__qualname__}.{attr} reads the global {name!r}", found
            for cell, name in zip(func.__closure__ or (), func.__code__.co_freevars):
                try:
                    held = cell.cell_contents
                except ValueError:
                    continue
                found = _held(held, is_user_module)
                if found is not None:
                    return f"{klass.__qualname__}.{attr} reads {name!r} from its closure", found
    return None


def _held(value: Any, is_user_module: Callable[[Any], bool]) -> nn.Module | None:
    """The user's module ``value`` is or holds as an item or a dict value, if any."""
    if isinstance(value, nn.Module):
        return value if is_user_module(value) else None
    items = (value.values() if isinstance(value, dict)
             else value if isinstance(value, (list, tuple)) else ())
    return next((v for v in items if isinstance(v, nn.Module) and is_user_module(v)), None)


@functools.lru_cache(maxsize=8192)
def _globals_read(code: types.CodeType) -> frozenset[str]:
    """The global names ``code`` and the functions defined in it load."""
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return frozenset(names)


__all__ = ["UserModuleReached", "reached", "reached_from_code", "reads_watched"]
