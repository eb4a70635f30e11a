"""fxsym.paramlayout: the layout derived from the analysis equals the one trial resizes of
whole-model probe copies learn (the oracle), without copying the model (issue 22 §6)."""

from __future__ import annotations

import copy
import weakref
from collections import Counter
from typing import Any

import pytest
import torch
from fuzz_nets import random_net
from helpers import assert_same_layout, assert_shapes_counted
from torch import nn

import fxsym
import fxsym.oracles
from fxsym import paramlayout
from fxsym.paramlayout.copying import _copy_module
from fxsym.resizing import keep_entries

torchvision = pytest.importorskip("torchvision")


class Concat(nn.Module):
    """Two convs side by side (a concatenation), a chunk gate, a grouped conv, a GroupNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 6, 1)
        self.gn = nn.GroupNorm(5, 10)
        self.grouped = nn.Conv2d(10, 10, 3, padding=1, groups=5)
        self.gate = nn.Conv2d(10, 8, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.grouped(self.gn(torch.cat([self.a(x), self.b(x)], 1)))
        u, v = self.gate(y).chunk(2, 1)
        return self.head((u * v.sigmoid()).mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(self.emb(x))[0])


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.inp = nn.Linear(4, 8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.cls.expand(x.shape[0], 1, 8), self.inp(x)], 1)
        return self.out(self.norm(self.mha(h, h, h, need_weights=False)[0])[:, 0])


TINY: dict[str, tuple[type[nn.Module], Any]] = {
    "concat": (Concat, lambda: (torch.randn(1, 3, 8, 8),)),
    "recurrent": (Recurrent, lambda: (torch.randint(0, 11, (2, 4)),)),
    "attention": (Attention, lambda: (torch.randn(2, 3, 4),)),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_direct_layout_equals_the_probe_layout_on_tiny_modules(name: str) -> None:
    cls, inputs = TINY[name]
    m = cls().eval()
    assert_same_layout(m, fxsym.analyze(m, example_inputs=inputs()))


def test_the_probe_layout_moved_to_the_oracles_and_the_old_path_still_works() -> None:
    """``probe_layout`` is an oracle of the derived layout: ``fxsym.oracles.probe_layout``.
    The old path ``fxsym.paramlayout.probe_layout`` gives the same layout, with a
    ``DeprecationWarning`` that names the new one."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(4, 6)
            self.down = nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(self.up(x).relu())

    m = Block().eval()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 4),))
    new = fxsym.oracles.probe_layout(m, sm)
    with pytest.warns(DeprecationWarning, match="fxsym.oracles.probe_layout"):
        old = paramlayout.probe_layout(m, sm)
    direct = paramlayout.layout(m, sm)
    for lay in (old, direct):
        assert dict(lay.shapes) == dict(new.shapes) and dict(lay.sizes) == dict(new.sizes)
        assert {g: [(s.param, s.dim, s.index.tolist(), s.unit.tolist()) for s in slices]
                for g, slices in lay.slices.items()} == {
            g: [(s.param, s.dim, s.index.tolist(), s.unit.tolist()) for s in slices]
            for g, slices in new.slices.items()}
    assert [s.param for s in new.slices[sm.groups()[0].name]] == [
        "up.weight", "up.bias", "down.weight"]


def test_one_layout_name_per_concept_the_old_one_warns() -> None:
    """Where units lie in the parameters is ``ParamLayout`` (``fxsym.analysis.Layout`` is the
    layout of one traced value). The old name ``Layout`` of ``fxsym.paramlayout`` and
    ``fxsym.importance`` still gives the class, with a ``DeprecationWarning``; a layout built
    from a model is a ``ParamLayout`` and counts its parameters."""
    import fxsym.analysis
    import fxsym.prune.importance

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(3, 5)
            self.down = nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(self.up(x).relu())

    m = Mlp()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 3),))
    lay = paramlayout.layout(m, sm)
    assert type(lay) is paramlayout.ParamLayout is fxsym.importance.ParamLayout
    assert lay.param_count({sm.groups()[0].name: 2}) == (3 * 2 + 2) + (2 * 3 + 3)
    for module in (paramlayout, fxsym.importance):
        with pytest.warns(DeprecationWarning, match="Layout is now ParamLayout"):
            old = module.Layout
        assert old is paramlayout.ParamLayout
        with pytest.raises(AttributeError, match="has no attribute 'Layuot'"):
            module.Layuot  # noqa: B018
    assert fxsym.analysis.Layout is not paramlayout.ParamLayout


