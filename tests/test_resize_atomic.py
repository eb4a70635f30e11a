"""``fxsym.resize`` is all-or-nothing, whatever its rules touch, and its indices are typed.

Fault injection: the N-th ``nn.Module.__setattr__`` made during one ``resize`` (every
parameter, buffer and attribute write of the nn and hf rules, including the ones on child
modules and attributes such as ``num_heads``) raises, for N = 1, 2, ... until a resize runs
through. After each failure the model must be exactly what it was: the same modules, the same
``__dict__`` values (by identity), the same containers' contents, the same Parameter and
buffer objects holding the same bits, never written in place.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

import fxsym


class Fault(Exception):
    """The injected failure."""


Snapshot = dict[str, Any]


def _snapshot(model: nn.Module) -> Snapshot:
    modules = list(model.named_modules())
    attrs = {name: dict(vars(m)) for name, m in modules}
    contents = {name: {k: (list(v.items()) if isinstance(v, dict) else list(v))
                       for k, v in vars(m).items() if isinstance(v, (dict, list, set))}
                for name, m in modules}
    tensors = {k: (t, t.detach().clone(), t._version, t.data_ptr())
               for k, t in model.state_dict(keep_vars=True).items()}
    return {"modules": modules, "attrs": attrs, "contents": contents, "tensors": tensors}


def _assert_identical(model: nn.Module, snap: Snapshot) -> None:
    modules = list(model.named_modules())
    assert [n for n, _ in modules] == [n for n, _ in snap["modules"]]
    assert all(a is b for (_, a), (_, b) in zip(modules, snap["modules"], strict=True))
    for name, m in modules:
        before, now = snap["attrs"][name], vars(m)
        assert now.keys() == before.keys(), name
        changed = [k for k in before if now[k] is not before[k]]
        assert not changed, f"{name}: {changed} rebound"
        for k, items in snap["contents"][name].items():
            v = now[k]
            current = list(v.items()) if isinstance(v, dict) else list(v)
            assert len(current) == len(items), f"{name}.{k}"
            assert all((a is b) if not isinstance(a, tuple) else
                       (a[0] == b[0] and a[1] is b[1])
                       for a, b in zip(current, items, strict=True)), f"{name}.{k}"
    state = model.state_dict(keep_vars=True)
    assert state.keys() == snap["tensors"].keys()
    for k, (obj, bits, version, ptr) in snap["tensors"].items():
        t = state[k]
        assert t is obj, k
        assert t._version == version and t.data_ptr() == ptr, f"{k} written in place"
        assert t.dtype == bits.dtype and torch.equal(t.detach(), bits), k


def _sharing(model: nn.Module) -> list[list[str]]:
    """The names of the parameters and buffers that are one tensor object."""
    places: dict[int, list[str]] = {}
    for k, t in model.state_dict(keep_vars=True).items():
        places.setdefault(id(t), []).append(k)
    return sorted(v for v in places.values() if len(v) > 1)


@contextmanager
def _fault_at(n: int, exc: Callable[[str], BaseException] = Fault,
              only: nn.Module | None = None) -> Iterator[list[int]]:
    """Make the ``n``-th module attribute write raise ``exc``; yields the write count. With
    ``only``, just the writes into that model's modules count (the hf plugin builds
    throw-away models on the meta device to learn which dims a config field sizes)."""
    original = nn.Module.__setattr__
    count = [0]
    owned = None if only is None else {id(m) for m in only.modules()}

    def counting(self: nn.Module, name: str, value: Any) -> None:
        if owned is not None and id(self) not in owned:
            original(self, name, value)
            return
        count[0] += 1
        if count[0] == n:
            raise exc(f"injected fault at write {n} ({type(self).__name__}.{name})")
        original(self, name, value)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nn.Module, "__setattr__", counting)
        yield count


def _choices(sm: fxsym.SymMap) -> dict[str, list[int]]:
    """Half of every group (at least one entry), in a shuffled order: every member moves."""
    gen = torch.Generator().manual_seed(0)
    return {g.name: torch.randperm(g.size, generator=gen)[: max(1, g.size // 2)].tolist()
            for g in sm.groups()}


def _vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)
    return model.eval(), (torch.randn(1, 3, 32, 32),)


def _swin() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torchvision.models.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[2, 2],
        num_classes=10)
    return model.eval(), (torch.randn(1, 3, 16, 16),)


class _MHABlock(nn.Module):
    """nn.MultiheadAttention between two projections (ViT's width is pinned by a literal)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.out(self.norm(a + h))


def _mha() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return _MHABlock().eval(), (torch.randn(1, 5, 8),)


class _HeadSplit(nn.Module):
    """Sizes read from int attributes (``self.heads``, ``self.hidden``): resize rebinds them."""

    def __init__(self) -> None:
        super().__init__()
        self.heads, self.head_dim, self.hidden = 2, 4, 8
        self.qkv = nn.Linear(6, self.hidden)
        self.out = nn.Linear(self.hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.qkv(x).view(b, s, self.heads, self.head_dim)
        h = (h * h.sum(-1, keepdim=True)).reshape(b, s, self.hidden)
        return self.out(h)


def _attributes() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return _HeadSplit().eval(), (torch.randn(2, 5, 6),)


def _llama(tied: bool = False) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64, tie_word_embeddings=tied)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model.eval(), {"input_ids": torch.tensor([[1, 2, 3, 4]])}


def _llama_tied() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The re-tying of ``lm_head`` to the embedding is part of the transaction too."""
    return _llama(tied=True)


def _conv_bn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BatchNorm's running statistics: buffers are written through ``__setattr__`` too."""
    return _small(), X


def _run(model: nn.Module, inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("build", [_vit, _swin, _mha, _llama, _llama_tied, _conv_bn,
                                   _attributes],
                         ids=["vit", "swin", "mha", "llama", "llama-tied", "conv-bn",
                              "attributes"])
def test_fault_at_every_write_leaves_the_model_identical(build: Callable[[], Any]) -> None:
    model, inputs = build()
    sm = fxsym.analyze(model, example_inputs=inputs)
    choices = _choices(sm)
    assert choices, "no group to resize"
    if build in (_vit, _attributes):  # int attributes are members: rebound in the transaction
        assert any(s.startswith("attr:") for g in sm.groups() for _, s in g.members)
    reference = copy.deepcopy(model)
    fxsym.resize(reference, fxsym.analyze(reference, example_inputs=inputs), choices)
    snap = _snapshot(model)
    n = 0
    while True:
        n += 1
        with _fault_at(n, only=model) as count:
            try:
                fxsym.resize(model, sm, choices)
            except fxsym.ResizeError as exc:
                assert isinstance(exc.__cause__, Fault) and "model restored" in str(exc)
                failed = True
            else:
                failed = False
        if not failed:
            break
        _assert_identical(model, snap)
    assert n == count[0] + 1 > 1, "the last resize must run through every write without fault"
    # the resize that ran through equals one on an untouched copy: nothing hidden was left over
    assert model.state_dict().keys() == reference.state_dict().keys()
    for (k, a), b in zip(model.state_dict().items(), reference.state_dict().values(),
                         strict=True):
        assert torch.equal(a, b), k
    for (name, m), r in zip(model.named_modules(), reference.modules(), strict=True):
        plain = {k: v for k, v in vars(m).items() if isinstance(v, (int, float, str, tuple))}
        assert plain == {k: v for k, v in vars(r).items() if k in plain}, name
    assert torch.equal(_run(model, inputs), _run(reference, inputs))
    assert _sharing(model) == _sharing(reference)  # tied parameters are still tied
    # the rules replace tensors, never write into them: the originals are untouched
    for _, (obj, bits, version, _) in snap["tensors"].items():
        assert obj._version == version and torch.equal(obj.detach(), bits)


def test_keyboard_interrupt_restores_then_propagates() -> None:
    model, inputs = _swin()
    sm = fxsym.analyze(model, example_inputs=inputs)
    snap = _snapshot(model)
    with _fault_at(7, KeyboardInterrupt), pytest.raises(KeyboardInterrupt, match="write 7"):
        fxsym.resize(model, sm, _choices(sm))
    _assert_identical(model, snap)
    fxsym.resize(model, sm, _choices(sm))  # the SymMap is still good: nothing happened
    assert _run(model, inputs).shape == (1, 10)


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 6, 1), nn.ReLU(), nn.Conv2d(6, 4, 1)).eval()


