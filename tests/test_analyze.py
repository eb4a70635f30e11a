"""The analyzer on small models: exact groups, and the oracles."""

from __future__ import annotations

import copy

import torch
from helpers import assert_oracles
from torch import nn

import fxsym


class ResidualNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 32, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = y + self.bn2(self.conv2(y))
        y = self.conv3(y)
        return self.head(y.mean(dim=(2, 3)))


def test_residual_block_has_exactly_two_groups() -> None:
    model = ResidualNet()
    sm = assert_oracles(model, (torch.randn(2, 3, 8, 8),))
    assert {g.name: g.members for g in sm.groups()} == {
        "conv1.out_channels": (
            ("conv1", "out_channels"), ("bn1", "num_features"), ("conv2", "in_channels"),
            ("conv2", "out_channels"), ("bn2", "num_features"), ("conv3", "in_channels")),
        "conv3.out_channels": (("conv3", "out_channels"), ("head", "in_features")),
    }
    assert [g.size for g in sm.groups()] == [16, 32]
    assert all(g.is_sortable for g in sm.groups())
    head_out = sm.get_symbol(model.head, "out_features")
    assert head_out.is_constant
    assert sm.get_symbol(model.conv1, "out_channels").is_searchable
    assert sm.get_symbol(model.conv2, "out_channels").parent is sm.get_symbol(
        model.conv1, "out_channels")


def test_analyze_leaves_model_bit_identical() -> None:
    model = ResidualNet().train()
    state = copy.deepcopy(model.state_dict())
    attrs = set(vars(model))
    fxsym.analyze(model, example_inputs=(torch.randn(2, 3, 8, 8),))
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert set(vars(model)) == attrs


def test_concat_and_flatten_to_linear() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 6, 3, padding=1)
            self.b = nn.Conv2d(3, 4, 1)
            self.c = nn.Conv2d(10, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 4 * 4, 5)
            self.fc2 = nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cat([self.a(x), self.b(x)], dim=1)
            y = torch.cat([y, self.c(y)], dim=1)[:, 10:]  # slice back to c's channels
            return self.fc2(torch.relu(self.fc(torch.flatten(y, 1))))

    sm = assert_oracles(M(), (torch.randn(2, 3, 4, 4),), min_groups=2)
    names = {g.name for g in sm.groups()}
    # the slice's start pins the part before it (a's and b's channels); c's part is kept
    # whole and stays free, as does fc's hidden size
    assert names == {"c.out_channels", "fc.out_features"}

    class N(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 6, 3, padding=1)
            self.b = nn.Conv2d(3, 4, 1)
            self.c = nn.Conv2d(10, 8, 3, padding=1)
            self.fc = nn.Linear(18 * 4 * 4, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cat([self.a(x), self.b(x)], dim=1)
            y = torch.cat([y, self.c(y)], dim=1)
            return self.fc(torch.flatten(y, 1))

    sm = assert_oracles(N(), (torch.randn(2, 3, 4, 4),), min_groups=3)
    groups = {g.name: g.members for g in sm.groups()}
    assert groups["a.out_channels"] == (("a", "out_channels"), ("c", "in_channels"),
                                        ("fc", "in_features"))
    assert set(groups) == {"a.out_channels", "b.out_channels", "c.out_channels"}
    # fc's input dim is three segments, each unit a 4x4 block
    dim = sm.analysis.symbol_dims[("fc", "in_features")]
    assert [(s.units, s.block) for s in dim] == [(6, 16), (4, 16), (8, 16)]


def test_grouped_and_depthwise_conv() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),  # depthwise: passes through
        nn.Conv2d(8, 12, 1),
        nn.Conv2d(12, 12, 3, padding=1, groups=4),  # 4 conv groups of 3 channels
        nn.Conv2d(12, 6, 1), nn.Conv2d(6, 2, 1),
    )
    sm = assert_oracles(model, (torch.randn(2, 3, 6, 6),), min_groups=3)
    groups = {g.name: g.members for g in sm.groups()}
    assert groups == {
        "0.out_channels": (("0", "out_channels"), ("2", "in_channels"), ("2", "out_channels"),
                           ("3", "num_features"), ("4", "in_channels")),
        "4.out_channels": (("4", "out_channels"), ("5", "in_channels"), ("5", "out_channels"),
                           ("6", "in_channels")),
        "6.out_channels": (("6", "out_channels"), ("7", "in_channels")),
    }
    grouped = sm.group("4.out_channels")
    assert (grouped.size, grouped.unit) == (4, 3)  # whole conv groups only
    assert sm.group("0.out_channels").unit == 1
    fxsym.resize(model, sm, {"4.out_channels": [3, 1]})
    assert (model[5].in_channels, model[5].groups, model[5].weight.shape[0]) == (6, 2, 6)
    assert model(torch.randn(1, 3, 6, 6)).shape == (1, 2, 6, 6)


