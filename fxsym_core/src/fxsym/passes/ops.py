"""What a pass needs to know about a node: its kind, its arguments and its effects.

A node's *kind* is the key the pattern engine indexes on: ``(op, target)`` for functions and
methods, ``("call_module", cls)`` for a module call. Several spellings of one operation
(``operator.mul``, ``torch.mul``, the ``mul`` method) share one canonical kind through an
alias table, so one pattern covers all of them. The table below holds only tensor operations
of torch itself; module classes (``nn.Sigmoid`` as an alias of ``torch.sigmoid``) are added by
plugins with :class:`OpAlias`.

Effects are judged conservatively, for the in-place and no-op passes: a node *may mutate* an
argument when it is an in-place method (``add_``), an in-place function (``operator.iadd``,
``torch.relu_``), a call with ``inplace=True`` or a module whose ``inplace`` attribute is
true; a node's value is *fresh* (a new tensor, aliasing nothing) only when its operation is
known to allocate — unknown operations are never assumed fresh.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.node import Target

from ..naming import qualname

Key = tuple[str, Any]
"""A node kind: ``(op, target)``; for modules ``("call_module", module_class)``."""

OpKind = Any
"""How a pattern names an operation: a callable, a method name (str) or a module class."""


def kind_key(kind: OpKind) -> Key:
    """The raw key of one spelling of an operation."""
    if isinstance(kind, tuple) and len(kind) == 2 and isinstance(kind[0], str):
        return kind  # already a key
    if isinstance(kind, str):
        return ("call_method", kind)
    if isinstance(kind, type) and issubclass(kind, nn.Module):
        return ("call_module", kind)
    if callable(kind):
        return ("call_function", kind)
    raise TypeError(f"cannot name an operation by {kind!r}: use a callable, a str or a module")


@dataclass(frozen=True)
class OpAlias:
    """Contributed item: ``aliases`` compute the same thing as ``canonical`` with the same args.

    A module class is an alias when calling the module on ``args`` equals calling
    ``canonical(*args)`` (``nn.Sigmoid`` for ``torch.sigmoid``).
    """

    canonical: OpKind
    aliases: tuple[OpKind, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"alias:{qualname(self.canonical, module=False)}")


@dataclass(frozen=True)
class ModuleSemantics:
    """Contributed item: what the passes may assume about a module family.

    * ``identity``: the module returns its first input unchanged — ``True`` or a predicate
      ``identity(module) -> bool`` (``nn.Dropout`` is an identity only in eval mode);
    * ``fresh``: its output is a new tensor aliasing no input (bool or predicate).
    """

    cls: type[nn.Module]
    identity: bool | Callable[[nn.Module], bool] = False
    fresh: bool | Callable[[nn.Module], bool] = False
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"semantics:{self.cls.__name__}")


# -- built-in aliases: spellings of the same torch operation ------------------------------------
_BUILTIN_ALIASES: list[tuple[OpKind, tuple[OpKind, ...]]] = [
    (operator.mul, (torch.mul, torch.multiply, "mul", "multiply", "__mul__")),
    (operator.add, (torch.add, "add", "__add__")),
    (operator.sub, (torch.sub, torch.subtract, "sub", "subtract", "__sub__")),
    (operator.truediv, (torch.div, torch.true_divide, "div", "true_divide", "__truediv__")),
    (operator.pow, (torch.pow, "pow", "__pow__")),
    (operator.neg, (torch.neg, torch.negative, "neg", "negative", "__neg__")),
    (operator.matmul, (torch.matmul, "matmul", "__matmul__")),
    (torch.sigmoid, (F.sigmoid, "sigmoid", torch.special.expit)),
    (torch.tanh, (F.tanh, "tanh")),
    (torch.exp, ("exp",)),
    (torch.log, ("log",)),
    (torch.sum, ("sum",)),
    (torch.softmax, (F.softmax, "softmax", torch.nn.functional.softmax)),
    (torch.relu, (F.relu, "relu")),
    (torch.reshape, ("reshape",)),
    (torch.flatten, ("flatten",)),
    (torch.unsqueeze, ("unsqueeze",)),
    (torch.einsum, ()),
]

COMMUTATIVE: frozenset[Key] = frozenset(
    {("call_function", operator.mul), ("call_function", operator.add)}
)
"""Canonical kinds whose two arguments may be swapped when matching."""


@dataclass
class OpTable:
    """Canonical kinds (aliases resolved) and module semantics, built from contributions."""

    canon: dict[Key, Key] = field(default_factory=dict)
    semantics: dict[type, ModuleSemantics] = field(default_factory=dict)
    _module_keys: dict[type, tuple[Key, ...]] = field(default_factory=dict)

    def add_alias(self, alias: OpAlias | tuple[OpKind, Iterable[OpKind]]) -> None:
        canonical, aliases = (
            (alias.canonical, alias.aliases) if isinstance(alias, OpAlias) else alias
        )
        target = self.canonical(kind_key(canonical))
        for a in aliases:
            self.canon[kind_key(a)] = target
        self._module_keys.clear()

    def add_semantics(self, item: ModuleSemantics) -> None:
        self.semantics[item.cls] = item

    def canonical(self, key: Key) -> Key:
        try:
            return self.canon.get(key, key)
        except TypeError:  # unhashable target
            return key

    def module_keys(self, cls: type) -> tuple[Key, ...]:
        """Kinds of a module call: its class and every base sharing its ``forward``."""
        try:
            return self._module_keys[cls]
        except KeyError:
            pass
        forward = getattr(cls, "forward", None)
        keys: list[Key] = []
        for base in cls.__mro__:
            if base is nn.Module or not (isinstance(base, type) and issubclass(base, nn.Module)):
                break
            if base is not cls and getattr(base, "forward", None) is not forward:
                break
            key = self.canonical(("call_module", base))
            if key not in keys:
                keys.append(key)
        self._module_keys[cls] = tuple(keys)
        return self._module_keys[cls]

    def semantics_of(self, module: nn.Module) -> ModuleSemantics | None:
        for base in type(module).__mro__:
            if base in self.semantics:
                return self.semantics[base]
        return None

    def is_identity_module(self, module: nn.Module) -> bool:
        sem = self.semantics_of(module)
        return sem is not None and _truth(sem.identity, module)

    def is_fresh_module(self, module: nn.Module) -> bool:
        sem = self.semantics_of(module)
        if sem is None or getattr(module, "inplace", False) is True:
            return False
        return _truth(sem.fresh, module)


def _truth(flag: bool | Callable[[nn.Module], bool], module: nn.Module) -> bool:
    return bool(flag(module)) if callable(flag) else bool(flag)


def builtin_table() -> OpTable:
    """A new table holding the built-in aliases only."""
    table = OpTable()
    for canonical, aliases in _BUILTIN_ALIASES:
        table.add_alias((canonical, aliases))
    return table


_DEFAULT: OpTable | None = None


def default_table() -> OpTable:
    """A shared built-in table (patterns cache their compiled form per table)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = builtin_table()
    return _DEFAULT


