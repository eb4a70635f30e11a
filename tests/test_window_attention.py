"""Window attention with head counts in attributes and a relative-position bias table.

MaxViT's attention (issue 11) splits a fused ``qkv`` projection by ``self.n_heads`` and
``self.head_dim``, adds a bias gathered from a table of ``(positions, heads)`` entries by a
buffer of indices, and merges the heads back with a size read from its input
(``out.reshape(B, G, P, D)``). Each of these used to pin the heads and the residual width:

* the attribute reads lost their identity once a ``chunk`` had split a group, so the reshape
  by ``self.n_heads`` no longer tied the attribute;
* ``table[index]`` (advanced indexing) was a boundary; it addresses the table's rows by
  position (pinned) and passes its heads dim through;
* a reshape by a size read from another dim pinned both; where both are one group of equal
  size, the two now keep equal sizes (a same-size class).
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym


def _relative_index(size: int) -> torch.Tensor:
    coords = torch.stack(torch.meshgrid(torch.arange(size), torch.arange(size),
                                        indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (size - 1)
    return rel[..., 0] * (2 * size - 1) + rel[..., 1]


class BiasedAttention(nn.Module):
    """Multi-head attention over windows of ``size * size`` tokens: heads from attributes, a
    relative-position bias table with one column per head."""

    def __init__(self, dim: int, head_dim: int, size: int) -> None:
        super().__init__()
        self.n_heads = dim // head_dim
        self.head_dim = head_dim
        self.tokens = size * size
        self.qkv = nn.Linear(dim, 3 * dim)
        self.merge = nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn((2 * size - 1) ** 2, self.n_heads))
        self.register_buffer("index", _relative_index(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, g, p, d = x.shape
        q, k, v = torch.chunk(self.qkv(x), 3, dim=-1)
        q = q.reshape(b, g, p, self.n_heads, self.head_dim).permute(0, 1, 3, 2, 4)
        k = k.reshape(b, g, p, self.n_heads, self.head_dim).permute(0, 1, 3, 2, 4)
        v = v.reshape(b, g, p, self.n_heads, self.head_dim).permute(0, 1, 3, 2, 4)
        bias = self.table[self.index.view(-1)].view(self.tokens, self.tokens, -1)
        scores = q @ k.transpose(-1, -2) + bias.permute(2, 0, 1).unsqueeze(0)
        out = (scores.softmax(-1) @ v).permute(0, 1, 3, 2, 4).reshape(b, g, p, d)
        return self.merge(out)


class WindowBlock(nn.Module):
    """A conv stem, window partition into ``p x p`` windows, attention, departition."""

    def __init__(self, dim: int = 8, head_dim: int = 2, p: int = 2) -> None:
        super().__init__()
        self.p = p
        self.stem = nn.Conv2d(3, dim, 1)
        self.attn = BiasedAttention(dim, head_dim, p)
        self.head = nn.Conv2d(dim, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        b, c, h, w = y.shape
        p = self.p
        t = y.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        t = t.reshape(b, (h // p) * (w // p), p * p, c)
        t = t + self.attn(t)
        t = t.reshape(b, h // p, w // p, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return self.head(t.reshape(b, c, h, w))


class TableOnly(nn.Module):
    """Per-head scores plus a bias table indexed by a buffer, heads from a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = 4
        self.q = nn.Linear(6, self.heads * 3)
        self.table = nn.Parameter(torch.randn(9, self.heads))
        self.register_buffer("index", _relative_index(2))
        self.out = nn.Linear(self.heads * 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, 3).transpose(1, 2)
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        attn = (q @ q.transpose(-1, -2) + bias).softmax(-1)
        return self.out((attn @ q).transpose(1, 2).flatten(2))


def _groups(sm: fxsym.SymMap) -> dict[str, fxsym.SymGroup]:
    return {g.name: g for g in sm.groups()}


