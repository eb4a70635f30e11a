"""The example plugin's hook implementations (entry point ``fxsym = example``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import fxsym

from . import inputs, modules, patterns


@fxsym.hookimpl
def fxsym_register_sym_infos(register: Any) -> None:
    modules.register_sym_infos(register)


@fxsym.hookimpl
def fxsym_leaf_module(module: Any, qualname: str) -> bool | None:
    return modules.keep_opaque_leaf(module, qualname)


@fxsym.hookimpl
def fxsym_register_patterns(register: Any) -> None:
    for pattern in patterns.PATTERNS:
        register(pattern)


@fxsym.hookimpl(wrapper=True)
def fxsym_example_inputs(model: Any) -> Generator[None, Any, Any]:
    # whatever plugin chose the default inputs, give them the model's dtype
    chosen = yield
    return inputs.like_model(model, chosen)
