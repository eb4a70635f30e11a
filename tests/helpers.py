"""Assertions shared by the analysis tests: the two oracles of DESIGN.md."""

from __future__ import annotations

from typing import Any

from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink


def assert_oracles(model: nn.Module, example_inputs: Any, *, min_groups: int = 1) -> fxsym.SymMap:
    """Analyze ``model``, then check permutation invariance and shrink runs."""
    model.eval()
    sm = fxsym.analyze(model, example_inputs=example_inputs)
    assert len(sm.groups()) >= min_groups, [g.name for g in sm.groups()]
    perm = check_permutation(model, sm, example_inputs)
    assert perm.ok, f"permutation oracle failed for {perm.failed}: {perm.error}"
    shrink = check_shrink(model, sm, example_inputs)
    assert shrink.ok, f"shrink oracle failed: {shrink.error}"
    return sm
