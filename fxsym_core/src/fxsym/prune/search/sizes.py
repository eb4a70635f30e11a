"""Explicit architecture sizes by role (:func:`sizes_for`).

A size such as "the hidden size" or "the FFN width" is mapped to groups by the roles the
plugins declare (``fxsym_roles``, :func:`fxsym.prune.roles.roles`): this package names none.
So ``--hidden 3072 --ffn 9216 --heads 24 --kv-heads 8`` keeps 3072 stream channels, 9216 units
in every dense FFN group, 8 key/value heads and 24 / 8 queries per key/value head in every
attention (the hf plugin's size rule of ``heads`` and ``kv_heads``). A size no group holds
or can take (:func:`put_sizes`), or a name no plugin declares, is a
:class:`~fxsym.errors.PlanError`.

Imports from fxsym: errors, roles, symbols.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import PlanError
from ...symbols import SymMap
from ..roles import Role, RoleKind, roles


def sizes_for(symmap: SymMap, **sizes: int | None) -> dict[str, int]:
    """``{group name: units to keep}`` for the sizes given by role (``sizes_for(symmap,
    NAME=entries)``: the roles the plugins declare, :func:`fxsym.prune.roles.roles`; the hf
    plugin's: channels for ``hidden``, ``ffn`` (dense FFNs), ``expert_ffn`` (routed experts'
    FFNs) and ``shared_ffn`` (shared experts' FFNs), heads for ``heads`` and ``kv_heads``,
    experts per MoE layer for ``experts``); ``None`` values are left out. A
    :class:`~fxsym.errors.PlanError` for a name no plugin declares, a size no group holds or
    one the groups cannot take (fewer units than an op picks by value, a size off the group's
    :attr:`~fxsym.SymGroup.step`). The sizes named directly are applied in the order the
    roles are declared, then those a role map's size rule makes of its names."""
    r = roles(symmap)
    given = {k: v for k, v in sizes.items() if v is not None}
    ruled = {n for names, _ in r.rules for n in names}
    named = [k for k in given if k not in ruled
             and ((role := r.role(k)) is None or role.kind is RoleKind.FIXED)]
    if named:
        sizable = [x.name for x in r.declared if x.kind is not RoleKind.FIXED]
        raise PlanError(f"no role of the model is sized by {', '.join(map(repr, named))}; "
                        f"the plugins declare {', '.join([*sizable, *sorted(ruled)]) or 'none'}")
    groups = {g.name: g for g in symmap.groups()}
    out: dict[str, int] = {}

    def put(role: Role, entries: int, what: str) -> None:
        if not role.groups:
            has = [f"{x.what} ({x.name}, --{x.name.replace('_', '-')})"
                   for x in r.of_kind(RoleKind.WIDTH) if x.groups and x.what != what]
            raise PlanError(f"no group of the model holds {what}" + (
                f"; its widths are {' and '.join(has)}" if has and role.kind is RoleKind.WIDTH
                else ""))
        put_sizes(groups, role.groups, entries, what, out)

    for role in r.declared:
        if role.name in given and role.name not in ruled:
            put(role, given[role.name], role.what)
    for names, rule in r.rules:
        asked = {k: v for k, v in given.items() if k in names}
        for said in rule(asked) if asked else ():
            role = r.role(said.role)
            if role is None:
                raise PlanError(f"a size rule gave {said.what} to role {said.role!r}, which no "
                                f"plugin declares")
            put(role, said.entries, said.what)
    return out


def put_sizes(groups: Mapping[str, Any], names: Iterable[str], entries: int, what: str,
         out: dict[str, int]) -> None:
    """``out[name] = `` the units of ``entries`` entries for each group of ``names``; a
    :class:`~fxsym.errors.PlanError` for a size one of them cannot take."""
    for name in names:
        g = groups[name]
        if entries % g.unit or not 1 <= entries // g.unit <= g.size:
            raise PlanError(f"{what} {entries}: group {name} has {g.size} units of "
                            f"{g.unit}; give a multiple of {g.unit} up to {g.size * g.unit}")
        if entries // g.unit % g.step and entries // g.unit != g.size:
            raise PlanError(f"{what} {entries}: group {name} keeps a multiple of "
                            f"{g.step * g.unit} entries or all {g.size * g.unit} "
                            f"({g.step_reason})")
        if entries // g.unit < g.min_size:
            raise PlanError(f"{what} {entries}: an op picks {g.min_size} of group {name}'s "
                            f"units by value (topk), so it keeps at least {g.min_size}")
        out[name] = entries // g.unit
