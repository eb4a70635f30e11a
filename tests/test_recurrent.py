"""nn.RNN / nn.GRU / nn.LSTM: the hidden size is a group (issue 21, part 2).

Every layer and direction of a recurrent module has ``hidden_size`` units: the rows of each
weight in gate blocks (4 for an LSTM, 3 for a GRU, 1 for an RNN), the columns of the
recurrent weight, and, for layers after the first, the columns reading the previous layer's
output (forward half, then backward half). A unit whose rows are all zero stays zero from a
zero state (each gate computes from zero pre-activations: the cell keeps ``0.5 * 0``, the
candidate is ``tanh(0)``), so a shrink must equal the original with the dropped units'
rows zeroed; each model is also checked by both oracles in float64.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym
import fxsym.oracles


class Tagger(nn.Module):
    """Linear -> recurrent module -> Linear over its output, plus its final state."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.inp = nn.Linear(5, rnn.input_size)
        self.rnn = rnn
        width = (rnn.proj_size or rnn.hidden_size) * (2 if rnn.bidirectional else 1)
        self.out = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, state = self.rnn(self.inp(x))
        h = state[0] if isinstance(self.rnn, nn.LSTM) else state
        return self.out(y) + h.sum() * 0.1


class Stacked(nn.Module):
    """Two recurrent modules in a row: the second's input size reads the first's output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.GRU(4, 6, batch_first=True, bidirectional=True)
        self.b = nn.LSTM(12, 5, batch_first=True)
        self.out = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.b(self.a(x)[0])[0])


class FinalState(nn.Module):
    """A classifier reading an LSTM's final states: ``h_n`` (the projection's width) and
    ``c_n`` (the hidden size) of the last layer."""

    def __init__(self, proj_size: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 6, num_layers=2, proj_size=proj_size, batch_first=True)
        self.head_h = nn.Linear(proj_size or 6, 2)
        self.head_c = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, c) = self.rnn(x)
        return self.head_h(h[-1]) + self.head_c(c[-1])


class GivenState(nn.Module):
    """An LSTM given its initial state, built with sizes written as numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 6, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = torch.zeros(1, x.shape[0], 6, dtype=x.dtype)
        return self.out(self.rnn(x, (h0, h0))[0])


RNNS = {
    "rnn": lambda: nn.RNN(6, 8, batch_first=True),
    "gru": lambda: nn.GRU(6, 8, batch_first=True),
    "lstm": lambda: nn.LSTM(6, 8, batch_first=True),
    "lstm-2-layers-bidirectional": lambda: nn.LSTM(6, 8, num_layers=2, bidirectional=True,
                                                    batch_first=True),
    "gru-2-layers-bidirectional": lambda: nn.GRU(6, 8, num_layers=2, bidirectional=True),
    "lstm-proj": lambda: nn.LSTM(6, 8, num_layers=2, proj_size=4, bidirectional=True,
                                 batch_first=True),
}


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 7, 5, dtype=torch.float64),)


def _group(sm: fxsym.SymMap, member: tuple[str, str]) -> fxsym.SymGroup:
    found = [g for g in sm.groups() if member in g.members]
    assert len(found) == 1, (member, [g.members for g in sm.groups()])
    return found[0]


def _zero_units(rnn: nn.RNNBase, symbol: str, dropped: Sequence[int]) -> None:
    """Zero the rows producing hidden units (or projection outputs) ``dropped``."""
    gates = {"LSTM": 4, "GRU": 3}.get(rnn.mode, 1)
    h = rnn.hidden_size
    with torch.no_grad():
        for name, p in rnn.named_parameters():
            if symbol == "proj_size":
                if name.startswith("weight_hr"):
                    p[list(dropped)] = 0
            elif not name.startswith("weight_hr"):
                p[[u + g * h for g in range(gates) for u in dropped]] = 0


