"""Random small nets for the fuzzer (``tests/test_fuzz.py``), each built from a seed.

A net is a :class:`FuzzNet`: a list of steps (plain data, drawn by :func:`random_net`) over a
feature map ``(N, C, H, W)`` whose channel count changes as the steps go, and the modules the
steps use. Its ``forward`` walks the list, so tracing it unrolls the steps into one graph. The
steps are the forms the analysis has rules for — convolutions (plain, depthwise, grouped),
linears over channels, norms (batch, group, layer), activations, residual adds,
concatenations, ``chunk`` and gating, slices and ``narrow`` counted from the start or from
the end, reshapes between maps and tokens, multi-head attention, channels split into groups
by ``unflatten`` (:class:`SplitChannels`: by a number, an attribute, both factors; issue 30)
— and the forms of issue 19 that need the analysis to see what Python reads
(:data:`GUARDED`): branches and values on sizes, sizes merged back from another tensor's
shape, caches filled by a forward; the hooks of issue 30 (:data:`HOOKED`): weights
computed by ``weight_norm``'s pre-hook, user hooks that reorder what a conv reads or returns;
and a branch on which module the forward runs in (:data:`IDENTITY`: a WeakSet, an ``id()``
table, a dict keyed by modules; issue 30).
"""

from __future__ import annotations

import random
import warnings
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: every step kind the default draw uses, with its weight
STEPS: dict[str, int] = {
    "conv": 4, "depthwise": 2, "grouped": 1, "pointwise_linear": 1, "batch_norm": 2,
    "group_norm": 1, "layer_norm": 1, "act": 3, "residual": 2, "concat": 2, "chunk_gate": 1,
    "chunk_swap": 1, "slice": 2, "narrow": 2, "tokens": 1, "attention": 1, "split_reshape": 1,
    "unflatten": 2,
}

#: the forms of issue 19 whose analysis reads sizes in Python (sections 1, 3 and 4)
GUARDED = ("branch_parity", "branch_equal", "size_value", "input_merge", "cache")
#: the forms of issue 30 section 4 whose forward asks which module it is (:class:`Marked`)
IDENTITY = ("identity",)

#: the forms of issue 30 (sections 2 and 3): a conv whose weight torch's ``weight_norm``
#: pre-hook computes (the norm along dim 0, 1 or over all), a conv whose input a user's
#: pre-hook flips or rolls along the channels, one whose output a user's hook does
HOOKED = ("weight_norm", "pre_hook", "post_hook")


