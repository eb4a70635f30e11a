"""Helpers of the pass tests: output comparison on several shapes and op counting.

Plugin wheels are built and pip-installed with the ``install_plugin`` fixture of
``tests/conftest.py`` (wheel builder in ``tests/plugin_wheels.py``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import fx, nn


def same_outputs(
    model: nn.Module,
    gm: fx.GraphModule,
    make_inputs: Callable[[tuple[int, ...]], tuple[Any, ...]],
    shapes: Iterable[tuple[int, ...]],
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    """``gm`` computes what ``model`` computes, on inputs of each of ``shapes``."""
    for shape in shapes:
        inputs = make_inputs(shape)
        with torch.no_grad():
            torch.testing.assert_close(gm(*inputs), model(*inputs), rtol=rtol, atol=atol)


def count(gm: fx.GraphModule, *kinds: Any) -> int:
    """Nodes of ``gm`` calling one of ``kinds``: module classes, functions or method names."""
    n = 0
    for node in gm.graph.nodes:
        for kind in kinds:
            if isinstance(kind, type) and node.op == "call_module":
                n += isinstance(gm.get_submodule(node.target), kind)
            elif isinstance(kind, str) and node.op == "call_method":
                n += node.target == kind
            elif callable(kind) and not isinstance(kind, type) and node.op == "call_function":
                n += node.target is kind
    return n


def ops(gm: fx.GraphModule) -> list[str]:
    """A readable list of the graph's operations."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            out.append(type(gm.get_submodule(node.target)).__name__)
        elif node.op == "call_method":
            out.append(f".{node.target}")
        elif node.op == "call_function":
            out.append(getattr(node.target, "__name__", str(node.target)))
    return out


def randomize_bn(model: nn.Module) -> nn.Module:
    """Give every BatchNorm non-trivial statistics and affine parameters."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.3, 0.3)
    return model


def call_count(nodes: Sequence[fx.Node]) -> int:
    return sum(1 for n in nodes if n.op in ("call_function", "call_method", "call_module"))


MUL = operator.mul
