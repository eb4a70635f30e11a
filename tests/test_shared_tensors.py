"""Tensors reached from more than one place, and the output contract (issue 9, items 3 and 7).

A parameter used outside its module (a tied autoencoder), one Parameter shared by two leaves
(a tied head and embedding), a shared tensor also held by a module the graph never calls: each
dim keeps the same entries at every place, the group says so, and a resize keeps the tensor
shared. The output contract decides which outputs pin their groups.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles, stale_sizes
from torch import nn

import fxsym


def _members(sm: fxsym.SymMap) -> dict[str, set[tuple[str, str]]]:
    return {g.name: set(g.members) for g in sm.groups()}


def _group_with(sm: fxsym.SymMap, member: tuple[str, str]) -> fxsym.SymGroup:
    found = [g for g in sm.groups() if member in g.members]
    assert len(found) == 1, (member, _members(sm))
    return found[0]


def test_weight_reused_through_a_functional_op_is_one_member() -> None:
    class TiedAutoencoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(12, 16)
            self.enc = nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.enc(self.pre(x)))
            return F.linear(h, self.enc.weight.t())  # decoder: the encoder's weight, transposed

    x = (torch.randn(3, 12),)
    sm = assert_oracles(TiedAutoencoder(), x)
    # the code has no dim that enc.weight's rows size other than enc.out_features: no
    # parameter member of its own (it would be sliced twice)
    assert _members(sm) == {"enc.out_features": {("enc", "out_features")}}
    # pre.out_features sizes enc.weight's columns, which size the decoder's output
    assert "pre.out_features" not in _members(sm)
    for size in (2, 5):
        m = TiedAutoencoder().eval()
        sm = fxsym.analyze(m, example_inputs=x)
        fxsym.resize(m, sm, {"enc.out_features": size})
        assert m.enc.weight.shape == (size, 16)
        assert m(*x).shape == (3, 16)


class _TiedLM(nn.Module):
    """Token embedding, a body of another width, a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # the graph alone never meets the embedding's width and the head's input: only the
        # shared weight ties them
        return self.head(self.down(torch.relu(self.up(self.emb(ids)))))


def test_parameter_shared_by_two_leaves_ties_their_symbols() -> None:
    ids = (torch.randint(0, 50, (2, 7)),)
    sm = assert_oracles(_TiedLM(), ids)
    hidden = _group_with(sm, ("emb", "embedding_dim"))
    assert {("head", "in_features"), ("down", "out_features"), ("up", "in_features")} <= set(
        hidden.members)


@pytest.mark.parametrize("keep", [[3, 0, 9, 4], [15, 1]])
def test_shared_parameter_stays_shared_after_resize(keep: list[int]) -> None:
    model = _TiedLM().eval()
    ids = (torch.randint(0, 50, (2, 7)),)
    sm = fxsym.analyze(model, example_inputs=ids)
    hidden = _group_with(sm, ("emb", "embedding_dim"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.resize(model, sm, {hidden.name: keep})
    assert model.head.weight is model.emb.weight
    assert model.emb.weight.shape == (50, len(keep))
    assert model.head.in_features == model.emb.embedding_dim == len(keep)
    assert model(*ids).shape == (2, 7, 50)


def test_shared_tensor_read_by_a_traced_module_and_held_by_an_uncalled_one() -> None:
    class ScaledEmbedding(nn.Embedding):  # overrides forward: traced into, weight read directly
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return F.embedding(ids, self.weight) * 2.0

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Embedding(40, 16)  # never called, as T5's and Bart's ``shared``
            self.enc = ScaledEmbedding(40, 16)
            self.enc.weight = self.shared.weight
            self.mix = nn.Linear(16, 16)
            self.head = nn.Linear(16, 40, bias=False)
            self.head.weight = self.shared.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.mix(self.enc(ids)))

    ids = (torch.randint(0, 40, (2, 5)),)
    sm = assert_oracles(Model(), ids)
    model = Model().eval()
    sm = fxsym.analyze(model, example_inputs=ids)
    group = _group_with(sm, ("head", "in_features"))
    assert ("mix", "out_features") in group.members
    assert not any(s.startswith("weight:") for _, s in group.members)  # sliced by head's rule
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.resize(model, sm, {group.name: 6})
    assert model.shared.weight is model.enc.weight is model.head.weight
    assert model.shared.weight.shape == (40, 6)
    assert model(*ids).shape == (2, 5, 40)
    assert stale_sizes(model) == []  # shared's and enc's embedding_dim follow the weight


class _SharedEmbedding(nn.Module):
    """T5's layout: ``shared`` is never called; its weight is the encoder's and the decoder's
    embedding (and, ``tied``, the head's); ``lone``: the encoder's only."""

    def __init__(self, lone: bool = False, tied: bool = True) -> None:
        super().__init__()
        self.shared = nn.Embedding(30, 16)
        self.enc, self.dec = nn.Embedding(30, 16), nn.Embedding(30, 16)
        self.enc.weight = self.shared.weight
        if not lone:
            self.dec.weight = self.shared.weight
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 30, bias=False)
        if tied:
            self.head.weight = self.shared.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.enc(ids) + self.dec(ids)))


