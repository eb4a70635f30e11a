"""Channel shuffle (ShuffleNet v2): what is exact, and what groups can express.

``benchmarks/shuffle_exact.py`` holds the argument (docs/design.md, *Channel shuffle: the
limit*): an exact shrink of a stage keeps, from each *path* of channels (the halves a channel
lands in at every ``chunk``), exactly as many channels as a stage of the new width has on that
path. These tests check that claim by enumeration on small stages, the consequence for the
real stages, and that the groups fxsym reports for a shuffle net pass both oracles.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym


def _exact_module() -> ModuleType:
    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "shuffle_exact.py"
    spec = importlib.util.spec_from_file_location("shuffle_exact", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("shuffle_exact", module)
    spec.loader.exec_module(module)
    return module


def shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, c, h, w)


def branch(cin: int, c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False),
                         nn.BatchNorm2d(c), nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c),
                         nn.ReLU())


class ShuffleStage(nn.Module):
    """A stem, a two-branch block, ``blocks - 1`` split blocks, each ending in a shuffle."""

    def __init__(self, c: int, blocks: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 1)
        self.a = branch(8, c)
        self.b = branch(8, c)
        self.rest = nn.ModuleList(branch(c, c) for _ in range(blocks - 1))
        self.head = nn.Conv2d(2 * c, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = shuffle(torch.cat([self.a(x), self.b(x)], 1))
        for block in self.rest:
            x1, x2 = x.chunk(2, dim=1)
            x = shuffle(torch.cat([x1, block(x2)], 1))
        return self.head(x)


def _live(sm: fxsym.SymMap, module: str) -> bool:
    return any(m == (module, "out_channels") for g in sm.groups() for m in g.members)


def test_two_block_shuffle_groups_pass_both_oracles() -> None:
    torch.manual_seed(0)
    model = ShuffleStage(4, 2).eval()
    sm = assert_oracles(model, (torch.randn(2, 3, 6, 6),))
    for conv in ("a.5", "b.5", "rest.0.5"):  # the producers the shuffles interleave
        assert _live(sm, conv), [g.name for g in sm.groups()]


@pytest.mark.parametrize(("c", "blocks"), [(10, 3), (20, 4)])
def test_a_cut_inside_a_unit_pins_that_unit_only(c: int, blocks: int) -> None:
    """After two shuffles a tied unit holds 4 channels; ``chunk`` cuts 10 = 2.5 units: the unit
    it cuts is kept whole (constant), the units on each side keep equal counts, and the next
    shuffle ties the branch to the pass-through half around that unit."""
    torch.manual_seed(0)
    model = ShuffleStage(c, blocks).eval()
    sm = assert_oracles(model, (torch.randn(2, 3, 6, 6),))
    for conv in ("a.5", "b.5", "rest.0.5", "rest.1.5"):
        assert _live(sm, conv), [g.name for g in sm.groups()]
    pinned = [g for g in sm.groups() if g.name.startswith("a.5.out_channels#")]
    assert pinned and all(g.same_size for g in pinned)
    table = sm.analysis.table
    dim = sm.analysis.symbol_dims[("a.5", "out_channels")]
    constant = [s.length for s in dim if table.is_constant(s.group)]
    assert constant and sum(constant) < c  # a's channels in the cut units only


class DepthwiseOverConcat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 6, 1)
        self.dw = nn.Conv2d(10, 10, 3, padding=1, groups=10)
        self.head = nn.Conv2d(10, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dw(torch.cat([self.a(x), self.b(x)], 1)))


def test_a_depthwise_conv_over_a_concatenation_keeps_both_groups() -> None:
    """One channel per conv group: every channel is a whole group, whatever the layout."""
    torch.manual_seed(0)
    model = DepthwiseOverConcat().eval()
    sm = assert_oracles(model, (torch.randn(2, 3, 5, 5),))
    assert {"a.out_channels", "b.out_channels"} <= {g.name for g in sm.groups()}
    fxsym.resize(model, sm, {"a.out_channels": [0, 3], "b.out_channels": [1, 2, 5]})
    assert model.dw.groups == model.dw.in_channels == model.dw.out_channels == 5
    assert model(torch.randn(1, 3, 4, 4)).shape == (1, 2, 4, 4)


@pytest.mark.parametrize(("c", "blocks"), [(6, 3), (4, 4)])
def test_deeper_shuffles_pin_only_what_they_cannot_cut(c: int, blocks: int) -> None:
    """Each shuffle doubles the channels a tied unit holds; once a ``chunk`` would cut a unit
    (6 = 2 * 3 channels: the second chunk) or leave a single unit (4 channels, the third), the
    trace report names the chunk or shuffle that pinned it, and what is reported still passes
    both oracles."""
    torch.manual_seed(0)
    model = ShuffleStage(c, blocks).eval()
    sm = assert_oracles(model, (torch.randn(2, 3, 6, 6),))
    assert any(e.kind == "boundary" and ("chunk" in e.where or "view" in e.where)
               for e in sm.trace_report)
    assert _live(sm, "rest.0.0")  # the inner width of a branch never meets a shuffle


def test_exact_shrinks_are_the_path_counts() -> None:
    exact = _exact_module()
    for blocks, c, width in [(2, 3, 2), (3, 3, 2), (3, 4, 2)]:
        found, _ = exact.brute_force(c, width, blocks)  # asserts the count and numerics
        assert (found == 0) == ((blocks, c, width) == (3, 3, 2))


def test_eight_block_stages_allow_two_widths_at_most() -> None:
    """An affine family of widths is what a same-size class of whole units can express;
    ShuffleNet v2's 8-block stages have none with three widths."""
    exact = _exact_module()
    assert exact.affine_widths(48, 8)[0] == 2
    assert exact.affine_widths(116, 8)[0] == 2
    assert exact.affine_widths(24, 4) == (3, 8)
