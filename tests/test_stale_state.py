"""A resize leaves no stale derived state (issue 19, item 4).

An eval forward fills module caches (timm's ``attention_bias_cache``); a resize that changes
what they were computed from clears what the trace proved to be a cache (the forward fills it
again from empty) and refuses, naming the attribute, derived tensors it cannot prove so.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fxsym
from fxsym.plugins import default_plugin_manager


class BiasCached(nn.Module):
    """timm-style attention: a per-head bias gathered by index, cached per device in eval."""

    def __init__(self, dim: int = 16, heads: int = 4, tokens: int = 5) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attention_biases = nn.Parameter(torch.randn(heads, tokens))
        self.register_buffer("idxs", torch.randint(0, tokens, (tokens, tokens)),
                             persistent=False)
        self.attention_bias_cache: dict[str, torch.Tensor] = {}

    def biases(self, device: torch.device) -> torch.Tensor:
        if self.training:
            return self.attention_biases[:, self.idxs]
        key = str(device)
        if key not in self.attention_bias_cache:
            self.attention_bias_cache[key] = self.attention_biases[:, self.idxs]
        return self.attention_bias_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(
            2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) + self.biases(x.device)).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1))


class Net(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.block = block
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.inp(x)))


X = torch.randn(2, 5, 8)


def _heads_group(sm: fxsym.SymMap, owner: str) -> fxsym.SymGroup:
    """The group holding ``owner``'s per-head bias rows."""
    for g in sm.groups():
        if (owner, "attention_biases:0") in g.members:
            return g
    raise AssertionError(f"no group holds {owner}.attention_biases:0: {sm.groups()}")


def _fresh(model: nn.Module) -> torch.Tensor:
    """The output with every cache recomputed."""
    clone = copy.deepcopy(model)
    for mod in clone.modules():
        if isinstance(getattr(mod, "attention_bias_cache", None), dict):
            mod.attention_bias_cache.clear()
    with torch.no_grad():
        return clone(X)


def test_permuting_heads_after_an_eval_forward_keeps_the_outputs() -> None:
    torch.manual_seed(0)
    model = Net(BiasCached()).eval()
    with torch.no_grad():
        expected = model(X)
    assert model.block.attention_bias_cache  # filled by the eval forward
    sm = fxsym.analyze(model, example_inputs=(X,))
    group = _heads_group(sm, "block")
    order = list(range(group.size))[::-1]
    fxsym.resize(model, sm, {group.name: order})
    with torch.no_grad():
        torch.testing.assert_close(model(X), expected, rtol=1e-5, atol=1e-6)


def test_shrinking_heads_after_an_eval_forward_recomputes_the_cache() -> None:
    torch.manual_seed(0)
    model = Net(BiasCached()).eval()
    with torch.no_grad():
        model(X)
    sm = fxsym.analyze(model, example_inputs=(X,))
    group = _heads_group(sm, "block")
    fxsym.resize(model, sm, {group.name: [0, 2]})
    with torch.no_grad():
        got = model(X)
    torch.testing.assert_close(got, _fresh(model))


def test_the_cache_is_found_whether_analyzed_before_or_after_the_eval_forward() -> None:
    torch.manual_seed(0)
    fresh = Net(BiasCached()).eval()
    used = copy.deepcopy(fresh)
    with torch.no_grad():
        used(X)
    groups = [[(g.name, g.size, tuple(g.members)) for g in fxsym.analyze(
        m, example_inputs=(X,)).groups()] for m in (fresh, used)]
    assert groups[0] == groups[1]


def test_a_failed_resize_puts_the_cache_back() -> None:
    torch.manual_seed(0)
    model = Net(BiasCached()).eval()
    with torch.no_grad():
        model(X)
    cache = model.block.attention_bias_cache
    entry = cache["cpu"]
    sm = fxsym.analyze(model, example_inputs=(X,))
    group = _heads_group(sm, "block")

    class Failing:
        @fxsym.hookimpl
        def fxsym_after_resize(self, model: nn.Module, symmap: object, kept: object,
                               sizes: object) -> None:
            raise RuntimeError("boom")

    pm = default_plugin_manager()
    pm.register(Failing(), name="failing-after-resize")
    try:
        with pytest.raises(fxsym.ResizeError):
            fxsym.resize(model, sm, {group.name: [0, 2]})
    finally:
        pm.unregister(name="failing-after-resize")
        pm.failed = [f for f in pm.failed if f.name != "failing-after-resize"]
    assert model.block.attention_bias_cache is cache and cache == {"cpu": entry}
    assert cache["cpu"] is entry


class Table(nn.Module):
    """Holds a dict of tensors computed once from its weight, read (never refilled) by forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.table = {"gain": self.lin.weight.detach().abs().mean()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table["gain"]


def test_derived_tensors_not_shown_to_be_a_cache_are_refused_by_name() -> None:
    torch.manual_seed(0)
    model = Net(Table()).eval()
    sm = fxsym.analyze(model, example_inputs=(X,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    groups = {g.name: g for g in sm.groups()}
    touched = [g for g in groups.values() if any(q == "block.lin" for q, _ in g.members)]
    assert touched
    with pytest.raises(fxsym.StaleStateError, match=r"block\.table"):
        fxsym.resize(model, sm, {touched[0].name: list(range(touched[0].size - 1))})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not sm.is_stale


class ScaledLinear(nn.Linear):
    """A leaf family (registered below) that caches a weight computed from its own."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "w" not in self.cache:
            self.cache["w"] = self.weight * 2
        return nn.functional.linear(x, self.cache["w"], self.bias)


