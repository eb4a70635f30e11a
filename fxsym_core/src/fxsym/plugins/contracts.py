"""What the hooks take and give: the typed values of the plugin boundary.

:mod:`.hookspecs` states each hook with these types, so a hook's contract is read from its
signature and mypy checks a plugin's implementations against it (see
:mod:`.hookspecs` for how a plugin declares what it implements):

* the ``register`` callables the registration hooks receive (:class:`SymInfoRegistrar`,
  :class:`OpRuleRegistrar`, :class:`ProxyRegistrar`, :class:`PatternRegistrar`) and the
  rules a plugin passes to them (:data:`ResizeFn`, :data:`ImportanceFn`, :data:`ValueFn`,
  :data:`OpRule`);
* the answers with more than one field, one shape each: :class:`GroupStep`
  (``fxsym_group_steps``), :class:`Undescribed` (``fxsym_undescribed_groups``),
  :class:`NeededBlocks` (``fxsym_depth_kinds``), :class:`RoleMap` (``fxsym_roles``: the
  :class:`Role` of each kind of group, :class:`RoleSize`, :class:`RoleKind`),
  :class:`AnalysisOption` (``fxsym_analysis_options``) and :class:`SizeOption`
  (``fxsym_size_options``), both defined in :mod:`fxsym.declarations` (no torch: the command
  line reads them for its flags); the answer of
  ``fxsym_derived_tensors`` is :class:`fxsym.plugins.hookroles.DerivedTensors`.

Types of higher rooms (``SymInfo``, ``SymMap``, ``OpContext``, ``Plan``, ...) are named in
annotations only: nothing here imports them when it runs.

Imports from fxsym: declarations.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, TypeVar

import torch
from torch import nn

from ..declarations import AnalysisOption, SizeOption

if TYPE_CHECKING:
    from ..analysis.context import OpContext
    from ..analysis.layout import Layout
    from ..passes.base import Pass
    from ..passes.ops import ModuleSemantics, OpAlias
    from ..passes.pattern import Pattern
    from ..symbols import SymInfo
    from ..tracer.proxy import ShapeProxy

#: the module class a family's rules receive (what ``register`` was given, or a subclass)
M = TypeVar("M", bound=nn.Module)

#: ``resize(module, symbol_name, index)``: keep the entries ``index`` (a 1-D LongTensor) of the
#: symbol's dimension in every parameter, buffer and attribute it sizes
ResizeFn: TypeAlias = Callable[[nn.Module, str, torch.Tensor], None]
#: ``importance(module, symbol_name)``: one score per entry of an OUTGOING symbol's dimension
ImportanceFn: TypeAlias = Callable[[nn.Module, str], torch.Tensor]
#: ``value(module, args, kwargs)``: a leaf's output for meta-device inputs without running it,
#: or ``None`` (run it); the output is whatever the module returns
ValueFn: TypeAlias = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]
#: a module family: its class, or the dotted ``module.qualname`` of a class of an optional
#: package (described without importing it)
ModuleClass: TypeAlias = "type[nn.Module] | str"
#: ``rule(ctx)``: the layout of an op's value (:mod:`fxsym.analysis.layout`)
OpRule: TypeAlias = "Callable[[OpContext], Layout]"
#: what an op rule is for: a ``call_function`` target, a ``call_method`` name, or a function's
#: dotted ``module.qualname``
OpTarget: TypeAlias = "Callable[..., Any] | str"
#: what ``fxsym_register_patterns`` contributes to :func:`fxsym.optimize`
PatternItem: TypeAlias = "Pass | Pattern | OpAlias | ModuleSemantics"
#: example inputs: positional arguments, or keyword arguments
ExampleInputs: TypeAlias = "tuple[Any, ...] | dict[str, Any]"
#: a forward hook or pre-hook as ``register_forward_(pre_)hook`` took it
ForwardHook: TypeAlias = Callable[..., Any]
#: ``fxsym_after_resize``'s ``kept``: ``{group name: indices kept}`` (1-D long tensors)
Kept: TypeAlias = Mapping[str, torch.Tensor]
#: ``fxsym_after_resize``'s ``sizes``: ``{(module qualname, symbol name): (before, after)}``
SizeChanges: TypeAlias = Mapping[tuple[str, str], tuple[int, int]]


class SymInfoRegistrar(Protocol):
    """The ``register`` of ``fxsym_register_sym_infos``: describe one family (or several
    classes sharing one description: a tuple or list of them)."""

    def __call__(
        self,
        nn_cls: ModuleClass | tuple[ModuleClass, ...] | list[ModuleClass],
        factory: Callable[[M], SymInfo],
        *,
        leaf: bool = True,
        resize: Callable[[M, str, torch.Tensor], None] | None = None,
        importance: Callable[[M, str], torch.Tensor] | None = None,
        value: Callable[[M, tuple[Any, ...], dict[str, Any]], Any] | None = None,
    ) -> None: ...


class OpRuleRegistrar(Protocol):
    """The ``register`` of ``fxsym_register_op_rules``: one rule for a target (or several
    targets: a tuple or list of them)."""

    def __call__(self, target: OpTarget | tuple[OpTarget, ...] | list[OpTarget],
                 rule: OpRule) -> None: ...


class ProxyRegistrar(Protocol):
    """The ``register`` of ``fxsym_register_proxies``: trace values of ``value_type`` with
    ``proxy_cls``."""

    def __call__(self, value_type: type, proxy_cls: type[ShapeProxy]) -> None: ...


class PatternRegistrar(Protocol):
    """The ``register`` of ``fxsym_register_patterns``: one pattern, pass, op alias or
    module semantics."""

    def __call__(self, item: PatternItem) -> None: ...


class GroupStep(NamedTuple):
    """A group's sizes taken only in steps (``fxsym_group_steps``): a kept size is a multiple
    of ``entries`` entries of the group's dim, or the whole group; ``reason`` says why (the
    kernel that needs it)."""

    entries: int
    reason: str


@dataclass(frozen=True)
class Undescribed:
    """What a model's own description (a config its library rebuilds the model from) cannot
    follow of one group (``fxsym_undescribed_groups``): no change at all (``step=None``: the
    group is kept whole), or sizes only in multiples of ``step`` entries of the group's dim
    (or the whole group). ``reason`` says why."""

    reason: str
    step: int | None = None

    def __post_init__(self) -> None:
        if self.step is not None and (isinstance(self.step, bool)
                                      or not isinstance(self.step, int) or self.step < 1):
            raise ValueError(f"Undescribed.step is a count of entries >= 1 or None, not "
                             f"{self.step!r}")


def undescribed(answer: Undescribed | str | tuple[int, str]) -> Undescribed:
    """One value of an ``fxsym_undescribed_groups`` answer as :class:`Undescribed`.

    Deprecated shapes, read with a :class:`DeprecationWarning` until plugins move to
    :class:`Undescribed`: a reason string (the group kept whole) and an ``(entries, reason)``
    tuple (a step of ``entries``); anything else is read as a reason."""
    if isinstance(answer, Undescribed):
        return answer
    warnings.warn("an fxsym_undescribed_groups answer of a reason or an (entries, reason) "
                  "tuple is deprecated: give fxsym.plugins.contracts.Undescribed(reason, "
                  "step=None | entries)", DeprecationWarning, stacklevel=3)
    if (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], Integral)
            and not isinstance(answer[0], bool) and answer[0] > 0):
        return Undescribed(str(answer[1]), step=int(answer[0]))
    return Undescribed(str(answer))


class NeededBlocks(NamedTuple):
    """A kind of blocks of a depth group of which at least one must stay
    (``fxsym_depth_kinds``): their ``positions`` in the stack and ``why`` one must stay."""

    positions: Sequence[int]
    why: str


class RoleKind(enum.Enum):
    """How the pruning workflow treats the groups of a :class:`Role`."""

    #: the width every block of a stack reads and writes (a residual stream): one size for
    #: all its groups; the architecture search tries fractions of it
    STREAM = "stream"
    #: a width inside the blocks the architecture search sizes: its groups fall into width
    #: classes (one source, one length), and every class of every such role is sized by one
    #: fraction of its own width, so that a candidate meets the parameter target
    WIDTH = "width"
    #: a count sized only when a request names it (``sizes_for``); the search keeps it whole
    COUNT = "count"
    #: groups no size names (listed so that no other role takes them); kept whole
    FIXED = "fixed"


@dataclass(frozen=True)
class Role:
    """One kind of group a plugin recognises in a model (``fxsym_roles``).

    ``name`` is how a request names its size (``sizes_for(symmap, **{name: entries})``, the
    CLI's ``--name`` flag, underscores as dashes) and the column of the search's table;
    ``what`` says it in messages (``"a dense FFN width"``); ``kind`` how the workflow treats
    it (:class:`RoleKind`); ``groups`` the names of the searchable groups it holds (in the
    order the search and plans list them). A role with no group is still declared: the
    workflow then says that no group of the model holds it.
    """

    name: str
    what: str
    kind: RoleKind
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Role.name is a Python identifier (a keyword of sizes_for), "
                             f"not {self.name!r}")


class RoleSize(NamedTuple):
    """What a :class:`RoleMap`'s size rule makes of a request: keep ``entries`` entries in
    every group of the role ``role``; ``what`` names that size in messages."""

    role: str
    entries: int
    what: str


#: a :class:`RoleMap`'s size rule: the sizes a request gives under the rule's names (only
#: those given) -> the roles' sizes; a request the rule cannot follow raises
#: :class:`fxsym.errors.PlanError`
SizeRule: TypeAlias = Callable[[Mapping[str, int]], Sequence[RoleSize]]


@dataclass(frozen=True)
class RoleMap:
    """A plugin's answer to ``fxsym_roles``: the roles it recognises in a model, and how the
    sizes a request names that are no role's own become roles' sizes.

    ``names`` are the request's names ``sizes`` reads instead of a role of that name (the hf
    plugin's ``heads`` and ``kv_heads``: with grouped queries, ``heads`` counts query heads,
    which the ``queries`` role holds per key/value head); ``sizes(given)`` receives those
    given and returns :class:`RoleSize` values, applied after the roles a request names
    directly.
    """

    roles: tuple[Role, ...]
    names: tuple[str, ...] = ()
    sizes: SizeRule | None = None


class UsageRecorder(Protocol):
    """Scores of some groups' units by how a calibration run uses them, recorded by forward
    hooks while the model (or pieces of it, block by block) runs (``fxsym_usage_recorder``:
    the hf plugin's experts of a mixture-of-experts layer, by router load and weighted
    output). The activation importance takes these scores for the groups they score."""

    #: true while the recorder runs a module call of its own (other hooks skip that call)
    inside: bool

    def attach(self, where: Callable[[str], bool]) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook the modules whose qualified names ``where`` accepts; the caller removes the
        handles returned when done."""

    def scores(self) -> dict[str, torch.Tensor]:
        """``{group name: one score per unit}`` for the groups recorded."""

    def records(self) -> Mapping[str, Mapping[str, list[float]]]:
        """What else was recorded, for a plan's ``extra``: ``{name: {group name: one number
        per unit}}`` (nothing: an empty mapping)."""


__all__ = [
    "AnalysisOption", "ExampleInputs", "ForwardHook", "GroupStep", "ImportanceFn", "Kept",
    "M", "ModuleClass", "NeededBlocks", "OpRule", "OpRuleRegistrar", "OpTarget", "PatternItem",
    "PatternRegistrar",
    "ProxyRegistrar", "ResizeFn", "Role", "RoleKind", "RoleMap", "RoleSize", "SizeChanges",
    "SizeOption", "SizeRule", "SymInfoRegistrar", "Undescribed", "UsageRecorder", "ValueFn",
    "undescribed",
]
