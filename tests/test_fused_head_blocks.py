"""Key heads projected fused with their value heads (Qwen3-Next's gated delta net).

One projection holds, per key head, its query and key (``head_k_dim`` each) and its ``r =
num_v_heads // num_k_heads`` value heads (``head_v_dim`` each); ``view(b, s, num_k_heads, 2 *
head_k_dim + head_v_dim * num_v_heads // num_k_heads)`` puts the key heads on the outer dim.
The per-head width sizes fixed entries, so it must keep its value under every resize: the
quotient ``num_v_heads // num_k_heads`` does where ``num_v_heads`` follows ``r`` times the
key heads (it becomes a member of their group, written by resize), every other attribute of
it is pinned. The value heads ``(num_k_heads, r * head_v_dim)`` reshaped to ``(num_v_heads,
head_v_dim)`` is a merge then a split; ``repeat_interleave`` of the query by ``v.shape[2] //
k.shape[2]`` (a constant) and the guard ``k.shape[2] != v.shape[2]`` (one key head against
``r`` value heads of the same group: never equal) keep the group, and a triangular solve
passes the columns it solves through. The unit kept is a whole key head with its value heads.
Each model is traced, resized and compared with a model of fewer heads built with the kept
heads' weights sliced by hand, in float64.
"""

from __future__ import annotations

import copy

import torch
from helpers import assert_oracles, group_with, has_group_with
from torch import nn

import fxsym


