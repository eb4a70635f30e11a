"""Roles: what the searchable groups of a model are, as its plugins declare them (issue 32 §1).

A *role* is a kind of group a plugin recognises (``fxsym_roles``, a
:class:`~fxsym.plugins.contracts.RoleMap` of :class:`~fxsym.plugins.contracts.Role`): a name a
request sizes it by, a description for messages, the groups it holds and a
:class:`~fxsym.plugins.contracts.RoleKind` saying how the workflow treats them (the one stream
width the search tries fractions of, the widths it sizes together, counts sized when asked,
groups no size names). fxsym names no role itself: the hf plugin declares a transformer's
(found by mechanisms, on any model), another plugin its own, the same way.

:func:`roles` gathers every plugin's answer into one :class:`Roles`, with what the workflow
adds from the kernel's own facts: the depth group (``layers``: the blocks of the one stack)
and the *width classes* of the width roles. Equal numbers are not the same thing: where a
group's size is read from is what a plugin says (``fxsym_group_sources``,
:func:`group_sources`; the hf plugin probes the config field whose change changes the group's
parameter dims). The groups of one width role read from one source and as long (in entries,
of one unit) are one width class; a role may hold several (widths that differ by layer), and
the search sizes each class from its own range. :func:`reachable` walks a traced graph, for
the role finders of plugins and the search's count of what a pick leaves unread.

Imports from fxsym: plugins, symbols.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx

from ..plugins.calls import call_hook
from ..plugins.contracts import Role, RoleKind, RoleMap, RoleSize, SizeRule
from ..symbols import SymMap

__all__ = ["Role", "RoleKind", "RoleMap", "RoleSize", "Roles", "SizeRule", "group_sources", "roles"]


@dataclass(frozen=True)
class Roles:
    """The roles of a model's groups (see the module docstring). ``roles.NAME`` is the
    groups of the role ``NAME`` (an empty tuple where the role is declared but holds none)."""

    #: every role declared, in the order of the plugins' answers
    declared: tuple[Role, ...] = ()
    #: the depth group whose blocks the search may drop (the model's only one), or ``None``
    layers: str | None = None
    #: ``(label, groups)`` of each width class: the groups of one width role read from one
    #: source and as long, labelled by their role where the role has one class, else by role
    #: and width (``"NAME 16384"``)
    classes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the answers' size rules: ``(names, rule)``
    rules: tuple[tuple[tuple[str, ...], SizeRule], ...] = ()

    def __getattr__(self, name: str) -> tuple[str, ...]:
        if not name.startswith("_"):
            for role in self.declared:
                if role.name == name:
                    return role.groups
        raise AttributeError(f"no role {name!r} is declared (roles: "
                             f"{', '.join(r.name for r in self.declared) or 'none'})")

    def role(self, name: str) -> Role | None:
        """The role called ``name``, or ``None``."""
        return next((r for r in self.declared if r.name == name), None)

    def of_kind(self, kind: RoleKind) -> tuple[Role, ...]:
        """The roles of that kind, in declared order."""
        return tuple(r for r in self.declared if r.kind is kind)

    @property
    def stream(self) -> tuple[str, ...]:
        """The groups of the stream roles (:attr:`RoleKind.STREAM`)."""
        return tuple(dict.fromkeys(n for r in self.of_kind(RoleKind.STREAM) for n in r.groups))

    @property
    def stream_role(self) -> Role | None:
        """The first stream role, or ``None``."""
        return next(iter(self.of_kind(RoleKind.STREAM)), None)

    def widths(self) -> dict[str, tuple[str, ...]]:
        """``{role: groups}`` of the width roles holding groups (the widths the search
        sizes, each from its own range)."""
        return {r.name: r.groups for r in self.of_kind(RoleKind.WIDTH) if r.groups}

    def role_of(self, label: str) -> str:
        """The role of the width class ``label``."""
        return label.partition(" ")[0]


def roles(symmap: SymMap) -> Roles:
    """The roles the plugins declare for the groups of ``symmap`` (``fxsym_roles``), with the
    depth group and the width classes (see the module docstring)."""
    answers: list[RoleMap | None] = call_hook("fxsym_roles", model=symmap.model,
                                              symmap=symmap)
    declared: dict[str, Role] = {}
    held: set[str] = set()
    rules: list[tuple[tuple[str, ...], SizeRule]] = []
    for answer in answers:
        if answer is None:
            continue
        for role in answer.roles:
            if role.name in declared:
                continue
            own = tuple(n for n in role.groups if n not in held)
            held.update(own)
            declared[role.name] = Role(role.name, role.what, role.kind, own)
        if answer.sizes is not None and answer.names:
            rules.append((tuple(answer.names), answer.sizes))
    depth = symmap.depth_groups()
    found = tuple(declared.values())
    groups = {g.name: g for g in symmap.groups()}
    widths = {r.name: r.groups for r in found if r.kind is RoleKind.WIDTH and r.groups}
    return Roles(found, depth[0].name if len(depth) == 1 else None,
                 _classes(groups, group_sources(symmap), widths), tuple(rules))


def _classes(groups: Mapping[str, Any], sources: Mapping[str, str],
             widths: Mapping[str, Sequence[str]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The width classes of the width roles (``widths``: ``{role: groups}``): groups of a
    role read from one source (``sources``; none said: one) and of one length and unit."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for role, names in widths.items():
        keyed: dict[tuple[str, int, int], list[str]] = {}
        for n in names:
            g = groups[n]
            keyed.setdefault((sources.get(n, ""), g.size * g.unit, g.unit), []).append(n)
        taken: set[str] = set()
        for (source, entries, unit), members in keyed.items():
            label = role if len(keyed) == 1 else f"{role} {entries}"
            if label in taken or sum(k[1] == entries for k in keyed) > 1:
                label += f" ({source or f'unit {unit}'})"
            while label in taken:
                label += "'"
            taken.add(label)
            out.append((label, tuple(members)))
    return tuple(out)


#: the sources said for the groups of each SymMap (``fxsym_group_sources``), asked once
_SOURCES: weakref.WeakKeyDictionary[SymMap, dict[str, str]] = weakref.WeakKeyDictionary()


def group_sources(symmap: SymMap) -> dict[str, str]:
    """``{group name: source}``: where the plugins say each group's size is read from
    (``fxsym_group_sources``; the first plugin to name a group decides), asked once per
    SymMap."""
    cached = _SOURCES.get(symmap)
    if cached is None:
        names = {g.name for g in symmap.groups()}
        cached = {}
        answers: list[Mapping[str, str] | None] = call_hook(
            "fxsym_group_sources", model=symmap.model, symmap=symmap)
        for said in answers:
            for name, source in (said or {}).items():
                if name in names and source:
                    cached.setdefault(str(name), str(source))
        _SOURCES[symmap] = cached
    return cached


def reachable(start: Iterable[fx.Node], step: Callable[[fx.Node], list[fx.Node]]
              ) -> set[fx.Node]:
    """The nodes reached from ``start`` by ``step`` (``start`` among them): with
    ``lambda n: list(n.users)`` what they feed, with ``lambda n: n.all_input_nodes`` what
    feeds them."""
    seen: set[fx.Node] = set()
    stack = list(start)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(step(n))
    return seen
