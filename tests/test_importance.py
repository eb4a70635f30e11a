"""fxsym.importance: units scored over every member of their group (issue 12)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxsym
from fxsym import importance


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 5, 1)
        self.fc = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(self.mha(h, h, h, need_weights=False)[0])


def _mlp() -> tuple[MLP, fxsym.SymMap]:
    torch.manual_seed(0)
    m = MLP()
    return m, fxsym.analyze(m, example_inputs=(torch.randn(2, 5),))


def test_zero_root_still_scores_through_its_consumers() -> None:
    m, sm = _mlp()
    with torch.no_grad():
        m.fc1.weight.zero_()
        m.fc1.bias.zero_()
    scores = importance.l1(m, sm)["fc1.out_features"]
    assert scores.shape == (6,) and bool((scores > 0).all())
    # exactly the consumer's columns (the producer's rows are zero)
    assert torch.allclose(scores.float(), m.fc2.weight.abs().sum(0).detach())


def test_l1_l2_sum_over_producer_rows_bias_and_consumer_columns() -> None:
    m, sm = _mlp()
    w1, b1, w2 = m.fc1.weight.detach(), m.fc1.bias.detach(), m.fc2.weight.detach()
    want_l1 = w1.abs().sum(1) + b1.abs() + w2.abs().sum(0)
    want_l2 = (w1.square().sum(1) + b1.square() + w2.square().sum(0)).sqrt()
    assert torch.allclose(importance.l1(m, sm)["fc1.out_features"].float(), want_l1)
    assert torch.allclose(importance.l2(m, sm)["fc1.out_features"].float(), want_l2)


def test_a_head_is_one_unit_over_all_its_rows() -> None:
    torch.manual_seed(0)
    m = Attn()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 4),))
    group = next(g for g in sm.groups() if ("mha", "embed_dim") in g.members)
    assert (group.size, group.unit) == (2, 4)
    lay = importance.layout(m, sm)
    rows = next(s for s in lay.slices[group.name]
                if s.param == "mha.in_proj_weight" and s.dim == 0)
    # q, k and v rows of head h: h*4..h*4+3 in each third
    want = torch.tensor([(r % 8) // 4 for r in range(24)])
    assert rows.index.tolist() == list(range(24)) and rows.unit.tolist() == want.tolist()
    w = m.mha.in_proj_weight.detach()
    scores = importance.l1(m, sm)[group.name]
    head0 = sum(float(w[r].abs().sum()) for r in range(24) if (r % 8) // 4 == 0)
    assert float(scores[0]) > head0  # plus the other members (inp rows, out columns, ...)


def test_layout_predicts_every_parameter_shape_after_a_resize() -> None:
    torch.manual_seed(0)
    m = Attn()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 4),))
    lay = importance.layout(m, sm)
    kept = {g.name: max(1, g.size // 2) for g in sm.groups()}
    predicted = lay.shapes_after(kept)
    fxsym.resize(m, sm, kept)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == predicted


def test_bn_scale_scores_only_groups_with_a_batch_norm() -> None:
    torch.manual_seed(0)
    m = ConvBN()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 8, 8),))
    scores = importance.bn_scale(m, sm)
    assert torch.allclose(scores["conv.out_channels"].float(), m.bn.weight.detach().abs())
    assert "conv2.out_channels" not in scores


def test_taylor_is_weight_times_gradient_over_all_members() -> None:
    m, sm = _mlp()
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    m.fc2.weight.grad = None
    scores = importance.taylor(loss_fn, [(x, y), (x, y)])(m, sm)["fc1.out_features"]
    assert m.fc2.weight.grad is None  # .grad left alone
    loss = 2 * loss_fn(m, (x, y))
    g1, gb, g2 = torch.autograd.grad(loss, [m.fc1.weight, m.fc1.bias, m.fc2.weight])
    want = ((m.fc1.weight * g1).abs().sum(1) + (m.fc1.bias * gb).abs()
            + (m.fc2.weight * g2).abs().sum(0)).detach()
    assert torch.allclose(scores.float(), want, atol=1e-6)


def test_activation_is_mean_abs_over_producer_outputs_and_consumer_inputs() -> None:
    m, sm = _mlp()
    m.train()
    batches = [torch.randn(3, 5), torch.randn(3, 5)]
    scores = importance.activation(batches)(m, sm)["fc1.out_features"]
    assert m.training  # modes put back
    with torch.no_grad():
        want = sum(m.fc1(b).abs().mean(0) + m.act(m.fc1(b)).abs().mean(0) for b in batches) / 2
    assert torch.allclose(scores.float(), want)


def test_unknown_criterion_is_a_plan_error() -> None:
    with pytest.raises(fxsym.PlanError, match="needs data"):
        importance.criterion_by_name("taylor")


def test_an_unknown_criterion_lists_every_kind_of_importance() -> None:
    with pytest.raises(fxsym.PlanError) as info:
        importance.criterion_by_name("l3")
    for name in ("l1", "l2", "bn_scale", "taylor(loss_fn, batches)", "activation(batches)",
                 "callable"):
        assert name in str(info.value)
