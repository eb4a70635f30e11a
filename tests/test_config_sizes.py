"""Int fields of a config object a module holds (``self.config.hidden_size``) read as sizes.

They behave like int attributes of the module (``tests/test_attribute_sizes.py``): a reshape
by one ties it to the dim it sizes, it is a member ``(owner, "attr:config.<field>")`` and
``fxsym.resize`` sets it. One config object shared by several modules is one value: every read
of a field is one group, pinned for all if any use pins it or if a leaf holding the config
could read it where fxsym does not see.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.resizing import engine


class Config:
    """A plain config object (not a module): sizes only."""

    def __init__(self, hidden_size: int = 8) -> None:
        self.hidden_size = hidden_size
        self.vocab_size = 5


class Block(nn.Module):
    """Reshapes its projection by ``self.config.hidden_size`` (a literal before)."""

    def __init__(self, config: Config, pin: bool = False) -> None:
        super().__init__()
        self.config = config
        self.pin = pin
        self.inp = nn.Linear(6, config.hidden_size)
        self.out = nn.Linear(config.hidden_size, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h = self.inp(x).reshape(b, -1, self.config.hidden_size)
        if self.pin and self.config.hidden_size > 4:  # Python reads the value
            h = h * 2
        return self.out(torch.relu(h)).reshape(b, -1)


class Two(nn.Module):
    def __init__(self, pin: bool = False, leaf: nn.Module | None = None) -> None:
        super().__init__()
        self.config = Config()
        self.a = Block(self.config)
        self.b = Block(self.config, pin=pin)
        self.leaf = leaf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x) + self.b(x)
        return y if self.leaf is None else self.leaf(y)


class Opaque(nn.Module):
    """A leaf (no SymInfo, a registered leaf by its name) holding the shared config."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.config.vocab_size


X = (torch.randn(2, 4, 6),)


def _model(**kwargs: object) -> Two:
    torch.manual_seed(0)
    return Two(**kwargs).eval()  # type: ignore[arg-type]


def test_a_config_field_in_a_reshape_is_a_member_and_follows_the_resize() -> None:
    model = _model()
    config = model.config
    sm = assert_oracles(model, X)
    (group,) = sm.groups()  # one config field: the blocks' widths move together
    assert {("a", "attr:config.hidden_size"), ("b", "attr:config.hidden_size"),
            ("a.inp", "out_features"), ("b.inp", "out_features")} <= set(group.members)
    fxsym.resize(model, sm, {group.name: 5})
    assert model.config is model.a.config is model.b.config  # still one config ...
    assert model.config is not config and config.hidden_size == 8  # ... a copy, the old kept
    assert model.config.hidden_size == 5 and model.a.inp.out_features == 5
    assert model(*X).shape == (2, 12)


def test_one_use_that_pins_a_shared_field_pins_it_for_every_reader() -> None:
    model = _model(pin=True)
    sm = fxsym.analyze(model, example_inputs=X)
    assert not sm.groups()
    lines = [e.message for e in sm.trace_report if e.kind == "config"]
    assert lines and "shared by a, b" in lines[0], lines


def test_a_leaf_holding_the_config_pins_its_fields() -> None:
    fxsym.SymMap.register(Opaque)(lambda m: fxsym.SymInfo(is_shape_preserving=True))
    try:
        torch.manual_seed(0)
        model = Two()
        model.leaf = Opaque(model.config)
        sm = fxsym.analyze(model.eval(), example_inputs=X)
    finally:
        fxsym.SymMap.unregister(Opaque)
    assert not sm.groups()
    (line,) = [e.message for e in sm.trace_report if e.kind == "config"]
    assert "held by leaf" in line and "hidden_size" in line


def test_a_fault_after_the_config_was_set_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    config = model.config
    sm = fxsym.analyze(model, example_inputs=X)
    (group,) = sm.groups()

    def fault(*args: object) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine, "_retie", fault)
    with pytest.raises(fxsym.ResizeError, match="injected fault"):
        fxsym.resize(model, sm, {group.name: 5})
    assert model.config is config and model.a.config is config and model.b.config is config
    assert config.hidden_size == 8 and model.a.inp.out_features == 8


class Recursive(nn.Module):
    """Calls itself once more from its own forward: the config is shadowed once."""

    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.inp = nn.Linear(6, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, again: bool = True) -> torch.Tensor:
        if again:
            return self(x, again=False)
        b = x.shape[0]
        return self.out(self.inp(x).reshape(b, -1, self.config.hidden_size)).reshape(b, -1)


def test_a_forward_that_calls_itself_shadows_the_config_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Recursive()).eval()
    sm = assert_oracles(model, X)
    assert ("0", "attr:config.hidden_size") in sm.groups()[0].members
    assert type(model[0].config) is Config


SEEN: list[object] = []


class Keeper(Block):
    """Lets its config escape the forward (as a mask builder's bound argument does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        SEEN.append(self.config)
        return super().forward(x)


def test_a_shadow_kept_elsewhere_copies_and_pickles_as_the_config() -> None:
    import copy
    import pickle

    torch.manual_seed(0)
    model = nn.Sequential(Keeper(Config())).eval()
    SEEN.clear()
    fxsym.analyze(model, example_inputs=X)
    kept: Any = SEEN[0]
    assert type(kept) is not Config and isinstance(kept, Config)  # the shadow
    assert kept.hidden_size == 8  # a plain int once the forward returned
    for clone in (copy.deepcopy(kept), pickle.loads(pickle.dumps(kept))):
        assert type(clone) is Config and vars(clone) == vars(model[0].config)
