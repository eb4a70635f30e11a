"""Each node's value, computed on the meta device when the node is created.

:class:`NodeValues` overrides torch.fx's ``create_node``: with example inputs, every node's
value is computed from its arguments' values (``node.meta["val"]``), which is what
:class:`~fxsym.tracer.ShapeProxy` answers shape questions from. In order of cost:

* a placeholder's value is the example input; a ``get_attr`` the attribute's (a size read from
  an attribute: its int, :mod:`.attribute_sizes`), its tensors moved to ``meta`` (:mod:`.meta`);
* a torch op the tracer has a rule for is computed from its inputs' metadata
  (:func:`~fxsym.tracer.values.op_value`); a leaf module whose family has a value rule is not
  run, nor one whose family is shape-preserving;
* a call whose key was seen (:mod:`.memo`) gets a fresh copy of the value it gave;
* anything else runs on meta tensors: a function or method as it is, a leaf module as its
  :func:`~fxsym.tracer.meta.meta_copy`.

A call whose value is ``None`` gives no proxy (:meth:`NodeValues.create_proxy`). A value that
cannot be computed is left out and reported (``unknown-value``) where it needs data; where the
model raised on the example inputs, the trace stops with a :class:`~fxsym.errors.ModelError`
(:mod:`.unknown`).

Imports from fxsym: errors, registry.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch import nn

from ..errors import ModelError, PluginError
from ..registry import ValueFn
from .guard import forward_hooked
from .memo import _fresh_copy, _global_key, _module_key, _op_key, _plain_key, _recorded
from .meta import _GRAD, _META, _NUMBER, _REAL, _tensor_kinds, meta_copy, to_meta
from .proxy import value_of
from .questions import drop_index_questions
from .state import TracerState
from .unknown import (
    _FAILED,
    _MODEL_RAISED,
    _DataDependence,
    _NeedsData,
    _UnknownValue,
    _value_unknown_type,
)
from .values import op_value


class NodeValues(TracerState):
    """The part of the tracer that computes each node's value on the meta device."""

    # -- values ----------------------------------------------------------------------------
    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any], name: str | None = None,
                     type_expr: Any | None = None, proxy_factory_fn: Any = None) -> Any:
        """A proxy of the new node; plain ``None`` for a call whose value is ``None`` (a leaf
        returning ``(out, None)``, a mask builder finding no mask). A proxy there would pass
        the model's ``x is not None`` checks, which the value does not, and the branch taken
        would then fail (``None[...]``); ``None`` allows nothing but identity checks, which it
        answers as the model does. The node stays in the graph (the call may write state)."""
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                     proxy_factory_fn)
        node = getattr(proxy, "node", None)
        if (kind in ("call_function", "call_method", "call_module") and node is not None
                and "val" in node.meta and node.meta["val"] is None):
            return None
        return proxy

    def create_node(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> torch.fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        drop_index_questions(self.index_questions, node)
        if self.with_values and kind != "output":
            self._evaluating, was = True, self._evaluating
            try:
                value = self._compute(node)
            finally:
                self._evaluating = was
            if value is not _FAILED:
                node.meta["val"] = value
        return node

    def _compute(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            assert self.placeholder_values is not None
            if node.target in self.placeholder_values:
                return self.placeholder_values[node.target]
            return to_meta(node.args[0]) if node.args else _FAILED
        if node.op == "get_attr":
            if node.target in self._attribute_values:
                return self._attribute_values[str(node.target)]
            obj = self.attribute_object(str(node.target))
            if _tensor_kinds(obj) == _NUMBER:  # a number kept as a tensor (``self.stride[i]``):
                return obj  # its value, which a fill or a scale may need (``new_full``)
            return to_meta(obj)
        try:
            args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), self._arg_value)
        except _UnknownValue:
            return _FAILED
        kinds = _tensor_kinds((args, kwargs))
        if (kinds & (_REAL | _GRAD | _NUMBER) and node.op == "call_module") or (
                kinds & _META and kinds & _REAL):
            # a factory given traced sizes ran for real (``torch.arange(n)``): its value stays
            # real while only real values meet it, and meets meta ones on the meta device
            args, kwargs = to_meta((args, kwargs))
        try:
            return self._evaluate(node, args, kwargs)
        except (ModelError, PluginError):
            raise
        except Exception as exc:
            where = self.scope.module_path or "<root>"
            if node.op == "call_module":
                where = str(node.target)
            if self._needs_data(node, args, kwargs, exc):
                self.report.add("unknown-value", where,
                                f"node {node.name}: {type(exc).__name__}: {exc}")
                return _FAILED
            if (node.op == "call_module" and str(node.target) in self.fallback_leaves
                    and not isinstance(exc, _MODEL_RAISED)):  # it already failed to trace
                self.report.add("unknown-value", where,
                                f"node {node.name}: {type(exc).__name__}: {exc}")
                return _FAILED
            raise ModelError(
                f"the model raised at node {node.name!r} ({where}) on the example inputs: "
                f"{type(exc).__name__}: {exc}. Check that example_inputs have the shapes and "
                "dtypes the model expects."
            ) from exc

    def _evaluate(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        target = node.target
        if node.op == "call_module":
            return self._run_leaf(node, args, kwargs)
        if node.op not in ("call_function", "call_method"):
            return _FAILED
        value = op_value(node.op, target, args, kwargs)
        if value is not None:
            return value
        with torch.no_grad():
            key = _op_key(node.op, target, args, kwargs)
            if key is not None and key in self._leaf_values:
                return _fresh_copy(self._leaf_values[key], args)
            if node.op == "call_function":
                assert callable(target)
                value = target(*args, **kwargs)
            else:
                assert isinstance(target, str)
                value = getattr(args[0], target)(*args[1:], **kwargs)
            if key is not None:
                recorded = _recorded(value, args)
                if recorded is not None:
                    self._leaf_values[key] = recorded
            return value

    def _needs_data(self, node: torch.fx.Node, args: Any, kwargs: Any, exc: Exception) -> bool:
        """Whether ``exc`` means "the value cannot be known without data" rather than "the
        model raised on these inputs".

        By type: a missing meta kernel or a copy out of a meta tensor (``NotImplementedError``)
        and torch's data-dependent errors (:data:`_VALUE_UNKNOWN`). Anything else is run once
        more under :class:`_DataDependence`, which raises :class:`_NeedsData` at the first op
        whose result depends on a meta tensor's data (``.item()``, ``bool(t)``, ``nonzero``):
        meta kernels report those with a plain ``RuntimeError``, as they do a shape mismatch.
        """
        if _value_unknown_type(exc):
            return True
        try:
            with _DataDependence():  # type: ignore[no-untyped-call]
                self._evaluate(node, args, kwargs)
        except _NeedsData:
            return True
        except Exception:  # the same failure again: the model's own
            return False
        return False

    def _arg_value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = value_of(a)
            if v is _FAILED or "val" not in a.meta:
                raise _UnknownValue
            return v
        if isinstance(a, torch.Tensor):
            return to_meta(a)
        return a

    def _run_leaf(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        """A leaf's value: what its family's value rule gives, else its input's for a
        shape-preserving family (no need to run it), else the module run on a shallow copy
        whose tensors are on the meta device."""
        mod = self._submodule(str(node.target))
        rule = self._value_rule(mod)
        if rule is not None and not forward_hooked(mod) and "forward" not in vars(mod):
            was, self._quiet = self._quiet, True  # the module's attributes read as they are
            self._own += 1
            try:
                value = rule(self.original(mod), args, kwargs)
            except Exception:
                value = None
            finally:
                self._quiet = was
                self._own -= 1
            if value is not None:
                return value
        if self._shape_preserving(mod) and args and isinstance(args[0], torch.Tensor):
            return args[0]
        key = self._leaf_key(mod, args, kwargs)
        if key is not None and key in self._leaf_values:
            return _fresh_copy(self._leaf_values[key], args)
        clone = self._meta_modules.get(id(mod))
        if clone is None:
            clone = self._meta_modules[id(mod)] = meta_copy(mod)
        with self._quietly(), torch.no_grad():
            value = clone(*args, **kwargs)
        if self.shadows is not None:
            self.shadows.ran_as_leaf(mod, clone)
        if key is not None:
            recorded = _recorded(value, args)
            if recorded is not None:
                self._leaf_values[key] = recorded
        return value

    def _leaf_key(self, mod: nn.Module, args: Any, kwargs: Any) -> Any:
        """What the value of torch.nn leaf ``mod`` on these inputs depends on: its class, its
        plain attributes, its tensors' and its inputs' metadata (``None``: something else may
        matter, run it). Two modules with one key give values of the same metadata."""
        if id(mod) not in self._module_keys:
            self._module_keys[id(mod)] = _module_key(mod)
        module = self._module_keys[id(mod)]
        if module is None:
            return None
        inputs = _plain_key((args, kwargs))
        return None if inputs is None else (module, inputs, _global_key())

    def _submodule(self, path: str) -> nn.Module:
        """The submodule at ``path``: the one :meth:`path_of_module` named so, looked up in a
        table rather than through the attribute reads torch.fx patches while it traces."""
        if self._modules_by_path is None:
            self._modules_by_path = {p: m for m, p in (self.submodule_paths or {}).items()}
        found = self._modules_by_path.get(path)
        if found is not None:
            return found
        with self._quietly():
            return self.root.get_submodule(path)

    def _value_rule(self, mod: nn.Module) -> ValueFn | None:
        """The value rule of ``mod``'s family (``register(..., value=rule)``)."""
        try:
            return self._value_rules[id(mod)]
        except KeyError:
            pass
        entry = self.registry.sym_info_entry(type(mod))
        rule = self._value_rules[id(mod)] = entry.value if entry is not None else None
        return rule

    def _shape_preserving(self, mod: nn.Module) -> bool:
        known = self._preserving.get(id(mod))
        if known is None:
            entry = self.registry.sym_info_entry(type(mod))
            with self._owncall():
                known = bool(entry is not None
                             and entry.factory(self.original(mod)).is_shape_preserving)
            self._preserving[id(mod)] = known
        return known