# -- reading nodes ------------------------------------------------------------------------------
class Modules:
    """``target -> module`` of one GraphModule, read lazily and cached."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self._cache: dict[str, nn.Module] = {}

    def get(self, target: Target) -> nn.Module:
        """The submodule a ``call_module`` node's ``target`` (a dotted path) names."""
        if not isinstance(target, str):
            raise TypeError(f"a module target is a dotted path, not {target!r}")
        try:
            return self._cache[target]
        except KeyError:
            mod = self.gm.get_submodule(target)
            self._cache[target] = mod
            return mod

    def forget(self, target: str) -> None:
        self._cache.pop(target, None)


def node_keys(node: fx.Node, table: OpTable, modules: Modules) -> tuple[Key, ...]:
    """Every canonical kind ``node`` answers to (one, or a module's class chain)."""
    if node.op == "call_module":
        return table.module_keys(type(modules.get(node.target)))
    return (table.canonical((node.op, node.target)),)


def get_arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` of ``node`` (positional) or ``name`` (keyword), else ``default``."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def tensor_shape(value: Any) -> tuple[int, ...] | None:
    """Static shape of a node's value from its metadata (``val`` or ``tensor_meta``)."""
    if not isinstance(value, fx.Node):
        return None
    for key in ("val", "tensor_meta", "example_value"):
        meta = value.meta.get(key)
        shape = getattr(meta, "shape", None)
        if shape is not None:
            try:
                return tuple(int(s) for s in shape)
            except (TypeError, ValueError):  # symbolic sizes
                return None
    return None


def literal_equal(a: Any, b: Any) -> bool:
    """Equality of two non-node arguments; floats within a relative 1e-6."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(literal_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, slice) and isinstance(b, slice):
        fields_a, fields_b = (a.start, a.stop, a.step), (b.start, b.stop, b.step)
        return all(literal_equal(x, y) for x, y in zip(fields_a, fields_b))
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


# -- effects ------------------------------------------------------------------------------------
INPLACE_OPERATORS: dict[Any, Any] = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.imatmul: operator.matmul,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}

NOT_DATA_INPLACE = frozenset({"requires_grad_", "retain_grad", "share_memory_", "names_"})
"""Methods ending in ``_`` that change no tensor data."""

_VIEW_METHODS = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze",
        "unsqueeze", "transpose", "permute", "t", "T", "mT", "expand", "expand_as", "narrow",
        "select", "split", "chunk", "unbind", "as_strided", "detach", "contiguous", "real",
        "imag", "diagonal", "movedim", "swapaxes", "swapdims", "unfold", "to", "type", "float",
        "double", "half", "bfloat16", "int", "long", "cpu", "cuda", "data", "view_as_real",
        "tensor_split", "split_with_sizes", "align_to", "refine_names", "rename", "values",
        "indices", "H", "mH", "adjoint", "conj", "resolve_conj", "resolve_neg",
    }
)

_FRESH_METHODS = frozenset(
    {
        "add", "sub", "mul", "div", "true_divide", "floor_divide", "pow", "neg", "abs", "exp",
        "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "softmax",
        "log_softmax", "matmul", "mm", "bmm", "clone", "sum", "mean", "amax", "amin", "prod",
        "norm", "clamp", "clip", "maximum", "minimum", "where", "masked_fill", "gelu",
        "__add__", "__mul__", "__sub__", "__truediv__", "__neg__", "__radd__", "__rmul__",
        "cumsum", "erf", "square", "reciprocal", "sign", "round", "floor", "ceil", "trunc",
        "logsumexp", "var", "std", "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge",
        "size", "dim", "numel", "tolist", "item", "new_zeros", "new_ones", "new_full",
        "new_empty", "new_tensor",
    }
)


def _is_fresh_function(target: Any) -> bool:
    if target in INPLACE_OPERATORS:
        return False
    if target in (operator.getitem,):
        return False
    if getattr(target, "__module__", "") in ("_operator", "operator"):
        return True  # arithmetic and comparison operators allocate
    name = getattr(target, "__name__", "")
    if name.endswith("_") or name in _VIEW_METHODS:
        return False
    module = getattr(target, "__module__", "") or ""
    allocating = {
        "add", "sub", "mul", "div", "pow", "neg", "abs", "exp", "log", "sqrt", "tanh",
        "sigmoid", "relu", "softmax", "log_softmax", "matmul", "mm", "bmm", "cat", "stack",
        "clone", "sum", "mean", "einsum", "zeros", "ones", "zeros_like", "ones_like", "full",
        "full_like", "rand", "randn", "empty", "arange", "linear", "conv1d", "conv2d",
        "conv3d", "batch_norm", "layer_norm", "group_norm", "gelu", "silu", "erf", "where",
        "maximum", "minimum", "clamp", "logsumexp", "baddbmm", "addmm", "cumsum", "amax",
        "tensor", "as_tensor", "multiply", "subtract", "true_divide", "square", "embedding",
        "leaky_relu", "elu", "hardtanh", "relu6", "hardswish", "hardsigmoid", "mish",
        "softplus", "adaptive_avg_pool2d", "avg_pool2d", "max_pool2d",
        "scaled_dot_product_attention",
    }
    inplace_capable = {"relu", "leaky_relu", "elu", "hardtanh", "relu6", "hardswish",
                       "hardsigmoid", "mish", "silu", "dropout", "threshold", "selu", "celu"}
    if name in inplace_capable and module.startswith("torch.nn.functional"):
        return True  # only when not inplace; checked by the caller through may_mutate
    return name in allocating and (module.startswith("torch") or module == "")


def is_fresh(node: Any, table: OpTable, modules: Modules) -> bool:
    """True when ``node``'s value is a new object that no other graph value aliases."""
    if not isinstance(node, fx.Node):
        return True  # literals are copied into each use
    if node.op == "call_method":
        return node.target in _FRESH_METHODS
    if node.op == "call_function":
        return _is_fresh_function(node.target) and mutated_arg(node, modules) is None
    if node.op == "call_module":
        return table.is_fresh_module(modules.get(node.target))
    return False


def _bound_inplace(node: fx.Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if "inplace" in node.kwargs or not callable(node.target):
        return False
    try:
        sig = inspect.signature(node.target)
    except (TypeError, ValueError):
        return False
    if "inplace" not in sig.parameters:
        return False
    try:
        bound = sig.bind_partial(*node.args, **node.kwargs)
    except TypeError:
        return False
    return bound.arguments.get("inplace") is True


def mutated_arg(node: fx.Node, modules: Modules, table: OpTable | None = None) -> Any:
    """The argument ``node`` writes into, or ``None`` when it mutates nothing known.

    With ``table``, a module call the table says is an identity (``Dropout(inplace=True)``
    in eval mode) writes nothing.
    """
    if node.op == "call_method":
        name = str(node.target)
        if name.endswith("_") and not name.startswith("__") and name not in NOT_DATA_INPLACE:
            return node.args[0] if node.args else None
        return None
    if node.op == "call_function":
        if node.target in INPLACE_OPERATORS:
            return node.args[0] if node.args else None
        name = getattr(node.target, "__name__", "")
        module = getattr(node.target, "__module__", "") or ""
        if (
            name.endswith("_")
            and not name.startswith("_")
            and module.startswith("torch")
            and name not in NOT_DATA_INPLACE
        ):
            return node.args[0] if node.args else None
        if _bound_inplace(node):
            return get_arg(node, 0, "input")
        return None
    if node.op == "call_module":
        module = modules.get(node.target)
        if getattr(module, "inplace", False) is True:
            if table is not None and table.is_identity_module(module):
                return None
            return node.args[0] if node.args else None
    return None


def may_be_mutated(value: fx.Node, modules: Modules, table: OpTable | None = None) -> bool:
    """True when a user of ``value`` writes into it."""
    return any(mutated_arg(user, modules, table) is value for user in value.users)
