"""Verification: every pass against the original outputs; no example inputs, no inexact pass."""

from __future__ import annotations

import warnings

import pytest
import torch
from passes_helpers import count, ops, randomize_bn
from torch import fx, nn

import fxsym
from fxsym.passes import Pass, PassWarning, graph_pass, optimize

EPS = 6e-5  # below the tolerance (atol 1e-4, rtol 0 here), but two of them are not


def _nudge(name: str) -> Pass:
    """A pass adding EPS to the graph's output: alone within tolerance."""

    def fn(gm: fx.GraphModule) -> int:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        value = out.args[0]
        with gm.graph.inserting_before(out):
            nudged = gm.graph.call_function(torch.add, (value, EPS))
        out.args = (nudged,)
        return 1

    return Pass(name, fn, default=False)


class Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


def test_each_pass_is_compared_with_the_original_outputs() -> None:
    x = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = optimize(Tiny(), passes=[_nudge("nudge_0")], example_inputs=(x,), rtol=0.0)
    assert one.meta["fxsym_passes"]["nudge_0"].status == "ok"  # alone: within tolerance
    names = [f"nudge_{i}" for i in range(5)]
    with pytest.warns(PassWarning, match="'nudge_1' .* rolled back"):
        gm = optimize(Tiny(), passes=[_nudge(n) for n in names], example_inputs=(x,), rtol=0.0)
    report = gm.meta["fxsym_passes"]
    # each step is within tolerance of the one before, but from the second on the sum is not
    assert [report[n].status for n in names] == ["ok"] + ["rolled back"] * 4
    assert gm.meta["fxsym_verified"] is True
    torch.testing.assert_close(gm(x), Tiny()(x), rtol=0.0, atol=1e-4)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.conv(x)))


def test_without_inputs_an_inexact_pass_is_refused_and_exact_ones_run() -> None:
    # a GraphModule: no plugin supplies example inputs for it (the nn plugin would for the
    # module, from its first convolution)
    model = randomize_bn(ConvBN()).eval()
    with pytest.warns(PassWarning, match=r"refused: 'patterns' \(fold_conv_bn x1\)"):
        gm = optimize(fxsym.trace(model))
    report = gm.meta["fxsym_passes"]
    assert report["patterns"].status == "refused" and "fold_conv_bn" in report["patterns"].message
    assert report["remove_noops"].status == "ok" and report["remove_noops"].changes == 1
    assert ops(gm) == ["Conv2d", "BatchNorm2d"]  # eval dropout gone (exact); BN kept
    assert gm.meta["fxsym_verified"] is True
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(gm(x), model(x))


def test_without_inputs_verify_false_applies_everything_unverified() -> None:
    model = randomize_bn(ConvBN()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm = optimize(fxsym.trace(model), verify=False)
    assert ops(gm) == ["Conv2d"]
    assert gm.meta["fxsym_verified"] is False
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(gm(x), model(x), rtol=1e-4, atol=1e-5)


def test_with_inputs_the_fold_is_verified_and_applied() -> None:
    model = randomize_bn(ConvBN()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm = optimize(model, example_inputs=(torch.randn(2, 3, 6, 6),))
    assert ops(gm) == ["Conv2d"] and gm.meta["fxsym_verified"] is True
    assert gm.meta["fxsym_passes"]["patterns"].verified


def test_a_user_pass_is_refused_without_inputs_unless_declared_exact() -> None:
    def swap(gm: fx.GraphModule) -> int:
        n = 0
        for node in gm.graph.nodes:
            if node.target is torch.relu:
                node.target = torch.nn.functional.relu
                n += 1
        return n

    with pytest.warns(PassWarning, match=r"refused: 'swap' \(1 change\)"):
        gm = optimize(Tiny(), passes=[Pass("swap", swap, default=False)])
    assert count(gm, torch.relu) == 1 and gm.meta["fxsym_passes"]["swap"].status == "refused"
    exact = graph_pass("swap", default=False, exact=True)(swap)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm = optimize(Tiny(), passes=[exact])
    assert count(gm, torch.nn.functional.relu) == 1 and gm.meta["fxsym_verified"] is True
