"""What the shadow tree promises holds at its edges (issue 30, section 4).

``fxsym/tracer/shadow.py`` promises that each ``config`` object is copied (a trace writing into
it writes into the copy) and that every traced value a forward leaves in an attribute, however
deeply nested, marks it derived state. On main a config ``object.__new__`` cannot build (a
dict subclass) was shared with the user's model, and values nested deeper than four
containers were not seen.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxsym

X = torch.randn(2, 4)


class DictConfig(dict):  # type: ignore[type-arg]
    """A config that is a dict subclass with attribute fields (``object.__new__`` refuses
    it), like EasyDict-style configs."""

    def __init__(self) -> None:
        super().__init__()
        self.width = 4
        self.calls: list[int] = []


class Uncopyable(DictConfig):
    """A config nothing can copy."""

    def __copy__(self) -> Any:
        raise TypeError("this config cannot be copied")


class WritesItsConfig(nn.Module):
    def __init__(self, config: DictConfig) -> None:
        super().__init__()
        self.config = config
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.calls.append(1)
        return self.lin(x).reshape(x.shape[0], self.config.width)


def test_a_config_object_new_cannot_build_is_copied_not_shared() -> None:
    """A dict-subclass config is copied with ``copy.copy``: the forward's append lands in the
    copy, the model's config is as it was, the traced program equals the model (on main the
    config was shared and the user's ``config.calls`` held the trace's append)."""
    model = WritesItsConfig(DictConfig()).eval()
    eager = model(X)
    model.config.calls.clear()
    gm = fxsym.trace(model, example_inputs=(X,))
    fxsym.analyze(model, example_inputs=(X,))
    assert model.config.calls == []
    torch.testing.assert_close(gm(X), eager)


def test_a_config_that_cannot_be_copied_is_refused() -> None:
    """A config neither ``object.__new__`` nor ``copy.copy`` can copy is refused with a
    TraceError naming it (on main it was shared: the trace wrote into it)."""
    model = WritesItsConfig(Uncopyable()).eval()
    with pytest.raises(fxsym.TraceError, match=r"Uncopyable.*cannot be copied"):
        fxsym.analyze(model, example_inputs=(X,))
    assert model.config.calls == []


def _nested(value: Any, depth: int) -> Any:
    for i in range(depth):
        value = [value] if i % 3 == 0 else ((value,) if i % 3 == 1 else {"k": value})
    return value


class KeepsNested(nn.Module):
    """Keeps a traced value ``depth`` containers deep in an attribute."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.kept = _nested(y.sum(-1), self.depth)
        return y


@pytest.mark.parametrize("depth", [0, 4, 5, 9])
def test_a_traced_value_kept_at_any_depth_is_derived_state(depth: int) -> None:
    """``self.kept = [(... {"k": y.sum(-1)} ...)]`` marks ``kept`` derived at any depth (on
    main: not at depth 5 and more, so no resize knew it)."""
    gm = fxsym.trace(KeepsNested(depth).eval(), example_inputs=(X,))
    assert gm.derived_state == {"": {"kept": "derived"}}


class KeepsACycle(nn.Module):
    """Keeps a list holding itself and, deep inside, a traced value."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        loop: list[Any] = []
        loop.append(loop)
        loop.append(_nested(y, 6))
        self.kept = loop
        return y


def test_a_kept_container_holding_itself_is_walked_once() -> None:
    """A cycle ends the walk (each container once) and the value behind it is found."""
    gm = fxsym.trace(KeepsACycle().eval(), example_inputs=(X,))
    assert gm.derived_state == {"": {"kept": "derived"}}
