"""The pattern engine: chain and subgraph patterns, aliases, overlaps, indexing, rounds."""

from __future__ import annotations

import operator

import torch
from passes_helpers import count, ops
from torch import fx, nn

from fxsym.passes import (
    ChainPattern,
    Match,
    PatternEngine,
    RewriteContext,
    Step,
    SubgraphPattern,
    apply_patterns,
)


def _exp_of_log(m: Match, ctx: RewriteContext) -> fx.Node:
    return m["input"]  # exp(log(x)) -> x (for the test's positive inputs)


def test_chain_pattern_with_aliases_and_predicates() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = torch.exp(torch.log(x))
            b = x.log().exp()
            c = torch.exp(torch.log(self.fc(x).abs() + 1))
            return a, b, c

    pattern = ChainPattern("exp_log", [Step(torch.log), Step("exp")], _exp_of_log)
    model = Net()
    gm = fx.symbolic_trace(model)
    assert apply_patterns(gm, [pattern]) == 3
    assert count(gm, torch.log, "log", torch.exp, "exp") == 0
    x = torch.rand(4, 3) + 0.1
    torch.testing.assert_close(gm(x), model(x))

    # a module-attribute predicate restricts the first step
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2, bias=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.relu(self.a(x)), torch.relu(self.b(x))

    only_biased = ChainPattern(
        "drop_relu_after_biased_linear",
        [Step(nn.Linear, attrs={"bias": lambda b: b is not None}), Step(torch.relu)],
        lambda m, ctx: m.nodes[0],
    )
    gm = fx.symbolic_trace(Scaled())
    assert apply_patterns(gm, [only_biased]) == 1
    assert ops(gm) == ["Linear", "Linear", "relu"]


def test_chain_argument_predicates() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (
                torch.exp(torch.softmax(x, -1)),
                torch.exp(torch.softmax(x, dim=0)),
                torch.exp(x.softmax(1)),
            )

    last_dim = ChainPattern(
        "exp_softmax_last",
        [Step(torch.softmax, args={(1, "dim"): lambda d: d in (-1, 1)}), Step(torch.exp)],
        lambda m, ctx: ctx.graph.call_function(torch.neg, (m["input"],)),
    )
    keyword_only = ChainPattern(
        "exp_softmax_kw",
        [Step(torch.softmax, args={"dim": 0}), Step(torch.exp)],
        lambda m, ctx: ctx.graph.call_function(torch.abs, (m["input"],)),
    )
    gm = fx.symbolic_trace(Net())
    assert apply_patterns(gm, [last_dim, keyword_only]) == 3
    assert ops(gm) == ["neg", "abs", "neg"]


def test_interior_node_used_elsewhere_blocks_the_match() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.log(x)
            return torch.exp(y), y

    gm = fx.symbolic_trace(Net())
    pattern = ChainPattern("exp_log", [Step(torch.log), Step(torch.exp)], _exp_of_log)
    assert apply_patterns(gm, [pattern]) == 0
    relaxed = ChainPattern("exp_log", [Step(torch.log, escape=True), Step(torch.exp)], _exp_of_log)
    assert apply_patterns(gm, [relaxed]) == 1
    assert ops(gm) == ["log"]  # the log stays: it is still used


def test_subgraph_pattern_binds_repeated_inputs_and_commutes() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x * x + y, y + torch.mul(x, x), x * y + y

    square_plus = SubgraphPattern(
        "square_plus", lambda a, b: a * a + b, lambda a, b: torch.addcmul(b, a, a)
    )
    model = Net()
    gm = fx.symbolic_trace(model)
    assert apply_patterns(gm, [square_plus]) == 2
    assert count(gm, torch.addcmul) == 2
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(x, y), model(x, y))


def test_subgraph_literals_must_match() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2.0 + 1.0, x * 2.0 + 1.5

    pattern = SubgraphPattern("affine", lambda x: x * 2 + 1, lambda x: torch.addcmul(
        torch.ones_like(x), x, torch.full_like(x, 2.0)))
    gm = fx.symbolic_trace(Net())
    assert apply_patterns(gm, [pattern]) == 1


def test_overlaps_resolved_largest_first_and_deterministically() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(torch.sigmoid(torch.relu(x)))

    def marker(name: str):
        def rewrite(m: Match, ctx: RewriteContext) -> fx.Node:
            node = ctx.graph.call_function(torch.neg, (m["input"],))
            node.meta["by"] = name
            return node

        return rewrite

    two_a = ChainPattern("two_a", [Step(torch.relu), Step(torch.sigmoid)], marker("two_a"))
    two_b = ChainPattern("two_b", [Step(torch.sigmoid), Step(torch.tanh)], marker("two_b"))
    three = ChainPattern(
        "three", [Step(torch.relu), Step(torch.sigmoid), Step(torch.tanh)], marker("three")
    )
    for order in ([two_a, two_b, three], [three, two_b, two_a]):
        gm = fx.symbolic_trace(Net())
        engine = PatternEngine(order)
        found = engine.find(gm)
        assert [m.pattern.name for m in found] == ["three"]
        assert engine.run(gm) == 1
        assert [n.meta.get("by") for n in gm.graph.nodes if n.target is torch.neg] == ["three"]
    # equal sizes: the earliest anchor wins, whatever the registration order
    for order in ([two_a, two_b], [two_b, two_a]):
        gm = fx.symbolic_trace(Net())
        assert [m.pattern.name for m in PatternEngine(order).find(gm)] == ["two_a"]


def test_rounds_reach_a_fixpoint() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(torch.relu(torch.relu(torch.relu(x - 0.5))))

    def one_relu(m: Match, ctx: RewriteContext) -> fx.Node:
        return ctx.graph.call_function(torch.relu, (m["x"],))

    twice = SubgraphPattern("relu_relu", lambda x: torch.relu(torch.relu(x)), rewrite=one_relu)
    model = Net()
    gm = fx.symbolic_trace(model)
    engine = PatternEngine([twice])
    # round 1 merges two disjoint pairs, round 2 merges the two new relus
    assert engine.run(gm) == 3
    assert ops(gm) == ["sub", "relu"]
    x = torch.randn(5)
    gm.recompile()
    torch.testing.assert_close(gm(x), model(x))


def test_index_offers_only_candidate_anchors() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(10):
                x = torch.relu(x) + 1
            return torch.tanh(torch.sigmoid(x))

    calls: list[str] = []

    class Counting(ChainPattern):
        def match(self, node: fx.Node, ctx: RewriteContext) -> Match | None:
            calls.append(node.name)
            return super().match(node, ctx)

    pattern = Counting("st", [Step(torch.sigmoid), Step(torch.tanh)], lambda m, ctx: m["input"])
    gm = fx.symbolic_trace(Net())
    engine = PatternEngine([pattern])
    assert engine.run(gm) == 1
    assert calls == ["tanh"]  # the 20 relu/add nodes were never offered to the pattern
    assert ("call_function", torch.tanh) in engine.index
    assert ("call_function", operator.add) not in engine.index


def test_bindings_follow_replacements_in_the_same_round() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.exp(torch.log(x))
            return torch.exp(torch.log(y + 1))

    gm = fx.symbolic_trace(Net())
    pattern = ChainPattern("exp_log", [Step(torch.log), Step(torch.exp)], _exp_of_log)
    assert apply_patterns(gm, [pattern]) == 2
    gm.graph.lint()
    x = torch.rand(3) + 0.5
    torch.testing.assert_close(gm(x), x + 1)
