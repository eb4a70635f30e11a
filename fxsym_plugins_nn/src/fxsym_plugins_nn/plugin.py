"""The ``nn`` plugin's hook implementations (entry point ``fxsym = nn``).

The rewrite patterns (:mod:`.patterns`, which needs fxsym's pass pipeline) and the op rules
are imported when their hook is first called, not when the plugin is loaded.

:class:`Hooks` declares the hooks this module implements; mypy checks each implementation
against fxsym's specification (the assignment at the end, for mypy only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from torch import nn

import fxsym
from fxsym.plugins import hookspecs
from fxsym.plugins.contracts import (
    AnalysisOption,
    ExampleInputs,
    ForwardHook,
    OpRuleRegistrar,
    PatternRegistrar,
    SymInfoRegistrar,
)
from fxsym.plugins.hookroles import DerivedTensors

from . import modules


class Hooks(hookspecs.RegisterSymInfosHook, hookspecs.LeafModuleHook,
            hookspecs.RegisterOpRulesHook, hookspecs.RegisterPatternsHook,
            hookspecs.ExampleInputsHook, hookspecs.DerivedTensorsHook,
            hookspecs.AnalysisOptionsHook, Protocol):
    """The hooks of the ``nn`` plugin."""


@fxsym.hookimpl
def fxsym_register_sym_infos(register: SymInfoRegistrar) -> None:
    modules.register_sym_infos(register)


@fxsym.hookimpl
def fxsym_leaf_module(module: nn.Module, qualname: str) -> bool | None:
    return modules.trace_into_functional(module, qualname)


@fxsym.hookimpl
def fxsym_register_op_rules(register: OpRuleRegistrar) -> None:
    from . import ops

    ops.register_op_rules(register)


@fxsym.hookimpl
def fxsym_register_patterns(register: PatternRegistrar) -> None:
    from . import patterns

    patterns.register_patterns(register)


@fxsym.hookimpl(trylast=True)
def fxsym_example_inputs(model: nn.Module) -> ExampleInputs | None:
    return modules.guess_example_inputs(model)


@fxsym.hookimpl
def fxsym_derived_tensors(module: nn.Module, hook: ForwardHook) -> DerivedTensors | None:
    from . import hooks

    return hooks.derived_tensors(hook)


@fxsym.hookimpl
def fxsym_analysis_options() -> Sequence[AnalysisOption]:
    from .declarations import OPTIONS

    return OPTIONS


if TYPE_CHECKING:
    from . import plugin as _this

    _checked: Hooks = _this
