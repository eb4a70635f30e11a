"""fxsym.paramlayout: modules alike in all but attributes their resize rule never reads (a
transformer layer's ``layer_idx``) share one trial run of the rule (issue 31 §4, the floor:
the layout ran the attention rule once per decoder layer); modules that differ in an attribute
their rule reads, however it reads it, are each decoded (the layout equals the oracle's)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from helpers import assert_same_layout
from torch import nn

import fxsym
from fxsym import paramlayout
from fxsym.resizing import keep_entries


class Tagged(nn.Module):
    """A linear layer with a per-output scale, stored in reverse when ``flip`` is 1; ``tag``
    (a layer index, say) is never read by its rule."""

    def __init__(self, n: int, flip: int, tag: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))
        self.scale = nn.Parameter(torch.randn(n))
        self.flip = flip
        self.tag = tag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale.flip(0) if self.flip else self.scale
        return nn.functional.linear(x, self.weight) * scale


def _info(mod: nn.Module) -> fxsym.SymInfo:
    return fxsym.SymInfo(
        n_in=fxsym.Symbol(cl_type=fxsym.Symbol.CLType.INCOMING, elastic_dims={-1}),
        n_out=fxsym.Symbol(is_searchable=True, cl_type=fxsym.Symbol.CLType.OUTGOING,
                           elastic_dims={-1}))


def _keep(mod: Any, name: str, index: torch.Tensor, flip: int) -> None:
    if name == "n_in":
        keep_entries(mod, "weight", 1, index)
        return
    keep_entries(mod, "weight", 0, index)
    n = mod.scale.shape[0]
    keep_entries(mod, "scale", 0, (n - 1 - index).flip(0) if flip else index)


#: the same rule, reading ``flip`` each way a rule may read an attribute
READS = {
    "attribute": lambda mod: mod.flip,
    "getattr": lambda mod: getattr(mod, "flip", 0),
    "vars": lambda mod: vars(mod).get("flip", 0),
    "dict": lambda mod: mod.__dict__["flip"],
}


class _Rule:
    """The rule of :class:`Tagged`, reading ``flip`` by ``how``, counting its runs."""

    def __init__(self, how: str) -> None:
        self.read, self.runs = READS[how], Counter[str]()

    def __call__(self, mod: Any, name: str, index: torch.Tensor) -> None:
        self.runs[name] += 1
        _keep(mod, name, index, self.read(mod))


@pytest.fixture
def tagged() -> Any:
    def register(how: str) -> _Rule:
        rule = _Rule(how)
        fxsym.SymMap.register(Tagged, resize=rule)(_info)
        return rule

    yield register
    fxsym.SymMap.unregister(Tagged)


def _stack(flips: list[int]) -> nn.Module:
    layers: list[nn.Module] = []
    for i, flip in enumerate(flips):
        layers += [Tagged(6, flip, tag=i), nn.ReLU()]
    return nn.Sequential(nn.Linear(4, 6), *layers, nn.Linear(6, 3)).eval()


def _runs(rule: _Rule, flips: list[int]) -> Counter[str]:
    """The runs of the rule the layout of a stack of ``flips`` makes (the oracle's after)."""
    m = _stack(flips)
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 4),))
    rule.runs.clear()
    paramlayout.layout(m, sm)
    runs = Counter(rule.runs)
    assert_same_layout(m, sm)
    return runs


def test_layers_differing_in_an_attribute_their_rule_never_reads_are_run_once(
        tagged: Any) -> None:
    """Six layers alike but for ``tag``: the rule runs as often as for two (the first decoded
    with its reads recorded, the second run plainly to check the reuse), not once per layer;
    the layout equals the oracle's."""
    rule = tagged("attribute")
    two, six = _runs(rule, [0] * 2), _runs(rule, [0] * 6)
    assert six == two


@pytest.mark.parametrize("how", sorted(READS))
def test_layers_differing_in_an_attribute_their_rule_reads_are_each_decoded(
        tagged: Any, how: str) -> None:
    """Layers alike but for ``flip``, which the rule reads (as an attribute, by ``getattr``,
    through ``vars`` or ``__dict__``), interleaved with ``tag``s that differ too: every
    layer's scales get their own units (the oracle's), the flipped ones in reverse."""
    tagged(how)
    flips = [0, 1, 0, 0, 1, 1]
    m = _stack(flips)
    lay = assert_same_layout(m, fxsym.analyze(m, example_inputs=(torch.randn(2, 4),)))
    for i, flip in enumerate(flips):
        layer = 2 * i + 1
        rows = {(s.param, s.dim): s.unit.tolist() for s in lay.slices[f"{layer}.n_out"]}
        want = [5, 4, 3, 2, 1, 0] if flip else [0, 1, 2, 3, 4, 5]
        assert rows[(f"{layer}.scale", 0)] == want, (how, i)


def test_a_rule_reading_around_the_class_is_caught_at_its_first_reuse(tagged: Any) -> None:
    """A rule reading ``flip`` with ``object.__getattribute__`` goes around the recording:
    the plain run of the second layer, whose ``flip`` differs, shows another result, and no
    layer reuses another's (the layout equals the oracle's)."""
    rule = tagged("attribute")
    rule.read = lambda mod: object.__getattribute__(mod, "flip")
    m = _stack([0, 1, 1, 0])
    lay = assert_same_layout(m, fxsym.analyze(m, example_inputs=(torch.randn(2, 4),)))
    assert [s.unit.tolist() for s in lay.slices["3.n_out"] if s.param == "3.scale"] == [
        [5, 4, 3, 2, 1, 0]]


def test_the_module_is_of_its_own_class_after_the_layout(tagged: Any) -> None:
    """The recording class is the trial copies' only, for the rule's run: the model's
    modules, and the copies between runs, are of their own class."""
    tagged("attribute")
    m = _stack([0, 0, 1])
    paramlayout.layout(m, fxsym.analyze(m, example_inputs=(torch.randn(2, 4),)))
    assert {type(mod) for mod in m} == {nn.Linear, Tagged, nn.ReLU}
