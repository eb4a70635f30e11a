"""Several batches run through one model in lock step, held at the entry of chosen modules.

A streamed calibration (:mod:`fxsym.prune.checkpoint`) must run the model's own program on every
batch, exactly as a model in memory would, yet read each decoder block's tensors once for all
batches. Catching the first block's arguments and replaying them to the later blocks is not
the model's program: layers of one model take different arguments (a sliding-window mask on
some layers and a full one on others, local and global rotary tables, no-rope layers, hybrid
attention and state-space layers), and every argument a replay holds fixed is wrong for some
family. So nothing is replayed here: each batch runs the whole ``forward`` of the model, in a
thread of its own, and a pre-hook on each *gate* module (a block) stops that thread before the
block runs. When every batch is stopped (at a gate, or done), the conductor opens one gate:
``enter(i)`` (load block ``i``'s tensors), then the batches waiting there run one after
another, each until it reaches its next gate or ends; then ``leave(i)`` (give the tensors
back). The model decides what each block receives; a gate only decides when.

Several models can run together (each batch is then a model and its input): each gate has a
place in an ``order`` (the block of the checkpoint a pruned model's block is read from), and
the conductor opens, of the gates batches wait at, the first in that order. A batch passes
its gates in increasing order, so every gate of one place is opened before any of the next:
what the place's gates share (the block's tensors, read once) is needed in one stretch.

One thread runs at a time (the conductor waits while a batch runs), so hooks, loaders and
recorders need no locks, and torch's intra-op threads are never oversubscribed. Grad mode is
per thread: each batch runs under :func:`torch.no_grad`.

What cannot be held in step raises :class:`~fxsym.errors.CheckpointError`, never guesses: a
gate reached while a batch is still inside another gate's module (a block calling a block).

Imports from fxsym: errors.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError

__all__ = ["run_in_lockstep"]


class _Abort(BaseException):
    """Raised in a batch's thread, at a gate, when the run is given up (another batch
    failed, or the conductor was interrupted)."""


@dataclass
class _Batch:
    """One batch's thread and where it stands: the gate it waits at (``None`` while it runs
    or once it has ended), the gate whose module it is inside, how it ended."""

    index: int
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    waiting: int | None = None
    inside: list[int] = field(default_factory=list)
    output: Any = None
    error: BaseException | None = None
    done: bool = False
    thread: threading.Thread | None = None


class _Conductor:
    def __init__(self, gates: Sequence[nn.Module], run: Callable[[Any], Any],
                 batches: Sequence[Any],
                 on_pass: Callable[[int, tuple[Any, ...], dict[str, Any], Any], None] | None,
                 order: Sequence[int]) -> None:
        self.gates, self.run, self.batches, self.on_pass = gates, run, batches, on_pass
        self.order = order
        self.states = [_Batch(i) for i in range(len(batches))]
        self.local = threading.local()
        self.reports: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.aborted = False

    # -- in a batch's thread ---------------------------------------------------------------
    def _body(self, state: _Batch) -> None:
        self.local.state = state
        state.go.acquire()
        try:
            if self.aborted:
                raise _Abort
            with torch.no_grad():
                state.output = self.run(self.batches[state.index])
        except _Abort:
            pass
        except BaseException as exc:  # handed to the conductor, raised there
            state.error = exc
        state.done = True
        self.reports.put(state.index)

    def _arrive(self, i: int, module: nn.Module, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
        state: _Batch | None = getattr(self.local, "state", None)
        if state is None:  # a gate called outside the run (the conductor's own thread)
            return
        if state.inside:
            raise CheckpointError(f"block {i} was called inside block {state.inside[-1]}: "
                                  "the blocks cannot be streamed one at a time")
        state.waiting = i
        self.reports.put(state.index)
        state.go.acquire()
        if self.aborted:
            raise _Abort
        state.inside.append(i)
        state.waiting = None
        if self.on_pass is not None:
            self.local.args = (args, kwargs)

    def _passed(self, i: int, module: nn.Module, args: tuple[Any, ...],
                kwargs: dict[str, Any], out: Any) -> None:
        state: _Batch | None = getattr(self.local, "state", None)
        if state is None:
            return
        state.inside.pop()
        if self.on_pass is not None:
            a, k = self.local.args
            self.on_pass(i, a, k, out)

    # -- in the conductor's thread -----------------------------------------------------------
    def _resume(self, state: _Batch) -> None:
        """Let ``state``'s batch run until it reaches a gate or ends."""
        state.go.release()
        self.reports.get()

    def conduct(self, enter: Callable[[int], None], leave: Callable[[int], None]) -> list[Any]:
        handles = []
        for i, gate in enumerate(self.gates):
            handles.append(gate.register_forward_pre_hook(
                lambda m, a, k, i=i: self._arrive(i, m, a, k), with_kwargs=True))
            handles.append(gate.register_forward_hook(
                lambda m, a, k, o, i=i: self._passed(i, m, a, k, o), with_kwargs=True))
        try:
            for state in self.states:
                state.thread = threading.Thread(target=self._body, args=(state,), daemon=True,
                                                name=f"fxsym-batch-{state.index}")
                state.thread.start()
                self._resume(state)
                self._raise_failed()
            while True:
                open_ = [s for s in self.states if not s.done]
                if not open_:
                    break
                at = min((s.waiting for s in open_ if s.waiting is not None),
                         key=lambda g: (self.order[g], g))
                enter(at)
                try:
                    for state in open_:
                        if state.waiting == at:
                            self._resume(state)
                            self._raise_failed()
                finally:
                    leave(at)
            return [s.output for s in self.states]
        finally:
            self._stop()
            for h in handles:
                h.remove()

    def _raise_failed(self) -> None:
        for state in self.states:
            if state.error is not None:
                raise state.error

    def _stop(self) -> None:
        """End every thread still waiting at a gate (or not yet started) and join them."""
        self.aborted = True
        for state in self.states:
            if state.thread is not None and not state.done:
                state.go.release()
        for state in self.states:
            if state.thread is not None:
                state.thread.join()


def run_in_lockstep(run: Callable[[Any], Any], batches: Sequence[Any],
                    gates: Sequence[nn.Module], *, enter: Callable[[int], None],
                    leave: Callable[[int], None],
                    on_pass: Callable[[int, tuple[Any, ...], dict[str, Any], Any], None]
                    | None = None, order: Sequence[int] | None = None) -> list[Any]:
    """``[run(batch) for batch in batches]``, computed in lock step at ``gates`` (see the
    module docstring): ``enter(i)`` before any batch runs gate ``i``'s module, ``leave(i)``
    after every batch waiting there has passed it and reached its next gate or ended;
    ``on_pass(i, args, kwargs, output)`` as each batch leaves gate ``i``'s module (the
    arguments it was called with). ``order`` (default: the gates' positions) places each
    gate: of the gates batches wait at, the first in it opens first. The first failure of a
    batch is raised here, after every batch's thread has ended."""
    if order is not None and len(order) != len(gates):
        raise ValueError(f"{len(order)} places for {len(gates)} gates")
    return _Conductor(gates, run, batches, on_pass,
                      range(len(gates)) if order is None else order).conduct(enter, leave)