class FusedGroupedHeads(nn.Module):
    """Causal linear attention whose key heads each serve ``num_v_heads // num_k_heads``
    value heads, projected fused per key head, with a per-value-head gate projected the same
    way (``in_proj_ba``'s ``view(b, s, num_k_heads, num_v_heads // num_k_heads)``)."""

    def __init__(self, dim: int = 12, nk: int = 3, nv: int = 6, dk: int = 4, dv: int = 2,
                 *, count_read: bool = False) -> None:
        super().__init__()
        self.num_k_heads, self.num_v_heads = nk, nv
        self.head_k_dim, self.head_v_dim = dk, dv
        self.count_read = count_read
        self.in_proj = nn.Linear(dim, nk * (2 * dk + dv * nv // nk), bias=False)
        self.gate = nn.Linear(dim, nv, bias=False)
        self.out = nn.Linear(nv * dv, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        qkv = self.in_proj(x)
        width = 2 * self.head_k_dim + self.head_v_dim * self.num_v_heads // self.num_k_heads
        qkv = qkv.view(qkv.size()[:-1] + (self.num_k_heads, width))  # noqa: RUF005
        q, k, v = torch.split(qkv, [self.head_k_dim, self.head_k_dim,
                                    self.num_v_heads // self.num_k_heads * self.head_v_dim],
                              dim=3)
        v = v.reshape(b, s, -1, self.head_v_dim)
        beta = self.gate(x).view(b, s, self.num_k_heads, self.num_v_heads // self.num_k_heads)
        beta = beta.reshape(b, s, self.num_v_heads).sigmoid()
        if k.shape[2] != v.shape[2]:
            q = q.repeat_interleave(v.shape[2] // k.shape[2], dim=2)
            k = k.repeat_interleave(v.shape[2] // k.shape[2], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)).tril()
        o = scores @ (v * beta.transpose(1, 2).unsqueeze(-1))
        o = o.transpose(1, 2).reshape(b, s, -1)
        if self.count_read:  # the value heads' count as a number: the tie cannot hold
            o = o * (torch.arange(self.num_v_heads, dtype=o.dtype).sum() + 1)
        return self.out(o)


def _x(dim: int = 12) -> torch.Tensor:
    return torch.randn(2, 5, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def _sliced(model: FusedGroupedHeads, keep: list[int]) -> FusedGroupedHeads:
    """A model of ``len(keep)`` key heads holding the weights of the kept ones, sliced by
    hand: each key head's block of the fused projection, its ``r`` gates and its ``r *
    head_v_dim`` input columns of ``out``."""
    nk, nv, dk, dv = model.num_k_heads, model.num_v_heads, model.head_k_dim, model.head_v_dim
    r = nv // nk
    ref = FusedGroupedHeads(model.in_proj.in_features, len(keep), r * len(keep), dk, dv)
    width = 2 * dk + r * dv
    with torch.no_grad():
        ref.double()
        ref.in_proj.weight.copy_(torch.cat([model.in_proj.weight[h * width:(h + 1) * width]
                                            for h in keep]))
        ref.gate.weight.copy_(torch.cat([model.gate.weight[h * r:(h + 1) * r] for h in keep]))
        ref.out.weight.copy_(torch.cat([model.out.weight[:, h * r * dv:(h + 1) * r * dv]
                                        for h in keep], dim=1))
    return ref.eval()


def test_key_heads_fused_with_their_value_heads_are_one_group() -> None:
    """Before: pinned at the fused view ('a size read from one dim reshapes another': the
    per-head width reads ``num_k_heads``, which sizes the outer dim), then at the value
    heads' reshape and the ``num_k_heads != num_v_heads`` guard."""
    torch.manual_seed(0)
    model = FusedGroupedHeads().double().eval()
    sm = assert_oracles(model, (_x(),))
    heads = group_with(sm, "in_proj", "out_features")
    assert heads.size == 3
    for member in [("gate", "out_features"), ("out", "in_features"),
                   ("", "attr:num_k_heads"), ("", "attr:num_v_heads")]:
        assert member in heads.members, heads.members
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=(_x(),)),
                 {heads.name: torch.tensor([2, 0])})
    assert (resized.num_k_heads, resized.num_v_heads) == (2, 4)
    assert resized.in_proj.out_features == 2 * (2 * 4 + 2 * 2)
    with torch.no_grad():
        torch.testing.assert_close(resized(_x()), _sliced(model, [2, 0])(_x()),
                                   rtol=1e-12, atol=1e-12)


def test_value_heads_count_read_as_a_number_pins_the_key_heads() -> None:
    """The tie of ``num_v_heads`` to the key heads is a claim its other uses are checked
    against: read as a number (``arange(self.num_v_heads)``), it pins the key heads."""
    torch.manual_seed(0)
    model = FusedGroupedHeads(count_read=True).double().eval()
    sm = fxsym.analyze(model, example_inputs=(_x(),))
    assert not has_group_with(sm, "in_proj", "out_features")
    assert sm.why_constant("in_proj", "out_features") is not None


class SolvedColumns(nn.Module):
    """``X = A⁻¹ V`` for a unit lower-triangular ``A`` over the sequence (the delta rule's
    UT transform): each feature column of ``V`` is solved on its own."""

    def __init__(self, dim: int = 6, width: int = 4) -> None:
        super().__init__()
        self.v = nn.Linear(dim, width)
        self.a = nn.Linear(dim, 3)
        self.out = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.a(x)
        system = (k @ k.transpose(-1, -2)).tril(-1) * 0.1
        solved = torch.linalg.solve_triangular(system, self.v(x), upper=False,
                                               unitriangular=True)
        return self.out(solved)


class SolvedFeatures(nn.Module):
    """A triangular system over the features themselves: the features are its dims."""

    def __init__(self, dim: int = 6, width: int = 4) -> None:
        super().__init__()
        self.v = nn.Linear(dim, width)
        self.system = nn.Parameter(torch.eye(width) + torch.randn(width, width).tril(-1))
        self.out = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        solved = torch.linalg.solve_triangular(self.system, self.v(x).unsqueeze(-1),
                                               upper=False)
        return self.out(solved.squeeze(-1))


def test_a_triangular_solve_passes_the_columns_it_solves() -> None:
    """Before: 'no op rule for linalg_solve_triangular' pinned the columns."""
    torch.manual_seed(0)
    model = SolvedColumns().double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    sm = assert_oracles(model, (x,))
    cols = group_with(sm, "v", "out_features")
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=(x,)),
                 {cols.name: torch.tensor([3, 1])})
    ref = copy.deepcopy(model)
    with torch.no_grad():
        ref.v = nn.Linear(6, 2).double()
        ref.v.weight.copy_(model.v.weight[[3, 1]])
        ref.v.bias.copy_(model.v.bias[[3, 1]])
        ref.out = nn.Linear(2, 6).double()
        ref.out.weight.copy_(model.out.weight[:, [3, 1]])
        ref.out.bias.copy_(model.out.bias)
        torch.testing.assert_close(resized(x), ref(x), rtol=1e-12, atol=1e-12)


def test_a_triangular_solve_over_the_features_pins_them() -> None:
    model = SolvedFeatures().double().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(3, 6, dtype=torch.float64),))
    assert not has_group_with(sm, "v", "out_features")
    assert "triangular solve" in str(sm.why_constant("v", "out_features"))


class TwiceAsWide(nn.Module):
    """A guard comparing a dim with its own group laid twice: ``2C > C`` for every ``C``."""

    def __init__(self, threshold: int | None = None) -> None:
        super().__init__()
        self.threshold = threshold
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(8, 3)
        self.c = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        hh = torch.cat([h, 2 * h], -1)
        bound = h.shape[-1] if self.threshold is None else self.threshold
        if hh.shape[-1] > bound:
            return self.b(hh) + self.c(h)
        return self.c(h)


def test_a_guard_between_sizes_of_one_group_is_decided_on_their_difference() -> None:
    """Before: each side's interval ([2, 8] against [1, 4]) overlapped, so the guard pinned."""
    x = torch.randn(3, 6, dtype=torch.float64)
    sm = assert_oracles(TwiceAsWide().double().eval(), (x,))
    assert group_with(sm, "a", "out_features").size == 4


def test_a_guard_against_a_number_still_pins() -> None:
    """``2C > 6`` holds for ``C == 4`` but not for ``C <= 3``: pinned, as before."""
    x = torch.randn(3, 6, dtype=torch.float64)
    sm = fxsym.analyze(TwiceAsWide(threshold=6).double().eval(), example_inputs=(x,))
    assert not has_group_with(sm, "a", "out_features")