@pytest.mark.parametrize(("lone", "tied"), [(False, True), (False, False), (True, False)])
def test_a_module_the_graph_never_calls_joins_the_groups_of_the_tensors_it_holds(
        lone: bool, tied: bool) -> None:
    ids = (torch.randint(0, 30, (2, 5)),)
    sm = assert_oracles(_SharedEmbedding(lone, tied), ids)
    hidden = _group_with(sm, ("enc", "embedding_dim"))
    assert ("shared", "embedding_dim") in hidden.members
    model = _SharedEmbedding(lone, tied).eval()
    sm = fxsym.analyze(model, example_inputs=ids)
    assert not sm.get_symbol(model.shared, "embedding_dim").is_constant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.resize(model, sm, {_group_with(sm, ("enc", "embedding_dim")).name: [9, 2, 4]})
    assert model.shared.weight is model.enc.weight and model.shared.weight.shape == (30, 3)
    assert stale_sizes(model) == []
    assert model(*ids).shape == (2, 5, 30)


def test_a_holder_whose_rule_cannot_say_what_it_sizes_is_left_out() -> None:
    """A family whose rule fails on every probe could size either dim: the uncalled module
    keeps out of the groups (as before), the tensor is still resized and re-shared."""
    class Opaque(nn.Embedding):
        pass

    def refuse(mod: nn.Module, sname: str, index: torch.Tensor) -> None:
        raise RuntimeError("no")

    class Model(_SharedEmbedding):
        def __init__(self) -> None:
            super().__init__(tied=False)
            self.shared = Opaque(30, 16)
            self.enc.weight = self.dec.weight = self.shared.weight

    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])

    class Plugin:
        @fxsym.hookimpl
        def fxsym_register_sym_infos(self, register: Any) -> None:
            register(Opaque, lambda m: fxsym.SymInfo(embedding_dim=fxsym.Symbol(
                is_searchable=True, cl_type=fxsym.Symbol.CLType.OUTGOING, elastic_dims={-1})),
                resize=refuse)

    pm.register(Plugin(), name="opaque")
    ids = (torch.randint(0, 30, (2, 5)),)
    model = Model().eval()
    with fxsym.use_plugins(pm):
        sm = fxsym.analyze(model, example_inputs=ids)
        hidden = _group_with(sm, ("enc", "embedding_dim"))
        assert not any(m == "shared" for m, _ in hidden.members)
        fxsym.resize(model, sm, {hidden.name: 4})
    assert model.shared.weight is model.enc.weight and model.shared.weight.shape == (30, 4)


def test_tensor_dim_no_symbol_sizes_pins_what_meets_it() -> None:
    class Model(nn.Module):  # the embedding's rows (its vocabulary) are read as features
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(12, 8)
            self.proj = nn.Linear(8, 12)
            self.out = nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.proj(self.emb(ids))  # proj.out_features meets the embedding's rows
            return self.out(h @ self.emb.weight)

    ids = (torch.randint(0, 12, (2, 5)),)
    sm = assert_oracles(Model(), ids)
    assert not any(("proj", "out_features") in g.members for g in sm.groups())
    assert {("proj", "in_features"), ("out", "in_features")} <= set(
        _group_with(sm, ("emb", "embedding_dim")).members)
    assert any("no symbol" in e.message for e in sm.trace_report.of_kind("boundary"))


# -- the output contract ---------------------------------------------------------------------------
class _TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.body(x))
        return {"logits": self.head(hidden), "hidden": hidden}


def test_every_output_is_the_contract_by_default() -> None:
    sm = fxsym.analyze(_TwoOutputs(), example_inputs=(torch.randn(2, 8),))
    assert sm.groups() == []
    assert sm.output_contract is None


@pytest.mark.parametrize("outputs", ["logits", ["logits"], 0, ("logits",)])
def test_outputs_outside_the_contract_do_not_pin(outputs: object) -> None:
    x = (torch.randn(2, 8),)
    sm = fxsym.analyze(_TwoOutputs(), example_inputs=x, outputs=outputs)
    assert [g.name for g in sm.groups()] == ["body.out_features"]
    assert sm.output_contract in (("logits",), (0,))
    assert any("hidden" in e.message for e in sm.trace_report.of_kind("outputs"))


def test_unknown_output_name_is_a_typed_error() -> None:
    with pytest.raises(fxsym.AnalysisError, match=r"'logit'.*logits"):
        fxsym.analyze(_TwoOutputs(), example_inputs=(torch.randn(2, 8),), outputs="logit")
    with pytest.raises(fxsym.AnalysisError):
        fxsym.analyze(_TwoOutputs(), example_inputs=(torch.randn(2, 8),), outputs=[])


def test_tuple_outputs_by_position() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.a(x)
            return self.b(h), h

    x = (torch.randn(2, 4),)
    def names(outputs: object) -> list[str]:
        return [g.name for g in fxsym.analyze(Model(), example_inputs=x,
                                              outputs=outputs).groups()]

    assert names((0,)) == ["a.out_features"]
    assert names(-1) == ["b.out_features"]
    assert names("*") == names(None) == []