TORCHVISION = ["resnet18", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x0_5",
               "mnasnet0_5", *(pytest.param(n, marks=pytest.mark.zoo) for n in (
                   "regnet_y_400mf", "efficientnet_b0", "googlenet"))]


@pytest.mark.parametrize("name", TORCHVISION)
def test_direct_layout_equals_the_probe_layout_on_torchvision(name: str) -> None:
    kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    m = torchvision.models.get_model(name, weights=None, num_classes=10, **kwargs).eval()
    assert_same_layout(m, fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 64, 64),)))


def test_direct_layout_equals_the_probe_layout_on_transformers_of_torchvision() -> None:
    from torchvision.models import VisionTransformer
    from torchvision.models.swin_transformer import SwinTransformer

    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                            hidden_dim=16, mlp_dim=32, num_classes=3).eval()
    assert_same_layout(vit, fxsym.analyze(vit, example_inputs=(torch.randn(1, 3, 32, 32),)))
    swin = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                           window_size=[4, 4], num_classes=3).eval()
    assert_same_layout(swin, fxsym.analyze(swin, example_inputs=(torch.randn(1, 3, 32, 32),)))


@pytest.mark.parametrize("seed", range(16))
def test_direct_layout_equals_the_probe_layout_on_fuzzed_nets(seed: int) -> None:
    m, x = random_net(seed)
    m.eval()
    assert_same_layout(m, fxsym.analyze(m, example_inputs=(x,)))


# -- rules the keep observer cannot follow ----------------------------------------------------
class Scaled(nn.Module):
    """A linear layer with a per-output scale, resized by a rule of its own that never calls
    ``keep_entries`` (it rebinds ``index_select`` results itself)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in))
        self.scale = nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight) * self.scale


def _scaled_info(mod: nn.Module) -> fxsym.SymInfo:
    return fxsym.SymInfo(
        n_in=fxsym.Symbol(cl_type=fxsym.Symbol.CLType.INCOMING, elastic_dims={-1}),
        n_out=fxsym.Symbol(is_searchable=True, cl_type=fxsym.Symbol.CLType.OUTGOING,
                           elastic_dims={-1}))


def _scaled_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    with torch.no_grad():
        if name == "n_in":
            mod.weight = nn.Parameter(mod.weight.index_select(1, index))
        else:
            mod.weight = nn.Parameter(mod.weight.index_select(0, index))
            mod.scale = nn.Parameter(mod.scale.index_select(0, index))


def _replace_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Not a keep: a fresh parameter of the new size (nothing says where the units went)."""
    if name == "n_out":
        mod.weight = nn.Parameter(torch.zeros(len(index), mod.weight.shape[1]))
        mod.scale = nn.Parameter(torch.zeros(len(index)))
    else:
        mod.weight = nn.Parameter(torch.zeros(mod.weight.shape[0], len(index)))


class TwoScaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Scaled(4, 6)
        self.b = Scaled(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def scaled_rule() -> Any:
    def register(resize: Any) -> None:
        fxsym.SymMap.register(Scaled, resize=resize)(_scaled_info)

    yield register
    fxsym.SymMap.unregister(Scaled)


def test_a_rule_that_keeps_slices_its_own_way_is_read_from_probes(scaled_rule: Any) -> None:
    scaled_rule(_scaled_resize)
    m = TwoScaled()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 4),))
    lay = assert_same_layout(m, sm)
    assert {(s.param, s.dim) for s in lay.slices["a.n_out"]} == {
        ("a.weight", 0), ("a.scale", 0), ("b.weight", 1)}


def test_a_rule_that_replaces_parameters_is_a_plan_error(scaled_rule: Any) -> None:
    scaled_rule(_replace_resize)
    m = TwoScaled()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 4),))
    with pytest.raises(fxsym.PlanError, match=r"a\.n_out"):
        paramlayout.layout(m, sm)


