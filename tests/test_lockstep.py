"""``fxsym.prune.lockstep.run_in_lockstep``: batches run through a model's own forward, held at the
entry of its blocks so that each block is entered once for all batches (issue 29 §1)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

from fxsym.errors import CheckpointError
from fxsym.prune.lockstep import run_in_lockstep


class Layered(nn.Module):
    """Each layer gets arguments of its own: a window that depends on the layer's position
    (as a sliding-window layer among full ones does) and the batch's own length."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            keep = torch.arange(x.shape[1]) >= x.shape[1] - (2 if i % 2 else x.shape[1])
            x = layer(x) * keep[None, :, None] + x
        return x


def test_the_outputs_are_the_model_s_and_each_block_is_entered_once() -> None:
    model = Layered().eval()
    batches = [torch.randn(2, n, 4) for n in (5, 3, 7)]
    events: list[tuple[str, int]] = []
    passes: list[tuple[int, torch.Size]] = []
    got = run_in_lockstep(model, batches, list(model.layers),
                          enter=lambda i: events.append(("enter", i)),
                          leave=lambda i: events.append(("leave", i)),
                          on_pass=lambda i, a, k, o: passes.append((i, a[0].shape)))
    with torch.no_grad():
        want = [model(b) for b in batches]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert events == [(e, i) for i in range(3) for e in ("enter", "leave")]
    assert passes == [(i, b.shape) for i in range(3) for b in batches]
    assert not got[0].requires_grad


def test_a_batch_that_fails_is_raised_and_every_thread_ends() -> None:
    model = Layered().eval()
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        run_in_lockstep(model, [torch.randn(1, 3, 4), torch.randn(1, 3, 5)],
                        list(model.layers), enter=lambda i: None, leave=lambda i: None)
    assert threading.active_count() == before
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_a_failure_while_entering_a_block_ends_every_thread() -> None:
    model = Layered().eval()
    before = threading.active_count()

    def enter(i: int) -> None:
        if i == 1:
            raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        run_in_lockstep(model, [torch.randn(1, 3, 4)] * 3, list(model.layers), enter=enter,
                        leave=lambda i: None)
    assert threading.active_count() == before


def test_a_block_called_inside_a_block_is_refused() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Identity() for _ in range(2))
            self.layers[0].forward = lambda x: self.layers[1](x)  # type: ignore[method-assign]

        def forward(self, x: torch.Tensor) -> Any:
            return self.layers[0](x)

    model = Nested()
    with pytest.raises(CheckpointError, match="block 1 was called inside block 0"):
        run_in_lockstep(model, [torch.zeros(1)], list(model.layers), enter=lambda i: None,
                        leave=lambda i: None)


def test_a_block_called_again_is_entered_again() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers[0](self.layers[1](self.layers[0](x)))

    model = Twice()
    entered: list[int] = []
    batches = [torch.randn(3, 2), torch.randn(1, 2)]
    got = run_in_lockstep(model, batches, list(model.layers), enter=entered.append,
                          leave=lambda i: None)
    assert entered == [0, 1, 0]
    with torch.no_grad():
        assert all(torch.equal(g, model(b)) for g, b in zip(got, batches))


def test_several_models_open_their_gates_in_the_order_given() -> None:
    """Two models whose gates share places (as two pruned copies read the same checkpoint
    block): every gate of a place opens before any gate of the next, whichever model holds
    it, and each model's outputs are its own."""
    first, second = Layered().eval(), Layered().eval()
    gates = [*first.layers, *second.layers]
    places = [0, 1, 2, 0, 2, 3]  # the second model's blocks read from places 0, 2, 3
    batches = [(first, torch.randn(1, 4, 4)), (second, torch.randn(1, 4, 4)),
               (second, torch.randn(1, 6, 4))]
    opened: list[int] = []
    got = run_in_lockstep(lambda job: job[0](job[1]), batches, gates,
                          enter=opened.append, leave=lambda g: None, order=places)
    with torch.no_grad():
        want = [m(x) for m, x in batches]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert opened == [0, 3, 1, 2, 4, 5]
    assert [places[g] for g in opened] == sorted(places)
    with pytest.raises(ValueError, match="5 places for 6 gates"):
        run_in_lockstep(lambda job: job[0](job[1]), batches, gates, enter=opened.append,
                        leave=lambda g: None, order=places[:5])