def test_a_cache_a_leaf_fills_when_run_for_its_value_is_a_cache() -> None:
    from fxsym_plugins_nn.modules import linear_info, linear_resize

    fxsym.SymMap.register(ScaledLinear, resize=linear_resize)(linear_info)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(ScaledLinear(8, 12), nn.ReLU(), nn.Linear(12, 3)).eval()
        with torch.no_grad():
            model(X)
        sm = fxsym.analyze(model, example_inputs=(X,))
        assert sm.derived_state == {"0": {"cache": "cache"}}
        (group,) = [g for g in sm.groups() if ("0", "out_features") in g.members]
        fxsym.resize(model, sm, {group.name: [1, 4, 7]})
        assert model[0].cache == {}
        with torch.no_grad():
            torch.testing.assert_close(model(X), _fresh_sequential(model))
    finally:
        fxsym.SymMap.unregister(ScaledLinear)


def _fresh_sequential(model: nn.Module) -> torch.Tensor:
    clone = copy.deepcopy(model)
    clone[0].cache.clear()
    with torch.no_grad():
        return clone(X)


def _biased_heads(sm: fxsym.SymMap) -> list[fxsym.SymGroup]:
    return [g for g in sm.groups() if any(s == "attention_biases:0" for _, s in g.members)]


@pytest.mark.parametrize("name", ["tiny_vit_5m_224", "levit_128s", "efficientformer_l1"])
def test_timm_attention_bias_caches_after_an_eval_forward(name: str) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    with torch.no_grad():  # random biases: timm starts them at zero, where no order shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = model(x)  # the user measures before pruning: the caches fill
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert any(kind == "cache" for attrs in sm.derived_state.values()
               for kind in attrs.values())
    heads = _biased_heads(sm)
    assert heads
    fxsym.resize(model, sm, {g.name: list(range(g.size))[::-1] for g in heads})
    with torch.no_grad():
        got = model(x)
    assert float((got - expected).norm() / expected.norm()) < 1e-5  # stale: ~3e-4
    sm = fxsym.analyze(model, example_inputs=(x,))
    fxsym.resize(model, sm, {g.name: max(1, g.size // 2) for g in _biased_heads(sm)})
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        got = model(x)
    fresh = copy.deepcopy(model)
    for mod in fresh.modules():
        if isinstance(getattr(mod, "attention_bias_cache", None), dict):
            mod.attention_bias_cache.clear()
    with torch.no_grad():
        torch.testing.assert_close(got, fresh(x))


class Grid(nn.Module):
    """ultralytics' ``Detect`` in small: cell centres and a scale computed from the feature
    map's spatial size (and constants), kept on the module and recomputed only when the input
    size changes. They depend on no weight and no resizable size: a resize cannot make them
    stale, so it need not refuse them."""

    shape = None
    grid = torch.empty(0)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.shape != y.shape[2:]:
            h, w = y.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h).type_as(y) + 0.5,
                                    torch.arange(w).type_as(y) + 0.5, indexing="ij")
            self.grid = torch.stack((sx, sy)).unsqueeze(0)
            self.scale = y.new_full((1, 1, h, w), 8.0)
            self.shape = y.shape[2:]
        return self.head(y) * self.scale + self.grid


IMG, OTHER = torch.randn(1, 3, 6, 5), torch.randn(1, 3, 4, 7)


@pytest.mark.parametrize("order", ["forward-then-analyze", "analyze-then-forward"])
def test_state_derived_from_spatial_sizes_only_does_not_block_a_resize(order: str) -> None:
    torch.manual_seed(0)
    model = Grid().eval()
    fresh = copy.deepcopy(model)
    if order == "forward-then-analyze":  # at another size: the trace recomputes the grid
        with torch.no_grad():
            model(OTHER)
        sm = fxsym.analyze(model, example_inputs=(IMG,))
    else:
        sm = fxsym.analyze(model, example_inputs=(IMG,))
        with torch.no_grad():
            model(IMG)
    assert sm.derived_state[""]["grid"] == "invariant"
    assert sm.derived_state[""]["scale"] == "invariant"
    keep = [0, 2, 5]
    fxsym.resize(model, sm, {"conv.out_channels": keep})
    fresh_sm = fxsym.analyze(fresh, example_inputs=(IMG,))
    fxsym.resize(fresh, fresh_sm, {"conv.out_channels": keep})
    with torch.no_grad():
        torch.testing.assert_close(model(IMG), fresh(IMG))
        torch.testing.assert_close(model(OTHER), fresh(OTHER))


class WeightGrid(Grid):
    """The same, but the kept tensor is computed from the conv's weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.shape != y.shape[2:]:
            self.grid = self.conv.weight.sum().expand(1, 2, *y.shape[2:])
            self.scale = y.new_full((1, 1, *y.shape[2:]), 8.0)
            self.shape = y.shape[2:]
        return self.head(y) * self.scale + self.grid


class ChannelGrid(Grid):
    """The same, but the kept tensor is sized by the conv's (resizable) output channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.shape != y.shape[2:]:
            self.grid = torch.zeros(1, y.shape[1], *y.shape[2:])
            self.scale = y.new_full((1, 1, *y.shape[2:]), 8.0)
            self.shape = y.shape[2:]
        return self.head(y + self.grid) * self.scale


@pytest.mark.parametrize("cls", [WeightGrid, ChannelGrid])
def test_state_derived_from_a_weight_or_a_resizable_size_is_refused(cls: type[Grid]) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    sm = fxsym.analyze(model, example_inputs=(IMG,))
    with torch.no_grad():
        model(IMG)
    assert sm.derived_state[""]["grid"] == "derived"
    assert sm.derived_state[""]["scale"] == "invariant"
    assert "conv.out_channels" in [g.name for g in sm.groups()]
    with pytest.raises(fxsym.StaleStateError, match=r"^grid holds"):
        fxsym.resize(model, sm, {"conv.out_channels": [0, 2, 5]})
