"""Answers remembered for the length of one run: a pure computation asked again with the
same arguments inside a run is computed once.

Design. A long call of the workflow (:func:`fxsym.prune_checkpoint`, :func:`fxsym.search.search`)
asks the plugins the same questions many times: each candidate of a search is planned with
the sizes the model's config can describe, each plan applied writes a config the model is
built from again, and every one of those probes builds the model on the meta device from a
config (``fxsym_plugins_hf.configs.meta_build``), most of them from a config built before.
Such a caller opens :func:`remembering` around the run (or is decorated with
:func:`one_run`); a computation asked for through
:func:`remembered` with a key already seen in the run gives the same answer object again.
Outside a run nothing is kept: each call computes, as if this module were not there, so a
program that changes a class between two runs (a test's monkeypatch) never sees an answer
of the first run.

What may be remembered: a computation whose answer depends only on its key (the key holds
everything it reads), and whose answer nobody changes (callers read it; a shared answer
changed by one would be wrong for the next). A key of ``None``, or one that cannot be hashed,
is not remembered.

The scope lives in a :class:`contextvars.ContextVar`: a thread started inside the run (the
lock-step batches of :mod:`fxsym.lockstep`) computes without it, and two runs in two threads
keep apart. A run opened inside another is the outer one's: the answers are kept until the
outermost ends, then dropped.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

__all__ = ["Run", "one_run", "remembered", "remembering"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclass
class Run:
    """The answers of one run by ``(kind, key)``, and by kind how many were computed and how
    many asked for."""

    answers: dict[tuple[str, Hashable], Any] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)
    asked: dict[str, int] = field(default_factory=dict)


_RUN: ContextVar[Run | None] = ContextVar("fxsym_memo_run", default=None)


@contextmanager
def remembering() -> Iterator[Run]:
    """Remember :func:`remembered` answers until the block ends (the outer run's, if one is
    open in this context); yields the run."""
    run = _RUN.get()
    if run is not None:
        yield run
        return
    run = Run()
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)
        run.answers.clear()


def remembered(kind: str, key: Hashable | None, compute: Callable[[], _T]) -> _T:
    """``compute()``, or the answer it gave for ``(kind, key)`` earlier in the open run
    (:func:`remembering`); without a run, or for a key of ``None`` or one that cannot be
    hashed, ``compute()``.
    An exception is not remembered: the next call computes again."""
    run = _RUN.get()
    if run is None or key is None:
        return compute()
    try:
        hash(key)
    except TypeError:
        return compute()
    run.asked[kind] = run.asked.get(kind, 0) + 1
    slot = (kind, key)
    if slot in run.answers:
        answer: _T = run.answers[slot]
        return answer
    answer = compute()
    run.computed[kind] = run.computed.get(kind, 0) + 1
    run.answers[slot] = answer
    return answer


def one_run(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """``fn`` whose every call is a run (:func:`remembering`)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with remembering():
            return fn(*args, **kwargs)

    return run
