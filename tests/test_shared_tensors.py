"""Tensors reached from more than one place, and the output contract (issue 9, items 3 and 7).

A parameter used outside its module (a tied autoencoder), one Parameter shared by two leaves
(a tied head and embedding), a shared tensor also held by a module the graph never calls: each
dim keeps the same entries at every place, the group says so, and a resize keeps the tensor
shared. The output contract decides which outputs pin their groups.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles
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
