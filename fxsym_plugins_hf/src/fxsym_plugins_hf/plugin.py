"""The ``hf`` plugin's hook implementations (entry point ``fxsym = hf``).

Importing this module imports transformers; without it installed the plugin fails to load,
and ``fxsym plugins`` reports why. The work is done in small modules: :mod:`.context` (trace
preparation), :mod:`.masks`, :mod:`.inputs` (default example inputs), :mod:`.attention` and
:mod:`.discovery` (attention modules), :mod:`.rotary`, :mod:`.modules` (``Conv1D``,
activations), :mod:`.ops` (op rules).
"""

from __future__ import annotations

from typing import Any

import transformers  # noqa: F401  (the plugin is inactive without transformers)

import fxsym

from . import attention, context, discovery, inputs, modules, ops, rotary


@fxsym.hookimpl
def fxsym_register_sym_infos(register: Any) -> None:
    register(modules.CONV1D, modules.conv1d_info, resize=modules.conv1d_resize,
             importance=modules.conv1d_importance)
    register(modules.activation_classes(), modules.activation_info, resize=modules.no_resize)
    for cls in discovery.attention_classes():
        register(cls, attention.attention_info, leaf=False, resize=attention.attention_resize,
                 importance=attention.attention_importance)
    for cls in discovery.rotary_classes():
        register(cls, rotary.rotary_info, leaf=False, resize=rotary.no_resize)


@fxsym.hookimpl
def fxsym_register_leaf_policies(register: Any) -> None:
    register(discovery.leaf_policy)


@fxsym.hookimpl
def fxsym_register_op_rules(register: Any) -> None:
    ops.register_op_rules(register)


@fxsym.hookimpl
def fxsym_trace_context(model: Any, example_inputs: Any) -> Any:
    return context.trace_context(model, example_inputs)


@fxsym.hookimpl
def fxsym_example_inputs(model: Any) -> Any:
    return inputs.example_inputs(model)


@fxsym.hookimpl
def fxsym_default_outputs(model: Any) -> Any:
    return inputs.default_outputs(model)
