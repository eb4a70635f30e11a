"""Tracing never writes into the model (issue 9, items 5 and 12).

After ``analyze`` every submodule's ``__dict__`` holds the very objects it held before —
containers compared by content, recursively, everything else by identity (parameters
included) — whether the analysis succeeded or failed; analyzing twice, and analyzing a deep
copy, give the same groups; the user's hooks never run.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import fxsym

torchvision = pytest.importorskip("torchvision")

from zoo.test_torchvision_zoo import SUBSET, input_size  # noqa: E402


def _frozen(value: Any, seen: set[int]) -> Any:
    """``value`` as a comparable tree: containers by content, anything else by identity."""
    if isinstance(value, (dict, list, tuple, set)) and not isinstance(value, nn.Module):
        if id(value) in seen:
            return ("seen", id(value))
        seen.add(id(value))
        if isinstance(value, dict):
            return (type(value), id(value), [(k, _frozen(v, seen)) for k, v in value.items()])
        if isinstance(value, set):
            return (type(value), id(value), sorted(map(id, value)))
        return (type(value), id(value) if not isinstance(value, tuple) else None,
                [_frozen(v, seen) for v in value])
    return ("obj", id(value))


def state_of(model: nn.Module) -> list[Any]:
    """Every submodule's ``__dict__``, deeply (see :func:`_frozen`)."""
    seen: set[int] = set()
    return [(name, id(mod), _frozen(vars(mod), seen)) for name, mod in model.named_modules()]


def _groups(sm: fxsym.SymMap) -> list[tuple[Any, ...]]:
    return [(g.name, g.size, g.is_sortable, tuple(g.members)) for g in sm.groups()]


class BiasCache(nn.Module):
    """timm-style attention: a relative bias cached per device in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)
        self.attention_biases = nn.Parameter(torch.zeros(2, 5))
        self.attention_bias_cache: dict[str, torch.Tensor] = {}

    def get_attention_biases(self, device: torch.device) -> torch.Tensor:
        if self.training:
            return self.attention_biases
        key = str(device)
        if key not in self.attention_bias_cache:
            self.attention_bias_cache[key] = self.attention_biases[:, :5]
        return self.attention_bias_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-2, -1)).unsqueeze(1) + self.get_attention_biases(x.device)[0]
        return self.proj(attn.softmax(-1).squeeze(1) @ v)


class WindowNet(nn.Module):
    """Reassigns an attribute from a traced size (Hugging Face Swin's ``window_size``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 8)
        self.window_size = 7
        self.seen: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.window_size > x.shape[1]:
            self.window_size = x.shape[1]
        self.seen.append(x.shape)
        return self.out(torch.relu(self.inp(x)))


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(6, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.emb(x))[0])


def _custom(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if name == "bias_cache":
        return BiasCache(), (torch.randn(2, 5, 8),)
    if name == "window":
        return WindowNet(), (torch.randn(2, 5, 8),)
    return LSTMNet(), (torch.randn(2, 7, 6),)


def _torchvision(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    size = input_size(name)
    return torchvision.models.get_model(name, weights=None), (torch.randn(1, 3, size, size),)


def _check_untouched(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    model.eval()
    before = state_of(model)
    first = _groups(fxsym.analyze(model, example_inputs=inputs))
    assert state_of(model) == before
    assert _groups(fxsym.analyze(model, example_inputs=inputs)) == first
    assert _groups(fxsym.analyze(copy.deepcopy(model), example_inputs=inputs)) == first
    assert state_of(model) == before
    model(*inputs)  # and it still runs


@pytest.mark.parametrize("name", ["bias_cache", "window", "lstm"])
def test_forward_writes_stay_inside_the_trace(name: str) -> None:
    _check_untouched(*_custom(name))


@pytest.mark.parametrize("name", sorted(SUBSET))
def test_zoo_models_untouched(name: str) -> None:
    torch.manual_seed(0)
    _check_untouched(*_torchvision(name))


#: Hugging Face models whose forward reassigns attributes from traced sizes
HF = {
    "swin": ("AutoModelForImageClassification",
             dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=32, patch_size=4,
                  window_size=4)),  # SwinLayer.set_shift_and_window_size: window_size
    "funnel": ("AutoModelForSequenceClassification",
               dict(vocab_size=100, d_model=32, n_head=2, d_head=16, d_inner=64,
                    block_sizes=[1, 1], block_repeats=[1, 1], num_decoder_layers=1)),  # seq_len
}


@pytest.mark.parametrize("name", sorted(HF))
def test_hugging_face_attribute_writes_stay_inside_the_trace(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    auto, kwargs = HF[name]
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(
        transformers.AutoConfig.for_model(name, **kwargs)).eval()
    before = state_of(model)
    first = _groups(fxsym.analyze(model))  # the hf plugin supplies the example inputs
    assert first and state_of(model) == before
    assert _groups(fxsym.analyze(model)) == first
    assert _groups(fxsym.analyze(copy.deepcopy(model))) == first


def test_failed_analysis_of_a_detection_model_leaves_it_as_it_was() -> None:
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None).eval()
    images = [torch.rand(3, 96, 128)]
    with torch.no_grad():
        expected = model(images)
    before = state_of(model)
    try:
        fxsym.analyze(model, example_inputs=(images,))
    except fxsym.FxsymError:
        pass
    assert state_of(model) == before
    with torch.no_grad():
        got = model(images)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key])


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)
        self.b = nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_user_hooks_do_not_run_and_stay_registered() -> None:
    model = Hooked().eval()
    calls: list[str] = []

    def pre(mod: nn.Module, args: Any) -> None:
        calls.append("pre")
        mod.touched_by_pre = True

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        calls.append("post")
        mod.touched_by_post = True

    def post_kw(mod: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        calls.append("post_kw")

    handles = [model.a.register_forward_pre_hook(pre), model.b.register_forward_hook(post),
               model.register_forward_hook(post_kw, with_kwargs=True),
               model.a.register_full_backward_hook(lambda *a: calls.append("backward"))]
    before = state_of(model)
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 12, 12),))
    assert [g.name for g in sm.groups()] == []  # not seen by the trace: what they touch pins
    hidden = [(e.where, e.message.split(" does not run")[0])
              for e in sm.trace_report.of_kind("hidden-hook")]
    assert hidden == [("Hooked", f"its forward hook {__name__}.{post_kw.__qualname__}"),
                      ("a", f"its forward pre-hook {__name__}.{pre.__qualname__}"),
                      ("b", f"its forward hook {__name__}.{post.__qualname__}")], hidden
    assert calls == []
    assert state_of(model) == before
    assert not hasattr(model.a, "touched_by_pre") and not hasattr(model.b, "touched_by_post")
    model(torch.randn(1, 3, 12, 12))  # registered as before: they run eagerly
    assert calls == ["pre", "post", "post_kw"]
    for h in handles:
        h.remove()


def test_torch_own_weight_norm_hook_still_computes_the_weight() -> None:
    model = Hooked().eval()
    model.b = nn.utils.weight_norm(model.b)  # the deprecated, hook-based weight_norm
    before = state_of(model)
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 12, 12),))
    assert state_of(model) == before
    assert sm.trace_report is not None
