"""Targets: explicit architecture sizes, and the search for a parameter target (issue 22 §4).

**Roles** (:func:`fxsym.prune.roles.roles`). A size such as "the hidden size" or "the FFN width" is
mapped to groups by the roles the plugins declare (``fxsym_roles``): this module names none. A
role's kind says how it is used here: the *stream* role (one size for all its groups: the hf
plugin's ``hidden``), *width* roles (sized by the search, each of its width classes from its
own range: the hf plugin's ``ffn``, ``expert_ffn``, ``shared_ffn``), *counts* sized only when
asked (``heads``, ``experts``) and groups no size names; *layers* are the depth group's
blocks. So ``--hidden 3072 --ffn 9216 --heads 24 --kv-heads 8 --layers 28``
(:func:`sizes_for`) keeps 3072 stream channels, 9216 units in every dense FFN group, 8
key/value heads and 24 / 8 queries per key/value head in every attention (the hf plugin's size
rule of ``heads`` and ``kv_heads``), and 28 blocks. A size no group holds, or a name no plugin
declares, is an error.

**Search** (:func:`search`): for a parameter target, a small space of *uniform* candidates
(every group of a role keeps the same size): a few depths (all blocks, then 7/8, 3/4, 5/8
and 1/2 of them) times a few sizes of the stream role (the same fractions, rounded down to a
multiple of ``round_to``), each with the widest widths of the width roles that meet the target
(one fraction for every width class, each class's width that fraction of its own, rounded
down to its step and ``round_to``); the counts stay whole. A candidate lands as close under
the target as the steps allow (one further under is not offered, see :func:`candidates`); a
target above the model's (active) parameters is an error; the kept plan records the target
and the count reached (``extra["target"]``). Each candidate is planned (blocks by block
importance, units by ``importance``), applied to a copy and scored by its loss on the
calibration batches: the loss a plugin gives (``fxsym_batch_loss``, :func:`batch_loss`: the
hf plugin's next-token cross-entropy where the model returns ``logits`` for ``input_ids``),
else the mean squared error to the unpruned model's output; only the
``shortlist`` candidates of lowest damage (:mod:`fxsym.shortlist`: estimated from the
importance scores and block importance the calibration already gave) are scored so, the
others ranked by that estimate alone. The table lists every candidate, its damage, its loss
or "not scored"; the plan of the lowest loss is kept (Minitron's architecture search, in
miniature: no distillation).
The candidates are counted from the parameters' metadata (:func:`candidates`, on a meta model
too); a checkpoint directory scores them by streaming instead of running a copy
(``evaluate``: :func:`fxsym.checkpoint.stream_loss`).

*Non-embedding* parameters (``non_embedding=True``) are every parameter but the embedding
tables (tied to the head or not: :func:`fxsym.embeddings.embedding_tables`), the count model
cards quote. *Active* parameters (``active=True``, :func:`active_params`) are those a token
uses: every parameter but those only looked up (an embedding table whose rows one token reads
one of; tied to an output head, it counts), and of a MoE layer's expert tensors only the share a
router picks. The experts of a MoE layer are a *routed* group (:attr:`SymGroup.routed`); a
token reads the ``k`` experts a ``topk`` over all of them picks (its ``min_size`` where no
such ``topk`` is found; DeepSeek picks ``topk_group`` routing groups first, then ``top_k``
experts): a parameter sliced by that group counts ``k /
E`` of its entries (``E`` the experts kept), unless it computes the scores the pick reads (the
router's weight, upstream of the integer positions in the trace), which every token uses
whole. The experts of each MoE layer are a count role of the hf plugin, ``experts``, sized only when
asked (:func:`sizes_for`); the search keeps them (fewer experts lower the active count by
the router's rows only).

Imports from fxsym: console, depth, embeddings, errors, importance, memo, paramlayout,
planning, plugins, roles, shortlist, symbols.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from torch import fx, nn

from ..errors import PlanError
from ..memo import one_run
from ..paramlayout import Slices, layout
from ..plugins.analysis_options import keeps_picked_blocks
from ..plugins.calls import call_hook
from ..symbols import SymMap
from .console import format_table
from .depth import block_importance, renamed, usable_blocks
from .embeddings import embedding_tables
from .importance import criterion_by_name, run_batch
from .planning import Plan, described, excluded_groups, param_shapes, solve, with_extra
from .roles import Role, RoleKind, Roles, group_sources, roles
from .shortlist import SHORTLIST, check_shortlist, damage
from .shortlist import shortlist as shortlist_of

__all__ = ["Candidate", "Roles", "SearchResult", "active_params", "batch_loss", "candidates",
           "expert_shares", "group_sources", "next_token_loss", "roles", "search", "sizes_for",
           "table", "target_record"]

#: the fractions of blocks and of the hidden size the search tries
FRACTIONS = (1.0, 0.875, 0.75, 0.625, 0.5)


def sizes_for(symmap: SymMap, **sizes: int | None) -> dict[str, int]:
    """``{group name: units to keep}`` for the sizes given by role (``sizes_for(symmap,
    NAME=entries)``: the roles the plugins declare, :func:`fxsym.prune.roles.roles`; the hf
    plugin's: channels for ``hidden``, ``ffn`` (dense FFNs), ``expert_ffn`` (routed experts'
    FFNs) and ``shared_ffn`` (shared experts' FFNs), heads for ``heads`` and ``kv_heads``,
    experts per MoE layer for ``experts``); ``None`` values are left out. A
    :class:`~fxsym.errors.PlanError` for a name no plugin declares, a size no group holds or
    one the groups cannot take (fewer experts than a router picks, a size off the group's
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
        _put(groups, role.groups, entries, what, out)

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


def _put(groups: Mapping[str, Any], names: Iterable[str], entries: int, what: str,
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
            raise PlanError(f"{what} {entries}: a router picks {g.min_size} of group "
                            f"{name}'s units, so it keeps at least {g.min_size}")
        out[name] = entries // g.unit


def active_params(model: nn.Module, symmap: SymMap) -> tuple[int, frozenset[str]]:
    """The parameters a token uses (see the module docstring), and the names of those it does
    not use at all (looked up only)."""
    skipped = embedding_tables(model, symmap, only_looked_up=True)
    shares = expert_shares(model, symmap)
    experts = {g.name: g.size for g in symmap.groups() if g.routed}
    total = 0.0
    for name, p in model.named_parameters():
        if name in skipped:
            continue
        k, group = shares.get(name, (1, ""))
        total += p.numel() * k / experts.get(group, 1)
    return round(total), skipped


def expert_shares(model: nn.Module, symmap: SymMap) -> dict[str, tuple[float, str]]:
    """``{parameter name: (k, routed group)}`` for every parameter sliced by a routed group
    that a token reads only at the positions its router picks, ``k`` of the group's units
    (a fraction where a unit holds several entries): the ``k`` of a ``topk`` over every entry
    of the group (DeepSeek's ``top_k`` experts, after it picked ``topk_group`` routing
    groups), else the group's ``min_size``. The group's pick is the first node of the trace,
    downstream of its parameters, that makes integer positions out of floating values
    (``topk``/``argmax`` over scores); a parameter upstream of it (the router's weight and
    bias, computing the scores) is used whole."""
    routed = [g for g in symmap.groups() if g.routed]
    graph = symmap.graph
    if not routed or graph is None:
        return {}
    lay = layout(model, symmap)
    order = {n: i for i, n in enumerate(graph.nodes)}
    picks = {n for n in graph.nodes if _is_pick(n)}
    uses = _param_nodes(model, graph)
    out: dict[str, tuple[float, str]] = {}
    for g in routed:
        params = {sl.param for sl in lay.slices.get(g.name, ())}
        starts = [n for p in params for n in uses.get(p, ())]
        downstream = [n for n in _closure(starts, lambda n: list(n.users)) if n in picks]
        pick = min(downstream, key=order.__getitem__, default=None)
        upstream = set() if pick is None else _closure([pick], lambda n: n.all_input_nodes)
        copies = _copies(lay.slices.get(g.name, ()), symmap)
        entries = next((k for k in (_entries_picked(n, g.size * g.unit * copies) for n in sorted(
            downstream, key=order.__getitem__)) if k is not None), None)
        share = g.min_size if entries is None else entries / (g.unit * copies)
        for p in params:
            if not upstream.intersection(uses.get(p, ())):
                out[p] = (share, g.name)
    return out


def _copies(slices: Sequence[Slices], symmap: SymMap) -> int:
    """How many times a parameter dim holds each unit of a routed group: the number of blocks
    where the analysis kept the blocks of picked groups (:func:`keeps_picked_blocks`: the
    expert positions of ``n_group`` routing groups, ``routing_groups="keep"``), else 1."""
    if keeps_picked_blocks(symmap.analysis_options) is None:
        return 1
    return max((sl.index.numel() // max(1, len(set(sl.unit.tolist()))) for sl in slices),
               default=1)


def _entries_picked(node: fx.Node, length: int) -> int | None:
    """``k`` of ``node`` if it is a ``topk`` along a dim of ``length`` entries, else
    ``None``."""
    if node.target not in (torch.topk, "topk"):
        return None
    out, inputs = node.meta.get("val"), node.all_input_nodes
    x = inputs[0].meta.get("val") if inputs else None
    if not isinstance(out, tuple) or not isinstance(x, torch.Tensor):
        return None
    d = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else -1)
    if not isinstance(d, int) or not -x.dim() <= d < x.dim():
        return None
    return int(out[1].shape[d]) if int(x.shape[d]) == length else None


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    return [t for x in v for t in _tensors(x)] if isinstance(v, (tuple, list)) else []


def _is_pick(node: fx.Node) -> bool:
    """Whether ``node`` makes integer positions out of floating values."""
    return any(not t.is_floating_point() and t.dtype != torch.bool
               for t in _tensors(node.meta.get("val"))) and any(
        t.is_floating_point() for a in node.all_input_nodes
        for t in _tensors(a.meta.get("val")))


def _closure(start: Iterable[fx.Node], step: Callable[[fx.Node], list[fx.Node]]
             ) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(start)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(step(n))
    return seen


def _param_nodes(model: nn.Module, graph: fx.Graph) -> dict[str, list[fx.Node]]:
    """The nodes reading each parameter: its ``get_attr``, its module's calls."""
    params = dict(model.named_parameters())
    names = {id(p): name for name, p in params.items()}
    modules = dict(model.named_modules())
    out: dict[str, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op == "get_attr" and str(n.target) in params:
            out.setdefault(str(n.target), []).append(n)
        elif n.op == "call_module" and str(n.target) in modules:
            for p in modules[str(n.target)].parameters():
                if id(p) in names:
                    out.setdefault(names[id(p)], []).append(n)
    return out


@dataclass(frozen=True)
class Candidate:
    """One uniform architecture the search tried: its depth, the size of the stream role
    (:attr:`fxsym.prune.roles.Roles.stream`) and the width of each width role (``None``: the model
    has no such group or the search keeps it; a role of several width classes: its widest
    class's), and of each width class searched (``classes``: ``(label, entries)``,
    :attr:`fxsym.prune.roles.Roles.classes`). ``candidate.NAME`` is the size of the role ``NAME``
    (the hf plugin's ``candidate.hidden``, ``candidate.ffn``)."""

    layers: int
    stream: int | None
    params: int
    loss: float = math.nan
    plan: Plan | None = field(default=None, repr=False, compare=False)
    classes: tuple[tuple[str, int], ...] = ()
    #: the damage the calibration pass estimates (:func:`fxsym.shortlist.damage`)
    damage: float = math.nan
    #: whether the candidate was scored by its loss (it was on the shortlist)
    scored: bool = True
    #: the stream role's name, or ``None`` where no plugin declares one
    stream_role: str | None = None
    #: ``(role, entries)`` of every width role declared (``None``: not set)
    role_widths: tuple[tuple[str, int | None], ...] = ()

    def __getattr__(self, name: str) -> int | None:
        own = vars(self)
        if not name.startswith("_"):
            if name == own.get("stream_role"):
                stream: int | None = own.get("stream")
                return stream
            for role, entries in own.get("role_widths", ()):
                if role == name:
                    return entries  # type: ignore[no-any-return]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def widths(self) -> dict[str, int]:
        """``{role: entries}`` of the width roles the candidate sets."""
        return {k: v for k, v in self.role_widths if v is not None}

    def sizes(self) -> dict[str, int | None]:
        """``{role: entries}`` of the stream role and of every width role declared."""
        return {**({self.stream_role: self.stream} if self.stream_role else {}),
                **dict(self.role_widths)}


@dataclass(frozen=True)
class SearchResult:
    """The candidates tried (in the order tried) and the best one's plan."""

    candidates: tuple[Candidate, ...]
    best: Candidate
    #: the depths not tried, each with why (:func:`candidates`' ``skipped``)
    skipped: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        assert self.best.plan is not None
        return self.best.plan

    def rows(self) -> list[dict[str, Any]]:
        """The candidates as JSON data (what :func:`fxsym.prune_checkpoint` records in the
        plan's ``extra["search"]``), the kept one marked ``kept``."""
        return [{"layers": c.layers, **c.sizes(), "classes": dict(c.classes), "params": c.params,
                 "loss": None if math.isnan(c.loss) else c.loss, "kept": c is self.best,
                 "damage": None if math.isnan(c.damage) else c.damage, "scored": c.scored}
                for c in self.candidates]

    def table(self) -> str:
        """The candidates as a table, the kept one marked, and the depths skipped."""
        return table(self.rows()) + "".join(f"\nskipped: {why}" for why in self.skipped)


#: the keys of a row (:meth:`SearchResult.rows`) that are no role's size
_ROW_KEYS = frozenset({"layers", "classes", "params", "loss", "kept", "damage", "scored"})


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Candidates (:meth:`SearchResult.rows`) as a table, the kept one marked: the stream
    role's column (a row's first role, unless a width class is of that role), then a column
    for each width role some candidate sets (the first where none does), or for each of its
    width classes where it has several."""
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in _ROW_KEYS))
    labels = list(dict.fromkeys(k for r in rows for k in r.get("classes") or {}))
    first_is_width = bool(keys) and any(c.partition(" ")[0] == keys[0] for c in labels)
    stream, width_keys = ([], keys) if first_is_width else (keys[:1], keys[1:])
    roles_set = ([k for k in width_keys if any(r.get(k) is not None for r in rows)]
                 or width_keys[:1])
    shown: list[tuple[str, str | None]] = []  # (column, role or width class)
    for k in roles_set:
        own = [c for c in labels if c.partition(" ")[0] == k and c != k]
        shown += [(c, None) for c in own] if own else [(k, k)]

    def value(r: Mapping[str, Any], column: str, role: str | None) -> Any:
        return r.get(role) if role is not None else (r.get("classes") or {}).get(column)

    def loss(r: Mapping[str, Any]) -> str:
        if not r.get("scored", True):
            return "not scored"
        return "nan" if r["loss"] is None else f"{r['loss']:.4f}"

    damaged = any(r.get("damage") is not None for r in rows)
    return format_table([[r["layers"], *(r.get(k) for k in stream),
                          *(value(r, c, k) for c, k in shown), f"{r['params']:,}",
                          *([f"{r['damage']:.4f}" if r.get("damage") is not None else ""]
                            if damaged else []),
                          loss(r), "<- kept" if r["kept"] else ""] for r in rows],
                        ["layers", *stream, *(c.replace("_", " ") for c, _ in shown),
                         "params", *(["damage"] if damaged else []), "calib loss", ""])


@dataclass(frozen=True)
class _Range:
    """What the search may give one width class: its width now, the step of entries every
    group of it takes at a time, and the fewest entries it keeps."""

    now: int
    step: int
    least: int


def _ranges(symmap: SymMap, r: Roles, kept: frozenset[str], whole: Mapping[str, str],
            step: Mapping[str, int], round_to: int, min_keep: int) -> dict[str, _Range]:
    """The range of each width class the search sizes (``{label: range}``): one with no
    group left to it (every group excluded) or with a group the model's description cannot
    follow is kept. Classes of different roles as wide and read from a common source (a
    config field changing both: DeepSeek's ``moe_intermediate_size`` sizes its experts and
    its shared experts) share one range, the steps of both, so every candidate gives them
    one width and the field can still describe them."""
    groups = {g.name: g for g in symmap.groups()}
    sources = group_sources(symmap)
    out: dict[str, _Range] = {}
    fields: dict[str, set[str]] = {}
    for label, names in r.classes:
        own = [groups[n] for n in names if n not in kept]
        if not own or whole.keys() & set(names):
            continue
        unit = math.lcm(*(step[g.name] for g in own))
        out[label] = _Range(
            max(g.size * g.unit for g in own),
            math.lcm(round_to, unit) if round_to % unit == 0 or unit % round_to == 0 else unit,
            max(min_keep * g.unit for g in own))
        fields[label] = {f for g in own for f in sources.get(g.name, "").split("+") if f}
    for label in out:
        tied = [k for k in out if out[k].now == out[label].now and fields[k] & fields[label]]
        if len(tied) > 1:
            one = _Range(out[label].now, math.lcm(*(out[k].step for k in tied)),
                         max(out[k].least for k in tied))
            out.update(dict.fromkeys(tied, one))
    return out


def candidates(model: nn.Module, symmap: SymMap, *, target_params: int,
               active: bool = False, non_embedding: bool = False, round_to: int = 64,
               block_scores: Mapping[str, Any] | None = None,
               fractions: Sequence[float] = FRACTIONS,
               depths: Sequence[int] | None = None,
               describable: bool = False, exclude: str | Iterable[str] = (),
               min_keep: int = 1, skipped: list[str] | None = None) -> list[Candidate]:
    """The uniform candidates meeting ``target_params`` (see the module docstring), unscored,
    counted from the parameters' metadata only (a meta model does); ``block_scores`` rank the
    blocks of a depth group where fewer are kept (all equal without); ``depths`` are the
    numbers of blocks tried instead of ``fractions`` of them (``(depth,)``: width only);
    ``describable`` keeps sizes the model's own description follows
    (:func:`fxsym.planning.described`: a hidden size or FFN width it cannot follow stays, one
    it follows in steps is a multiple of them). ``exclude`` (:func:`fxsym.plan`'s: names or
    ``fnmatch`` patterns) keeps those groups whole in every candidate, counted whole: an
    excluded hidden size is not searched, excluded FFN groups keep their width while the
    others are searched; ``min_keep`` is the fewest units a searched hidden size or FFN
    width keeps. A depth whose blocks cannot be kept (:func:`fxsym.depth.usable_blocks`:
    fewer blocks than the kinds the model needs, or blocks the config cannot say while they
    read values chosen by position) is skipped, and why is added to ``skipped`` (a list, if
    given). A :class:`~fxsym.errors.PlanError` if the target is above the model's
    (active) parameters or no candidate meets it.

    Each candidate lands as close under the target as the steps allow: its FFN-like widths
    (dense, expert and shared-expert FFNs, each a fraction of its own width, one fraction for
    all) are the widest that fit, so it lies within a width step of the target; a candidate
    whose widths stay whole (its depth and hidden size alone fit) is offered only where it is
    as close as those (without such candidates: where its hidden size could not grow a step
    and still fit; without those either, every candidate is)."""
    r = roles(symmap)
    groups = {g.name: g for g in symmap.groups()}
    depth = symmap.depth_group(r.layers) if r.layers else None
    scores = dict(block_scores or {})
    if depth is not None and scores.get(depth.name) is None:
        scores[depth.name] = torch.zeros(depth.size)
    count = _counter(model, symmap, active, non_embedding)
    whole_model = count({}, None)
    what = _counted(active, non_embedding)
    if target_params > whole_model:
        raise PlanError(f"the target of {target_params:,} {what} is above the model's "
                        f"{whole_model:,}: nothing to prune; give a target under "
                        f"{whole_model:,}")
    whole, said = described(model, symmap) if describable else ({}, {})
    kept = excluded_groups(symmap, exclude)
    step = {g.name: g.unit * math.lcm(g.step, said.get(g.name, (1, ""))[0])
            for g in symmap.groups()}
    hidden_now = groups[r.stream[0]].size * groups[r.stream[0]].unit if r.stream else None
    hidden_step = math.lcm(round_to, *(step[n] for n in r.stream))
    hidden_least = max((min_keep * groups[n].unit for n in r.stream), default=0)
    stream_role = r.stream_role.name if r.stream_role is not None else None
    width_roles = r.of_kind(RoleKind.WIDTH)
    hidden_least = math.ceil(hidden_least / hidden_step) * hidden_step
    ranges = _ranges(symmap, r, kept, whole, step, round_to, min_keep)
    fixed = bool((whole.keys() | kept) & set(r.stream))
    widths = (1.0,) if fixed or not hidden_now else fractions
    sized = partial(_sizes, symmap, r, kept)
    found: list[tuple[Candidate, bool, bool]] = []
    tried: set[tuple[Any, ...]] = set()
    unusable = skipped if skipped is not None else []
    counts = ([0] if depth is None else list(depths) if depths is not None
              else [max(1, round(depth.size * lf)) for lf in fractions])
    for n_layers in counts:
        if depth is not None and not 1 <= n_layers <= depth.size:
            raise PlanError(f"{n_layers} blocks of {depth.name!r}: it has {depth.size}")
        for hf in widths:
            hidden = hidden_now if hidden_now is None or fixed else min(hidden_now, max(
                hidden_step, hidden_least, int(hidden_now * hf) // hidden_step * hidden_step))
            key = (n_layers, hidden)
            if key in tried:
                continue
            tried.add(key)
            blocks, why = _blocks(model, symmap, depth, scores.get(r.layers or ""), n_layers)
            if why is not None:
                if why not in unusable:
                    unusable.append(why)
                continue
            layers = _layers_arg(r.layers, blocks)
            chosen = _widest(count, sized, hidden, ranges, layers, target_params)
            if chosen is None:
                continue
            sizes = sized(hidden if hidden != hidden_now else None,
                          {k: w for k, w in chosen.items() if w != ranges[k].now})
            params = count(sizes, layers)
            widths_bind = any(w < ranges[k].now for k, w in chosen.items())
            hidden_binds = (hidden is not None and hidden_now is not None
                            and hidden < hidden_now and count(sized(
                                min(hidden_now, hidden + hidden_step), {}), layers)
                            > target_params)
            role = {k.name: chosen[max((c for c in chosen if r.role_of(c) == k.name),
                                       key=lambda c: ranges[c].now)]
                    for k in width_roles if any(r.role_of(c) == k.name for c in chosen)}
            found.append((Candidate(n_layers or 0, hidden, params,
                                    classes=tuple(chosen.items()), stream_role=stream_role,
                                    role_widths=tuple((k.name, role.get(k.name))
                                                      for k in width_roles)),
                          widths_bind, hidden_binds))
    if not found:
        raise PlanError(f"no uniform candidate reaches {target_params:,} {what}" + "".join(
                            f"; skipped {why}" for why in unusable))
    bound = [c.params for c, widths_bind, _ in found if widths_bind]
    if bound:  # within a width step of the target: others only where as close
        return [c for c, widths_bind, _ in found if widths_bind or c.params >= min(bound)]
    close = [c for c, _, hidden_binds in found if hidden_binds]
    return close or [c for c, _, _ in found]


@one_run  # each candidate's plugin probes (described sizes, meta builds) answered once
def search(model: nn.Module, symmap: SymMap, *, target_params: int,
           batches: Iterable[Any] = (), active: bool = False, non_embedding: bool = False,
           round_to: int = 64,
           importance: Any = "l2", loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
           fractions: Sequence[float] = FRACTIONS,
           block_scores: Mapping[str, Any] | None = None,
           evaluate: Callable[[Plan], float] | None = None,
           evaluate_all: Callable[[Sequence[Plan]], Sequence[float]] | None = None,
           depths: Sequence[int] | None = None,
           describable: bool = False,
           exclude: str | Iterable[str] = (),
           min_keep: int = 1,
           progress: bool = False,
           shortlist: int | None = SHORTLIST) -> SearchResult:
    """Search uniform architectures meeting ``target_params`` (see the module docstring);
    nothing of ``model`` is changed.

    ``block_scores`` (``{depth group: one score per block}``) rank the blocks instead of
    :func:`~fxsym.depth.block_importance` on ``batches``; ``evaluate(plan)`` scores a
    candidate instead of running a pruned copy of ``model`` on ``batches`` (a checkpoint
    streamed layer by layer: :func:`fxsym.checkpoint.prune_checkpoint`), and then ``batches``
    may be empty; ``evaluate_all(plans)`` scores every candidate in one call instead (a
    checkpoint read once for all of them: :func:`fxsym.checkpoint.stream_losses`).
    ``depths`` are the numbers of blocks tried, ``describable`` keeps sizes the model's own
    description follows (:func:`candidates`; each plan with
    :func:`fxsym.plan`'s ``describable``); ``exclude`` and ``min_keep`` are
    :func:`fxsym.plan`'s, given to every candidate (:func:`candidates`: an excluded group
    keeps its size in all of them). ``progress`` shows the candidates being scored.

    Only the ``shortlist`` candidates of lowest damage (:func:`fxsym.shortlist.damage`,
    from ``importance``'s scores and ``block_scores``) are scored by their loss (``None``:
    all of them); the others are in the result, ranked by damage alone (``scored`` false,
    ``loss`` nan). The importance is computed once for all the candidates."""
    from .console import track

    check_shortlist(shortlist)
    batches = list(batches)
    if not batches and ((evaluate is None and evaluate_all is None) or block_scores is None):
        raise PlanError("the search needs at least one calibration batch")
    r = roles(symmap)
    groups = {g.name: g for g in symmap.groups()}
    depth = symmap.depth_group(r.layers) if r.layers else None
    if block_scores is None:
        block_scores = (block_importance(batches)(model, symmap) if depth is not None else {})
    skipped: list[str] = []
    found = candidates(model, symmap, target_params=target_params, active=active,
                       non_embedding=non_embedding, round_to=round_to,
                       block_scores=block_scores, fractions=fractions, depths=depths,
                       describable=describable, exclude=exclude, min_keep=min_keep,
                       skipped=skipped)
    kept = excluded_groups(symmap, exclude)
    hidden_now = groups[r.stream[0]].size * groups[r.stream[0]].unit if r.stream else None
    now = _class_now(symmap, r, kept)
    reference = (_references(model, batches)
                 if loss is None and evaluate is None and evaluate_all is None else None)

    def label(c: Candidate) -> str:
        return ", ".join([f"layers {c.layers}",
                          *(f"{k} {w}" for k, w in c.sizes().items() if k == c.stream_role),
                          *(f"{k.replace('_', ' ')} {w}" for k, w in c.classes)])

    given = _scored_once(model, symmap, importance)
    planned = []
    for c in found:
        blocks, _ = _blocks(model, symmap, depth, block_scores.get(r.layers or ""), c.layers)
        p = solve(model, symmap, importance=given, scope="uniform",
                  sizes=_sizes(symmap, r, kept, c.stream if c.stream != hidden_now else None,
                               {k: w for k, w in c.classes if w != now.get(k)}),
                  layers=_layers_arg(r.layers, blocks), describable=describable,
                  exclude=exclude, min_keep=min_keep)
        planned.append(replace(c, plan=p, damage=damage(symmap, p, given(model, symmap),
                                                        block_scores)))
    picked = set(shortlist_of([c.damage for c in planned], shortlist))
    chosen = [c for i, c in enumerate(planned) if i in picked]
    if evaluate_all is not None:
        values = list(evaluate_all([c.plan for c in chosen if c.plan is not None]))
    else:
        values = []
        for c in (track(chosen, description="scoring candidates", label=label)
                  if progress else chosen):
            assert c.plan is not None
            values.append(evaluate(c.plan) if evaluate is not None
                          else _loss_of(model, symmap, c.plan, batches, loss, reference))
    losses = dict(zip(sorted(picked), values, strict=True))
    scored = [replace(c, loss=losses[i]) if i in losses else replace(c, scored=False)
              for i, c in enumerate(planned)]
    best = min((c for c in scored if c.scored), key=lambda c: (math.isnan(c.loss), c.loss))
    assert best.plan is not None
    marked = replace(best, plan=with_extra(best.plan, target=target_record(
        target_params, active, best.params, non_embedding=non_embedding)))
    return SearchResult(tuple(marked if c is best else c for c in scored), marked,
                        tuple(skipped))


def _scored_once(model: nn.Module, symmap: SymMap, importance: Any
                 ) -> Callable[[nn.Module, SymMap], dict[str, torch.Tensor]]:
    """``importance`` (a criterion's name, a criterion, or scores) as a criterion computed
    once and named as :func:`fxsym.plan` names it, so every candidate is planned from the
    same scores."""
    if isinstance(importance, Mapping):
        scores: dict[str, torch.Tensor] = dict(importance)
        name = "given"
    elif isinstance(importance, str):
        scores, name = criterion_by_name(importance)(model, symmap), importance
    elif callable(importance):
        scores, name = importance(model, symmap), getattr(importance, "__name__", "custom")
    else:
        raise PlanError(f"importance must be a criterion's name, a criterion or {{group name: "
                        f"scores}}; got a {type(importance).__name__}")

    def given(m: nn.Module, s: SymMap) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = name
    return given


def target_record(target: int, active: bool, reached: int, *, non_embedding: bool = False
                  ) -> dict[str, Any]:
    """What a plan made for a parameter target records of it (``plan.extra["target"]``): the
    target given, whether it counts active (or non-embedding) parameters, and the count the
    plan reached."""
    return {"params": target, "active": active, "reached": reached,
            **({"non_embedding": True} if non_embedding else {})}


def _counted(active: bool, non_embedding: bool) -> str:
    """What a target counts, as a message says it."""
    return ("active parameters" if active else "non-embedding parameters" if non_embedding
            else "parameters")


def _sizes(symmap: SymMap, r: Roles, kept: frozenset[str], stream: int | None,
           widths: Mapping[str, int]) -> dict[str, int]:
    """:func:`sizes_for` a size of the stream role and the widths of width classes
    (``{label: entries}``, :attr:`Roles.classes`), but for the groups kept whole."""
    groups = {g.name: g for g in symmap.groups()}
    out: dict[str, int] = {}
    if stream is not None:
        role = r.stream_role
        if role is None or not r.stream:
            raise PlanError(f"no group of the model holds "
                            f"{'a stream width' if role is None else role.what}")
        _put(groups, r.stream, stream, role.what, out)
    classes = dict(r.classes)
    for label, entries in widths.items():
        role = r.role(r.role_of(label))
        _put(groups, (n for n in classes[label] if n not in kept), entries,
             f"{role.what if role is not None else label} ({label})", out)
    return {k: v for k, v in out.items() if k not in kept}


def _class_now(symmap: SymMap, r: Roles, kept: frozenset[str]) -> dict[str, int]:
    """The width now of each width class (of its groups not kept whole)."""
    groups = {g.name: g for g in symmap.groups()}
    return {label: max(groups[n].size * groups[n].unit for n in own)
            for label, names in r.classes if (own := [n for n in names if n not in kept])}


def _layers_arg(name: str | None, blocks: list[int] | None) -> Any:
    return None if name is None or blocks is None else {name: blocks}


def _blocks(model: nn.Module, symmap: SymMap, depth: Any, scores: Any, k: int
            ) -> tuple[list[int] | None, str | None]:
    """The ``k`` blocks of ``depth`` a candidate keeps, or why that depth is skipped
    (:func:`fxsym.depth.usable_blocks`)."""
    if depth is None:
        return None, None
    kept, why = usable_blocks(model, symmap, depth, k, scores)
    return kept, None if why is None else f"{k} blocks of {depth.container}: {why}"


def _counter(model: nn.Module, symmap: SymMap, active: bool, non_embedding: bool = False
             ) -> Callable[[Mapping[str, int], Any], int]:
    """``count(sizes, layers)``: the (active or non-embedding) parameters of the plan of
    those sizes and blocks, without building it."""
    shapes_after = param_shapes(model, symmap)
    skipped = (embedding_tables(model, symmap, only_looked_up=True) if active
               else embedding_tables(model, symmap) if non_embedding else frozenset())
    shares = expert_shares(model, symmap) if active else {}
    sizes_now = {g.name: g.size for g in symmap.groups()}
    groups = symmap.depth_groups()
    # whether each parameter is left out, for each choice of blocks: a search counts
    # hundreds of plans of a few depths
    left_out: dict[tuple[tuple[str, tuple[int, ...]], ...], dict[str, bool]] = {}

    def count(sizes: Mapping[str, int], layers: Any) -> int:
        kept = layers or {}
        out = left_out.setdefault(
            tuple(sorted((name, tuple(blocks)) for name, blocks in kept.items())), {})
        total = 0.0
        for k, v in shapes_after(sizes).items():
            gone = out.get(k)
            if gone is None:
                gone = out[k] = k in skipped or renamed(k, groups, kept) is None
            if gone:
                continue
            picked, g = shares.get(k, (1, ""))
            total += math.prod(v) * picked / sizes.get(g, sizes_now.get(g, 1))
        return round(total)

    return count


def _widest(count: Callable[[Mapping[str, int], Any], int],
            sized: Callable[[int | None, Mapping[str, int]], dict[str, int]],
            hidden: int | None, ranges: Mapping[str, _Range], layers: Any,
            target: int) -> dict[str, int] | None:
    """The widest widths of the width classes (``{label: entries}``) meeting ``target``
    with that hidden size and those blocks, or ``None``: one fraction for every class, each
    class's width that fraction of its own, rounded down to its step, at least its least
    (and one step); ``sized(hidden, widths)`` gives the groups' sizes."""
    hidden_sizes = sized(hidden, {}) if hidden is not None else {}
    if not ranges:
        return None if count(hidden_sizes, layers) > target else {}

    def width(rg: _Range, f: float) -> int:
        if f >= 1:
            return rg.now
        w = int(f * rg.now + 1e-9) // rg.step * rg.step
        least = max(rg.step, math.ceil(rg.least / rg.step) * rg.step)
        return min(rg.now, max(w, least))

    def at(f: float) -> dict[str, int]:
        return {k: width(rg, f) for k, rg in ranges.items()}

    options = sorted({min(1.0, n * rg.step / rg.now) for rg in ranges.values()
                      for n in range(1, rg.now // rg.step + 1)} | {1.0})

    def fits(f: float) -> bool:
        w = at(f)
        return count(sized(hidden, {k: v for k, v in w.items() if v != ranges[k].now}),
                     layers) <= target

    best = None
    lo, hi = 0, len(options) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(options[mid]):
            best, lo = options[mid], mid + 1
        else:
            hi = mid - 1
    return None if best is None else at(best)


def _references(model: nn.Module, batches: Sequence[Any]) -> list[Any]:
    with torch.no_grad():
        return [_output(run_batch(model.eval(), b)) for b in batches]


def _output(out: Any) -> Any:
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def _loss_of(model: nn.Module, symmap: SymMap, p: Plan, batches: Sequence[Any],
             loss: Callable[[nn.Module, Any], torch.Tensor] | None,
             reference: list[Any] | None) -> float:
    trial, trial_map = copy.deepcopy((model, symmap))
    p.apply(trial, trial_map)
    trial.eval()
    total = 0.0
    with torch.no_grad():
        for i, batch in enumerate(batches):
            if loss is not None:
                total += float(loss(trial, batch))
                continue
            out = run_batch(trial, batch)
            value = batch_loss(out, batch)
            if value is None:
                assert reference is not None
                value = float(nn.functional.mse_loss(_output(out).float(),
                                                     reference[i].float()))
            total += value
    return total / len(batches)


def batch_loss(out: Any, batch: Any) -> float | None:
    """The loss of a model's output ``out`` on ``batch`` a plugin gives
    (``fxsym_batch_loss``: the hf plugin's next-token cross-entropy where the output holds
    ``logits`` for the batch's ``input_ids``), or ``None`` where none does."""
    value: float | None = call_hook("fxsym_batch_loss", output=out, batch=batch)
    return None if value is None else float(value)


def next_token_loss(out: Any, batch: Any) -> float | None:
    """Deprecated: :func:`batch_loss` (the loss moved into the plugin that knows the model's
    outputs: ``fxsym_plugins_hf.loss.next_token_loss``)."""
    warnings.warn("fxsym.prune.search.next_token_loss is deprecated: use "
                  "fxsym.prune.search.batch_loss (the plugins' fxsym_batch_loss) or "
                  "fxsym_plugins_hf.loss.next_token_loss",
                  DeprecationWarning, stacklevel=2)
    return batch_loss(out, batch)
