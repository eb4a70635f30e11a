"""Values computed from metadata are what running gives.

The tracer computes a node's value without running it where a rule says what it is: a
family's ``value=`` rule (the nn plugin's for convolutions, ``nn.Linear`` and Swin's window
attention) and the core's rules for pointwise arithmetic, ``F.adaptive_avg_pool2d``,
``torch.cat``, ``F.max_pool2d``, ``F.avg_pool2d`` and ``mean`` (:mod:`fxsym.tracer.values`).
Each rule either says ``None`` or gives exactly the metadata (shape, dtype, strides, device)
that running on the meta device gives; here over many generated configurations, including
ones where running raises (then the rule must say ``None``), and over every node of real
models. A wrong input still raises the same ``fxsym.ModelError``.
"""

from __future__ import annotations

import functools
import operator
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxsym
from fxsym.registry import get_registry
from fxsym.tracer.meta import meta_copy, to_meta
from fxsym.tracer.values import op_value

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _meta(value: Any) -> Any:
    """Metadata of a value, tensors by shape, dtype, strides and device."""
    if isinstance(value, torch.Tensor):
        return (type(value), tuple(value.shape), value.dtype, value.stride(), value.device,
                value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_meta(v) for v in value))
    return value


def _run(fn: Callable[[], Any]) -> tuple[bool, Any]:
    with torch.no_grad():
        try:
            return True, fn()
        except Exception as exc:
            return False, exc


class _Tally:
    """How often a rule was asked and how often it answered; every answer is compared with
    running."""

    def __init__(self) -> None:
        self.checked = self.given = 0

    def check(self, value: Any, run: Callable[[], Any], context: Any) -> bool:
        """Whether the rule answered ``value`` (not ``None``); an answer must be exactly the
        metadata of what ``run`` gives, and ``run`` must not raise."""
        self.checked += 1
        if value is None:
            return False
        self.given += 1
        ran, expected = _run(run)
        assert ran and _meta(value) == _meta(expected), (context, expected)
        return True


def _rule(cls: type) -> Callable[..., Any]:
    fxsym.load_plugins()
    entry = get_registry().sym_info_entry(cls)
    assert entry is not None and entry.value is not None, cls
    return entry.value


def _layouts(x: torch.Tensor, rng: random.Random) -> list[torch.Tensor]:
    """``x`` row-major and in other layouts of the same shape: channels-last, permuted
    copies, a slice of a larger tensor, an expanded size-1 dim, odd strides on size-1 dims."""
    out = [x]
    if x.dim() == 4:
        out.append(x.contiguous(memory_format=torch.channels_last))
    if x.dim() == 5:
        out.append(x.contiguous(memory_format=torch.channels_last_3d))
    if x.dim() >= 2:
        out.append(x.transpose(0, -1).contiguous().transpose(0, -1))
        last_first = torch.empty((x.shape[-1], *x.shape[:-1]), dtype=x.dtype, device="meta")
        out.append(last_first.permute(*range(1, x.dim()), 0))  # NCHW seen as NHWC
        bigger = torch.empty((*x.shape[:-1], x.shape[-1] + 2), dtype=x.dtype, device="meta")
        out.append(bigger[..., 1:-1])
    if x.dim() >= 1 and x.shape[0] > 0:
        out.append(x[:1].expand(x.shape))
        out.append(x.as_strided(x.shape, [s if n != 1 else rng.choice([1, 7])
                                          for s, n in zip(x.stride(), x.shape)]))
    return out


# -- convolutions ---------------------------------------------------------------------------------
def _conv_configs(rng: random.Random, count: int) -> list[dict[str, Any]]:
    configs = []
    for _ in range(count):
        n = rng.choice([1, 2, 2, 3])
        transposed = rng.random() < 0.3
        groups = rng.choice([1, 1, 2, 3])
        cin = groups * rng.choice([1, 2, 3])
        cout = groups * rng.choice([1, 2])
        padding: Any = rng.choice([0, 1, 2, "same", "valid", (1,) * n])
        stride = rng.choice([1, 1, 2, 3])
        if transposed and isinstance(padding, str):
            padding = 0
        if padding == "same":
            stride = 1
        configs.append(dict(
            n=n, transposed=transposed, cin=cin, cout=cout, groups=groups,
            kernel=tuple(rng.choice([1, 2, 3]) for _ in range(n)), stride=stride,
            padding=padding, dilation=rng.choice([1, 1, 2]), bias=rng.random() < 0.6,
            padding_mode="zeros" if transposed or rng.random() < 0.85 else "reflect",
            output_padding=rng.choice([0, 1]) if transposed else 0,
            batch=rng.choice([None, 1, 2]), spatial=tuple(rng.choice([1, 3, 5, 8])
                                                         for _ in range(n)),
            channels=cin if rng.random() < 0.85 else cin + 1,
            dtype=rng.choice(DTYPES), input_dtype=None if rng.random() < 0.9 else torch.float32,
        ))
    return configs


