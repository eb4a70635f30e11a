"""Assertions shared by the analysis tests: the two oracles of DESIGN.md."""

from __future__ import annotations

from typing import Any

from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink


def assert_oracles(model: nn.Module, example_inputs: Any, *, min_groups: int = 1,
                   expect_unchecked: bool = False) -> fxsym.SymMap:
    """Analyze ``model``, then check permutation invariance and shrink runs.

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
    return sm


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
