"""A module's int attributes read as sizes get their ``get_attr`` nodes when the forward first
uses them, placed where an eager read would have put them.

Most modules a trace goes into hold ints their forward never reads (strides, flags, counts);
a node made for each, computed and erased again, was a tenth of some CNNs' analysis. The
graph an analysis sees must stay the one an eager read gives, less the unused reads: node
order (which reason the analysis reports first), module stacks (depth groups), the questions
torch's argument parser asks, and a rollback of a module that failed to trace.
"""

from __future__ import annotations

from typing import Any

import torch
from test_attribute_sizes import HeadSplit
from torch import nn

import fxsym
from fxsym.tracer import tracer as tracer_module
from fxsym.tracer.questions import ATTRIBUTE_META, CONCRETE_META


class ManyInts(nn.Module):
    """Six int attributes; the forward reads one."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d, self.e, self.width = 1, 2, 3, 4, 5, 8
        self.up = nn.Linear(4, self.width)
        self.down = nn.Linear(self.width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x).reshape(x.shape[0], self.width)
        return self.down(h)


def test_unused_int_attributes_make_no_node(monkeypatch: Any) -> None:
    made: list[str] = []
    create = tracer_module.FxsymTracer.create_node

    def counting(self: Any, kind: str, target: Any, *args: Any, **kwargs: Any) -> Any:
        if kind == "get_attr":
            made.append(str(target))
        return create(self, kind, target, *args, **kwargs)

    monkeypatch.setattr(tracer_module.FxsymTracer, "create_node", counting)
    model = ManyInts().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(3, 4),))
    assert made == ["width"]
    group = {g.name: g for g in sm.groups()}["up.out_features"]
    assert ("", "attr:width") in group.members
    assert (model.a, model.e) == (1, 5)


class Inner(nn.Module):
    """Traced into: reshapes by the size it is given."""

    def forward(self, x: torch.Tensor, k: Any) -> torch.Tensor:
        return x.reshape(x.shape[0], k, -1)


class LateReads(nn.Module):
    """Reads ``b`` inside a child call and ``a`` at the end: the nodes of both belong before
    anything the forward computes, ``a`` first, with the module stack of this module."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = 2, 4
        self.proj = nn.Linear(3, 8)
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(self.proj(x), self.b)
        return h.flatten(1) * self.a


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = LateReads()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_a_late_read_sits_where_the_forward_began() -> None:
    sm = fxsym.analyze(Outer().eval(), example_inputs=(torch.randn(5, 3),))
    nodes = list(sm.graph.nodes)
    names = [n.name for n in nodes]
    assert names[:3] == ["x", "block_a", "block_b"], names
    for node in nodes[1:3]:
        assert node.meta[ATTRIBUTE_META][0] == "block"
        assert list(node.meta["nn_module_stack"]) == ["block"]
    sm.graph.lint()


class Unflatten(HeadSplit):
    """``torch.unflatten`` by two attributes: torch's argument parser asks ``__index__`` of
    both before the call is recorded, so both nodes are made during those questions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.unflatten(self.qkv(x), -1, (self.heads, self.head_dim))
        h = h * h.sum(-1, keepdim=True)
        return self.out(h.flatten(2))


def test_parser_questions_asked_while_nodes_are_made_are_the_parsers() -> None:
    sm = fxsym.analyze(Unflatten().eval(), example_inputs=(torch.randn(2, 5, 6),))
    for node in sm.graph.nodes:
        if ATTRIBUTE_META in node.meta:
            assert not node.meta.get(CONCRETE_META), (node.name, node.meta[CONCRETE_META])
    assert "qkv.out_features" in [g.name for g in sm.groups()]


class Fails(nn.Module):
    """Uses its own attribute, hands the value out, then fails to trace (data-dependent
    control flow): rolled back and kept as a leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 4

    def forward(self, x: torch.Tensor, box: list[Any]) -> torch.Tensor:
        box.append(self.k)
        y = x.reshape(x.shape[0], self.k, -1)
        if y.sum() > 0:
            return y * 2
        return y


class UsesHandedOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 8)
        self.fails = Fails()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box: list[Any] = []
        y = self.fails(self.proj(x), box)
        return y.flatten(1)[:, :2] * box[0]


def test_a_value_whose_node_a_rollback_erased_is_made_again() -> None:
    model = UsesHandedOut().eval()
    x = torch.randn(5, 3)
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert "fails" in {e.where for e in sm.trace_report.entries if e.kind == "leaf-fallback"}
    sm.graph.lint()
    reads = [n for n in sm.graph.nodes if ATTRIBUTE_META in n.meta]
    assert [n.meta[ATTRIBUTE_META] for n in reads] == [("fails", "k")]
    gm = sm.graph_module
    torch.testing.assert_close(gm(x), model(x))


class KeepsACopy(nn.Module):
    """Sets an attribute to another's value without using it: the value has no node."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 4
        self.proj = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.k
        return self.proj(x)


def test_an_unused_value_set_to_an_attribute_stays_derived_and_makes_no_node() -> None:
    model = KeepsACopy().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3),))
    sm.graph.lint()
    assert list(sm.graph.nodes)[-1].op == "output"
    assert not [n for n in sm.graph.nodes if ATTRIBUTE_META in n.meta]
    assert sm.derived_state == {"": {"seen": "derived"}}
    assert not hasattr(model, "seen")