def test_window_attention_heads_and_width_are_groups() -> None:
    torch.manual_seed(0)
    model = WindowBlock().eval()
    x = torch.randn(2, 3, 4, 4)
    sm = assert_oracles(model, (x,))
    groups = _groups(sm)
    heads = groups["attn.qkv.out_features#0"]
    assert (heads.size, heads.unit) == (4, 2)
    assert ("attn", "attr:n_heads") in heads.members
    assert ("attn", "table:1") in heads.members
    assert ("attn", "attr:head_dim") not in heads.members
    width = groups["stem.out_channels"]
    # the merge reshapes heads back by the input's width: both keep equal sizes, whole heads
    assert width.unit == 2 and heads.name in width.same_size
    assert {("attn.qkv", "in_features"), ("attn.merge", "out_features"),
            ("head", "in_channels")} <= set(width.members)


def test_window_attention_resize_drops_a_silent_head() -> None:
    torch.manual_seed(0)
    model = WindowBlock().eval()
    x = torch.randn(2, 3, 4, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    with torch.no_grad():  # v's head 1 and width unit 3 contribute nothing: drop both
        model.attn.qkv.weight[16 + 2:16 + 4] = 0
        model.attn.qkv.bias[16 + 2:16 + 4] = 0
        model.stem.weight[6:] = 0
        model.stem.bias[6:] = 0
        model.attn.merge.weight[6:] = 0
        model.attn.merge.bias[6:] = 0
    inputs = [torch.randn(b, 3, 2 * s, 2 * s) for b, s in [(2, 2), (1, 3), (3, 1)]]
    expected = [model(t) for t in inputs]
    fxsym.resize(model, sm, {"attn.qkv.out_features#0": [0, 2, 3],
                             "stem.out_channels": [0, 1, 2]})
    assert (model.attn.n_heads, model.attn.head_dim) == (3, 2)
    assert model.attn.table.shape == (9, 3) and model.attn.qkv.out_features == 18
    assert model.stem.out_channels == 6 and model.attn.merge.out_features == 6
    for t, out in zip(inputs, expected, strict=True):
        torch.testing.assert_close(model(t), out)


def test_width_and_heads_must_keep_equal_sizes() -> None:
    model = WindowBlock().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 4, 4),))
    assert {"attn.qkv.out_features#0", "stem.out_channels"} <= set(_groups(sm))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(fxsym.ResizeError):
        fxsym.resize(model, sm, {"attn.qkv.out_features#0": 2, "stem.out_channels": 3})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_bias_table_indexed_by_a_buffer_is_a_member_of_the_heads() -> None:
    torch.manual_seed(0)
    model = TableOnly().eval()
    x = torch.randn(2, 4, 6)
    sm = assert_oracles(model, (x,))
    group = _groups(sm)["q.out_features"]
    assert (group.size, group.unit) == (4, 3)
    assert ("", "table:1") in group.members and ("", "attr:heads") in group.members
    assert not any(m == ("", "table:0") for g in sm.groups() for m in g.members)
    with torch.no_grad():  # head 2 contributes nothing to the output
        model.out.weight[:, 6:9] = 0
    expected = model(x)
    fxsym.resize(model, sm, {group.name: [0, 1, 3]})
    assert model.table.shape == (9, 3) and model.heads == 3
    torch.testing.assert_close(model(x), expected)


@pytest.mark.parametrize("index", ["list", "mask", "two"])
def test_other_advanced_indexing_still_pins(index: str) -> None:
    class Pick(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            if index == "list":
                y = y[:, [0, 2, 4]]
            elif index == "mask":
                y = y[:, y[0] > 0]
            else:
                y = y[torch.tensor([0, 1]), torch.tensor([1, 2])][:, None]
            return self.b.weight[:, : y.shape[1]].sum() + y.sum()

    sm = fxsym.analyze(Pick().eval(), example_inputs=(torch.randn(2, 4),))
    assert "a.out_features" not in _groups(sm)
