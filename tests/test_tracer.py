"""The tracer: shape-aware proxies, example inputs, robust fallback, errors, no mutation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxsym


def _same(gm: torch.fx.GraphModule, model: nn.Module, *inputs: torch.Tensor) -> None:
    torch.testing.assert_close(gm(*inputs), model(*inputs))


def test_shape_control_flow_and_dynamic_view_trace() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] == 3:
                x = x * 2
            if x.dim() == 4 and x.dtype == torch.float32 and len(x) > 0:
                x = x.view(x.size(0), -1)
            n, c = x.shape
            return x[:, : c // 2] + n

    model = M()
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 3, 4, 4),))
    assert "view" in gm.code and "size" in gm.code
    # the batch size stays symbolic: other batch sizes give eager results
    for batch in (1, 2, 5):
        _same(gm, model, torch.randn(batch, 3, 4, 4))


def test_nodes_carry_meta_values() -> None:
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU())
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 3, 8, 8),))
    vals = {n.name: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta}
    assert vals["_0"].shape == (2, 5, 6, 6) and vals["_0"].device.type == "meta"
    assert vals["_1"].dtype == torch.float32


def test_dict_example_inputs_and_defaults_fixed() -> None:
    class M(nn.Module):
        def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float = 2.0) -> torch.Tensor:
            out = input_ids.float() * scale
            if mask is not None:
                out = out * mask
            return out

    model = M()
    ids = torch.arange(6).view(2, 3)
    gm = fxsym.trace(model, example_inputs={"input_ids": ids})
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["input_ids"]
    torch.testing.assert_close(gm(ids), model(ids))
    gm2 = fxsym.trace(model, example_inputs={"input_ids": ids, "mask": torch.ones(2, 3)})
    assert "mul_1" in gm2.code or gm2.code.count("mul") == 2


def test_untraceable_submodule_falls_back_to_leaf_and_is_reported() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent: cannot be resolved from shapes
                return x + 1
            return x - 1

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.bad = Bad()
            self.b = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.bad(self.a(x)))

    model = M()
    gm = fxsym.trace(model, example_inputs=(torch.randn(3, 4),))
    assert [e.where for e in gm.trace_report.fallbacks] == ["bad"]
    assert "Bad kept as a leaf" in gm.trace_report.fallbacks[0].message
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["a", "bad", "b"]
    x = torch.randn(3, 4)
    _same(gm, model, x)
    # the analysis keeps going around it: groups touching the leaf are constant
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert sm.groups() == []
    assert any(e.kind == "boundary" and "bad" in e.where for e in sm.trace_report)


def test_trace_never_mutates_the_model() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + torch.tensor([1.0, 2.0, 3.0])  # a tensor constant

    model = M()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = set(vars(model))
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 3),))
    assert set(vars(model)) == attrs
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    _same(gm, model, torch.randn(2, 3))


def test_without_example_inputs_tracing_is_plain_fx() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Tanh())  # nothing a plugin can guess inputs from
    gm = fxsym.trace(model)
    assert all("val" not in n.meta for n in gm.graph.nodes)
    _same(gm, model, torch.randn(2, 3))
    with pytest.raises(fxsym.AnalysisError, match="example_inputs"):
        fxsym.analyze(model)


def test_errors_are_typed_and_say_what_to_do() -> None:
    with pytest.raises(fxsym.TraceError, match=r"torch\.nn\.Module"):
        fxsym.trace(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(fxsym.AnalysisError, match=r"torch\.nn\.Module"):
        fxsym.analyze("resnet")  # type: ignore[arg-type]
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
    with pytest.raises(fxsym.ModelError, match="example_inputs have the shapes"):
        fxsym.analyze(model, example_inputs=(torch.randn(1, 4, 8, 8),))  # 4 channels, not 3
    with pytest.raises(fxsym.TraceError, match="do not match"):
        fxsym.analyze(model, example_inputs={"y": torch.randn(1, 3, 8, 8)})

    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("this model refuses")

    with pytest.raises(fxsym.TraceError, match="this model refuses"):
        fxsym.analyze(Raises(), example_inputs=(torch.randn(2),))


def test_plugin_proxy_class_is_used_for_its_value_type() -> None:
    from fxsym.tracer import ShapeProxy

    class SizeProxy(ShapeProxy):
        pass

    class Plugin:
        @fxsym.hookimpl
        def fxsym_register_proxies(self, register):  # type: ignore[no-untyped-def]
            register(torch.Size, SizeProxy)

    seen: list[type] = []

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(type(x.size()))
            seen.append(type(x))
            return x.view(x.shape[0], -1)

    pm = fxsym.load_plugins()
    pm.register(Plugin(), name="size-proxy")
    try:
        fxsym.trace(M(), example_inputs=(torch.randn(2, 3, 2),))
    finally:
        pm.unregister(name="size-proxy")
    assert seen == [SizeProxy, ShapeProxy]


def test_trace_context_hook_is_entered_and_restored_on_error() -> None:
    import contextlib

    events: list[str] = []

    class Plugin:
        @fxsym.hookimpl
        def fxsym_trace_context(self, model, example_inputs):  # type: ignore[no-untyped-def]
            @contextlib.contextmanager
            def ctx():  # type: ignore[no-untyped-def]
                events.append("enter")
                try:
                    yield
                finally:
                    events.append("exit")

            return ctx()

    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("no")

    pm = fxsym.load_plugins()
    pm.register(Plugin(), name="ctx")
    try:
        fxsym.trace(nn.ReLU(), example_inputs=(torch.randn(2),))
        with pytest.raises(fxsym.TraceError):
            fxsym.trace(Raises(), example_inputs=(torch.randn(2),))
    finally:
        pm.unregister(name="ctx")
    assert events == ["enter", "exit", "enter", "exit"]


def test_decorated_root_forward_with_kwargs_is_called_by_keyword() -> None:
    import functools
    from collections import OrderedDict

    def passes_through(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            kwargs.setdefault("scale", 3.0)
            return fn(self, *args, **kwargs)

        return wrapper

    class Out(OrderedDict):  # a Mapping output type of its own
        pass

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        @passes_through
        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float = 1.0, **kwargs: object) -> Out:
            y = self.lin(x) * scale
            if mask is not None:
                y = y * mask
            return Out(logits=y, extra=None)

    model = M()
    x = torch.randn(2, 3, 4)
    gm = fxsym.trace(model, example_inputs={"x": x})
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    out = gm(x)
    assert type(out) is dict and list(out) == ["logits"]  # None fields dropped
    torch.testing.assert_close(out["logits"], model(x)["logits"])  # the decorator ran
    gm2 = fxsym.trace(model, example_inputs={"x": x, "mask": torch.ones(2, 3, 1)})
    assert [n.target for n in gm2.graph.nodes if n.op == "placeholder"] == ["x", "mask"]
    gm3 = fxsym.trace(model, example_inputs=(x,))  # positional: binds past the decorator
    assert [n.target for n in gm3.graph.nodes if n.op == "placeholder"] == ["x"]
    torch.testing.assert_close(gm3(x)["logits"], model(x)["logits"])


def test_buffers_follow_traced_sizes_and_inline_modules_are_traced_through() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("positions", torch.arange(16).float())
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = self.positions[: x.shape[1]]  # a buffer sliced by a traced size
            return nn.ReLU()(self.lin(x)) + pos[None, :, None]  # a module built inline

    model = M()
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 5, 4),))
    assert any(n.op == "get_attr" and n.target == "positions" for n in gm.graph.nodes)
    assert not any(n.op == "call_module" and n.target != "lin" for n in gm.graph.nodes)
    for seq in (3, 5, 9):
        x = torch.randn(2, seq, 4)
        _same(gm, model, x)


def test_factories_with_traced_sizes_and_nested_fallback_unwinds_module_stack() -> None:
    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent: this module falls back to a leaf
                return x + 1
            return x - 1

    class Middle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 2

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.middle = Middle()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s = x.shape[:2]
            ones = torch.ones(b, s, device=x.device)  # several traced sizes as *size
            return self.lin(self.middle(x)) + ones[..., None]

    model = M()
    ones_before = torch.ones
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 3, 4),))
    assert [e.where for e in gm.trace_report.fallbacks] == ["middle.inner"]
    assert any(n.target is torch.ones for n in gm.graph.nodes)
    assert torch.ones is ones_before  # restored after tracing
    for shape in ((2, 3, 4), (5, 7, 4)):
        x = torch.randn(*shape)
        _same(gm, model, x)


@torch.fx.wrap
def check_metadata(x: torch.Tensor) -> torch.Tensor:
    """A function kept as one node whose own check fails (its message mentions 'meta')."""
    if x.shape[-1] != 4:
        raise RuntimeError(f"metadata mismatch: expected 4 features, got {x.shape[-1]}")
    return x


def test_unknown_values_are_told_from_model_errors_by_type() -> None:
    class NeedsData(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.b = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = x.abs().max().item()  # a RuntimeError on meta: the data is unknown
            picked = x.nonzero()  # no meta kernel (NotImplementedError)
            h = self.b(torch.relu(self.a(x)))
            return h * scale + picked.shape[0] * 0

    sm = fxsym.analyze(NeedsData(), example_inputs=(torch.randn(2, 4),))
    assert [g.name for g in sm.groups()] == ["a.out_features"]
    unknown = " ".join(e.message for e in sm.trace_report.of_kind("unknown-value"))
    assert "item" in unknown and "nonzero" in unknown

    class Checks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return check_metadata(self.a(x)[..., :3])

    with pytest.raises(fxsym.ModelError, match="metadata mismatch"):
        fxsym.analyze(Checks(), example_inputs=(torch.randn(2, 6),))


class _Validates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 3:
            raise ValueError(f"expected 3 channels, got {x.shape[1]}")
        return self.a(x)


def test_a_model_rejecting_its_inputs_is_a_model_error() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Validates()
            self.b = nn.Conv2d(8, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.inner(x))

    bad = (torch.randn(1, 4, 8, 8),)
    for model in (_Validates(), Outer()):  # at the root, and in a submodule
        with pytest.raises(fxsym.ModelError, match="expected 3 channels"):
            fxsym.analyze(model, example_inputs=bad)
    assert [g.name for g in fxsym.analyze(Outer(), example_inputs=(torch.randn(1, 3, 8, 8),))
            .groups()] == ["inner.a.out_channels"]


def test_trace_errors_suggest_example_inputs_only_when_none_were_given() -> None:
    import json

    class Dumps(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            json.dumps({"n": x.shape[0]})  # a Proxy is not JSON
            return x

    with pytest.raises(fxsym.TraceError) as info:
        fxsym.trace(Dumps(), example_inputs=(torch.randn(2, 3),))
    assert "example_inputs" not in str(info.value) and "leaf" in str(info.value)
    with pytest.raises(fxsym.TraceError, match="Pass example_inputs"):
        fxsym.trace(Dumps())


class _PosConv(nn.Module):
    """wav2vec2's positional convolution: a weight-normed Conv1d added to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv1d(4, 8, 1)
        self.b = nn.Conv1d(8, 16, 1)
        self.conv = nn.utils.parametrizations.weight_norm(
            nn.Conv1d(16, 16, 3, padding=1, groups=2), name="weight", dim=2)
        self.out = nn.Conv1d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.relu(self.a(x)))
        return self.out(h + torch.nn.functional.gelu(self.conv(h)))


