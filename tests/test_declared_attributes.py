"""Attributes a SymInfo declares from its symbols (``SymInfo.declare``).

A leaf's ``forward`` reads ``self.num_heads``/``self.head_dim`` in Python the tracer never sees:
the declaration is how ``fxsym.resize`` knows to keep them right, and how users see them (they
are members ``(module, "attr:name")`` of the groups of the symbols they read).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym import SizeExpr, Symbol, SymInfo
from fxsym.resizing import keep_entries

IN, OUT = Symbol.CLType.INCOMING, Symbol.CLType.OUTGOING


class TinyAttention(nn.Module):
    """Multi-head self-attention whose head layout lives in int attributes only."""

    def __init__(self, hidden: int = 8, heads: int = 2, head_dim: int = 3) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, head_dim
        self.all_head_size = heads * head_dim
        self.qkv = nn.Parameter(torch.randn(3 * heads * head_dim, hidden) / hidden**0.5)
        self.out = nn.Parameter(torch.randn(hidden, heads * head_dim) / (heads * head_dim)**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (x @ self.qkv.t()).split(self.all_head_size, -1)
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim**0.5, -1) @ v
        return a.transpose(1, 2).reshape(b, s, self.all_head_size) @ self.out.t()


def attention_info(mod: TinyAttention, declare: bool = True) -> SymInfo:
    info = SymInfo(
        hidden=Symbol(cl_type=IN, elastic_dims={-1}),
        out=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}),
        heads=Symbol(is_searchable=True, size=mod.num_heads),
        head_dim=Symbol(is_searchable=True, size=mod.head_dim),
    )
    if declare:
        info.declare(num_heads="heads", head_dim="head_dim",
                     all_head_size="heads * head_dim")
    return info


def _rows(mod: TinyAttention, heads: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    return (heads[:, None] * mod.head_dim + dims[None, :]).flatten()


def attention_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Only the tensors: the declared attributes follow through the engine."""
    heads, dims = torch.arange(mod.num_heads), torch.arange(mod.head_dim)
    if name == "hidden":
        keep_entries(mod, "qkv", 1, index)
        return
    if name == "out":
        keep_entries(mod, "out", 0, index)
        return
    if name == "heads":
        heads = index
    else:
        dims = index
    rows = _rows(mod, heads, dims)
    width = mod.all_head_size
    keep_entries(mod, "qkv", 0, torch.cat([rows, rows + width, rows + 2 * width]))
    keep_entries(mod, "out", 1, rows)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.attn = TinyAttention()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(torch.relu(self.inp(x))))


X = (torch.randn(2, 4, 5),)


@contextmanager
def _registered(declare: bool = True) -> Iterator[None]:
    fxsym.SymMap.register(TinyAttention, resize=attention_resize)(
        lambda m: attention_info(m, declare))
    try:
        yield
    finally:
        fxsym.SymMap.unregister(TinyAttention)


def _model() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def test_size_expressions_parse_and_validate() -> None:
    e = SizeExpr.parse("hidden // heads")
    assert e == SizeExpr(("hidden",), "heads") and str(e) == "hidden // heads"
    assert e.evaluate({"hidden": 12, "heads": 4}) == (3, 0)
    assert SizeExpr.parse("heads*head_dim*2").factors == ("heads", "head_dim", 2)
    assert SizeExpr.parse("embed_dim // 8").evaluate({"embed_dim": 20}) == (2, 4)
    for bad in ("", "heads +1", "a // b // c", "a // b * c", "* a", "a *", "8", "(a)", "0 * a"):
        with pytest.raises(ValueError, match="size expression"):
            SizeExpr.parse(bad)
    info = SymInfo(heads=Symbol(size=2))
    with pytest.raises(ValueError, match="no symbol 'hidden'"):
        info.declare(head_dim="hidden // heads")
    with pytest.raises(ValueError, match="not a public attribute"):
        info.declare(_n="heads")
    assert info.declare(num_heads="heads").attributes == {"num_heads": SizeExpr(("heads",))}


def test_declared_attributes_are_members_and_follow_a_resize() -> None:
    with _registered():
        model = _model()
        sm = fxsym.analyze(model, example_inputs=X)
        groups = {g.name: g for g in sm.groups()}
        assert groups["attn.heads"].members == (
            ("attn", "heads"), ("attn", "attr:num_heads"), ("attn", "attr:all_head_size"))
        assert groups["inp.out_features"].members == (
            ("inp", "out_features"), ("attn", "hidden"))
        assert ("attn", "attr:head_dim") in groups["attn.head_dim"].members
        reference = _run(model)
        fxsym.resize(model, sm, {"attn.heads": [1], "attn.head_dim": [2, 0]})
        attn = model.attn
        assert (attn.num_heads, attn.head_dim, attn.all_head_size) == (1, 2, 2)
        assert attn.qkv.shape == (6, 8) and attn.out.shape == (8, 2)
        assert _run(model).shape == reference.shape


