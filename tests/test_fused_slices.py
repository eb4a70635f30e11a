"""Fused projections cut by sizes, and interleaved (heads, 3, head_dim) views (issue 11, 2).

A slice whose bounds are computed from sizes cuts the dim into blocks. Where a bound follows
a resize (``qkv[..., :self.n_q * self.head_dim]``: linear in the kept heads once
``head_dim`` is pinned) the part before it is tied to the size it is computed from, so the
attributes become members; where it is constant (``x[..., :cos.shape[-1]]``) only the parts
whose size it fixes are pinned, as for a slice written with numbers.
A view into ``(heads, 3, head_dim)`` whose heads end constant (BLOOM: a per-head bias built
from the head count) is read instead as equal blocks: every head keeps the same ``head_dim``
entries of its query, key and value, and ``head_dim`` is a group. Each model is checked with
both oracles and by an exact comparison with a masked copy.
"""

from __future__ import annotations

import copy

import torch
from helpers import assert_oracles
from torch import nn

import fxsym


class SlicedBySizes(nn.Module):
    """A fused projection cut into q (2 heads), k and v (1 key/value head) at bounds computed
    from the module's attributes; v's features leave through ``out`` unviewed."""

    def __init__(self) -> None:
        super().__init__()
        self.n_q, self.n_kv, self.head_dim = 2, 1, 4
        self.qkv = nn.Linear(8, (2 + 2 * 1) * 4)
        self.out = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.qkv(x)
        q_end = self.n_q * self.head_dim
        k_end = q_end + self.n_kv * self.head_dim
        q = h[..., :q_end].reshape(*x.shape[:-1], -1, self.head_dim)
        k = h[..., q_end:k_end]
        v = h[..., k_end:]
        scores = torch.einsum("bshd,btd->bst", q, k)
        return self.out(torch.softmax(scores, dim=-1) @ v)


class RotaryBySize(nn.Module):
    """A rotation of the leading ``cos.shape[-1]`` features (a rotary slice whose bound is a
    size read from the cos table)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 12)
        self.out = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        cos = torch.cos(torch.arange(x.shape[1], dtype=x.dtype)[:, None] * torch.ones(4))
        n = cos.shape[-1]
        rot, rest = h[..., :n], h[..., n:]
        rot = rot * cos + torch.cat([-rot[..., 2:], rot[..., :2]], dim=-1)
        return self.out(torch.cat([rot, rest], dim=-1))


class Interleaved(nn.Module):
    """BLOOM's attention in small: one projection viewed ``(heads, 3, head_dim)``, heads
    folded into the batch, a per-head bias built from the head count (``bias=True``: it pins
    the heads), heads merged back by ``num_heads * head_dim``."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.bias = 2, 4, bias
        self.qkv = nn.Linear(8, 3 * 8)
        self.dense = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fused = self.qkv(x).view(b, s, self.num_heads, 3, self.head_dim)
        q, k, v = (fused[..., i, :].transpose(1, 2) for i in range(3))
        q = q.reshape(b * self.num_heads, s, self.head_dim)
        k = k.reshape(b * self.num_heads, s, self.head_dim).transpose(-1, -2)
        v = v.reshape(b * self.num_heads, s, self.head_dim)
        base = torch.zeros(1, 1, s)
        if self.bias:
            slopes = torch.arange(1, 1 + self.num_heads, dtype=x.dtype)
            base = slopes.repeat(b)[:, None, None] * torch.ones(1, 1, s)
        probs = torch.softmax(base.baddbmm(q, k, alpha=0.5), dim=-1)
        ctx = torch.bmm(probs, v).view(b, self.num_heads, s, self.head_dim)
        ctx = ctx.permute(0, 2, 1, 3).reshape(b, s, self.num_heads * self.head_dim)
        return self.dense(ctx)


def _resized(model: nn.Module, inputs: tuple[torch.Tensor, ...],
             choices: dict[str, list[int]]) -> nn.Module:
    clone = copy.deepcopy(model)
    return fxsym.resize(clone, fxsym.analyze(clone, example_inputs=inputs), choices)


def _groups(sm: fxsym.SymMap) -> dict[str, fxsym.SymGroup]:
    return {g.name: g for g in sm.groups()}


def _zeroed(model: nn.Module, name: str, rows: list[int]) -> nn.Module:
    out = copy.deepcopy(model)
    mod = out.get_submodule(name)
    with torch.no_grad():
        mod.weight[rows] = 0
        mod.bias[rows] = 0
    return out


