"""The engine's input-kind index, later rounds, inlined replacements and the paused recompile."""

from __future__ import annotations

import gc

import torch
from passes_helpers import ops
from torch import fx, nn
from torch.fx.graph import PythonCode

from fxsym.passes import (
    ChainPattern,
    Match,
    PatternEngine,
    RewriteContext,
    Step,
    SubgraphPattern,
    apply_patterns,
)
from fxsym.passes.engine import recompile
from fxsym.passes.ops import default_table


class _Counting(ChainPattern):
    """A chain pattern that records the anchors it is offered."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.offered: list[str] = []

    def match(self, node: fx.Node, ctx: RewriteContext) -> Match | None:
        self.offered.append(node.name)
        return super().match(node, ctx)


def test_anchors_whose_input_has_another_kind_are_not_offered() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(5):
                x = torch.tanh(torch.relu(x))  # tanh anchors, but the input is no sigmoid
            return torch.tanh(torch.sigmoid(x))

    pattern = _Counting("st", [Step(torch.sigmoid), Step(torch.tanh)], lambda m, ctx: m["input"])
    assert pattern.input_filter(default_table(), ("call_function", torch.tanh)) == (
        0,
        frozenset({("call_function", torch.sigmoid)}),
    )
    gm = fx.symbolic_trace(Net())
    assert PatternEngine([pattern]).run(gm) == 1
    assert pattern.offered == ["tanh_5"]
    assert ops(gm).count("tanh") == 5


def test_an_input_given_by_keyword_is_still_offered() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    s = graph.call_function(torch.sigmoid, (x,))
    t = graph.call_function(torch.tanh, (), {"input": s})
    graph.output(t)
    gm = fx.GraphModule(nn.Module(), graph)
    pattern = _Counting("st", [Step(torch.sigmoid), Step(torch.tanh)], lambda m, ctx: m["input"])
    assert apply_patterns(gm, [pattern]) == 1
    assert pattern.offered == ["tanh"]
    assert ops(gm) == []


def test_subgraph_filter_covers_every_variant_or_none() -> None:
    table = default_table()
    one = SubgraphPattern("one", lambda x: torch.exp(torch.sin(x)), lambda x: x)
    assert one.input_filter(table, ("call_function", torch.exp)) == (
        0,
        frozenset({("call_function", torch.sin)}),
    )
    two = SubgraphPattern(
        "two", [lambda x: torch.exp(torch.sin(x)), lambda x: torch.exp(torch.cos(x))], lambda x: x
    )
    assert two.input_filter(table, ("call_function", torch.exp)) == (
        0,
        frozenset({("call_function", torch.sin), ("call_function", torch.cos)}),
    )
    # a variant whose anchor reads a pattern input directly cannot be filtered
    loose = SubgraphPattern(
        "loose", [lambda x: torch.exp(torch.sin(x)), lambda x: torch.exp(x)], lambda x: x
    )
    assert loose.input_filter(table, ("call_function", torch.exp)) is None
    # the two arguments of + may come in either order: no filter
    plus = SubgraphPattern("plus", lambda x, y: torch.sin(x) + y, lambda x, y: x)
    assert plus.input_filter(table, plus.anchor_keys(table)[0]) is None


def test_inlined_replacement_with_nested_arguments_keywords_and_an_input() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.exp(x) * y, torch.neg(torch.neg(x)) + 1

    product = SubgraphPattern(
        "stack_prod",
        lambda x, y: torch.exp(x) * y,
        lambda x, y: torch.stack([torch.exp(x), y]).prod(dim=0),
    )
    double_neg = SubgraphPattern("double_neg", lambda x: torch.neg(torch.neg(x)), lambda x: x)
    model = Net()
    gm = fx.symbolic_trace(model)
    assert apply_patterns(gm, [product, double_neg]) == 2
    assert ops(gm) == ["exp", "stack", ".prod", "add"]
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(gm(x, y), model(x, y))
    # the same pattern objects apply again to a fresh graph (the prepared form is reused)
    gm = fx.symbolic_trace(model)
    assert apply_patterns(gm, [product, double_neg]) == 2
    torch.testing.assert_close(gm(x, y), model(x, y))


def test_recompile_pauses_the_collector_and_restores_it() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.sin, (x,)))
    gm = fx.GraphModule(nn.Module(), graph)
    node = next(n for n in gm.graph.nodes if n.target is torch.sin)
    node.target = torch.cos
    enabled = gc.isenabled()
    seen: list[bool] = []
    original = type(gm).recompile

    def spy(self: fx.GraphModule) -> PythonCode:
        seen.append(gc.isenabled())
        return original(self)

    type(gm).recompile = spy  # type: ignore[method-assign]
    try:
        recompile(gm)
    finally:
        type(gm).recompile = original  # type: ignore[method-assign]
    assert seen == [False]
    assert gc.isenabled() == enabled
    torch.testing.assert_close(gm(torch.zeros(2)), torch.ones(2))
