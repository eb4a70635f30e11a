"""Meta builds without weight initialisation: :func:`no_meta_init`.

The probes of a config (:func:`.configs.meta_build`: the group sources, the fields a resize
writes, depth and diffusers probes) build a whole model on the meta device and read only its
shapes and int attributes. A tensor on the meta device holds no values, so the weight
initialisers that ``nn.Linear.reset_parameters`` and transformers' ``post_init`` call on it
write nothing; yet on meta each one runs torch's Python decompositions (``uniform_``, ``normal_``
...): a third of a 30-layer model's meta build. Inside :func:`no_meta_init` an initialiser
called on a meta tensor returns that tensor at once; on any other tensor it runs.

The skip is a :class:`torch.overrides.TorchFunctionMode`, whose stack is per thread: a model
built with real weights in another thread at the same time is initialised as always (unlike
patching ``torch.nn.init``, as transformers' ``no_init_weights`` does, which every thread
sees). Only functions that write values are skipped, and only where they cannot raise:
``torch.nn.init``'s ``uniform_``, ``normal_``, ``trunc_normal_``, ``constant_``, ``ones_``,
``zeros_``, the tensor methods ``uniform_``, ``normal_``, ``zero_``, ``fill_``, and the fan-based
``kaiming_*``/``xavier_*`` on tensors of two dims or more (they refuse fewer). None changes a
shape, a dtype or a device, so what a meta build is read for is unchanged; the initialisers
that check a tensor's shape (``eye_``, ``dirac_``, ``orthogonal_``, ``sparse_``) still run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["no_meta_init"]

_init = torch.nn.init
#: the functions whose only effect on a tensor is its values, and which never raise
_ANY: frozenset[Callable[..., Any]] = frozenset([
    _init.uniform_, _init.normal_, _init.trunc_normal_, _init.constant_, _init.ones_,
    _init.zeros_, torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.zero_,
    torch.Tensor.fill_])
#: those that raise for a tensor of fewer than two dims (its fans), only for that
_FANS: frozenset[Callable[..., Any]] = frozenset([
    _init.kaiming_uniform_, _init.kaiming_normal_, _init.xavier_uniform_,
    _init.xavier_normal_])


class no_meta_init(TorchFunctionMode):
    """While active in this thread, an initialiser called on a meta tensor returns it
    unchanged (see the module docstring)."""

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func in _ANY or func in _FANS:
            target = args[0] if args else (kwargs or {}).get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta and (
                    func in _ANY or target.dim() >= 2):
                return target
        return func(*args, **(kwargs or {}))
