"""Assertions shared by the analysis tests: the two oracles of DESIGN.md, finding a group
by a symbol it holds, the probe layout as the oracle of the derived one, and the small model
the loader tests save and load, with the check that a refused load leaves it as it was."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym import paramlayout
from fxsym.errors import FxsymError, PlanError
from fxsym.oracles import check_permutation, check_shrink, check_values, probe_layout


def assert_oracles(model: nn.Module, example_inputs: Any, *, min_groups: int = 1,
                   expect_unchecked: bool = False) -> fxsym.SymMap:
    """Analyze ``model``, then check permutation invariance, shrink runs and shrink values
(dropping units equals zeroing them where they are read; groups whose dim meets a
normalisation are not checked by value, and a model with none checked passes that oracle).

    The model is used as given (the oracles work on perturbed eval-mode copies). A model with
    no sortable group of size ≥ 2 leaves the permutation oracle *not checked*, which fails
    unless the test says so with ``expect_unchecked=True`` (which then requires it).
    """
    sm = fxsym.analyze(model, example_inputs=example_inputs)
    assert len(sm.groups()) >= min_groups, [g.name for g in sm.groups()]
    perm = check_permutation(model, sm, example_inputs)
    if expect_unchecked:
        assert perm.status == "not checked", f"permutation oracle: {perm}"
    else:
        assert perm.ok, f"permutation oracle: {perm}"
    shrink = check_shrink(model, sm, example_inputs)
    assert shrink.status != "failed", f"shrink oracle: {shrink}"
    assert shrink.ok or expect_unchecked, f"shrink oracle: {shrink}"
    values = check_values(model, sm, example_inputs)
    assert values.status != "failed", f"value oracle: {values}"
    return sm


def group_with(sm: fxsym.SymMap, qualname: str, symbol: str) -> fxsym.SymGroup:
    """The searchable group that holds member ``(qualname, symbol)``.

    Tests find a group by what it holds, never by its name: a group is named after its root,
    the first producer in graph order, which a library release may change (transformers 5.24
    moved GPT-J's heads from ``q_proj.out_features`` to the attention module's ``heads``).
    Module paths are the checkpoint's own keys, and symbol names are fxsym's.
    """
    found = [g for g in sm.groups() if (qualname, symbol) in g.members]
    assert len(found) == 1, f"{(qualname, symbol)} in {[g.name for g in found]}"
    return found[0]


def has_group_with(sm: fxsym.SymMap, qualname: str, symbol: str) -> bool:
    """Whether a searchable group holds member ``(qualname, symbol)``."""
    return any((qualname, symbol) in g.members for g in sm.groups())


def stale_sizes(model: nn.Module) -> list[tuple[str, str, int, int]]:
    """Every size attribute of an embedding, linear, convolution or ``Conv1D`` in ``model``
    that is not the length of the weight dim it names: ``(module, attribute, value, length)``."""
    named: dict[type, tuple[tuple[str, int], ...]] = {
        nn.Embedding: (("num_embeddings", 0), ("embedding_dim", 1)),
        nn.Linear: (("out_features", 0), ("in_features", 1)),
        nn.Conv2d: (("out_channels", 0),)}
    try:  # GPT-2's transposed projection: weight (nx, nf)
        from transformers.pytorch_utils import Conv1D
        named[Conv1D] = (("nx", 0), ("nf", 1))
    except ImportError:
        pass
    out = []
    for name, mod in model.named_modules():
        for cls, attrs in named.items():
            if isinstance(mod, cls):
                for attr, d in attrs:
                    if getattr(mod, attr) != mod.weight.shape[d]:
                        out.append((name, attr, getattr(mod, attr), mod.weight.shape[d]))
    return out


class ReadThrough(nn.Module):
    """``c1``'s 8 channels read whole by ``c3`` and through ``op`` by ``c2`` (a lazy conv, so
    ``op`` may change the channel count)."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op
        self.c1 = nn.Conv2d(3, 8, 1)
        self.c2 = nn.LazyConv2d(4, 1)
        self.c3 = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c1(x)
        return self.c2(self.op(h)) + self.c3(h)


