"""Which parameter and buffer dims (and module attributes) a config field sizes
(:class:`Prober`), found by building the model on the meta device from the config as it was
before the resize and from a copy with the field tripled: the dims that follow the field are
the field's, whatever other fields hold the same number (``vocab_size ==
intermediate_size``). Each build is made once per field.

Imports from the plugin: configs.builds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from .builds import attention_layouts, meta_build, meta_modules, tensor_shapes


class Prober:
    """Which parameter and buffer dims a config field sizes, found by building the model on
    the meta device from the config as it was before the resize and from a copy with the
    field set to another value: the dims that follow the field are the field's, whatever
    other fields hold the same number (``vocab_size == intermediate_size``)."""

    def __init__(self, model: nn.Module, before: Any) -> None:
        self.model = model
        self.before = before
        self._base: dict[str, tuple[int, ...]] | None = None
        self._now: dict[str, tuple[int, ...]] = {}
        self._built = False
        self._base_attributes: dict[str, dict[str, int]] | None = None
        self._base_model: nn.Module | None = None
        self._base_layouts: dict[str, tuple[int, int, int, int]] | None = None
        self._probes: dict[tuple[str, int], nn.Module | None] = {}

    def _base_build(self) -> nn.Module | None:
        """The model built from the config before the resize on the meta device (once)."""
        if self._base_model is None:
            self._base_model = meta_build(self.model, self.before)
        return self._base_model

    def base_layouts(self) -> dict[str, tuple[int, int, int, int]]:
        """:func:`.attention.current_layout` of every attention module of the model built
        from the config before the resize; empty if it cannot be built."""
        if self._base_layouts is None:
            built = self._base_build()
            self._base_layouts = {} if built is None else attention_layouts(built)
        return self._base_layouts

    def _probe_shapes(self, field: str, old: int | None) -> dict[str, tuple[int, ...]] | None:
        """The parameter and buffer shapes of the model built with ``field`` set to three
        times ``old`` (the shapes of the old config and of the resized model read once);
        ``None`` if ``old`` is not a size or the model cannot be built on meta."""
        if not self._built:
            self._built = True
            built = self._base_build()
            self._base = None if built is None else tensor_shapes(built)
            self._now = tensor_shapes(self.model)
        if self._base is None or not old:
            return None
        built = self.probe_build(field, old)
        return None if built is None else tensor_shapes(built)

    def probe_build(self, field: str, old: int) -> nn.Module | None:
        """The model built on the meta device from the config before the resize with
        ``field`` set to three times ``old`` (once per field)."""
        if (field, old) not in self._probes:
            probe = copy.deepcopy(self.before)
            setattr(probe, field, 3 * old)
            self._probes[(field, old)] = meta_build(self.model, probe)
        return self._probes[(field, old)]

    def follow(self, field: str, old: int | None) -> dict[str, int] | None:
        """``{where: length now}`` at each dim ``field`` (of value ``old``) sizes: ``where``
        is the owning module, or ``"<tensor>:<dim>"`` where one module's dims differ;
        ``None`` if the model cannot be built on the meta device from the config."""
        shapes = self._probe_shapes(field, old)
        if shapes is None or self._base is None or not old:
            return None
        where: dict[str, dict[str, int]] = {}
        for name, shape in self._base.items():
            other, current = shapes.get(name), self._now.get(name)
            if other is None or current is None or not len(other) == len(shape) == len(
                    current):
                continue
            for d, (a, b) in enumerate(zip(shape, other, strict=True)):
                if a == old and b == 3 * old:
                    owner = name.rpartition(".")[0]
                    where.setdefault(owner, {})[f"{name}:{d}"] = current[d]
        found: dict[str, int] = {}
        for owner, dims in where.items():
            if len(set(dims.values())) == 1:
                found[owner] = next(iter(dims.values()))
            else:
                found.update(dims)
        return found


    def follow_units(self, field: str, old: int | None) -> dict[str, int] | None:
        """``{module: count now}`` for a field that counts whole units of the dims it sizes
        (DeepSeek's ``num_attention_heads``: ``q_b_proj`` has ``heads * qk_head_dim`` rows
        and no head count attribute the forward reads): the dims that are a multiple of
        ``old`` and grow with the field in proportion, read in the resized model in those
        units; ``None`` where the model cannot be built or the units are not whole."""
        shapes = self._probe_shapes(field, old)
        if shapes is None or self._base is None or not old:
            return None
        found: dict[str, set[int]] = {}
        for name, shape in self._base.items():
            other, current = shapes.get(name), self._now.get(name)
            if other is None or current is None or not len(other) == len(shape) == len(
                    current):
                continue
            for a, b, now in zip(shape, other, current, strict=True):
                if a % old == 0 and b == 3 * a and a != b:
                    unit = a // old
                    if now % unit:
                        return None
                    found.setdefault(name.rpartition(".")[0], set()).add(now // unit)
        if any(len(v) != 1 for v in found.values()):
            return None
        return {owner: v.pop() for owner, v in found.items()}

    def attributes_following(self, field: str, old: int) -> set[tuple[str, str]]:
        """The ``(module qualname, attribute)`` int attributes that hold ``field``'s value
        (``old``) when the model is built from the config, and follow it when the field
        changes."""
        if self._base_attributes is None:
            self._base_attributes = meta_modules(self.model, self.before) or {}
        probe = copy.deepcopy(self.before)
        setattr(probe, field, 3 * old)
        other = meta_modules(self.model, probe)
        if other is None:
            return set()
        return {(name, attr) for name, attrs in self._base_attributes.items()
                for attr, value in attrs.items()
                if value == old and other.get(name, {}).get(attr) == 3 * old}

    def set_attributes(self, field: str, old: int | None, found: Mapping[str, int]) -> None:
        """Set the int attributes of the model's modules that follow ``field`` when the model
        is built (``experts.num_experts``, which a ``grouped_mm`` experts kernel reads at run
        time but the traced one does not) to the length now of the dims that follow the
        field inside that module (``found``, from :meth:`follow`), where those agree."""
        if not old or not found:
            return
        probe = copy.deepcopy(self.before)
        setattr(probe, field, 3 * old)
        if self._base_attributes is None:
            self._base_attributes = meta_modules(self.model, self.before) or {}
        base, other = self._base_attributes, meta_modules(self.model, probe)
        if other is None:
            return
        lengths = {where.partition(":")[0].rpartition(".")[0] if ":" in where else where: n
                   for where, n in found.items()}
        modules = dict(self.model.named_modules())
        for name, attrs in base.items():
            mod = modules.get(name)
            if mod is None:
                continue
            inside = {n for owner, n in lengths.items()
                      if owner == name or owner.startswith(f"{name}.") or not name}
            if len(inside) != 1:
                continue
            now = inside.pop()
            for attr, value in attrs.items():
                state: dict[str, Any] = mod.__dict__  # restored by the transaction
                if value == old and other.get(name, {}).get(attr) == 3 * old and isinstance(
                        state.get(attr), int) and state[attr] != now:
                    state[attr] = now