@pytest.mark.parametrize("kind", list(RNNS))
def test_recurrent_hidden_size_is_a_group(kind: str) -> None:
    torch.manual_seed(0)
    model = Tagger(RNNS[kind]()).double().eval()
    sm = assert_oracles(model, _inputs(), min_groups=2)
    hidden = _group(sm, ("rnn", "hidden_size"))
    assert hidden.size == 8
    assert _group(sm, ("inp", "out_features")).members[-1] == ("rnn", "input_size")
    proj = model.rnn.proj_size
    if not proj:
        assert ("out", "in_features") in hidden.members
    else:
        assert _group(sm, ("rnn", "proj_size")).size == proj
    choices: dict[str, torch.Tensor] = {hidden.name: torch.tensor([0, 3, 4, 7])}
    masked = copy.deepcopy(model)
    _zero_units(masked.rnn, "hidden_size", [1, 2, 5, 6])
    if proj:
        choices[_group(sm, ("rnn", "proj_size")).name] = torch.tensor([1, 2])
        _zero_units(masked.rnn, "proj_size", [0, 3])
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=_inputs()), choices)
    assert resized.rnn.hidden_size == 4 and resized.rnn.proj_size == (2 if proj else 0)
    x = torch.randn(3, 9, 5, dtype=torch.float64)
    torch.testing.assert_close(resized(x), masked(x), rtol=1e-10, atol=1e-10)


def test_stacked_recurrent_modules_tie_input_to_both_halves() -> None:
    torch.manual_seed(0)
    model = Stacked().double().eval()
    x = (torch.randn(2, 7, 4, dtype=torch.float64),)
    sm = assert_oracles(model, x, min_groups=2)
    first = _group(sm, ("a", "hidden_size"))
    assert ("b", "input_size") in first.members
    fxsym.resize(model, sm, {first.name: 2, _group(sm, ("b", "hidden_size")).name: 3})
    assert (model.a.hidden_size, model.b.input_size, model.b.hidden_size) == (2, 4, 3)
    assert model(*x).shape == (2, 7, 2)


def test_a_state_given_with_a_literal_size_pins_the_hidden_size() -> None:
    model = GivenState().double().eval()
    x = (torch.randn(2, 7, 4, dtype=torch.float64),)
    sm = fxsym.analyze(model, example_inputs=x)
    assert all(("rnn", "hidden_size") not in g.members for g in sm.groups())
    assert sm.why_constant("rnn", "hidden_size") is not None


@pytest.mark.parametrize("proj_size", [0, 3])
def test_final_states_carry_their_groups(proj_size: int) -> None:
    torch.manual_seed(0)
    model = FinalState(proj_size).double().eval()
    x = (torch.randn(2, 7, 4, dtype=torch.float64),)
    sm = assert_oracles(model, x)
    hidden = _group(sm, ("rnn", "hidden_size"))
    assert ("head_c", "in_features") in hidden.members
    h_group = _group(sm, ("rnn", "proj_size")) if proj_size else hidden
    assert ("head_h", "in_features") in h_group.members


def test_timm_sequencer_keeps_its_lstm_groups() -> None:
    """timm's Sequencer2d (the class ``timm.create_model("sequencer2d_s")`` builds, at a
    small width): every block's two bidirectional LSTMs (over rows and columns) have their
    hidden size as a group, the ``fc`` after their concatenated outputs reading both halves
    of each."""
    from timm.models.sequencer import Sequencer2d
    torch.manual_seed(0)
    model = Sequencer2d(num_classes=10, img_size=32, layers=(1, 1, 1, 1),
                        embed_dims=(16, 24, 24, 24), hidden_sizes=(4, 6, 6, 6)).double().eval()
    x = (torch.randn(1, 3, 32, 32, dtype=torch.float64),)
    sm = assert_oracles(model, x, min_groups=8)
    hidden = _group(sm, ("stages.0.blocks.0.rnn_tokens.rnn_v", "hidden_size"))
    assert ("stages.0.blocks.0.rnn_tokens.fc", "in_features") in hidden.members
    assert fxsym.oracles.coverage(sm) > 0.9
