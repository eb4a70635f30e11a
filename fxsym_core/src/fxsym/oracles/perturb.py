"""Perturbed copies: the model every oracle runs, with noise that makes a wrong group show.

:func:`perturbed` deep-copies a model (with its SymMap, so the copy's groups are the caller's),
puts it in eval mode and adds noise scaled to each floating tensor (:data:`NOISE`; constant
initialisations would hide a member missing from a group). :class:`PerturbedCopy` holds one
such copy, resized if asked, in a ``with`` block, and frees every tensor it held when done:
a copy and its SymMap sit in reference cycles, which Python frees only when its cyclic
collector happens to run, so one copy is alive at a time.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from ..modstate import CACHE, computed_tensors
from ..resizing import resize
from ..symbols import SymMap

#: noise relative to a tensor's own scale
NOISE = 0.1
#: the scale used for a tensor that is constant zero (biases, zero-initialised tables)
NOISE_FLOOR = 0.02

#: buffers perturbed along with the parameters (the statistics a norm layer uses in eval mode)
NORM_STATISTICS = ("running_mean", "running_var")


def perturbed(model: nn.Module, seed: int, symmap: SymMap | None = None, *,
              dtype: torch.dtype | None = None) -> Any:
    """A deep copy of ``model`` in eval mode whose weights carry noise scaled to each tensor.

    Every floating parameter and every norm statistic (:data:`NORM_STATISTICS`) gets Gaussian
    noise of standard deviation ``NOISE`` times the tensor's own scale: its standard deviation,
    else (a constant tensor) its mean absolute value, else :data:`NOISE_FLOOR`. A running
    variance is multiplied by ``exp(noise)`` instead, so it stays positive. Non-finite entries
    are left alone. Tied tensors stay tied (each is perturbed once, in the copy).

    With ``symmap`` (computed for ``model``), the copy and a copy of the SymMap are made
    together and returned as ``(model_copy, symmap_copy)``: the copy's groups are the given
    ones, bound to the copied modules; and the caches the trace found
    (:attr:`SymMap.derived_state`, filled from the weights before the noise) are emptied, so
    the copy recomputes them from its own weights.

    With ``dtype``, the copy's floating parameters and buffers are built in that dtype, equal
    to ``perturbed(model, seed).to(dtype)`` (the noise rounded to each tensor's own dtype
    first) without a copy in the model's own dtype in between (ViT-H's float32 copy is 2.5
    GB).

    A tensor attribute computed with grad (``weight_norm``'s ``weight`` before a forward
    without grad), which ``deepcopy`` refuses, is copied detached: its forward pre-hook
    computes it again.
    """
    memo: dict[int, Any] = {}
    native: dict[int, torch.dtype] = {}
    if dtype is not None:
        for tensor in _floating_tensors(model):
            memo[id(tensor)] = _converted(tensor, dtype)
            native[id(memo[id(tensor)])] = tensor.dtype
    memo.update(computed_tensors(model))
    if symmap is not None:
        clone, sm = copy.deepcopy((model, symmap), memo)
    else:
        clone, sm = copy.deepcopy(model, memo), None
    clone.eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in _perturbable(clone):
            _add_noise(tensor, gen, multiplicative=name.endswith("running_var"),
                       rounded=native.get(id(tensor), tensor.dtype))
    if sm is None:
        return clone
    modules = dict(clone.named_modules())
    for qualname, attrs in sm.derived_state.items():
        for attr, kind in attrs.items():
            container = vars(modules[qualname]).get(attr) if qualname in modules else None
            if kind == CACHE and isinstance(container, (dict, list, set)):
                container.clear()
    return clone, sm


def _floating_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The floating parameters and buffers of ``model`` holding data, each once (what
    ``model.to(dtype)`` converts)."""
    seen: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point() and not t.is_meta and not isinstance(
                t, (UninitializedParameter, UninitializedBuffer)):
            seen.setdefault(id(t), t)
    return list(seen.values())


