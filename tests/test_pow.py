"""``pow`` in every spelling is one broadcasting elementwise rule (the nn plugin registers
it once; the method was also registered as a unary op, which won and pinned a tensor
exponent as an "extra tensor operand"): a tensor raised to a number, a number raised to a
tensor, and a tensor raised to a tensor of the same group, as ``**``, ``torch.pow``, the
``pow``/``pow_`` methods and ``float_power``. Each
model is checked against eager by the oracles (permutation exact in float64, shrink runs)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import assert_oracles, group_with
from torch import nn

Pow = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SPELLINGS: dict[str, Pow] = {
    "tensor ** number": lambda a, b: a.abs() ** 1.5,
    "number ** tensor": lambda a, b: 1.5 ** a,
    "torch.pow(tensor, number)": lambda a, b: torch.pow(a, 2),
    "torch.pow(number, tensor)": lambda a, b: torch.pow(2.0, a),
    "tensor.pow(number)": lambda a, b: a.pow(2),
    "tensor.pow_(number)": lambda a, b: a.clone().pow_(2),
    "tensor ** tensor": lambda a, b: a.abs() ** b.sigmoid(),
    "torch.pow(tensor, tensor)": lambda a, b: torch.pow(a.abs(), b.sigmoid()),
    "tensor.pow(tensor)": lambda a, b: a.abs().pow(b.sigmoid()),
    "tensor.pow(broadcast tensor)": lambda a, b: a.abs().pow(b.sigmoid().mean(0)),
    "(broadcast tensor).pow(tensor)": lambda a, b: a.abs().mean(0).pow(b.sigmoid()),
    "tensor.float_power(tensor)": lambda a, b: a.abs().float_power(b.sigmoid()),
    "torch.float_power(tensor, tensor)": lambda a, b: torch.float_power(a.abs(), b.sigmoid()),
}


class TwoBranches(nn.Module):
    """Two linears whose outputs meet in ``combine``, read by a third linear."""

    def __init__(self, combine: Pow) -> None:
        super().__init__()
        self.combine = combine
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.combine(self.a(x), self.b(x)) + self.b(x))


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_pow_ties_its_operands_in_every_spelling(spelling: str) -> None:
    model = TwoBranches(SPELLINGS[spelling]).double().eval()
    sm = assert_oracles(model, (torch.randn(4, 6, dtype=torch.float64),))
    g = group_with(sm, "b", "out_features")
    assert g.size == 8
    assert {("a", "out_features"), ("out", "in_features")} <= set(g.members)