def test_parametrized_modules_are_traced_into_and_analysis_holds() -> None:
    from helpers import assert_oracles

    model = _PosConv().eval()
    x = (torch.randn(1, 4, 10),)
    sm = assert_oracles(model, x)
    assert [g.name for g in sm.groups()] == ["a.out_channels"]
    assert [e.where for e in sm.trace_report.of_kind("traced-into")] == ["conv"]
    gm = fxsym.trace(model, example_inputs=x)
    _same(gm, model, *x)


def test_torch_tensor_of_a_traced_size() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 12)
            self.b = nn.Linear(12, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = torch.tensor(x.shape[-2], dtype=torch.float32)
            scale = torch.tensor([x.shape[0], x.shape[1]]).prod()
            return self.b(torch.relu(self.a(x))) / n.sqrt() + scale

    model = Scaled().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 6),))
    assert [g.name for g in sm.groups()] == ["a.out_features"]
    gm = sm.graph_module
    for shape in ((2, 5, 6), (3, 7, 6)):
        _same(gm, model, torch.randn(*shape))


def test_values_of_factories_stay_real_until_they_meet_meta_ones() -> None:
    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.b = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1])
            if (pos >= 3).any():  # real values: the question resolves at trace time
                x = x + pos[:, None] + torch.zeros(x.shape[0], x.shape[1], 1)
            return self.b(torch.relu(self.a(x)))

    model = Positions().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 4),))
    assert [g.name for g in sm.groups()] == ["a.out_features"]
    _same(sm.graph_module, model, torch.randn(2, 5, 4))
