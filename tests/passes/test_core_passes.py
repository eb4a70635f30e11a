"""The core passes: dead-code elimination, in-place removal, no-op removal."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from passes_helpers import count, ops, same_outputs
from torch import fx, nn

from fxsym.passes import PassWarning, optimize


def vec(shape: tuple[int, ...]) -> tuple[torch.Tensor]:
    return (torch.randn(*shape),)


# -- dead-code elimination -----------------------------------------------------------------------
def test_dce_removes_dead_nodes_but_keeps_writes() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.relu(x)  # unused: erased
            self.fc(x)  # unused module call (eval): erased
            x.add_(1)  # unused result but writes into the input: kept
            return x * 2

    model = Net().eval()
    gm = optimize(model, passes=["dce"])
    assert count(gm, torch.relu, nn.Linear) == 0
    assert count(gm, "add_") == 1
    assert gm.meta["fxsym_passes"]["dce"].changes >= 2
    assert ops(gm) == [".add_", "mul"]
    x = torch.randn(2, 4)
    x1, x2 = x.clone(), x.clone()
    torch.testing.assert_close(gm(x1), model(x2))
    torch.testing.assert_close(x1, x2)  # the write still happens


def test_dce_keeps_training_batchnorm_that_updates_statistics() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.bn(x)
            return x + 1

    gm = optimize(Net().train(), passes=["dce"])
    assert count(gm, nn.BatchNorm1d) == 1
    gm_eval = optimize(Net().eval(), passes=["dce"])
    assert count(gm_eval, nn.BatchNorm1d) == 0


# -- in-place removal ----------------------------------------------------------------------------
def test_inplace_rewritten_when_safe() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y = self.fc(x)
            y.mul_(2)
            z = y.add_(1)  # z aliases y
            w = F.relu(y * 3, inplace=True)
            v = self.act(y + 1)
            u = torch.sigmoid_(y - 1)
            t = (y * 1.5).clamp_(min=0.0)
            return y, z, w, v, u, t

    model = Net()
    gm = optimize(model, example_inputs=(torch.randn(2, 4),))
    assert gm.meta["fxsym_passes"]["remove_inplace"].changes == 6
    assert count(gm, "mul_", "add_", "clamp_", torch.sigmoid_) == 0
    assert not any(n.kwargs.get("inplace") for n in gm.graph.nodes)
    assert all(not getattr(m, "inplace", False) for m in gm.modules())
    assert model.act.inplace  # the user's module is untouched
    same_outputs(model, gm, vec, [(2, 4), (5, 4), (1, 4)])


def test_inplace_on_input_is_refused_with_a_reason() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.add_(1)
            return x * 2

    with pytest.warns(PassWarning, match=r"remove_inplace kept 1 .*graph input 'x'"):
        gm = optimize(Net(), passes=["remove_inplace"])
    assert count(gm, "add_") == 1


def test_inplace_through_a_view_is_refused() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = x * 1.5
            v = y.view(-1)  # alias of y taken before the write
            y.add_(1)
            s = y[0]  # a view: writing into it writes into y
            s.zero_()
            return v, y

    model = Net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm = optimize(model, passes=["remove_inplace"])
    messages = " ".join(str(w.message) for w in caught if w.category is PassWarning)
    assert "kept 2" in messages and "may alias" in messages
    assert count(gm, "add_", "zero_") == 2
    same_outputs(model, gm, vec, [(3, 2), (4, 5)])


def test_inplace_random_fill_is_refused() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x + 1
            y.normal_()
            return y

    with pytest.warns(PassWarning, match="random fill"):
        gm = optimize(Net(), passes=["remove_inplace"])
    assert count(gm, "normal_") == 1


def test_eval_dropout_with_inplace_is_no_write() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.2, inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(torch.flatten(x, 1))  # flatten may alias x

    model = Net().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PassWarning)
        gm = optimize(model, example_inputs=(torch.randn(2, 3, 4),))
    assert ops(gm) == ["flatten"]
    with pytest.warns(PassWarning, match="may alias"):
        optimize(Net().train(), passes=["remove_inplace"])


def test_inplace_removal_enables_later_patterns() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 1)
            self.bn = nn.BatchNorm2d(3)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.bn(self.conv(x)))

    model = Net().eval()
    gm = optimize(model, example_inputs=(torch.randn(1, 2, 4, 4),))
    assert ops(gm) == ["Conv2d", "ReLU"]
    same_outputs(model, gm, vec, [(1, 2, 4, 4), (3, 2, 5, 6)])


# -- no-op removal -------------------------------------------------------------------------------
def test_noops_removed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.id = nn.Identity()
            self.drop = nn.Dropout(0.5)
            self.drop2 = nn.Dropout1d(0.2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.drop2(self.drop(self.id(x)).unsqueeze(0)).squeeze(0)
            y = F.dropout(y, 0.3, training=False)
            y = torch.tanh(y)[:, :]
            y = y[...] * 1
            y = 0 + (y + 0)
            y = (y - 0) / 1
            return y.view(-1, 2).reshape(2, -1).view(-1)

    model = Net().eval()
    gm = optimize(model, passes=["remove_noops"], example_inputs=(torch.randn(4, 6),))
    assert ops(gm) == [".unsqueeze", ".squeeze", "tanh", ".reshape"]
    same_outputs(model, gm, vec, [(4, 6), (2, 2)])


def test_noops_kept_when_not_provably_no_ops() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = mask * 1  # bool * 1 is an integer tensor
            b = x * 1.0001
            c = x[:, 1:]
            d = self.drop(x)  # training mode: not an identity
            return a, b, c, d

    model = Net().train()
    inputs = (torch.randn(3, 4), torch.rand(3, 4) > 0.5)
    gm = optimize(model, passes=["remove_noops"], example_inputs=inputs, verify=False)
    assert gm.meta["fxsym_passes"]["remove_noops"].changes == 0
    assert count(gm, nn.Dropout) == 1


def test_arithmetic_noops_need_shapes() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1 + 0

    no_shapes = fx.symbolic_trace(Net())
    assert optimize(no_shapes, passes=["remove_noops"]).meta["fxsym_passes"].changes == 0
    gm = optimize(Net(), passes=["remove_noops"], example_inputs=(torch.randn(2),))
    assert gm.meta["fxsym_passes"].changes == 2
    assert ops(gm) == []


def test_noop_kept_when_its_value_is_written_in_place() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = x + 0
            y.mul_(3)  # removing `+ 0` would make this write reach x
            return x, y

    model = Net()
    gm = optimize(model, passes=["remove_noops"], example_inputs=(torch.randn(3),))
    assert gm.meta["fxsym_passes"].changes == 0
    x = torch.randn(3)
    out, ref = gm(x.clone()), model(x.clone())
    torch.testing.assert_close(out, ref)


def test_chained_reshapes_keep_a_shared_inner_value() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = x.reshape(-1)
            return a.view(2, -1), a

    gm = optimize(Net(), passes=["remove_noops"])
    assert gm.meta["fxsym_passes"].changes == 0
    g = fx.symbolic_trace(Net())
    assert len(list(gm.graph.nodes)) == len(list(g.graph.nodes))
