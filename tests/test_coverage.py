"""``fxsym.oracles.coverage`` counts producing modules: an OUTGOING symbol, or a parameter an op
rule made the producer of a dim; parameters that only follow a dim are members, not counted."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import fxsym
from fxsym.oracles import coverage


class OwnForwardLinear(nn.Linear):
    """Overrides ``forward``: traced into, its weight produces through ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) * 2


class AddBias(nn.Module):
    """Only follows a dim: its parameter is added to what another module produced."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


X = (torch.randn(3, 4),)


def test_a_traced_into_projection_counts_through_its_weight() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OwnForwardLinear(4, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
    sm = fxsym.analyze(model, example_inputs=X)
    assert sm.analysis is not None and ("0", "weight:0") in sm.analysis.param_producers
    assert [g.members[0] for g in sm.groups()] == [("0", "weight:0")]
    assert coverage(sm) == 0.5  # the projection is covered, the head (model output) is not


def test_a_parameter_that_follows_a_dim_is_a_member_but_not_counted() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), AddBias(6), nn.Linear(6, 2)).eval()
    sm = fxsym.analyze(model, example_inputs=X)
    (group,) = sm.groups()
    assert ("1", "bias:0") in group.members
    assert sm.analysis is not None and not sm.analysis.param_producers
    assert coverage(sm) == 0.5