# -- nothing is copied but member modules, on the meta device ---------------------------------
class Uncopyable(nn.Module):
    """A model whose root refuses ``copy.deepcopy`` (as a model holding a lock, a file or a
    process handle does): the layout must not copy the model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise TypeError("this model cannot be copied")


def test_the_layout_never_copies_the_model() -> None:
    m = Uncopyable()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 5),))
    with pytest.raises(TypeError):
        copy.deepcopy(m)
    lay = paramlayout.layout(m, sm)
    rows = {(s.param, s.dim): s.unit.tolist() for s in lay.slices["fc1.out_features"]}
    assert rows == {("fc1.weight", 0): list(range(6)), ("fc1.bias", 0): list(range(6)),
                    ("fc2.weight", 1): list(range(6))}


def test_the_layout_of_a_meta_model_reads_no_weight() -> None:
    """Parameters on the meta device hold nothing to read: a layout from their metadata."""
    with torch.device("meta"):
        m = Attention().eval()
    ref = Attention().eval()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 3, 4, device="meta"),))
    sm_ref = fxsym.analyze(ref, example_inputs=(torch.randn(2, 3, 4),))
    got, want = paramlayout.layout(m, sm), paramlayout.layout(ref, sm_ref)
    assert {g: [(s.param, s.dim, s.index.tolist(), s.unit.tolist()) for s in v]
            for g, v in got.slices.items()} == {
        g: [(s.param, s.dim, s.index.tolist(), s.unit.tolist()) for s in v]
        for g, v in want.slices.items()}


# -- how many trial runs: the shortcuts of the direct derivation -------------------------------
class _Counted:
    """A resize rule wrapped to count its runs per symbol."""

    def __init__(self, rule: Any) -> None:
        self.rule, self.runs = rule, Counter[str]()

    def __call__(self, mod: Any, name: str, index: torch.Tensor) -> None:
        self.runs[name] += 1
        self.rule(mod, name, index)


class CountedConv(nn.Conv2d):
    pass


class CountedLinear(nn.Linear):
    pass


@pytest.fixture
def counted() -> Any:
    from fxsym_plugins_nn.modules import conv_info, conv_resize, linear_info, linear_resize

    rules = {CountedConv: _Counted(conv_resize), CountedLinear: _Counted(linear_resize)}
    fxsym.SymMap.register(CountedConv, resize=rules[CountedConv])(conv_info)
    fxsym.SymMap.register(CountedLinear, resize=rules[CountedLinear])(linear_info)
    yield rules
    fxsym.SymMap.unregister(CountedConv)
    fxsym.SymMap.unregister(CountedLinear)


def test_a_rule_changing_no_parameter_is_run_twice(counted: Any) -> None:
    """A depthwise conv's ``in_channels`` rule changes attributes only (its weight's rows go
    with ``out_channels``): two trials say so, not one per bit of its 32 units."""
    m = nn.Sequential(nn.Conv2d(3, 32, 1), CountedConv(32, 32, 3, padding=1, groups=32),
                      nn.Conv2d(32, 4, 1)).eval()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 8, 8),))
    lay = paramlayout.layout(m, sm)
    assert counted[CountedConv].runs["in_channels"] == 2
    assert_same_layout(m, sm)
    assert {(s.param, s.dim) for s in lay.slices["0.out_channels"]} == {
        ("0.weight", 0), ("0.bias", 0), ("1.weight", 0), ("1.bias", 0), ("2.weight", 1)}


def _same_copy(a: Any, b: Any, original: Any, seen: set[int]) -> None:
    """``a`` (our copy) and ``b`` (deepcopy's) of ``original`` agree: same classes, same
    state, the memo's stand-ins in the same places, nothing mutable shared with the original."""
    assert type(a) is type(b)
    if isinstance(original, torch.Tensor):
        assert a is b  # both the memo's stand-in
        return
    if id(original) in seen:
        return
    seen.add(id(original))
    if isinstance(original, (nn.Module, dict, list, set)) or hasattr(original, "__dict__"):
        assert a is not original or isinstance(original, type)
    if isinstance(original, nn.Module) or (hasattr(original, "__dict__")
                                           and not isinstance(original, type)):
        a, b, original = vars(a), vars(b), vars(original)
    if isinstance(original, dict):
        assert list(a) == list(b)  # a class's __setstate__ may rebuild some entries
        for k in a:
            _same_copy(a[k], b[k], original.get(k, b[k]), seen)
    elif isinstance(original, (list, tuple)):
        assert len(a) == len(b) == len(original)
        for x, y, o in zip(a, b, original):
            _same_copy(x, y, o, seen)
    elif isinstance(original, weakref.ref):
        assert a() is b()
    elif not isinstance(original, set):
        assert a == b or a is b


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "recurrent", "attention", "concat"])
def test_a_meta_copy_of_a_module_is_what_deepcopy_gives(name: str) -> None:
    """The layout's copies of one module (``_copy_module``) are made without ``deepcopy``'s
    generic machinery: they hold what a deepcopy holds (classes, attributes, containers, the
    meta stand-ins), share nothing mutable with the model, and run the same rules."""
    if name in TINY:
        m = TINY[name][0]()
    else:
        m = torchvision.models.get_model(name, weights=None, num_classes=10)
    memo = {id(t): torch.empty(t.shape, device="meta") for t in (
        *m.parameters(), *m.buffers())}
    for _, mod in m.named_modules():
        ours = _copy_module(mod, dict(memo))
        _same_copy(ours, copy.deepcopy(mod, dict(memo)), mod, set())


