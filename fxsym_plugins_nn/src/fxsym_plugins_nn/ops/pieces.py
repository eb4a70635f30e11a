"""Concatenations and cuts: a dim as segments laid end to end.

``cat`` lays its operands' dims end to end (:func:`~fxsym.analysis.concat_dims`); ``stack``
ties them. :func:`cut_dim` is the inverse, shared by ``split``/``chunk``, reshapes and slices:
a group segment crossing a cut is split into blocks of the group
(:meth:`GroupTable.split <fxsym.analysis.GroupTable.split>`), so every dim that holds the group
sees the same blocks; a cut inside a unit (a head, a conv group) is refused or, where the
caller proves the cut stays in place, the unit becomes a constant block. ``chunk`` into equal
pieces stays a group where the pieces provably keep equal sizes under every resize.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    AttributeSize,
    Dim,
    Layout,
    OpContext,
    Seg,
    SizeLayout,
    TensorLayout,
    Unsupported,
    concat_dims,
    dim_size,
    fixed_dim,
    is_fixed,
    size_checked,
    tie_size,
)

from .common import norm_dim, op_name
from .linear_sizes import stays_constant


def _tensor_list(ctx: OpContext, a: Any) -> tuple[list[TensorLayout], list[tuple[int, ...]]]:
    """Layouts and shapes of a list of tensors: a list of nodes, or one node holding a tuple."""
    if isinstance(a, torch.fx.Node):
        lays, vals = ctx.layout(a), ctx.val(a)
        if not isinstance(lays, tuple) or isinstance(lays, TensorLayout):
            ctx.unsupported("expected a sequence of tensors")
        return list(lays), [tuple(v.shape) for v in vals]
    return [ctx.tensor_layout(t) for t in a], [ctx.shape(t) for t in a]


def concat(ctx: OpContext) -> Layout:
    """``torch.cat``: segments laid end to end along ``dim``; other dims tied."""
    dim = ctx.val(ctx.arg(1, "dim", 0))
    lays, shapes = _tensor_list(ctx, ctx.arg(0, "tensors"))
    lays = [lay for lay, s in zip(lays, shapes) if s != (0,)]
    if not lays:
        return ctx.fixed()
    ndim = len(lays[0])
    d = norm_dim(dim, ndim)
    out: list[Dim] = []
    for i in range(ndim):
        if i == d:
            out.append(concat_dims([lay[i] for lay in lays]))
        else:
            out.append(ctx.unify(*[lay[i] for lay in lays]))
    return TensorLayout(out)


def stack(ctx: OpContext) -> Layout:
    dim = ctx.val(ctx.arg(1, "dim", 0))
    lays, _ = _tensor_list(ctx, ctx.arg(0, "tensors"))
    ndim = len(lays[0])
    d = norm_dim(dim, ndim + 1)
    dims = [ctx.unify(*[lay[i] for lay in lays]) for i in range(ndim)]
    dims.insert(d, fixed_dim(len(lays)))
    return TensorLayout(dims)


def split(ctx: OpContext) -> Layout:
    """``split``/``chunk``/``unbind``: pieces keep the other dims' groups.

    Along an elastic dim, ``chunk`` into equal pieces cuts the dim's groups into blocks at
    the piece boundaries (:func:`cut_dim`), and the blocks of each piece keep as many units
    as the first piece's (``chunk`` cuts at equal sizes at run time); their entries are chosen
    independently. ``split`` at sizes read from module attributes keeps the pieces too
    (:func:`_cut_at_attributes`). Pieces of sizes written as numbers (``split(64)``), unequal
    pieces and ``unbind`` pin that dim.
    """
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    name = op_name(ctx)
    default_dim = 0
    at = 2 if name in ("split", "split_with_sizes", "chunk", "tensor_split") else 1
    d = ctx.val(ctx.arg(at, "dim", default_dim))
    d = norm_dim(int(d), len(lay))
    pieces = ctx.value
    sizes = [p.shape[d] for p in pieces] if name != "unbind" else []
    cuts: list[Dim] | None = None
    if not is_fixed(lay[d]):
        by = _attribute_sizes(ctx) if name == "split" else None
        if name == "chunk" and len(sizes) > 1 and len(set(sizes)) == 1:
            cuts = _cut_equal_chunks(ctx, lay[d], sizes)
        elif by is not None:
            cuts = _cut_at_attributes(ctx, lay[d], sizes, by)
        else:
            ctx.fix(lay[d], f"{name} cuts an elastic dim at sizes written as numbers")
        lay = ctx.table.resolve_layout(lay)
    elif name == "split":
        _constant_sizes(ctx, sizes)
    out = []
    for i, piece in enumerate(pieces):
        dims = list(lay)
        if name == "unbind":
            dims.pop(d)
        else:
            dims[d] = cuts[i] if cuts is not None else fixed_dim(piece.shape[d])
        out.append(TensorLayout(dims))
    return tuple(out)


def _constant_sizes(ctx: OpContext, sizes: Sequence[int]) -> None:
    """A ``split`` of a dim of fixed size at traced sizes (``split(x, [self.head_k_dim,
    self.num_v_heads // self.num_k_heads * self.head_v_dim], dim=3)`` after a fused view):
    each size that keeps its piece's size under every resize (:func:`stays_constant`) is
    checked; the others are pinned by ``check_uses``."""
    raw = ctx.arg(1, "split_size_or_sections", None)
    if not isinstance(raw, (tuple, list)) or len(raw) != len(sizes):
        return
    for entry, size in zip(raw, sizes, strict=True):
        lay = ctx.layout(entry) if isinstance(entry, torch.fx.Node) else None
        if isinstance(lay, SizeLayout) and stays_constant(ctx, entry, size):
            size_checked(ctx, lay)


def _attribute_sizes(ctx: OpContext) -> AttributeSize | list[AttributeSize | int] | None:
    """The sizes a ``split`` was given, where module attributes size its pieces: one int
    attribute (``split(self.width)``, pieces of that size), or one entry per piece, each an
    int attribute or a number (``split((self.c, self.c))``, ``split(self.sizes)`` of a tuple
    attribute); arithmetic on sizes (``self.n_groups * self.state_size``) counts as a number,
    its piece pinned (with the attributes it reads, by ``check_uses``); ``None`` otherwise."""
    raw = ctx.arg(1, "split_size_or_sections", None)
    if raw is None:
        raw = ctx.arg(1, "split_size", None)
    lay = ctx.layout(raw) if isinstance(raw, (torch.fx.Node, tuple, list)) else None
    if isinstance(lay, AttributeSize):
        return lay if len(lay) == 1 else None
    if not isinstance(lay, tuple) or isinstance(lay, (SizeLayout, TensorLayout)):
        return None
    values = ctx.val(raw)
    entries: list[AttributeSize | int] = []
    for entry, value in zip(lay, values, strict=True):
        if isinstance(entry, AttributeSize) and len(entry) == 1:
            entries.append(entry)
        elif entry is None and type(value) is int:
            entries.append(value)
        elif isinstance(entry, SizeLayout) and entry.derived and type(value) is int:
            entries.append(value)  # arithmetic on sizes: the piece is pinned, as by a number
        else:
            return None
    return entries if any(isinstance(e, AttributeSize) for e in entries) else None


def _cut_at_attributes(ctx: OpContext, dim: Dim, sizes: Sequence[int],
                       by: AttributeSize | list[AttributeSize | int]) -> list[Dim] | None:
    """``dim`` split at sizes read from module attributes: each attribute is tied to the piece
    it sizes (:func:`~fxsym.analysis.tie_size`: a member of the piece's group, which
    ``fxsym.resize`` sets to the entries kept), so the cut follows every resize. One attribute
    sizing every piece (``split(self.width)``) needs equal pieces that stay equal
    (:func:`_cut_equal_chunks`); a piece sized by a number is fixed. ``None`` (and the dim
    pinned, with the reason) where the cut falls inside a unit of a group or a piece cannot be
    tied to its attribute."""
    if isinstance(by, AttributeSize):
        if len(set(sizes)) != 1:
            ctx.fix(dim, "split at a size read from a module attribute leaves a shorter last "
                         "piece, whose size would not follow a resize")
            return None
        pieces = _cut_equal_chunks(ctx, dim, sizes) if len(sizes) > 1 else [dim]
        if pieces is None:
            return None
        entries: list[AttributeSize | int] = [by, *[-1] * (len(pieces) - 1)]
    else:
        if len(by) != len(sizes):
            return None
        try:
            pieces = cut_dim(ctx, dim, sizes)
        except Unsupported as exc:
            ctx.fix(dim, f"split at sizes read from module attributes: {exc}")
            return None
        entries = by
    for piece, entry in zip(pieces, entries, strict=True):
        piece = ctx.table.resolve(piece)
        if isinstance(entry, AttributeSize):
            if not tie_size(ctx, entry, piece):
                ctx.fix(piece, "split at a size read from a module attribute that cannot be "
                               "tied to the piece it sizes")
        elif entry != -1:
            ctx.fix(piece, "split at a size written as a number fixes this piece")
    return [ctx.table.resolve(p) for p in pieces]


def _cut_equal_chunks(ctx: OpContext, dim: Dim, sizes: Sequence[int]) -> list[Dim] | None:
    """``dim`` cut into pieces of ``sizes`` entries whose sizes stay equal under every resize;
    ``None`` (and the dim pinned) where the cut or the equal sizes cannot be proven.

    A unit a cut falls inside becomes a constant block of its own (``chunk`` after a channel
    shuffle whose units hold several channels); the pieces' free segments are then paired in
    order and keep equal numbers of units (a same-size class), and their fixed entries must
    match. Where one piece has a single free segment longer than the other's by whole units,
    its last units are made constant to balance them."""
    try:
        pieces = cut_dim(ctx, dim, sizes, pin_straddled=True)
    except Unsupported as exc:
        ctx.fix(dim, str(exc))
        return None
    if not _keep_pieces_equal(ctx, pieces):
        ctx.fix(dim, "chunk pieces with different group structure")
        return None
    pieces = [ctx.table.resolve(p) for p in pieces]
    free = [_free_segments(ctx, p) for p in pieces]
    for other in free[1:]:
        for a, b in zip(free[0], other, strict=True):
            ctx.table.tie_sizes(a.group, b.group)  # type: ignore[arg-type]
    return pieces


def _free_segments(ctx: OpContext, dim: Dim) -> list[Seg]:
    return [s for s in ctx.table.resolve(dim)
            if s.group is not None and not ctx.table.is_constant(s.group)]


def _keep_pieces_equal(ctx: OpContext, pieces: list[Dim]) -> bool:
    """Whether ``pieces`` (of equal sizes now) keep equal sizes under every resize once their
    free segments, paired in order, keep equal numbers of units; a single free segment per
    piece longer than the shortest by whole units gives up its last units (made constant)."""
    table = ctx.table
    free = [_free_segments(ctx, p) for p in pieces]
    if any(len(f) != len(free[0]) for f in free):
        return False
    if len(free[0]) == 1:
        shortest = min(f[0].length for f in free)
        for f in free:
            seg = f[0]
            root = table.find(seg.group)  # type: ignore[arg-type]
            per = seg.length // table.units[root]
            extra = seg.length - shortest
            if extra % per:
                return False
            if extra:
                n = table.units[root]
                try:
                    blocks = table.split(root, [n - extra // per, extra // per])
                except ValueError:
                    return False
                ctx.fix((Seg(blocks[1], extra // per, per),),
                        "given up to keep the halves of a chunk equal")
        free = [_free_segments(ctx, p) for p in pieces]
    for other in free[1:]:
        for a, b in zip(free[0], other, strict=True):
            ra, rb = table.find(a.group), table.find(b.group)  # type: ignore[arg-type]
            if a.length != b.length or a.length // table.units[ra] != b.length // table.units[rb]:
                return False
    return True


def cut_dim(ctx: OpContext, dim: Dim, sizes: Sequence[int], *,
            pin_straddled: bool = False) -> list[Dim]:
    """``dim`` cut into consecutive pieces of ``sizes`` entries.

    A group segment crossing a piece boundary is split there into blocks
    (:meth:`GroupTable.split <fxsym.analysis.GroupTable.split>`), so every dim that refers to
    the group sees the same blocks; fixed segments (with ``pin_straddled``, constant groups
    too) are cut locally.
    Unsupported where a boundary falls inside a unit of a group (whole heads, whole conv
    groups) or the group is tied so that it cannot be cut (its size must equal another's that
    is not cut alike). With ``pin_straddled``, a unit a boundary falls inside becomes a block
    of its own, constant, instead: the caller must then prove that the boundary stays at the
    same place inside it under every resize (equal pieces whose sizes are tied).
    """
    table = ctx.table
    if sum(sizes) != dim_size(dim):
        raise Unsupported(f"pieces {list(sizes)} do not cover a dim of {dim_size(dim)}")
    bounds = list(itertools.accumulate(sizes))[:-1]
    while True:  # a group is cut once at every boundary inside it (blocks #0, #1, ...)
        dim = table.resolve(dim)
        offset = 0
        for seg in dim:
            end = offset + seg.length
            inside = sorted({b - offset for b in bounds if offset < b < end})
            if seg.group is not None and inside and not (
                    pin_straddled and table.is_constant(seg.group)):
                break
            offset = end
        else:
            break
        assert seg.group is not None
        root = table.find(seg.group)
        per = seg.length // table.units[root]
        if any(b % per for b in inside):
            if not pin_straddled:
                raise Unsupported(f"a cut falls inside a unit of {per} entries")
            _pin_straddled_unit(ctx, root, next(b for b in inside if b % per) // per, per)
            continue
        cuts = [0, *(b // per for b in inside), table.units[root]]
        try:
            table.split(root, [hi - lo for lo, hi in itertools.pairwise(cuts)])
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
    dim = table.resolve(dim)
    pieces: list[list[Seg]] = [[] for _ in sizes]
    starts = [0, *bounds]
    offset = 0
    for seg in dim:
        end = offset + seg.length
        for i, start in enumerate(starts):
            stop = start + sizes[i]
            lo, hi = max(offset, start), min(end, stop)
            if lo >= hi:
                continue
            if seg.group is None or (hi - lo < seg.length and table.is_constant(seg.group)):
                pieces[i].append(Seg(None, hi - lo, 1))
            else:  # a cut group segment lies within one piece
                pieces[i].append(seg)
        offset = end
    return [concat_dims([tuple(p)]) for p in pieces]


def _pin_straddled_unit(ctx: OpContext, root: int, unit: int, per: int) -> None:
    """Make unit ``unit`` of group ``root`` a constant block of its own (the blocks before and
    after it stay free)."""
    table = ctx.table
    n = table.units[root]
    parts = [p for p in (unit, 1, n - unit - 1) if p]
    why = f"a cut falls inside a unit of {per} entries"
    if len(parts) < 2:
        table.fix(root, why)
        return
    try:
        blocks = table.split(root, parts)
    except ValueError as exc:
        raise Unsupported(str(exc)) from exc
    ctx.fix((Seg(blocks[1 if unit else 0], 1, per),), why)


def aligned_pieces(ctx: OpContext, pieces: list[Dim]) -> list[Dim]:
    """Equal pieces cut at every segment boundary any of them has (:func:`cut_dim`, a unit a
    boundary falls inside made constant), so they can be tied segment by segment."""
    for _ in range(8):
        pieces = [ctx.table.resolve(p) for p in pieces]
        bounds = sorted({b for p in pieces for b in itertools.accumulate(s.length for s in p)})
        if all(set(itertools.accumulate(s.length for s in p)) == set(bounds) for p in pieces):
            return pieces
        sizes = [hi - lo for lo, hi in itertools.pairwise([0, *bounds])]
        pieces = [tuple(itertools.chain.from_iterable(cut_dim(ctx, p, sizes, pin_straddled=True)))
                  for p in pieces]
    return pieces