X = (torch.randn(1, 3, 4, 4),)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_index_tensors_of_any_integer_dtype_are_accepted(dtype: torch.dtype) -> None:
    model, ref = _small(), _small()
    sm = fxsym.analyze(model, example_inputs=X)
    fxsym.resize(model, sm, {"0.out_channels": torch.tensor([5, 1, 2], dtype=dtype)})
    keep = torch.tensor([5, 1, 2])
    assert torch.equal(model[0].weight, ref[0].weight[keep])
    assert torch.equal(model[1].running_var, ref[1].running_var[keep])
    assert torch.equal(model[3].weight, ref[3].weight[:, keep])


def test_meta_index_tensor_is_a_typed_error_naming_the_group() -> None:
    model = _small()
    sm = fxsym.analyze(model, example_inputs=X)
    snap = _snapshot(model)
    index = torch.tensor([0, 1], device="meta")
    with pytest.raises(fxsym.ResizeError, match=r"0.out_channels.*meta"):
        fxsym.resize(model, sm, {"0.out_channels": index})
    _assert_identical(model, snap)


def test_bad_choice_after_a_good_one_touches_nothing() -> None:
    model = _small()
    sm = fxsym.analyze(model, example_inputs=X)
    snap = _snapshot(model)
    with _fault_at(1) as count, pytest.raises(fxsym.ResizeError, match="meta"):
        fxsym.resize(model, sm, {"0.out_channels": [3, 1],
                                 "3.out_channels": torch.tensor([0], device="meta")})
    assert count[0] == 0  # validation refused it before the first write
    _assert_identical(model, snap)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_index_tensor_is_moved() -> None:
    model, ref = _small(), _small()
    sm = fxsym.analyze(model, example_inputs=X)
    fxsym.resize(model, sm, {"0.out_channels": torch.tensor([5, 1], device="cuda")})
    assert torch.equal(model[0].weight, ref[0].weight[torch.tensor([5, 1])])


