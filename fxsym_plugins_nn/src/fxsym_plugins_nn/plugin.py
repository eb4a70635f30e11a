"""The ``nn`` plugin's hook implementations (entry point ``fxsym = nn``).

The rewrite patterns (:mod:`.patterns`, which needs fxsym's pass pipeline) and the op rules
are imported when their hook is first called, not when the plugin is loaded.
"""

from __future__ import annotations

from typing import Any

import fxsym

from . import modules


@fxsym.hookimpl
def fxsym_register_sym_infos(register: Any) -> None:
    modules.register_sym_infos(register)


@fxsym.hookimpl
def fxsym_leaf_module(module: Any, qualname: str) -> bool | None:
    return modules.trace_into_functional(module, qualname)


@fxsym.hookimpl
def fxsym_register_op_rules(register: Any) -> None:
    from . import ops

    ops.register_op_rules(register)


@fxsym.hookimpl
def fxsym_register_patterns(register: Any) -> None:
    from . import patterns

    patterns.register_patterns(register)


@fxsym.hookimpl(trylast=True)
def fxsym_example_inputs(model: Any) -> Any:
    return modules.guess_example_inputs(model)


@fxsym.hookimpl
def fxsym_derived_tensors(module: Any, hook: Any) -> Any:
    from . import hooks

    return hooks.derived_tensors(hook)
