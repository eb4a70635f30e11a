"""Every question a trace answers about an elastic size is a guard.

Python reads sizes as well as tensor ops do: ``if y.shape[1] == self.ch:``, ``assert
y.shape[1] == self.channels``, ``y / math.sqrt(y.shape[1])``, ``range(C)``. The answer is
baked into the trace, so a group whose size such a question read is kept only when the answer
holds for every size the group may take (``C > 0``), or when what it compares is tied (an
attribute compared equal to a size becomes a member of the group, written by ``resize``);
otherwise the group is pinned with a ``guard`` line in the trace report. A size taken from one
tensor's shape that reshapes another (heads merged back with ``reshape(B, N, C)``, ``C`` read
from the input) ties the two dims or pins both.

Each module below is traced, compared with eager, and resized.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink

X = torch.randn(2, 3, 6, 6)


def _analyze(model: nn.Module, x: torch.Tensor = X) -> fxsym.SymMap:
    model.eval()
    sm = fxsym.analyze(model, example_inputs=(x,))
    with torch.no_grad():  # the traced graph computes what the model computes
        torch.testing.assert_close(sm.graph_module(x), model(x))
    return sm


def _members(sm: fxsym.SymMap) -> dict[tuple[str, str], str]:
    return {m: g.name for g in sm.groups() for m in g.members}


def _guard_lines(sm: fxsym.SymMap) -> list[str]:
    return [str(e) for e in sm.trace_report.of_kind("guard")]


def _assert_pinned(sm: fxsym.SymMap, producer: str, *words: str) -> None:
    """``producer``'s group is constant and a guard line names the question."""
    assert (producer, "out_channels") not in _members(sm), [g.name for g in sm.groups()]
    lines = _guard_lines(sm)
    assert any(all(w in line for w in words) for line in lines), lines


def _assert_sound(model: nn.Module, sm: fxsym.SymMap, x: torch.Tensor = X) -> None:
    assert check_permutation(model, sm, (x,)).ok
    shrink = check_shrink(model, sm, (x,))
    assert shrink.ok, shrink


def _dropped(model: nn.Module, consumer: str, keep: list[int]) -> nn.Module:
    """``model`` with the input channels of ``consumer`` not in ``keep`` zeroed: what a
    correct drop of the other channels computes."""
    ref = copy.deepcopy(model)
    conv = ref.get_submodule(consumer)
    drop = [i for i in range(conv.weight.shape[1]) if i not in keep]
    with torch.no_grad():
        conv.weight[:, drop] = 0
    return ref


class _Two(nn.Module):
    def __init__(self, ch: int = 8) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, ch, 1)
        self.c2 = nn.Conv2d(ch, 4, 1)


def test_branch_on_size_equal_to_attribute_ties_it() -> None:
    class M(_Two):
        def __init__(self) -> None:
            super().__init__()
            self.ch = 8

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.shape[1] == self.ch:
                y = y * 2
            else:
                y = -y
            return self.c2(y)

    model = M()
    sm = _analyze(model)
    members = _members(sm)
    assert members.get(("", "attr:ch")) == members[("c1", "out_channels")], members
    _assert_sound(model, sm)
    keep = [0, 2, 5, 7]
    ref = _dropped(model, "c2", keep)
    fxsym.resize(model, sm, {members[("c1", "out_channels")]: keep})
    assert model.ch == 4
    with torch.no_grad():
        torch.testing.assert_close(model(X), ref(X))


def test_assert_on_size_equal_to_attribute_ties_it() -> None:
    class M(_Two):  # diffusers' Upsample2D: assert hidden_states.shape[1] == self.channels
        def __init__(self) -> None:
            super().__init__()
            self.channels = 8

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            assert y.shape[1] == self.channels
            return self.c2(y)

    model = M()
    sm = _analyze(model)
    members = _members(sm)
    assert members.get(("", "attr:channels")) == members[("c1", "out_channels")], members
    _assert_sound(model, sm)


def test_branch_on_size_equal_to_number_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.shape[1] == 8:
                y = y * 2
            else:
                y = -y
            return self.c2(y)

    model = M()
    sm = _analyze(model)
    _assert_pinned(sm, "c1", "bool()")


def test_branch_on_size_parity_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.shape[1] % 2 == 0:
                y = y * 2
            return self.c2(y)

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "bool()")


