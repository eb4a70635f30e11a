"""The nn plugin's patterns: each fires where it applies, keeps outputs, and holds back
where it must not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from passes_helpers import count, randomize_bn, same_outputs
from torch import nn

from fxsym.passes import format_passes, optimize

SHAPES_2D = [(2, 3, 9, 9), (1, 3, 5, 7), (4, 3, 12, 6)]


def img(shape: tuple[int, ...]) -> tuple[torch.Tensor]:
    return (torch.randn(*shape),)


# -- Conv + BatchNorm ----------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_bn_folds_in_eval_mode(dims: int) -> None:
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = conv(3, 6, 3, padding=1, bias=dims != 2)
            self.bn = bn(6)
            self.conv2 = conv(6, 4, 1, groups=2)
            self.bn2 = bn(4, affine=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn2(self.conv2(torch.relu(self.bn(self.conv(x)))))

    model = randomize_bn(Net()).eval()
    weight_before = model.conv.weight.clone()
    shapes = [(2, 3) + (5,) * dims, (1, 3) + (4,) * dims]
    gm = optimize(model, example_inputs=img(shapes[0]))
    assert count(gm, nn.modules.batchnorm._BatchNorm) == 0
    assert count(gm, conv) == 2
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules())
    same_outputs(model, gm, img, shapes)
    # the user's model is untouched: same modules, same weights
    assert isinstance(model.bn, bn) and torch.equal(model.conv.weight, weight_before)
    assert gm.get_submodule("conv") is not model.conv


def test_conv_bn_not_folded_in_training_mode() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x))

    model = Net().train()
    gm = optimize(model, example_inputs=img((2, 3, 8, 8)), verify=False)
    assert count(gm, nn.BatchNorm2d) == 1
    assert gm.meta["fxsym_passes"]["patterns"].changes == 0


def test_conv_feeding_two_bns_is_not_folded() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn_a = nn.BatchNorm2d(4)
            self.bn_b = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return self.bn_a(y) + self.bn_b(y)

    model = randomize_bn(Net()).eval()
    gm = optimize(model, example_inputs=img((2, 3, 8, 8)))
    assert count(gm, nn.BatchNorm2d) == 2
    same_outputs(model, gm, img, SHAPES_2D)


def test_bn_whose_conv_output_is_used_elsewhere_is_not_folded() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.conv(x)
            return self.bn(y), y.mean()

    model = randomize_bn(Net()).eval()
    gm = optimize(model, example_inputs=img((2, 3, 8, 8)))
    assert count(gm, nn.BatchNorm2d) == 1
    same_outputs(model, gm, img, SHAPES_2D)


def test_shared_conv_gets_its_own_folded_copy() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.bn = nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x)) + self.conv(x)

    model = randomize_bn(Net()).eval()
    gm = optimize(model, example_inputs=img((2, 3, 6, 6)))
    assert count(gm, nn.BatchNorm2d) == 0
    assert count(gm, nn.Conv2d) == 2
    same_outputs(model, gm, img, SHAPES_2D)


# -- Linear + BatchNorm1d ------------------------------------------------------------------------
def test_linear_bn1d_folds_on_2d_input() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 7)
            self.bn = nn.BatchNorm1d(7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.fc(x))

    model = randomize_bn(Net()).eval()
    gm = optimize(model, example_inputs=(torch.randn(3, 5),))
    assert count(gm, nn.BatchNorm1d) == 0 and count(gm, nn.Linear) == 1
    same_outputs(model, gm, lambda s: (torch.randn(*s),), [(3, 5), (1, 5), (9, 5)])


def test_linear_bn1d_on_3d_input_is_not_folded() -> None:
    # BatchNorm1d on (N, C, L) normalizes dim 1, not the Linear's feature dim
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.fc(x))

    model = randomize_bn(Net()).eval()
    gm = optimize(model, example_inputs=(torch.randn(2, 4, 4),))
    assert count(gm, nn.BatchNorm1d) == 1
    same_outputs(model, gm, lambda s: (torch.randn(*s),), [(2, 4, 4), (3, 4, 4)])


def test_linear_bn1d_needs_shapes() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 7)
            self.bn = nn.BatchNorm1d(7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.fc(x))

    # a plain torch.fx graph without example inputs carries no shapes: the rank is unknown
    gm = optimize(torch.fx.symbolic_trace(randomize_bn(Net()).eval()))
    assert count(gm, nn.BatchNorm1d) == 1


# -- log(softmax) --------------------------------------------------------------------------------
def test_log_softmax_all_spellings() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sm = nn.Softmax(dim=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = torch.log(F.softmax(x, dim=-1))
            b = x.softmax(0).log()
            c = torch.log(self.sm(x))
            d = torch.log(torch.softmax(x, 1, dtype=torch.float64))
            return a, b, c, d

    model = Net()
    gm = optimize(model, example_inputs=(torch.randn(3, 4),))
    assert count(gm, torch.log_softmax) == 4
    assert count(gm, torch.log, "log", F.softmax, "softmax", nn.Softmax) == 0
    same_outputs(model, gm, lambda s: (torch.randn(*s) * 5,), [(3, 4), (6, 2), (1, 8)])


def test_log_softmax_kept_when_softmax_is_used_elsewhere() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            p = torch.softmax(x, -1)
            return torch.log(p), p

    gm = optimize(Net(), example_inputs=(torch.randn(3, 4),))
    assert count(gm, torch.log_softmax) == 0 and count(gm, torch.log) == 1


# -- sum over an outer product -------------------------------------------------------------------
def test_sum_over_outer_product_becomes_einsum() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 5))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            manual_matmul = (x.unsqueeze(-1) * self.w).sum(dim=-2)  # (b, i, 1) * (i, o)
            outer = (x[:, :, None] * y[:, None, :]).sum(1)  # sum_i x_bi * y_bj
            both = (torch.unsqueeze(x, 2) * torch.unsqueeze(y, 1)).sum((1, 2))
            return manual_matmul, outer, both

    model = Net()
    inputs = (torch.randn(4, 6), torch.randn(4, 3))
    gm = optimize(model, example_inputs=inputs)
    assert count(gm, torch.einsum) == 3
    assert count(gm, "sum", torch.sum, "unsqueeze", torch.unsqueeze) == 0
    for b in (4, 1, 7):
        x, y = torch.randn(b, 6), torch.randn(b, 3)
        torch.testing.assert_close(gm(x, y), model(x, y), rtol=1e-5, atol=1e-5)


def test_sum_of_plain_product_or_keepdim_is_not_einsum() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            plain = (x * y).sum(-1)  # not an outer product
            keep = (x.unsqueeze(-1) * y.unsqueeze(1)).sum(1, keepdim=True)
            return plain, keep

    model = Net()
    gm = optimize(model, example_inputs=(torch.randn(2, 3), torch.randn(2, 3)))
    assert count(gm, torch.einsum) == 0
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(gm(x, y), model(x, y))


# -- silu and tanh-GELU --------------------------------------------------------------------------
def test_x_times_sigmoid_x_becomes_silu() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sig = nn.Sigmoid()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y = x + 1
            return (
                x * torch.sigmoid(x),
                torch.sigmoid(y) * y,
                x.mul(x.sigmoid()),
                x * self.sig(x),
            )

    model = Net()
    gm = optimize(model, example_inputs=(torch.randn(3, 4),))
    assert count(gm, F.silu) == 4
    assert count(gm, torch.sigmoid, "sigmoid", nn.Sigmoid) == 0
    same_outputs(model, gm, lambda s: (torch.randn(*s),), [(3, 4), (2, 2, 2), (7,)])


def test_sigmoid_of_another_value_is_not_silu() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            s = torch.sigmoid(x)
            return x * torch.sigmoid(y), x * s, s  # second: sigmoid used twice

    gm = optimize(Net(), example_inputs=(torch.randn(3), torch.randn(3)))
    assert count(gm, F.silu) == 0


def test_manual_tanh_gelu_becomes_gelu() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            c = math.sqrt(2.0 / math.pi)
            hf = 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))
            y = x + 1
            swapped = y * 0.5 * (1 + ((y + 0.044715 * y**3) * 0.7978845608).tanh())
            z = x - 1
            cube = 0.5 * (z * (1.0 + torch.tanh(c * (z + 0.044715 * z * z * z))))
            return hf, swapped, cube

    model = Net()
    gm = optimize(model, example_inputs=(torch.randn(3, 5),))
    assert count(gm, F.gelu) == 3
    assert count(gm, torch.tanh, "tanh", torch.pow) == 0
    assert all(n.kwargs.get("approximate") == "tanh" for n in gm.graph.nodes if n.target is F.gelu)
    same_outputs(model, gm, lambda s: (torch.randn(*s) * 3,), [(3, 5), (4,), (2, 3, 2)])


def test_gelu_formula_with_a_wrong_constant_is_kept() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.044715 * torch.pow(x, 3.0))))

    gm = optimize(Net(), example_inputs=(torch.randn(3),))
    assert count(gm, F.gelu) == 0 and count(gm, torch.tanh) == 1


def test_patterns_are_contributed_by_the_nn_distribution() -> None:
    text = format_passes()
    for name in ("fold_conv_bn", "fold_linear_bn", "log_softmax", "einsum_outer_sum", "silu",
                 "gelu_tanh"):
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert "fxsym-plugins-nn" in line