def _conv(cfg: dict[str, Any]) -> nn.Module:
    kind = {(1, False): nn.Conv1d, (2, False): nn.Conv2d, (3, False): nn.Conv3d,
            (1, True): nn.ConvTranspose1d, (2, True): nn.ConvTranspose2d,
            (3, True): nn.ConvTranspose3d}[(cfg["n"], cfg["transposed"])]
    extra: dict[str, Any] = {}
    if cfg["transposed"]:
        extra["output_padding"] = cfg["output_padding"]
    return kind(cfg["cin"], cfg["cout"], cfg["kernel"], stride=cfg["stride"],
                padding=cfg["padding"], dilation=cfg["dilation"], groups=cfg["groups"],
                bias=cfg["bias"], padding_mode=cfg["padding_mode"], device="meta",
                dtype=cfg["dtype"], **extra)


def test_conv_rule_gives_what_running_gives() -> None:
    rng = random.Random(0)
    tally = _Tally()
    for cfg in _conv_configs(rng, 700):
        try:
            mod = _conv(cfg)
        except (ValueError, RuntimeError):  # a configuration torch refuses to build
            continue
        rule = _rule(type(mod))
        batch = () if cfg["batch"] is None else (cfg["batch"],)
        dtype = cfg["input_dtype"] or cfg["dtype"]
        x = torch.empty((*batch, cfg["channels"], *cfg["spatial"]), dtype=dtype, device="meta")
        for inp in _layouts(x, rng):
            tally.check(rule(mod, (inp,), {}), functools.partial(mod, inp), (cfg, inp.stride()))
    assert tally.checked > 1500 and tally.given > 300, (tally.checked, tally.given)