def test_shapes_compared_whole_pin() -> None:
    class Stored(_Two):  # ultralytics Detect: if self.shape != shape: recompute
        def __init__(self) -> None:
            super().__init__()
            self.shape = (2, 8, 6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if self.shape != y.shape:
                y = y * 2
            return self.c2(y)

    class Sliced(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.shape[:2] == torch.Size((2, 8)):
                y = -y
            return self.c2(y)

    for model in (Stored(), Sliced()):
        sm = _analyze(model)
        _assert_pinned(sm, "c1", "bool()")


def test_shapes_compared_whole_are_decided_entry_by_entry() -> None:
    class Equal(nn.Module):  # equal shapes of two groups: their sizes tied
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1)
            self.c = nn.Conv2d(16, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, z = self.a(x), self.b(x)
            if y.shape == z.shape:
                y = y * 2
            return self.c(torch.cat([y, z], 1))

    class Ranks(_Two):  # shapes of different lengths differ for every size
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.shape != y.shape[1:]:
                y = y * 2
            return self.c2(y)

    model = Equal()
    sm = _analyze(model)
    members = _members(sm)
    ga, gb = members[("a", "out_channels")], members[("b", "out_channels")]
    assert ga != gb
    assert gb in sm.group(ga).same_size
    _assert_sound(model, sm)
    model = Ranks()
    sm = _analyze(model)
    assert ("c1", "out_channels") in _members(sm)
    _assert_sound(model, sm)


def test_size_added_to_a_tensor_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            return self.c2(y) + y.shape[1]

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "add")


def test_size_through_math_sqrt_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            return self.c2(y / math.sqrt(y.shape[1]))

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "float()")


def test_size_as_tensor_value_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            return self.c2(y) * torch.tensor(y.shape[1])

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "tensor")


def test_size_as_loop_count_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            z = self.c2(y)
            for _ in range(y.shape[1] // 4):
                z = z * 0.5
            return z

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "index")


def test_size_read_as_python_int_pins() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            return self.c2(y) * float(int(y.shape[1]) + 1)

    sm = _analyze(M())
    _assert_pinned(sm, "c1", "int()")


def test_numel_is_a_guard_over_every_size() -> None:
    class Holds(_Two):  # diffusers' Upsample2D
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            if y.numel() * 2 > 2**31:
                y = y.contiguous() * 0
            return self.c2(y)

    model = Holds()
    sm = _analyze(model)
    assert ("c1", "out_channels") in _members(sm)
    _assert_sound(model, sm)

    class Number(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            return self.c2(y) / y.numel()

    _assert_pinned(_analyze(Number()), "c1", "numel")


def test_guards_that_hold_for_every_size_keep_the_group() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x)
            assert y.shape[1] > 0 and y.shape[1] >= 1 and y.shape[1] != 0
            assert y.shape[1] <= 8 and y.shape[1] < 1000 and not y.shape[1] > 8
            if y.shape[1]:
                y = y * 2
            if x.shape[1] == 3:  # the input's channels: no group
                y = y + 1
            return self.c2(y)

    model = M()
    sm = _analyze(model)
    assert ("c1", "out_channels") in _members(sm), [g.name for g in sm.groups()]
    assert not _guard_lines(sm), _guard_lines(sm)
    _assert_sound(model, sm)


def test_heads_merged_back_with_the_inputs_size_tie_or_pin() -> None:
    class XCA(nn.Module):  # timm edgenext's cross-covariance attention, in short
        def __init__(self, dim: int = 8, heads: int = 2) -> None:
            super().__init__()
            self.num_heads = heads
            self.qkv = nn.Linear(dim, dim * 3)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, N, C = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
            q, k, v = qkv.unbind(0)
            attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
            return self.proj(x)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.xca = XCA()
            self.out = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.xca(self.inp(x)))

    model = M()  # the input's channels are a group: heads and channels keep equal sizes
    x = torch.randn(2, 5, 4)
    sm = _analyze(model, x)
    _assert_sound(model, sm, x)
    assert ("inp", "out_features") in _members(sm)

    xca = XCA()  # the input's channels are fixed: C cannot follow the heads
    x = torch.randn(2, 5, 8)
    sm = _analyze(xca, x)
    assert not sm.groups(), [g.name for g in sm.groups()]
    lines = [str(e) for e in sm.trace_report.of_kind("boundary")]
    assert any("size read from a fixed dim" in line for line in lines), lines


def test_expand_by_sizes() -> None:
    class M(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x).mean((2, 3), keepdim=True)
            b, c, h, w = x.shape[0], y.shape[1], x.shape[2], x.shape[3]
            return self.c2(y.expand(b, c, h, w) + y.expand(-1, -1, h, w))

    model = M()
    sm = _analyze(model)
    assert ("c1", "out_channels") in _members(sm)
    _assert_sound(model, sm)

    class Fixed(_Two):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.c1(x).mean((2, 3), keepdim=True)
            return self.c2(y.expand(x.shape[0], 8, 6, 6))  # 8 written by hand

    sm = _analyze(Fixed())
    assert ("c1", "out_channels") not in _members(sm)
