"""The ``nn`` plugin's hook implementations (entry point ``fxsym = nn``)."""

from __future__ import annotations

from typing import Any

import fxsym

from . import modules, ops, patterns


@fxsym.hookimpl
def fxsym_register_sym_infos(register: Any) -> None:
    modules.register_sym_infos(register)


@fxsym.hookimpl
def fxsym_register_leaf_policies(register: Any) -> None:
    register(modules.trace_into_functional)


@fxsym.hookimpl
def fxsym_register_op_rules(register: Any) -> None:
    ops.register_op_rules(register)


@fxsym.hookimpl
def fxsym_register_patterns(register: Any) -> None:
    patterns.register_patterns(register)


@fxsym.hookimpl(trylast=True)
def fxsym_example_inputs(model: Any) -> Any:
    return modules.guess_example_inputs(model)