def test_conv_rule_declines_subclasses_and_other_calls() -> None:
    class Scaled(nn.Conv2d):
        def _conv_forward(self, x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
            return super()._conv_forward(x, w, b)[:, :1]

    rule = _rule(nn.Conv2d)
    x = torch.empty(1, 3, 8, 8, device="meta")
    assert rule(Scaled(3, 4, 3, device="meta"), (x,), {}) is None
    conv = nn.Conv2d(3, 4, 3, device="meta")
    assert rule(conv, (x,), {}) is not None
    assert rule(conv, (x, x), {}) is None
    assert rule(conv, (torch.empty(1, 3, 8, 8, dtype=torch.int64, device="meta"),), {}) is None
    assert rule(conv, (x.requires_grad_(),), {}) is None


def test_rules_decline_a_replaced_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library that replaces a torch.nn forward (on the class or on one module) makes the
    module compute something else: it is run, not described."""
    x = torch.empty(1, 3, 8, 8, device="meta")
    conv = nn.Conv2d(3, 4, 3, device="meta")
    rule = _rule(nn.Conv2d)
    assert rule(conv, (x,), {}) is not None
    original = nn.Conv2d._conv_forward
    monkeypatch.setattr(nn.Conv2d, "_conv_forward",
                        lambda self, x, w, b: original(self, x, w, b)[:, :1])
    assert rule(conv, (x,), {}) is None
    monkeypatch.undo()
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    model[0].forward = lambda x: x[:, :2]  # run on the traced copy: the shape says it ran
    gm = fxsym.trace(model, example_inputs=(torch.randn(1, 3, 8, 8),))
    assert [tuple(n.meta["val"].shape) for n in gm.graph.nodes
            if n.op == "call_module"] == [(1, 2, 8, 8)]


# -- Linear ---------------------------------------------------------------------------------------
def test_linear_rule_gives_what_running_gives() -> None:
    rng = random.Random(1)
    rule = _rule(nn.Linear)
    tally = _Tally()
    for _ in range(400):
        fin, fout = rng.choice([1, 3, 8]), rng.choice([1, 4, 6])
        dtype = rng.choice(DTYPES)
        mod = nn.Linear(fin, fout, bias=rng.random() < 0.6, device="meta", dtype=dtype)
        lead = tuple(rng.choice([1, 2, 3]) for _ in range(rng.choice([0, 1, 2, 3])))
        last = fin if rng.random() < 0.85 else fin + 1
        xdtype = dtype if rng.random() < 0.9 else torch.float32
        x = torch.empty((*lead, last), dtype=xdtype, device="meta")
        for inp in _layouts(x, rng):
            tally.check(rule(mod, (inp,), {}), functools.partial(mod, inp),
                        (lead, last, fin, inp.stride()))
    assert tally.checked > 1000 and tally.given > 250, (tally.checked, tally.given)


# -- Swin window attention ------------------------------------------------------------------------
def test_swin_attention_rule_gives_what_running_gives() -> None:
    swin = pytest.importorskip("torchvision.models.swin_transformer")
    rng = random.Random(2)
    rule = _rule(swin.ShiftedWindowAttention)
    tally = _Tally()
    for _ in range(40):
        cls = rng.choice([swin.ShiftedWindowAttention, swin.ShiftedWindowAttentionV2])
        heads = rng.choice([1, 2, 3])
        dim = heads * rng.choice([2, 4])
        window = [rng.choice([2, 3, 4]), rng.choice([2, 4])]
        shift = [rng.choice([0, 1]), rng.choice([0, 2])]
        mod = cls(dim, window, shift, heads, qkv_bias=rng.random() < 0.7,
                  proj_bias=rng.random() < 0.7)
        dtype = rng.choice(DTYPES)
        mod = mod.to(dtype).train(rng.random() < 0.3)
        assert _rule(cls) is rule
        clone = meta_copy(mod)
        channels = dim if rng.random() < 0.85 else dim + heads
        x = torch.empty(rng.choice([1, 2]), rng.choice([1, 3, 4, 7]), rng.choice([2, 4, 5]),
                        channels, dtype=dtype, device="meta")
        for inp in _layouts(x, rng):
            tally.check(rule(mod, (inp,), {}), functools.partial(clone, inp),
                        (cls, window, shift, inp.shape))
    assert tally.given > 20, (tally.checked, tally.given)


# -- pointwise arithmetic and adaptive average pooling (the core's rules) -----------------------
_POINTWISE: list[tuple[str, Any]] = [
    ("call_function", operator.add), ("call_function", operator.sub),
    ("call_function", operator.mul), ("call_function", operator.truediv),
    ("call_function", torch.add), ("call_function", torch.mul), ("call_function", torch.sub),
    ("call_function", torch.div), ("call_function", torch.true_divide),
    ("call_method", "add"), ("call_method", "mul"), ("call_method", "sub"),
    ("call_method", "div"),
]


def _call(op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if op == "call_method":
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


def _operand(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    kind = rng.random()
    if kind < 0.12:
        return rng.choice([2, -3, 0.5, float("inf"), 2**40, True, 2**70, 1j])
    if kind < 0.2:
        shape = ()
    elif kind < 0.55:  # broadcast: some dims to 1, some leading dims dropped
        shape = tuple(1 if rng.random() < 0.5 else s for s in shape)
        shape = shape[rng.choice([0, 0, 1]):]
    elif kind < 0.62 and shape:  # one dim that does not broadcast
        i = rng.randrange(len(shape))
        shape = (*shape[:i], shape[i] + 1, *shape[i + 1:])
    elif kind < 0.7:  # more dims than the other operand
        shape = (rng.choice([1, 2]), *shape)
    if rng.random() < 0.12:
        dtype = rng.choice([torch.int64, torch.int32, torch.bool, torch.float32, torch.float16])
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("seed", [3, 13, 23])
def test_pointwise_rule_gives_what_running_gives(seed: int) -> None:
    rng = random.Random(seed)
    tally, reordered = _Tally(), 0
    for _ in range(700):
        shape = tuple(rng.choice([1, 2, 3, 5]) for _ in range(rng.choice([0, 1, 2, 3, 4])))
        if rng.random() < 0.05:
            shape = (*shape, 0)
        dtype = rng.choice(DTYPES)
        a = torch.empty(shape, dtype=dtype, device="meta")
        b = _operand(rng, shape, dtype)
        op, target = rng.choice(_POINTWISE)
        others = _layouts(b, rng) if isinstance(b, torch.Tensor) else [b]
        for x in _layouts(a, rng):
            other = rng.choice(others)
            for args in ((x, other), (other, x), (x, x)):
                if op == "call_method" and not isinstance(args[0], torch.Tensor):
                    continue
                value = op_value(op, target, args, {})
                if tally.check(value, functools.partial(_call, op, target, args, {}), (
                        target, [(a.shape, a.stride()) if isinstance(a, torch.Tensor) else a
                                 for a in args])):
                    reordered += not value.is_contiguous()
    assert tally.checked > 3000 and tally.given > 800 and reordered > 50, (
        tally.checked, tally.given, reordered)


def test_pointwise_rule_leaves_other_calls_to_running() -> None:
    x = torch.empty(2, 3, device="meta")
    assert op_value("call_function", torch.add, (x, x), {"alpha": 2}) is None
    assert op_value("call_function", torch.add, (x, x, 2), {}) is None
    assert op_value("call_method", "add_", (x, x), {}) is None
    assert op_value("call_function", operator.floordiv, (x, x), {}) is None
    assert op_value("call_function", operator.add, (x, torch.empty(4, device="meta")), {}) is None
    assert op_value("call_function", operator.add, (2, 3), {}) is None
    assert op_value("call_function", operator.add, (x, x), {}) is not None


def test_adaptive_avg_pool2d_rule_gives_what_running_gives() -> None:
    rng = random.Random(4)
    tally = _Tally()
    sizes: list[Any] = [1, 2, 3, 7, (1, 1), (2, 3), (None, 2), (1, None), [3, 3], (None, None),
                        (0, 2), (2,), (1, 2, 3), -1, 2.0]
    for _ in range(300):
        shape = tuple(rng.choice([1, 2, 3, 6, 9]) for _ in range(rng.choice([2, 3, 4, 5])))
        x = torch.empty(shape, dtype=rng.choice((*DTYPES, torch.int64)), device="meta")
        size = rng.choice(sizes)
        for inp in _layouts(x, rng):
            for args, kwargs in (((inp, size), {}), ((inp,), {"output_size": size})):
                tally.check(op_value("call_function", F.adaptive_avg_pool2d, args, kwargs),
                            functools.partial(F.adaptive_avg_pool2d, *args, **kwargs),
                            (shape, size, inp.stride()))
    assert tally.checked > 1000 and tally.given > 200, (tally.checked, tally.given)


def test_cat_rule_gives_what_running_gives() -> None:
    rng = random.Random(5)
    tally = _Tally()
    for _ in range(500):
        ndim = rng.choice([1, 2, 3, 4, 4, 5])
        dim = rng.randrange(-ndim, ndim) if rng.random() < 0.95 else ndim
        base = [rng.choice([1, 2, 3]) for _ in range(ndim)]
        dtype = rng.choice(DTYPES)
        tensors = []
        for _ in range(rng.choice([1, 2, 3, 5])):
            shape = list(base)
            shape[dim % ndim] = rng.choice([1, 2, 4])
            if rng.random() < 0.05:  # another size elsewhere, another dtype, an empty dim
                shape[rng.randrange(ndim)] += 1
            kind = rng.choice([dtype] * 12 + [torch.float32, torch.int64])
            if rng.random() < 0.03:
                shape[0] = 0
            tensors.append(rng.choice(_layouts(torch.empty(shape, dtype=kind, device="meta"),
                                               rng) + [None] * 3))
        tensors = [t if t is not None else torch.empty(
            shape, dtype=dtype, device="meta") for t in tensors]
        for args, kwargs in (((tensors, dim), {}), ((tensors,), {"dim": dim}),
                             ((tuple(tensors),), {}) if dim == 0 else ((tensors, dim), {})):
            tally.check(op_value("call_function", torch.cat, args, kwargs),
                        functools.partial(torch.cat, *args, **kwargs),
                        (dim, [(t.shape, t.stride(), t.dtype) for t in tensors]))
    assert tally.checked > 1000 and tally.given > 300, (tally.checked, tally.given)


def _pool_size(rng: random.Random) -> Any:
    return rng.choice([1, 2, 3, 4, 0, -1, (2, 3), (3,), [3, 1], (1, 2, 3), 2.0])


@pytest.mark.parametrize("target", [F.max_pool2d, F.avg_pool2d])
def test_pool2d_rules_give_what_running_gives(target: Any) -> None:
    rng = random.Random(6)
    tally = _Tally()
    for _ in range(1000):
        shape = tuple(rng.choice([1, 2, 3, 5, 8, 9]) for _ in range(rng.choice([3, 4, 4, 4, 5])))
        x = torch.empty(shape, dtype=rng.choice((*DTYPES, torch.int64)), device="meta")
        kernel = _pool_size(rng)
        extra: dict[str, Any] = {}
        for name, choices in (("stride", [None, 1, 2, 3, (1, 2), [], 0]),
                              ("padding", [0, 1, 2, (1, 0), -1]),
                              ("ceil_mode", [False, True, 1]),
                              *((("dilation", [1, 2, (2, 1), 0]),
                                 ("return_indices", [False, True]))
                                if target is F.max_pool2d else
                                (("count_include_pad", [True, False]),
                                 ("divisor_override", [None, 2])))):
            if rng.random() < 0.6:
                extra[name] = rng.choice(choices)
        positional = rng.random() < 0.3 and "stride" in extra and "padding" in extra
        for inp in _layouts(x, rng):
            if positional:
                rest = {k: v for k, v in extra.items() if k not in ("stride", "padding")}
                args, kwargs = (inp, kernel, extra["stride"], extra["padding"]), rest
            else:
                args, kwargs = (inp, kernel), extra
            tally.check(op_value("call_function", target, args, kwargs),
                        functools.partial(target, *args, **kwargs),
                        (shape, inp.stride(), kernel, extra))
    assert tally.checked > 3000 and tally.given > 100, (tally.checked, tally.given)


def test_mean_rule_gives_what_running_gives() -> None:
    rng = random.Random(7)
    tally = _Tally()
    for _ in range(400):
        ndim = rng.choice([1, 2, 3, 4, 4])
        shape = tuple(rng.choice([1, 2, 3, 5]) for _ in range(ndim))
        x = torch.empty(shape, dtype=rng.choice((*DTYPES, torch.int64)), device="meta")
        dims: Any = rng.choice([rng.randrange(-ndim, ndim),
                                [rng.randrange(-ndim, ndim) for _ in range(rng.choice([1, 2]))],
                                tuple(range(ndim)), [ndim], [], None, (0, 0)])
        keep = rng.choice([None, False, True, 1])
        for inp in _layouts(x, rng):
            calls: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = [
                ("call_method", "mean", (inp, dims), {}),
                ("call_method", "mean", (inp,), {"dim": dims}),
                ("call_function", torch.mean, (inp, dims), {})]
            if keep is not None:
                calls = [(op, t, a, {**k, "keepdim": keep}) for op, t, a, k in calls]
                calls.append(("call_method", "mean", (inp, dims, keep), {}))
            for op, target, args, kwargs in calls:
                tally.check(op_value(op, target, args, kwargs),
                            functools.partial(_call, op, target, args, kwargs),
                            (shape, inp.stride(), dims, keep))
    assert tally.checked > 3000 and tally.given > 500, (tally.checked, tally.given)


# -- through the tracer ---------------------------------------------------------------------------
class _Counted(nn.Module):
    """A leaf family of a test: its forward counts its runs."""

    runs = 0

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).runs += 1
        return x @ self.weight


def _counted_info(mod: nn.Module) -> fxsym.SymInfo:
    return fxsym.SymInfo(n_in=fxsym.Symbol(cl_type=fxsym.Symbol.CLType.INCOMING,
                                           elastic_dims={-1}))


def test_a_registered_value_rule_replaces_running_the_leaf() -> None:
    calls: list[nn.Module] = []

    def value(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(mod)
        if getattr(mod, "declines", False):
            return None
        return torch.empty(*args[0].shape[:-1], 5, device="meta")

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = _Counted()
            self.b = _Counted()
            self.a.declines = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    fxsym.SymMap.register(_Counted, value=value)(_counted_info)
    try:
        _Counted.runs = 0
        model = Model()
        gm = fxsym.trace(model, example_inputs=(torch.randn(3, 5),))
        # the rule declines a, which runs; b's value is the rule's, b is not run
        assert calls == [model.a, model.b] and _Counted.runs == 1
        vals = {n.name: n.meta["val"] for n in gm.graph.nodes if n.op == "call_module"}
        assert tuple(vals["b"].shape) == (3, 5) and vals["b"].is_meta
    finally:
        fxsym.SymMap.unregister(_Counted)


def test_a_value_rule_is_not_used_when_a_hook_runs_around_the_forward() -> None:
    seen: list[int] = []

    def value(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        seen.append(1)
        return torch.empty(*args[0].shape[:-1], 5, device="meta")

    x = torch.randn(3, 5)
    fxsym.SymMap.register(_Counted, value=value)(_counted_info)
    try:
        with pytest.warns(FutureWarning):  # torch's own pre-hook: the guard keeps it
            normed = nn.Sequential(torch.nn.utils.weight_norm(_Counted()))
        fxsym.trace(normed, example_inputs=(x,))
        assert not seen
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
        try:  # a global hook runs around every module
            fxsym.trace(nn.Sequential(_Counted()), example_inputs=(x,))
        finally:
            handle.remove()
        assert not seen
        fxsym.trace(nn.Sequential(_Counted()), example_inputs=(x,))
        assert len(seen) == 1
    finally:
        fxsym.SymMap.unregister(_Counted)


@pytest.mark.parametrize("model, x, torch_says", [
    (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), torch.randn(1, 4, 16, 16), "channel"),
    (nn.Sequential(nn.Linear(6, 3)), torch.randn(2, 5), "same reduction dim"),
    (nn.Sequential(nn.Conv1d(2, 2, 5)), torch.randn(1, 2, 3), "Kernel size can't be greater"),
])
def test_a_wrong_input_raises_the_model_error_running_raises(
        model: nn.Module, x: torch.Tensor, torch_says: str) -> None:
    with pytest.raises(Exception) as direct:
        with torch.no_grad():
            meta_copy(model[0])(to_meta(x))
    assert torch_says in str(direct.value)
    with pytest.raises(fxsym.ModelError) as raised:
        fxsym.analyze(model, example_inputs=(x,))
    assert str(direct.value) in str(raised.value)
    assert "node '_0'" in str(raised.value)


def test_swin_attention_with_other_channels_is_run_as_before() -> None:
    """Running it raises (its qkv projection does not fit), and the tracer reports the value
    unknown (the window attention reads its index table's data): the rule says ``None``."""
    swin = pytest.importorskip("torchvision.models.swin_transformer")
    model = nn.Sequential(swin.ShiftedWindowAttention(8, [2, 2], [1, 1], 2))
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 4, 4, 6),))
    lines = [str(e) for e in sm.trace_report]
    assert any("unknown-value" in line and "same reduction dim" in line for line in lines)


