"""Focused tests of the nn plugin's op rules and families: each hard op, with both oracles."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles
from torch import nn

import fxsym


def _groups(sm: fxsym.SymMap) -> dict[str, set[tuple[str, str]]]:
    return {g.name: set(g.members) for g in sm.groups()}


def test_multihead_attention_embed_dim_in_whole_heads() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(6, 16)
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
            self.norm = nn.LayerNorm(16)
            self.out = nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            a, _ = self.attn(h, h, h, need_weights=False)
            return self.out(self.norm(h + a))

    model = Block()
    sm = assert_oracles(model, (torch.randn(2, 5, 6),))
    g = sm.group("inp.out_features")
    assert (g.size, g.unit) == (4, 4)  # the embedding dim goes a head at a time
    assert {("attn", "embed_dim"), ("attn", "embed_dim_out"), ("norm", "normalized_shape"),
            ("out", "in_features")} <= set(g.members)
    fxsym.resize(model, sm, {"inp.out_features": [3, 1]})
    assert (model.attn.embed_dim, model.attn.num_heads, model.attn.head_dim) == (8, 2, 4)
    assert model(torch.randn(1, 7, 6)).shape == (1, 7, 3)


def test_channel_shuffle_is_never_a_wrong_group() -> None:
    class Shuffle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 1)
            self.b = nn.Conv2d(8, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            n, c, h, w = y.shape
            y = y.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
            return self.b(y)

    # an interleaving of two blocks: a's channels are cut in halves, which keep the same
    # channels (tests/test_fused_blocks.py)
    sm = assert_oracles(Shuffle(), (torch.randn(2, 3, 4, 4),))
    assert [g.name for g in sm.groups()] == ["a.out_channels#0"]
    sm = assert_oracles(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ChannelShuffle(2), nn.Conv2d(8, 2, 1)),
                        (torch.randn(1, 3, 4, 4),), min_groups=0,
                        expect_unchecked=True)
    assert sm.groups() == []


def test_cat_of_cat_split_chunk_unbind() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5, 1), nn.Conv2d(3, 6, 1)
            self.d = nn.Conv2d(15, 7, 1)
            self.e = nn.Conv2d(7, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cat([torch.cat([self.a(x), self.b(x)], 1), self.c(x)], 1)
            z = self.d(y)
            top, bottom = z.split(2, dim=2)  # along a fixed (spatial) dim: groups pass through
            rows = torch.stack(z.unbind(3), 3)
            first, _ = z.chunk(2, dim=1)  # along the elastic dim: pinned
            return self.e(top + bottom + rows[:, :, :2]) + first.sum()

    sm = assert_oracles(M(), (torch.randn(2, 3, 4, 4),), min_groups=3)
    assert set(_groups(sm)) == {"a.out_channels", "b.out_channels", "c.out_channels"}
    dim = sm.analysis.symbol_dims[("d", "in_channels")]
    assert [s.length for s in dim] == [4, 5, 6]


def test_channels_last_permute_and_layer_norm_last_dim() -> None:
    class ConvNeXtish(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 1)
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.norm = nn.LayerNorm(8)
            self.pw1 = nn.Linear(8, 16)
            self.pw2 = nn.Linear(16, 8)
            self.gamma = nn.Parameter(torch.rand(8))
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
            return self.head(x + y.permute(0, 3, 1, 2))

    model = ConvNeXtish()
    sm = assert_oracles(model, (torch.randn(2, 3, 5, 5),), min_groups=2)
    groups = _groups(sm)
    assert {("pw2", "out_features"), ("norm", "normalized_shape"), ("", "gamma:0"),
            ("dw", "in_channels"), ("head", "in_channels")} <= groups["stem.out_channels"]
    assert groups["pw1.out_features"] == {("pw1", "out_features"), ("pw2", "in_features")}
    fxsym.resize(model, sm, {"stem.out_channels": 5})
    assert model.gamma.shape == (5,) and isinstance(model.gamma, nn.Parameter)


def test_matmul_einsum_sdpa_contracted_dims() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(4, 6)
            self.w = nn.Parameter(torch.randn(6, 3))
            self.o = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = torch.einsum("bid,bjd->bij", self.q(x), self.k(x)).softmax(-1)
            y = torch.bmm(s, self.v(x)) @ self.w
            z = F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))
            return self.o(y + z @ self.w)

    sm = assert_oracles(M(), (torch.randn(2, 5, 4),), min_groups=2)
    groups = _groups(sm)
    assert groups["q.out_features"] == {("q", "out_features"), ("k", "out_features")}
    assert groups["v.out_features"] == {("v", "out_features"), ("", "w:0")}


def test_conv_transpose_prelu_pixel_shuffle() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8),
        nn.ConvTranspose2d(8, 12, 2, stride=2), nn.BatchNorm2d(12),
        nn.PixelShuffle(2),  # 12 channels -> 3 channels of 4 sub-pixels
        nn.Conv2d(3, 2, 1),
    )
    sm = assert_oracles(model, (torch.randn(1, 3, 4, 4),), min_groups=2)
    groups = {g.name: g for g in sm.groups()}
    assert set(groups["0.out_channels"].members) == {
        ("0", "out_channels"), ("1", "num_parameters"), ("2", "in_channels")}
    g = groups["2.out_channels"]
    assert (g.size, g.unit) == (3, 4)
    assert ("5", "in_channels") in g.members


def test_functional_forms_of_modules() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 6, 1)
            self.w = nn.Parameter(torch.randn(5, 6, 3, 3))
            self.bn_w, self.bn_b = nn.Parameter(torch.ones(5)), nn.Parameter(torch.zeros(5))
            self.register_buffer("mean", torch.zeros(5))
            self.register_buffer("var", torch.ones(5))
            self.fc_w = nn.Parameter(torch.randn(4, 5))
            self.out = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.conv2d(self.a(x), self.w, padding=1)
            y = F.batch_norm(y, self.mean, self.var, self.bn_w, self.bn_b, training=False)
            return self.out(F.linear(F.relu(y).mean((2, 3)), self.fc_w))

    sm = assert_oracles(M(), (torch.randn(2, 3, 4, 4),), min_groups=1)
    assert _groups(sm)["a.out_channels"] == {("a", "out_channels"), ("", "w:1")}


def test_recurrent_layers_chained_between_linears_are_exact() -> None:
    """An LSTM's hidden size feeds a GRU and the GRU's a linear: each is a group of its own
    (tests/test_recurrent.py covers the families one by one), and every oracle holds."""
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(3, 8)
            self.lstm = nn.LSTM(8, 6, batch_first=True)
            self.gru = nn.GRU(6, 5, batch_first=True)
            self.out = nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, _ = self.lstm(self.inp(x))
            y, _ = self.gru(y)
            return self.out(y)

    sm = assert_oracles(M(), (torch.randn(2, 4, 3),), min_groups=3)
    for qualname in ("lstm", "gru"):
        assert any(q == qualname for g in sm.groups() for q, _ in g.members), qualname


def test_stochastic_depth_and_dropout_pass_channels() -> None:
    torchvision = __import__("pytest").importorskip("torchvision")

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 1)
            self.b = nn.Conv2d(8, 8, 1)
            self.sd = torchvision.ops.StochasticDepth(0.2, "row")
            self.drop = nn.Dropout2d(0.1)
            self.c = nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            return self.c(self.drop(y + self.sd(self.b(y))))

    sm = assert_oracles(M(), (torch.randn(2, 3, 4, 4),))
    assert _groups(sm)["a.out_channels"] == {("a", "out_channels"), ("b", "in_channels"),
                                            ("b", "out_channels"), ("c", "in_channels")}


def test_a_slice_read_only_for_its_shape_does_not_pin() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.b = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            n = h[:, 0].shape[0]  # only the shape of the slice is used
            return self.b(h).view(n, -1)

    sm = assert_oracles(M(), (torch.randn(3, 4),))
    assert [g.name for g in sm.groups()] == ["a.out_features"]