def test_attention_heads_become_units() -> None:
    class Attention(nn.Module):
        def __init__(self, dim: int = 16, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.o = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, n, _ = x.shape
            q, k, v = (p(x).view(b, n, -1, 4).transpose(1, 2) for p in (self.q, self.k, self.v))
            att = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
            out = (att @ v).transpose(1, 2).reshape(b, n, -1)
            return self.o(out)

    model = Attention()
    sm = assert_oracles(model, (torch.randn(2, 5, 16),), min_groups=1)
    heads = {g.name: g for g in sm.groups()}
    # head i of v goes with head i of q and k: one group of 4 heads of 4 channels
    assert set(heads) == {"q.out_features"}
    assert (heads["q.out_features"].size, heads["q.out_features"].unit) == (4, 4)
    assert set(heads["q.out_features"].members) == {
        ("q", "out_features"), ("k", "out_features"), ("v", "out_features"), ("o", "in_features")}
    fxsym.resize(model, sm, {"q.out_features": [2, 0]})
    assert model.q.weight.shape == (8, 16) and model.o.weight.shape == (16, 8)
    assert model(torch.randn(1, 3, 16)).shape == (1, 3, 16)


def test_broadcast_mask_does_not_tie_groups() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 1)
            self.gate = nn.Conv2d(3, 1, 1)  # one channel, broadcast over a's 8
            self.b = nn.Conv2d(8, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x) * torch.sigmoid(self.gate(x)))

    sm = assert_oracles(M(), (torch.randn(2, 3, 5, 5),))
    assert {g.name: g.members for g in sm.groups()} == {
        "a.out_channels": (("a", "out_channels"), ("b", "in_channels"))}


def test_squeeze_excitation_gate_ties_channels() -> None:
    class SE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc1 = nn.Conv2d(8, 2, 1)
            self.fc2 = nn.Conv2d(2, 8, 1)
            self.out = nn.Conv2d(8, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
            return self.out(y * s)

    sm = assert_oracles(SE(), (torch.randn(2, 3, 5, 5),), min_groups=2)
    groups = {g.name: set(g.members) for g in sm.groups()}
    assert groups["conv.out_channels"] == {("conv", "out_channels"), ("fc1", "in_channels"),
                                           ("fc2", "out_channels"), ("out", "in_channels")}
    assert groups["fc1.out_channels"] == {("fc1", "out_channels"), ("fc2", "in_channels")}


def test_literal_reshape_pins_the_group() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x).view(-1, 6))  # 6 written by hand: cannot shrink

    sm = fxsym.analyze(M(), example_inputs=(torch.randn(3, 4),))
    assert sm.groups() == []
    assert any("literal" in e.message for e in sm.trace_report)


def test_unknown_op_is_a_boundary_and_reported() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 6)
            self.c = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.cumsum(self.a(x), dim=-1) + self.b(torch.relu(self.a(x))))

    sm = assert_oracles(M(), (torch.randn(3, 4),), min_groups=0, expect_unchecked=True)
    assert sm.groups() == []
    assert any("cumsum" in e.message for e in sm.trace_report)


def test_shared_module_called_twice() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.shared = nn.Linear(8, 8)
            self.out = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            h = torch.relu(self.shared(h))
            return self.out(self.shared(h))

    sm = assert_oracles(M(), (torch.randn(3, 4),), min_groups=1)
    # shared's input sees both a's output and its own output: all one group
    assert [g.name for g in sm.groups()] == ["a.out_features"]
    assert set(sm.groups()[0].members) == {("a", "out_features"), ("shared", "in_features"),
                                           ("shared", "out_features"), ("out", "in_features")}


def test_model_on_several_input_shapes() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))
    for shape in [(1, 3, 8, 8), (3, 3, 16, 12)]:
        sm = assert_oracles(model, (torch.randn(*shape),))
        assert [g.name for g in sm.groups()] == ["0.out_channels"]


def test_default_example_inputs_from_the_first_layer() -> None:
    torchvision = __import__("pytest").importorskip("torchvision")
    model = torchvision.models.resnet18()
    sm = fxsym.analyze(model)  # no inputs: the nn plugin guesses (1, 3, 224, 224)
    assert len(sm.groups()) == 12
    assert tuple(sm.graph_module.example_inputs[0].shape) == (1, 3, 224, 224)
    with __import__("pytest").raises(fxsym.AnalysisError, match="example_inputs"):
        fxsym.analyze(nn.Sequential(nn.ReLU()))


def test_why_constant_names_the_boundary() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 5)
            self.c = nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.cumsum(self.b(torch.relu(self.a(x))), dim=-1))

    sm = fxsym.analyze(M(), example_inputs=(torch.randn(3, 4),))
    assert [g.name for g in sm.groups()] == ["a.out_features"]
    assert sm.why_constant("a", "out_features") is None
    assert "cumsum" in (sm.why_constant("b", "out_features") or "")
    assert "output" in (sm.why_constant("c", "out_features") or "")
    assert "fixed" in (sm.why_constant("a", "in_features") or "")