def test_oracles_pass_with_the_declaration_and_fail_without() -> None:
    with _registered():
        assert_oracles(_model(), X, min_groups=4)
    with _registered(declare=False):
        from fxsym.oracles import check_shrink

        model = _model()
        shrink = check_shrink(model, fxsym.analyze(model, example_inputs=X), X)
        assert shrink.status == "failed"  # the stale num_heads breaks the view


def test_a_choice_leaving_a_remainder_is_refused_before_anything_changes() -> None:
    class Divided(TinyAttention):
        pass

    def info(mod: Divided) -> SymInfo:
        return SymInfo(hidden=Symbol(cl_type=IN, elastic_dims={-1}),
                       out=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}),
                       heads=Symbol(is_searchable=True, size=mod.num_heads),
                       ).declare(head_dim="hidden // heads")

    fxsym.SymMap.register(Divided, resize=attention_resize)(info)
    try:
        model = nn.Sequential(nn.Linear(5, 6), Divided(hidden=6, heads=2, head_dim=3)).eval()
        sm = fxsym.analyze(model, example_inputs=X)
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(fxsym.ResizeError, match=r"1.head_dim = hidden // heads.*remainder"):
            fxsym.resize(model, sm, {"0.out_features": [0, 1, 2, 3, 4]})
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
        assert model[1].head_dim == 3
        model[1].head_dim = 4  # a declaration that does not describe the module
        with pytest.raises(fxsym.ResizeError, match="does not hold before the resize"):
            fxsym.resize(model, sm, {"0.out_features": [0, 1, 2, 3]})
    finally:
        fxsym.SymMap.unregister(Divided)


def test_a_fault_mid_resize_leaves_declared_attributes_untouched() -> None:
    with _registered():
        model = _model()
        sm = fxsym.analyze(model, example_inputs=X)
        original = nn.Module.__setattr__
        seen: list[str] = []

        def faulty(self: nn.Module, name: str, value: Any) -> None:
            if self is model.attn and name == "all_head_size":
                seen.append(name)
                raise RuntimeError("injected fault")
            original(self, name, value)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nn.Module, "__setattr__", faulty)
            with pytest.raises(fxsym.ResizeError, match="injected fault"):
                fxsym.resize(model, sm, {"attn.heads": [1], "attn.head_dim": [0, 1]})
        assert seen
        attn = model.attn
        assert (attn.num_heads, attn.head_dim, attn.all_head_size) == (2, 3, 6)
        assert attn.qkv.shape == (18, 8)


def _run(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(*X)
    return out


class MHABlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(self.attn(h, h, h, need_weights=False)[0])


def test_nn_multihead_attention_declares_its_widths_and_head_count() -> None:
    torch.manual_seed(0)
    model = MHABlock().eval()
    x = (torch.randn(2, 5, 6),)
    sm = assert_oracles(model, x)
    (group,) = [g for g in sm.groups() if ("attn", "embed_dim") in g.members]
    assert {("attn", f"attr:{a}") for a in ("embed_dim", "kdim", "vdim", "num_heads")} <= set(
        group.members)
    fxsym.resize(model, sm, {group.name: 2})  # 2 heads of head_dim 4
    attn = model.attn
    assert (attn.embed_dim, attn.kdim, attn.vdim, attn.num_heads, attn.head_dim) == (
        8, 8, 8, 2, 4)
    assert model(*x).shape == (2, 5, 3)


def test_a_declaration_that_does_not_describe_the_module_pins_and_is_reported() -> None:
    def wrong(mod: TinyAttention) -> SymInfo:
        info = attention_info(mod, declare=False)
        return info.declare(head_dim="heads")  # 2, but head_dim is 3

    fxsym.SymMap.register(TinyAttention, resize=attention_resize)(wrong)
    try:
        sm = fxsym.analyze(_model(), example_inputs=X)
    finally:
        fxsym.SymMap.unregister(TinyAttention)
    names = {g.name for g in sm.groups()}
    assert "attn.heads" not in names and "inp.out_features" in names  # the rest stays
    (line,) = [e.message for e in sm.trace_report if e.kind == "declared"]
    assert "attn.head_dim = heads" in line and "head_dim is 3" in line, line