def flip_channels(mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A user's forward pre-hook: the module reads its input's channels reversed."""
    return (args[0].flip(1),)


def roll_channels(mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A user's forward pre-hook: the module reads its input's channels rotated by one."""
    return (args[0].roll(1, 1),)


def roll_output(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    """A user's forward hook: the module's output channels rotated by one."""
    return out.roll(1, 1)


class Attention(nn.Module):
    """Multi-head self-attention over tokens ``(N, L, C)``: fused qkv, heads, a projection.

    With ``merge_from_input`` the heads are split and merged back with the sizes read from
    the input (``B, L, C = x.shape``, ``C // heads``: timm's XCA; issue 19 section 3)."""

    def __init__(self, dim: int, heads: int, merge_from_input: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.merge_from_input = merge_from_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, c = x.shape
        head_dim = c // self.heads if self.merge_from_input else -1
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        out = attn.softmax(dim=-1) @ v
        if self.merge_from_input:
            out = out.transpose(1, 2).reshape(n, length, c)
        else:
            out = out.transpose(1, 2).flatten(2)
        return self.proj(out)


class SplitChannels(nn.Module):
    """A conv to ``groups * width`` channels split by ``unflatten`` into ``(groups, width)``,
    written as ``form`` says, then ``tail``: softmax within each group (flattened back), the
    mean of each group (``groups`` channels), the sum of the groups (``width`` channels), or
    flattened back as it is."""

    FORMS = ("number", "attribute", "function", "keywords", "inner", "pair")
    TAILS = ("softmax", "mean", "sum", "flatten")

    def __init__(self, conv: nn.Conv2d, groups: int, form: str, tail: str) -> None:
        super().__init__()
        self.conv, self.groups, self.form, self.tail = conv, groups, form, tail
        # private: the tracer reads them as the numbers a model would write
        self._g, self._width = groups, conv.out_channels // groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        g = self._g
        if self.form == "number":
            z = y.unflatten(1, (g, -1))
        elif self.form == "attribute":
            z = y.unflatten(1, (self.groups, -1))
        elif self.form == "function":
            z = torch.unflatten(y, -3, (g, -1))
        elif self.form == "keywords":
            z = y.unflatten(dim=1, sizes=[g, -1])
        elif self.form == "inner":
            z = y.unflatten(1, (-1, self._width))
        else:
            z = y.unflatten(1, (g, self._width))
        if self.tail == "softmax":
            return z.softmax(2).flatten(1, 2)
        if self.tail == "mean":
            return z.mean(2)
        if self.tail == "sum":
            return z.sum(1)
        return z.flatten(1, 2)

    def out_channels(self) -> int:
        return {"mean": self._g, "sum": self._width}.get(self.tail, self._g * self._width)


class CachedScale(nn.Module):
    """A per-channel scale whose exponential is cached by the first eval forward (the shape
    of timm's ``attention_bias_cache``; issue 19 section 4)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(channels))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return x * self.log_scale.exp()[:, None, None]
        if "scale" not in self.cache:
            self.cache["scale"] = self.log_scale.exp()
        return x * self.cache["scale"][:, None, None]


#: a model's registries of its own modules (issue 30, section 4): by identity (a WeakSet), by
#: ``id()`` and keyed by the module
MARKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
MARKED_IDS: set[int] = set()
MARKED_BY: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


class Marked(nn.Module):
    """A conv whose output channels are rolled when the module is registered — asked by
    ``self in MARKED``, ``id(self) in MARKED_IDS`` or ``MARKED_BY.get(self)`` (``how``). A
    marked module registers itself when built and when copied (``__setstate__``, which a
    deep copy calls), as a model keeping a registry of its modules would; a trace that asks
    another object takes the branch without the roll."""

    def __init__(self, conv: nn.Conv2d, how: int, marked: bool) -> None:
        super().__init__()
        self.conv = conv
        self.how = how
        self.marked = marked
        self._register()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._register()

    def _register(self) -> None:
        if self.marked:
            MARKED.add(self)
            MARKED_IDS.add(id(self))
            weakref.finalize(self, MARKED_IDS.discard, id(self))
            MARKED_BY[self] = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.how == 0:
            hit = self in MARKED
        elif self.how == 1:
            hit = id(self) in MARKED_IDS
        else:
            hit = MARKED_BY.get(self, False)
        return y.roll(1, 1) if hit else y


class FuzzNet(nn.Module):
    """The net of one seed: ``steps`` (kind and ints) walked over a feature map."""

    def __init__(self, steps: list[tuple[Any, ...]], mods: dict[str, nn.Module],
                 classes: int) -> None:
        super().__init__()
        self.steps = steps
        self.mods = nn.ModuleDict(mods)
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for step in self.steps:
            h = self._step(step, h)
        return h

    def _step(self, step: tuple[Any, ...], h: torch.Tensor) -> torch.Tensor:
        kind, key = step[0], step[1]
        m = self.mods
        if kind in ("conv", "depthwise", "grouped", "batch_norm", "group_norm", "stem",
                    "cache", "unflatten", "identity", *HOOKED):
            return m[key](h)
        if kind == "head":
            return m[key](h.mean((2, 3)))
        if kind == "pointwise_linear":
            return m[key](h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if kind == "layer_norm":
            return m[key](h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if kind == "act":
            return (F.relu, F.gelu, F.silu, torch.tanh)[step[2]](h)
        if kind == "residual":
            return h + m[key](F.relu(h))
        if kind == "concat":
            return torch.cat([m[key + "a"](h), m[key + "b"](h)], 1)
        if kind == "chunk_gate":
            a, b = m[key](h).chunk(2, 1)
            return a * torch.sigmoid(b)
        if kind == "chunk_swap":
            a, b = h.chunk(2, 1)
            return torch.cat([b, m[key](a)], 1)
        if kind == "slice":
            start, stop = step[2], step[3]
            return torch.cat([m[key](h[:, start:stop]), m[key + "w"](h)], 1)
        if kind == "narrow":
            start, length = step[2], step[3]
            return torch.cat([m[key](torch.narrow(h, 1, start, length)), m[key + "w"](h)], 1)
        if kind == "tokens":
            n, c, hh, ww = h.shape
            t = m[key](h.flatten(2).transpose(1, 2))
            return t.transpose(1, 2).reshape(n, -1, hh, ww)
        if kind == "attention":
            n, c, hh, ww = h.shape
            t = h.flatten(2).transpose(1, 2)
            t = t + m[key](t)
            return t.transpose(1, 2).reshape(n, c, hh, ww)
        if kind == "split_reshape":  # (N, g * c', H, W) -> (N, g, c', H, W) -> sum of groups
            n, c, hh, ww = h.shape
            return m[key](h).reshape(n, step[2], -1, hh, ww).sum(1)
        if kind == "branch_parity":
            y = m[key](h)
            return y * 2 if y.shape[1] % 2 == 0 else y
        if kind == "branch_equal":
            y = m[key](h)
            return y * 2 if y.shape[1] == step[2] else y
        if kind == "size_value":
            y = m[key](h)
            return m[key + "b"](y) + y.shape[1]
        raise ValueError(kind)


def random_net(seed: int, forms: tuple[str, ...] = ()) -> tuple[FuzzNet, torch.Tensor]:
    """The net of ``seed`` and an input for it: a stem conv, 2 to 6 random steps (each of
    ``forms`` once more, at random places), a pooled linear head."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    mods: dict[str, nn.Module] = {}
    steps: list[tuple[Any, ...]] = []
    c = rng.choice([4, 6, 8, 12])
    mods["s0"] = nn.Conv2d(3, c, 3, padding=1)
    steps.append(("stem", "s0"))
    kinds = rng.choices(list(STEPS), weights=list(STEPS.values()), k=rng.randint(2, 6))
    for form in forms:
        kinds.insert(rng.randint(0, len(kinds)), form)
    for i, kind in enumerate(kinds, 1):
        key = f"s{i}"
        c = _add_step(rng, kind, key, c, mods, steps)
    classes = rng.randint(2, 5)
    mods["head"] = nn.Linear(c, classes)
    steps.append(("head", "head"))
    net = FuzzNet(steps, mods, classes).eval()
    x = torch.randn(rng.choice([1, 2]), 3, 4, rng.choice([4, 6]))
    if "cache" in forms:
        with torch.no_grad():
            net(x)  # an eval forward fills the caches, as measuring accuracy would
    return net, x


def _conv(c_in: int, c_out: int, rng: random.Random, groups: int = 1) -> nn.Conv2d:
    k = rng.choice([1, 3])
    return nn.Conv2d(c_in, c_out, k, padding=k // 2, groups=groups)


def _add_step(rng: random.Random, kind: str, key: str, c: int, mods: dict[str, nn.Module],
              steps: list[tuple[Any, ...]]) -> int:
    """Append one step of ``kind`` on ``c`` channels; the channels after it."""
    widths = [4, 6, 8, 10, 12, 16]
    if kind == "conv":
        out = rng.choice(widths)
        mods[key] = _conv(c, out, rng)
        steps.append((kind, key))
        return out
    if kind == "depthwise":
        mods[key] = nn.Conv2d(c, c, 3, padding=1, groups=c)
        steps.append((kind, key))
        return c
    if kind == "grouped":
        g = 2
        if c % g:
            return _add_step(rng, "conv", key, c, mods, steps)
        out = rng.choice([w for w in widths if w % g == 0])
        mods[key] = _conv(c, out, rng, groups=g)
        steps.append((kind, key))
        return out
    if kind == "pointwise_linear":
        out = rng.choice(widths)
        mods[key] = nn.Linear(c, out)
        steps.append((kind, key))
        return out
    if kind == "batch_norm":
        mods[key] = nn.BatchNorm2d(c)
        steps.append((kind, key))
        return c
    if kind == "group_norm":
        mods[key] = nn.GroupNorm(rng.choice([1, c]), c)
        steps.append((kind, key))
        return c
    if kind == "layer_norm":
        mods[key] = nn.LayerNorm(c)
        steps.append((kind, key))
        return c
    if kind == "act":
        steps.append((kind, key, rng.randrange(4)))
        return c
    if kind == "residual":
        mods[key] = _conv(c, c, rng)
        steps.append((kind, key))
        return c
    if kind == "concat":
        a, b = rng.choice(widths), rng.choice(widths)
        mods[key + "a"], mods[key + "b"] = _conv(c, a, rng), _conv(c, b, rng)
        steps.append((kind, key))
        return a + b
    if kind == "chunk_gate":
        out = rng.choice([4, 6, 8])
        mods[key] = _conv(c, 2 * out, rng)
        steps.append((kind, key))
        return out
    if kind == "chunk_swap":
        if c % 2:
            return _add_step(rng, "conv", key, c, mods, steps)
        mods[key] = _conv(c // 2, c // 2, rng)
        steps.append((kind, key))
        return c
    if kind in ("slice", "narrow"):
        if c < 4:
            return _add_step(rng, "conv", key, c, mods, steps)
        length = rng.randint(1, c - 2)
        first = rng.randint(0, c - length)
        from_end = rng.random() < 0.5
        start = first - c if from_end else first
        if kind == "slice":
            stop: int | None = start + length
            if from_end and stop == 0:
                stop = None
            steps.append((kind, key, start, stop))
        else:
            steps.append((kind, key, start, length))
        out_a, out_b = rng.choice(widths), rng.choice(widths)
        mods[key], mods[key + "w"] = _conv(length, out_a, rng), _conv(c, out_b, rng)
        return out_a + out_b
    if kind == "tokens":
        out = rng.choice(widths)
        mods[key] = nn.Linear(c, out)
        steps.append((kind, key))
        return out
    if kind in ("attention", "input_merge"):
        heads = rng.choice([h for h in (1, 2, 4) if c % h == 0])
        mods[key] = Attention(c, heads, merge_from_input=kind == "input_merge")
        steps.append(("attention", key))
        return c
    if kind == "split_reshape":
        g = rng.choice([2, 3])
        out = rng.choice([2, 4])
        mods[key] = _conv(c, g * out, rng)
        steps.append((kind, key, g))
        return out
    if kind.split("/")[0] == "unflatten":  # "unflatten/FORM/TAIL" forces both
        g, width = rng.choice([2, 3, 4]), rng.choice([2, 3, 4])
        conv = _conv(c, g * width, rng)
        drawn = rng.choice(SplitChannels.FORMS), rng.choice(SplitChannels.TAILS)
        form, tail = kind.split("/")[1:] or drawn
        mods[key] = split = SplitChannels(conv, g, form, tail)
        steps.append(("unflatten", key, form, tail))
        return split.out_channels()
    if kind in ("branch_parity", "branch_equal"):
        out = rng.choice([w for w in widths if w % 2 == 0])
        mods[key] = _conv(c, out, rng)
        steps.append((kind, key, out))
        return out
    if kind == "size_value":
        out = rng.choice(widths)
        mods[key], mods[key + "b"] = _conv(c, out, rng), _conv(out, out, rng)
        steps.append((kind, key))
        return out
    if kind == "cache":
        mods[key] = CachedScale(c)
        steps.append((kind, key))
        return c
    if kind in HOOKED:
        out = rng.choice(widths)
        conv = _conv(c, out, rng)
        if kind == "weight_norm":
            with warnings.catch_warnings():  # the hook version, deprecated
                warnings.simplefilter("ignore", FutureWarning)
                conv = nn.utils.weight_norm(conv, dim=rng.choice([0, 1, None]))
        elif kind == "pre_hook":
            conv.register_forward_pre_hook(rng.choice([flip_channels, roll_channels]))
        else:
            conv.register_forward_hook(roll_output)
        mods[key] = conv
        steps.append((kind, key))
        return out
    if kind == "identity":
        out = rng.choice(widths)
        mods[key] = Marked(_conv(c, out, rng), rng.randrange(3), rng.random() < 0.8)
        steps.append((kind, key))
        return out
    raise ValueError(kind)