def _converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of ``tensor`` in ``dtype``; a parameter's copy a parameter of its class (as its
    ``__deepcopy__`` makes it)."""
    data = tensor.detach().to(dtype, copy=True)
    if isinstance(tensor, nn.Parameter):
        return type(tensor)(data, tensor.requires_grad)
    return data


def _perturbable(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    named: list[tuple[str, torch.Tensor]] = [*model.named_parameters(remove_duplicate=False)]
    named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False)
              if n.rpartition(".")[2] in NORM_STATISTICS]
    for name, tensor in named:
        if id(tensor) in seen or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        seen.add(id(tensor))
        yield name, tensor


def _add_noise(tensor: torch.Tensor, gen: torch.Generator, *, multiplicative: bool,
               rounded: torch.dtype) -> None:
    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
    source = tensor.detach().float()
    if not multiplicative and source.numel() > 1:
        spread = float(source.std())
        if math.isfinite(spread):  # every entry finite: no mask to build, read or apply
            scale = spread if spread > 0 else _scale_of_constant(source)
            noise.mul_(NOISE * scale).add_(source)
            tensor.copy_(noise.to(rounded))
            return
    finite = torch.isfinite(tensor)
    if multiplicative:
        new = source * torch.exp(NOISE * noise)
    else:
        values = source[finite]
        scale = float(values.std()) if values.numel() > 1 else 0.0
        if not scale > 0:
            scale = _scale_of_constant(values)
        new = source + NOISE * scale * noise
    tensor.copy_(torch.where(finite, new.to(rounded).to(tensor.dtype), tensor))


def _scale_of_constant(values: torch.Tensor) -> float:
    """The noise scale of finite ``values`` with no spread: their mean absolute value, else
    the one :data:`NOISE_FLOOR` gives."""
    scale = float(values.abs().mean()) if values.numel() else 0.0
    return scale if scale > 0 else NOISE_FLOOR / NOISE


class PerturbedCopy:
    """A :func:`perturbed` copy of the model and its SymMap (``model``, ``symmap``) in
    ``dtype`` (default: the model's own), resized by ``choices`` if given, used in a ``with``
    block; every tensor it held is freed when it is done with. The oracles use it, and so
    does anything else that makes copies of a model to resize and drop
    (``benchmarks/shrink_coverage.py``).

    Dropping the copy is not enough: the copy and its SymMap form reference cycles (the traced
    graph, the symbols), so their tensors would live until Python's cyclic collector runs, and
    the float64 copies of a large model piled up (vit_b_16: 3 GB above the model's own 0.35
    GB). Freeing means rebinding each parameter's and buffer's data to an empty tensor: the
    copy is never run again and nothing outside it holds its tensors. A resize builds its new
    tensors beside the old ones (it is atomic), so a copy to resize is resized in the model's
    own dtype and converted after, which holds half the bytes of resizing a float64 copy;
    :meth:`resize` frees the tensors a resize replaced (the SymMap's traced modules still point
    at them)."""

    def __init__(self, model: nn.Module, seed: int, symmap: SymMap, dtype: torch.dtype | None,
                 choices: dict[str, Any] | None = None) -> None:
        self.model, self.symmap = perturbed(model, seed, symmap,
                                            dtype=None if choices else dtype)
        self._held = _tensors(self.model)
        if choices:
            try:
                self.resize(choices)
            except BaseException:
                self.__exit__()
                raise
            if dtype is not None:
                self.model.to(dtype)
                self._held.update(_tensors(self.model))

    def __enter__(self) -> PerturbedCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        _free([*self._held.values(), *_tensors(self.model).values()])
        self._held = {}

    def resize(self, choices: dict[str, Any]) -> None:
        resize(self.model, self.symmap, choices)
        now = _tensors(self.model)
        _free([t for key, t in self._held.items() if key not in now])
        self._held = now


def _tensors(model: nn.Module) -> dict[int, torch.Tensor]:
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {id(t): t for _, t in named}


def _free(tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        if not t.is_meta:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
