"""Checked by ``mypy`` (see ``[tool.mypy] files``), never run: what a type checker sees of
fxsym's public API. Names the facade imports on first use must still have their real types."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import assert_type

import torch
from torch import fx, nn

import fxsym
from fxsym.passes import Pass as PassClass


def check(model: nn.Module, x: torch.Tensor) -> None:
    assert_type(fxsym.optimize(model, example_inputs=(x,)), fx.GraphModule)
    assert_type(fxsym.Pass, type[PassClass])
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert_type(sm, fxsym.SymMap)
    assert_type(sm.groups(), list[fxsym.SymGroup])
    assert_type(sm.trace_report, fxsym.TraceReport)  # always set: no None check needed
    assert_type(fxsym.resize(model, sm, {"g": 3}), nn.Module)
    assert_type(fxsym.load_plugins(), fxsym.PluginManager)
    ctx = fxsym.use_plugins(fxsym.PluginManager())
    assert isinstance(ctx, AbstractContextManager)
    assert_type(fxsym.trace(model, example_inputs=(x,)), fx.GraphModule)