def test_alike_modules_of_other_sizes_are_run_once_per_symbol(counted: Any) -> None:
    """Linear layers of four sizes: the first of each symbol takes two trials to show its rule
    keeps exactly the entries given, the others one trial each (which keeps exactly the
    entries given, along the same dims)."""
    m = nn.Sequential(CountedLinear(4, 6), nn.ReLU(), CountedLinear(6, 10), nn.ReLU(),
                      CountedLinear(10, 12), nn.ReLU(), CountedLinear(12, 3)).eval()
    sm = fxsym.analyze(m, example_inputs=(torch.randn(2, 4),))
    paramlayout.layout(m, sm)
    assert counted[CountedLinear].runs == {"out_features": 4, "in_features": 4}
    assert_same_layout(m, sm)


class Flipped(nn.Module):
    """A linear layer with a per-output scale stored in reverse when ``flip`` is 1: its rule
    keeps the rows given and, then, the mirrored scales."""

    def __init__(self, n_in: int, n_out: int, flip: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in))
        self.scale = nn.Parameter(torch.randn(n_out))
        self.flip = flip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale.flip(0) if self.flip else self.scale
        return nn.functional.linear(x, self.weight) * scale


def _flipped_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    if name == "n_in":
        keep_entries(mod, "weight", 1, index)
        return
    keep_entries(mod, "weight", 0, index)
    n = mod.scale.shape[0]
    keep_entries(mod, "scale", 0, (n - 1 - index).flip(0) if mod.flip else index)


def test_an_alike_module_whose_rule_keeps_otherwise_is_decoded_in_full() -> None:
    """The second ``Flipped`` is of the first one's kind (class, rule, what it holds, sizes
    aside), but its rule keeps other scales than the entries given: its one trial shows it,
    and it is decoded in full (scale ``i`` is unit ``5 - i``)."""
    fxsym.SymMap.register(Flipped, resize=_flipped_resize)(_scaled_info)
    try:
        m = nn.Sequential(Flipped(4, 6, 0), nn.ReLU(), Flipped(6, 6, 1), nn.ReLU(),
                          nn.Linear(6, 3)).eval()
        lay = assert_same_layout(m, fxsym.analyze(m, example_inputs=(torch.randn(2, 4),)))
    finally:
        fxsym.SymMap.unregister(Flipped)
    rows = {(s.param, s.dim): s.unit.tolist() for s in lay.slices["2.n_out"]}
    assert rows[("2.scale", 0)] == [5, 4, 3, 2, 1, 0]
    assert rows[("2.weight", 0)] == rows[("4.weight", 1)] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("name", sorted(TINY))
def test_changed_shapes_count_what_the_shares_of_every_slice_sum_to(name: str) -> None:
    """Shapes after a choice of sizes, one group alone (counted from the slices per unit) or
    many (heads x head dims cutting one projection crosswise, a concatenation side by side),
    are the reference sums of shares, for random choices."""
    cls, inputs = TINY[name]
    m = cls().eval()
    assert_shapes_counted(paramlayout.layout(m, fxsym.analyze(m, example_inputs=inputs())))
