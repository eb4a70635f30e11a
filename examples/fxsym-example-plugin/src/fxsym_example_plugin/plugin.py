"""The example plugin's hook implementations (entry point ``fxsym = example``)."""

from __future__ import annotations

from typing import Any

import fxsym

from . import modules, patterns


@fxsym.hookimpl
def fxsym_register_sym_infos(register: Any) -> None:
    modules.register_sym_infos(register)


@fxsym.hookimpl
def fxsym_register_leaf_policies(register: Any) -> None:
    register(modules.keep_opaque_leaf)


@fxsym.hookimpl
def fxsym_register_patterns(register: Any) -> None:
    for pattern in patterns.PATTERNS:
        register(pattern)