def assert_same_layout(model: nn.Module, sm: fxsym.SymMap) -> paramlayout.ParamLayout:
    """The layout derived from the analysis and the one trial resizes of whole-model probe
    copies learn (:func:`fxsym.oracles.probe_layout`) agree on every group's slices,
    exactly."""
    direct = paramlayout.layout(model, sm)
    probe = probe_layout(model, sm)
    assert dict(direct.shapes) == dict(probe.shapes)
    assert dict(direct.sizes) == dict(probe.sizes)
    assert set(direct.slices) == set(probe.slices)

    def rows(lay: paramlayout.ParamLayout, group: str) -> list[tuple[Any, ...]]:
        return [(s.param, s.dim, s.index.tolist(), s.unit.tolist()) for s in lay.slices[group]]

    for group in probe.slices:
        assert rows(direct, group) == rows(probe, group), group
    return direct


def assert_shapes_counted(lay: paramlayout.ParamLayout, seed: int = 0) -> None:
    """``lay.changed_shapes`` of random choices of sizes (all groups, then each alone) are
    the reference count: per cut dim, the sum over its slices of the product of the shares
    each group keeps of the slice."""
    def reference(kept: dict[str, int]) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, list[int]] = {}
        cut: dict[tuple[str, int], torch.Tensor] = {}
        for group, count in kept.items():
            for s in lay.slices.get(group, ()) if count != lay.sizes[group] else ():
                share = cut.setdefault((s.param, s.dim), torch.ones(
                    lay.shapes[s.param][s.dim], dtype=torch.float64))
                share.index_copy_(0, s.index, share.index_select(0, s.index) * (
                    count / lay.sizes[group]))
        for (param, dim), share in cut.items():
            shapes.setdefault(param, list(lay.shapes[param]))[dim] = round(float(share.sum()))
        return {name: tuple(shape) for name, shape in shapes.items()}

    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        kept = {g: int(torch.randint(1, n + 1, (1,), generator=gen))
                for g, n in lay.sizes.items()}
        assert lay.changed_shapes(kept) == reference(kept)
        for g, k in kept.items():
            assert lay.changed_shapes({g: k}) == reference({g: k})


def small_seq() -> nn.Module:
    """A conv, its norm and two linears: the model the loader tests save and load."""
    return nn.Sequential(OrderedDict([
        ("conv", nn.Conv2d(3, 8, 3)), ("bn", nn.BatchNorm2d(8)), ("relu", nn.ReLU()),
        ("pool", nn.AdaptiveAvgPool2d(1)), ("flat", nn.Flatten()),
        ("fc1", nn.Linear(8, 6)), ("act", nn.ReLU()), ("fc2", nn.Linear(6, 2))]))


def save_pruned_small_seq(directory: Path, example: torch.Tensor, **save: Any) -> nn.Module:
    """A seeded :func:`small_seq`, half of it pruned by l1 (analyzed on ``example``) and saved
    to ``directory`` with ``fxsym.save`` (``save``: its keywords); the pruned model."""
    torch.manual_seed(0)
    model = small_seq().eval()
    sm = fxsym.analyze(model, example_inputs=(example,))
    plan = fxsym.plan(model, sm, ratio=0.5, importance="l1")
    plan.apply(model, sm)
    fxsym.save(model, directory, plan, **save)
    return model

def assert_load_refused(directory: Path, error: type[Exception] = PlanError,
                        match: str = "") -> None:
    """``fxsym.load`` of ``directory`` into a fresh :func:`small_seq` raises ``error`` (an
    FxsymError) and leaves the fresh model as it was."""
    fresh = small_seq()
    before = {n: (t, t.detach().clone()) for n, t in fresh.state_dict(keep_vars=True).items()}
    with pytest.raises(error, match=match) as info:
        fxsym.load(fresh, directory)
    assert isinstance(info.value, FxsymError)
    now = fresh.state_dict(keep_vars=True)
    assert now.keys() == before.keys()
    assert all(now[n] is t and torch.equal(t.detach(), c) for n, (t, c) in before.items())
