"""Fused projections and partial slices: one dim made of blocks (issue 11, part 2).

A projection cut by ``chunk`` into q/k/v or gate/up, a leading part sliced off for rotary
embeddings, a channel shuffle: each block of the projection's output becomes a group of its
own, named ``<producer>#<block>``, or shares one with other blocks where later ops tie them.
Each model is analyzed, resized, and compared with the original model in which the removed
entries are zeroed at their producer (for these models a zero entry contributes nothing
downstream, so both must agree exactly), on several input shapes; then both oracles run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles
from torch import nn
from torchvision.models.shufflenetv2 import channel_shuffle

import fxsym
from fxsym.errors import ResizeError


class FusedQKV(nn.Module):
    """Self-attention with one ``qkv`` projection chunked into q, k, v."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 3 * 12)
        self.out = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return self.out(att @ v)


class GateUp(nn.Module):
    """A gated MLP with one ``gate_up`` projection chunked into gate and up."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up = nn.Linear(8, 2 * 10)
        self.down = nn.Linear(10, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class PartialRotary(nn.Module):
    """A rotation applied to the leading ``rotary_dim`` features only."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 12)
        self.out = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        rot, rest = h[..., :4], h[..., 4:]
        rot = torch.cat([-rot[..., 2:], rot[..., :2]], dim=-1)
        return self.out(torch.cat([rot, rest], dim=-1))


class Shuffle(nn.Module):
    """Two branches concatenated and channel-shuffled (torchvision's ShuffleNetV2) between
    two convs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        self.c = nn.Conv2d(8, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = channel_shuffle(torch.cat([self.a(x), self.b(x)], dim=1), 2)
        return self.c(torch.relu(y))


class ShuffleUnit(nn.Module):
    """A stride-1 ShuffleNetV2 unit: half the channels pass, the other half go through a
    branch, then the halves are shuffled; twice, so the second unit cuts shuffled blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 1)
        self.branch1 = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU(),
                                     nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 4, 1))
        self.branch2 = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1))
        self.head = nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        for branch in (self.branch1, self.branch2):
            y1, y2 = y.chunk(2, dim=1)
            y = channel_shuffle(torch.cat((y1, branch(y2)), dim=1), 2)
        return self.head(y).mean((2, 3))


