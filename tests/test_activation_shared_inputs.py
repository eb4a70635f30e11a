"""Consumers of one tensor are measured once (issue 31 §4: an explicit-size prune near its
floor). In a decoder block the gate and up projections of the MLP read the same normed
hidden states (where attention is traced through, its query, key and value projections too):
the activation recorder took the mean of ``|x|`` in float64 of that tensor once per consumer
(SmolLM2-135M, 512 tokens: 242 means of 182 tensors). It now gives the last mean again while
the tensor is the same object, unchanged since, along the same dim; the scores are those of a
mean taken for every consumer."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import fxsym
from fxsym.prune.importance import ActivationRecorder


class _Abs(TorchFunctionMode):
    """Counts the ``abs`` calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") == "abs":
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Fan(nn.Module):
    """A producer whose output three consumers read, then a fourth reading their sum."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(6, 8)
        self.a, self.b, self.c = nn.Linear(8, 5), nn.Linear(8, 5), nn.Linear(8, 5)
        self.post = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return self.post(self.a(h) + self.b(h) * self.c(h))


def _by_hand(model: _Fan, xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each consumer's mean ``|input|`` per unit, averaged over the batches and summed over
    the consumers of the unit's group (what the recorder means), computed here."""
    with torch.no_grad():
        hs = [model.pre(x) for x in xs]
        ss = [model.a(h) + model.b(h) * model.c(h) for h in hs]
    per = lambda ts: sum(t.abs().double().mean(0) for t in ts) / len(ts)  # noqa: E731
    return {"hidden": 3 * per(hs), "out": per(ss)}


def test_consumers_of_one_tensor_are_measured_once_with_the_same_scores() -> None:
    """Three consumers of one tensor: one mean of ``|x|`` a batch for them (before: three),
    and the scores equal the means computed for each consumer by hand (float64)."""
    torch.manual_seed(0)
    model = _Fan().double().eval()
    xs = [torch.randn(4, 6, dtype=torch.float64) for _ in range(2)]
    sm = fxsym.analyze(model, example_inputs=(xs[0],))
    recorder = ActivationRecorder(model, sm, consumers_only=True)
    handles = recorder.attach()
    with _Abs() as counted, torch.no_grad():
        for x in xs:
            model(x)
    for h in handles:
        h.remove()
    scores = recorder.scores()
    expected = _by_hand(model, xs)
    hidden = next(g.name for g in sm.groups() if ("a", "in_features") in g.members)
    out = next(g.name for g in sm.groups() if ("post", "in_features") in g.members)
    assert counted.count == 2 * 2, counted.count  # h and the sum, a batch
    torch.testing.assert_close(scores[hidden], expected["hidden"], rtol=1e-12, atol=0)
    torch.testing.assert_close(scores[out], expected["out"], rtol=1e-12, atol=0)


def test_a_tensor_changed_in_place_between_its_consumers_is_measured_again() -> None:
    """The same tensor object given to a second consumer after an in-place change is measured
    again (its version moved): the scores hold the mean of what each consumer read."""
    torch.manual_seed(1)
    model = _Fan().double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    sm = fxsym.analyze(model, example_inputs=(x,))
    recorder = ActivationRecorder(model, sm, consumers_only=True)
    handles = recorder.attach()
    with torch.no_grad():
        h = model.pre(x)
        before = h.abs().double().mean(0)
        model.a(h)
        h.mul_(3)
        model.b(h)
        model.c(h)
    for handle in handles:
        handle.remove()
    hidden = next(g.name for g in sm.groups() if ("a", "in_features") in g.members)
    torch.testing.assert_close(recorder.scores()[hidden], before + 2 * (3 * before),
                               rtol=1e-12, atol=0)