# -- real models: every value a rule gave is what running gives --------------------------------
def _rerun(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    args, kwargs = torch.fx.node.map_aggregate(
        (node.args, node.kwargs), lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a)
    if node.op == "call_module":
        return meta_copy(gm.get_submodule(str(node.target)))(*args, **kwargs)
    return _call(node.op, node.target, args, kwargs)


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "swin_t", "regnet_y_400mf",
                                  "efficientnet_b0", "resnet18", "convnext_tiny", "vit_b_16",
                                  "densenet121", "shufflenet_v2_x0_5"])
def test_every_node_value_of_a_real_model_is_what_running_gives(name: str) -> None:
    tv = pytest.importorskip("torchvision")
    model = tv.models.get_model(name, weights=None).eval()
    gm = fxsym.trace(model, example_inputs=(torch.randn(1, 3, 224, 224),))
    ruled = 0
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op not in ("call_module", "call_function", "call_method"):
                continue
            if "val" not in node.meta or not all(
                    "val" in a.meta for a in node.all_input_nodes):
                continue
            if node.op == "call_module":
                mod = gm.get_submodule(str(node.target))
                entry = get_registry().sym_info_entry(type(mod))
                if entry is None or entry.value is None:
                    continue
            elif node.target not in (operator.add, operator.mul, operator.sub,
                                     operator.truediv, F.adaptive_avg_pool2d, torch.add,
                                     torch.mul, "add", "mul", torch.cat):
                continue
            ruled += 1
            assert _meta(node.meta["val"]) == _meta(_rerun(gm, node)), node.format_node()
    assert ruled > 20