def test_fused_projection_sliced_by_computed_sizes() -> None:
    torch.manual_seed(0)
    model = SlicedBySizes().eval()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    (v,) = groups.values()  # the block after both cuts
    assert v.name.startswith("qkv.out_features#"), v.name
    assert v.size == 4 and set(v.members) == {("qkv", "out_features"), ("out", "in_features")}
    table = sm.analysis.table
    dim = sm.analysis.symbol_dims[("qkv", "out_features")]
    reasons = [table.reason(s.group) for s in dim]
    assert [s.length for s in dim] == [8, 4, 4] and table.find(dim[2].group) == v.id
    assert reasons[2] is None and all("slice bound" in str(r) for r in reasons[:2]), reasons

    resized = _resized(model, inputs, {v.name: [0, 3]})
    assert resized.qkv.out_features == 14 and resized.out.in_features == 2
    reference = _zeroed(model, "qkv", [13, 14])
    for shape in [(2, 5, 8), (1, 3, 8)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(resized(x), reference(x), rtol=1e-5, atol=1e-5)


def test_rotary_slice_by_a_size_pins_only_its_part() -> None:
    torch.manual_seed(0)
    model = RotaryBySize().eval()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    assert set(groups) == {"proj.out_features#1"}, set(groups)
    rest = groups["proj.out_features#1"]
    assert rest.size == 8 and ("out", "in_features") in rest.members


def test_interleaved_heads_view_keeps_head_dim_when_heads_are_pinned() -> None:
    torch.manual_seed(0)
    model = Interleaved().eval()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    assert set(groups) == {"qkv.out_features#0#0"}, set(groups)
    hd = groups["qkv.out_features#0#0"]
    assert hd.size == 4
    assert set(hd.members) == {("qkv", "out_features"), ("", "attr:head_dim"),
                               ("dense", "in_features")}
    assert any(e.kind == "alternative" for e in sm.trace_report), str(sm.trace_report)

    keep = [1, 3]
    resized = _resized(model, inputs, {hd.name: keep})
    assert resized.head_dim == 2 and resized.qkv.out_features == 12
    assert resized.dense.in_features == 4
    drop = [h * 12 + j * 4 + d for h in range(2) for j in range(3) for d in (0, 2)]
    reference = _zeroed(model, "qkv", drop)
    for shape in [(2, 5, 8), (3, 2, 8)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(resized(x), reference(x), rtol=1e-5, atol=1e-5)


def test_interleaved_heads_view_keeps_heads_when_they_are_free() -> None:
    torch.manual_seed(0)
    model = Interleaved(bias=False).eval()
    inputs = (torch.randn(2, 5, 8),)
    sm = fxsym.analyze(model, example_inputs=inputs)
    assert not any(e.kind == "alternative" for e in sm.trace_report), str(sm.trace_report)
    assert "qkv.out_features" in _groups(sm) and _groups(sm)["qkv.out_features"].size == 2
    assert_oracles(model, inputs)


def _repeat_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: each key/value head repeated for its query heads."""
    b, kv, s, d = t.shape
    return t[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)


class GQASliced(nn.Module):
    """Phi-3's attention in small: one ``qkv`` projection sliced at
    ``n_q * head_dim`` and ``n_q * head_dim + n_kv * head_dim`` (attribute sizes), heads split
    by ``view(..., -1, head_dim)``, key/value heads repeated for their query heads."""

    def __init__(self) -> None:
        super().__init__()
        self.n_q, self.n_kv, self.head_dim, self.rep = 4, 2, 3, 2
        self.qkv = nn.Linear(8, (4 + 2 * 2) * 3)
        self.out = nn.Linear(4 * 3, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.qkv(x)
        q_end = self.n_q * self.head_dim
        k_end = q_end + self.n_kv * self.head_dim
        q, k, v = h[..., :q_end], h[..., q_end:k_end], h[..., k_end:]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        k, v = (_repeat_kv(t, self.rep) for t in (k, v))
        att = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return self.out(att.transpose(1, 2).reshape(b, s, -1))


def test_gqa_projection_sliced_by_attribute_sizes_keeps_its_heads() -> None:
    torch.manual_seed(0)
    model = GQASliced().eval()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    groups = _groups(sm)
    heads = [g for g in groups.values() if g.name.startswith("qkv.out_features#")]
    assert len(heads) == 1 and heads[0].size == 2, set(groups)  # key/value heads
    assert {("", "attr:n_q"), ("", "attr:n_kv"), ("out", "in_features")} <= set(heads[0].members)

    resized = _resized(model, inputs, {heads[0].name: [1]})
    assert (resized.n_q, resized.n_kv, resized.qkv.out_features) == (2, 1, 12)
    drop = [*range(0, 6), *range(12, 15), *range(18, 21)]  # query heads 0-1, kv head 0
    reference = _zeroed(model, "qkv", drop)  # a zero value head adds nothing to `out`
    for shape in [(2, 5, 8), (1, 7, 8)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(resized(x), reference(x), rtol=1e-5, atol=1e-5)