def test_indices_for_a_model_on_the_meta_device_are_moved_there() -> None:
    model = _small()
    sm = fxsym.analyze(model, example_inputs=X)
    model.to("meta")
    fxsym.resize(model, sm, {"0.out_channels": [5, 1]})
    assert model[0].weight.shape == (2, 3, 3, 3) and model[0].weight.is_meta
    assert model[3].weight.shape == (6, 2, 1, 1)


def test_a_rule_writing_in_place_is_named_when_the_resize_fails() -> None:
    model = _small()
    sm = fxsym.analyze(model, example_inputs=X)
    from fxsym.registry import get_registry

    entry = get_registry().sym_info_entry(nn.Conv2d)
    assert entry is not None and entry.resize is not None
    rule = entry.resize

    def in_place(mod: nn.Module, name: str, index: torch.Tensor) -> None:
        if name == "in_channels":
            with torch.no_grad():
                mod.weight.mul_(2)
            raise Fault("rule broke after writing in place")
        rule(mod, name, index)

    class Plugin:
        @fxsym.hookimpl
        def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
            register(nn.Conv2d, entry.factory, resize=in_place)

    pm = fxsym.load_plugins()
    pm.register(Plugin(), name="in-place-resize")
    try:
        with pytest.warns(fxsym.PluginWarning), \
                pytest.raises(fxsym.ResizeError, match=r"in place: 3\.weight"):
            fxsym.resize(model, sm, {"0.out_channels": [0, 1]})
    finally:
        pm.unregister(name="in-place-resize")
    assert model[0].weight.shape == (8, 3, 3, 3)  # the rest is restored


def test_whatever_a_failing_rule_rebinds_is_restored() -> None:
    model = _small()
    model[0].tags = [1, 2]  # type: ignore[assignment]
    sm = fxsym.analyze(model, example_inputs=X)
    snap = _snapshot(model)
    from fxsym.registry import get_registry

    entry = get_registry().sym_info_entry(nn.Conv2d)
    assert entry is not None and entry.resize is not None
    rule = entry.resize

    def meddling(mod: nn.Module, name: str, index: torch.Tensor) -> None:
        rule(mod, name, index)
        if name == "out_channels":
            mod.add_module("extra", nn.Linear(1, 1))
            mod.register_buffer("new_buffer", torch.zeros(1))
            mod.register_forward_hook(lambda *args: None)
            object.__setattr__(mod, "sneaky", 1)
            object.__setattr__(mod, "_parameters", {})
            mod.tags.append(3)  # type: ignore[operator]
            mod.padding = (5, 5)
            del mod.groups
            mod.train()
            raise Fault("rule broke after meddling")

    class Plugin:
        @fxsym.hookimpl
        def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
            register(nn.Conv2d, entry.factory, resize=meddling)

    pm = fxsym.load_plugins()
    pm.register(Plugin(), name="meddling-resize")
    try:
        with pytest.warns(fxsym.PluginWarning), \
                pytest.raises(fxsym.ResizeError, match="model restored: rule broke after meddling"):
            fxsym.resize(model, sm, {"0.out_channels": [0, 1]})
    finally:
        pm.unregister(name="meddling-resize")
    _assert_identical(model, snap)
    assert model[0].tags == [1, 2] and not model.training


def test_a_size_for_a_model_on_the_meta_device_is_a_typed_error() -> None:
    model = _small()
    sm = fxsym.analyze(model, example_inputs=X)
    model.to("meta")
    with pytest.raises(fxsym.ResizeError, match=r"0.out_channels.*meta.*indices"):
        fxsym.resize(model, sm, {"0.out_channels": 3})
    assert model[0].weight.shape == (8, 3, 3, 3)