class Contradicted(nn.Module):
    """A grouped conv makes whole units of 3 channels; a chunk into 3 would cut them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 6, 1)
        self.g = nn.Conv2d(6, 6, 1, groups=2)
        self.h = nn.Conv2d(2, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        z = self.g(y)
        p, q, r = y.chunk(3, dim=1)
        return z + self.h(p * q * r).sum(1, keepdim=True)


def _masked(model: nn.Module, removed: dict[str, Sequence[int]]) -> nn.Module:
    """A copy of ``model`` whose producers (module name -> output entries) output zeros at
    the entries a resize removed."""
    out = copy.deepcopy(model)
    modules = dict(out.named_modules())
    with torch.no_grad():
        for name, rows in removed.items():
            mod = modules[name]
            idx = torch.tensor(list(rows), dtype=torch.long)
            mod.weight[idx] = 0
            if getattr(mod, "bias", None) is not None:
                mod.bias[idx] = 0
    return out


def _check_eager(model: nn.Module, resized: nn.Module, removed: dict[str, Sequence[int]],
                 shapes: Sequence[tuple[int, ...]]) -> None:
    reference = _masked(model, removed).eval()
    resized.eval()
    for shape in shapes:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(resized(x), reference(x), rtol=1e-5, atol=1e-5)


def _resize(model: nn.Module, inputs: tuple[torch.Tensor, ...],
            choices: dict[str, object]) -> nn.Module:
    """A resized copy of ``model`` (analyzed afresh)."""
    clone = copy.deepcopy(model)
    return fxsym.resize(clone, fxsym.analyze(clone, example_inputs=inputs), choices)


def _groups(sm: fxsym.SymMap) -> dict[str, fxsym.SymGroup]:
    return {g.name: g for g in sm.groups()}


def test_fused_qkv_blocks_become_groups() -> None:
    torch.manual_seed(0)
    model = FusedQKV()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs, min_groups=2)
    groups = _groups(sm)
    # q and k are multiplied: their blocks share one group; v's block is its own
    assert set(groups) == {"qkv.out_features#0", "qkv.out_features#2"}
    qk, v = groups["qkv.out_features#0"], groups["qkv.out_features#2"]
    assert (qk.size, v.size) == (12, 12)
    assert ("out", "in_features") in v.members and ("out", "in_features") not in qk.members
    # chunk cuts at equal sizes at run time: the blocks keep equal numbers of units
    assert qk.same_size == ("qkv.out_features#2",) and v.same_size == ("qkv.out_features#0",)
    dim = sm.analysis.symbol_dims[("qkv", "out_features")]
    assert [sm.analysis.table.find(s.group) for s in dim] == [qk.id, qk.id, v.id]

    keep_qk, keep_v = [0, 2, 5, 7, 8, 11], [1, 2, 3, 6, 9, 10]
    resized = _resize(model, inputs,
                           {qk.name: keep_qk, v.name: keep_v})
    assert resized.qkv.out_features == 18 and resized.out.in_features == 6
    drop_qk = [i for i in range(12) if i not in keep_qk]
    drop_v = [i for i in range(12) if i not in keep_v]
    removed = {"qkv": drop_qk + [12 + i for i in drop_qk] + [24 + i for i in drop_v]}
    _check_eager(model, resized, removed, [(2, 5, 8), (3, 7, 8), (1, 1, 8)])

    with pytest.raises(ResizeError, match="as many units"):
        _resize(model, inputs,
                     {qk.name: 6, v.name: 4})


def test_gate_up_blocks_tied_by_product() -> None:
    torch.manual_seed(0)
    model = GateUp()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    assert set(groups) == {"gate_up.out_features#0"}
    group = groups["gate_up.out_features#0"]
    assert group.size == 10 and group.same_size == ()
    assert set(group.members) == {("gate_up", "out_features"), ("down", "in_features")}

    keep = [0, 3, 4, 8, 9]
    resized = _resize(model, inputs,
                           {group.name: keep})
    assert resized.gate_up.out_features == 10 and resized.down.in_features == 5
    drop = [i for i in range(10) if i not in keep]
    _check_eager(model, resized, {"gate_up": drop + [10 + i for i in drop]},
                 [(2, 5, 8), (4, 3, 8), (1, 8)])


def test_partial_rotary_slice_pins_only_its_part() -> None:
    torch.manual_seed(0)
    model = PartialRotary()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    assert set(groups) == {"proj.out_features#1"}
    rest = groups["proj.out_features#1"]
    assert rest.size == 8
    assert set(rest.members) == {("proj", "out_features"), ("out", "in_features")}
    dim = sm.analysis.symbol_dims[("proj", "out_features")]
    table = sm.analysis.table
    assert [s.length for s in dim if table.reason(s.group) is not None] == [2, 2]
    assert table.find(dim[-1].group) == rest.id and dim[-1].length == 8

    keep = [1, 2, 6]
    resized = _resize(model, inputs,
                           {rest.name: keep})
    assert resized.proj.out_features == 7
    drop = [4 + i for i in range(8) if i not in keep]
    _check_eager(model, resized, {"proj": drop}, [(2, 5, 8), (3, 8), (1, 1, 8)])


def test_channel_shuffle_is_a_block_permutation() -> None:
    torch.manual_seed(0)
    model = Shuffle()
    inputs = (torch.randn(2, 3, 5, 5),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    # the shuffle lays a's and b's channels alternately: both keep the same channels
    assert set(groups) == {"a.out_channels"}
    group = groups["a.out_channels"]
    assert set(group.members) == {("a", "out_channels"), ("b", "out_channels"),
                                  ("c", "in_channels")}

    keep = [0, 3]
    resized = _resize(model, inputs,
                           {group.name: keep})
    assert resized.c.in_channels == 4
    _check_eager(model, resized, {"a": [1, 2], "b": [1, 2]},
                 [(2, 3, 5, 5), (1, 3, 7, 4), (3, 3, 2, 2)])


def test_shuffle_units_chunk_shuffled_blocks() -> None:
    torch.manual_seed(0)
    model = ShuffleUnit().eval()
    inputs = (torch.randn(2, 3, 6, 6),)
    sm = assert_oracles(model, inputs, min_groups=3)
    names = set(_groups(sm))
    assert {"branch1.0.out_channels", "branch2.0.out_channels"} <= names
    assert any(n.startswith("stem.out_channels#") for n in names), names
    shrunk = _resize(model, inputs,
                          {g.name: max(1, g.size // 2) for g in sm.groups()})
    assert shrunk.stem.out_channels < 8
    for shape in [(2, 3, 6, 6), (1, 3, 9, 5)]:
        assert shrunk(torch.randn(*shape)).shape == (shape[0], 5)


def test_split_contradicting_an_earlier_tie_pins() -> None:
    torch.manual_seed(0)
    model = Contradicted()
    inputs = (torch.randn(2, 3, 4, 4),)
    sm = fxsym.analyze(model, example_inputs=inputs)
    assert "a.out_channels" not in _groups(sm)
    why = sm.why_constant("a", "out_channels")
    assert why is not None and "inside a unit" in why, why
    assert_oracles(model, inputs)
