"""The pruned weights written, tensor by tensor (:func:`write_weights`).

Each output tensor is the input tensor with the slices the plan keeps along each dim
(:mod:`.cuts`), renamed as the kept layers are renumbered (a dropped layer's tensors are not
written), stored as the reader stores it (a fused tensor made whole, cut, and split again by
:meth:`~.reader.StoredLayout.store`: one layer's experts at a time; the parameters one stored
tensor becomes, cut, and fused again), checked against the shape of the resized meta model,
read in chunks of rows (:meth:`~.tensors.Tensors.rows`; a tensor kept whole that the
calibration pass read and checked, its file unchanged since, is the bytes of its file,
copied by the kernel: :mod:`fxsym.prune.spans`) and written straight into its shard
(safetensors files of at most ``max_shard_size`` bytes, :data:`SHARD` with a
``model.safetensors.index.json``, or one ``model.safetensors``): the shapes are known before
any tensor is read, so each file's header goes first and its tensors follow one at a time
(safetensors has no such writer; the format is a length, a JSON header, the bytes).

Imports from fxsym: errors, persist, spans (console inside a function).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ..persist import INDEX, WEIGHTS
from ..spans import Span, copy_span
from .memory import trim
from .tensors import CODES, DTYPES, Tensors

#: the name of one shard of ``n`` (beside ``INDEX``, the index; one file is ``WEIGHTS``)
SHARD = "model-{:05d}-of-{:05d}.safetensors"
DEFAULT_SHARD_BYTES = 5 * 10**9


def _shard_plan(sizes: Mapping[str, int], limit: int) -> list[list[str]]:
    """The tensors in shards of at most ``limit`` bytes (a larger tensor alone), in order."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _write_shard(path: Path, dtypes: Mapping[str, torch.dtype],
                 shapes: Mapping[str, tuple[int, ...]],
                 produce: Iterator[tuple[str, Iterator[torch.Tensor | Span]]]) -> None:
    """Write one safetensors file whose tensors (names, dtypes and shapes known in advance)
    ``produce`` yields one at a time (in the order of ``shapes``), each as chunks of rows, so
    neither the file nor a large tensor is ever held in memory whole: the header first (the
    format's: an 8-byte little-endian length, then JSON padded to 8 bytes), then each tensor's
    bytes in order (a :class:`~fxsym.spans.Span`, a whole input tensor, copied from its file
    by the kernel). A tensor that does not have its announced dtype and shape raises
    :class:`~fxsym.errors.CheckpointError`. The memory a tensor's chunks took is given back
    (:func:`.memory.trim`) after it; a span took none (the kernel copies it): no trim."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "producer": "fxsym"}}
    offset = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * torch.empty((), dtype=dtypes[name]).element_size()
        header[name] = {"dtype": CODES[dtypes[name]], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "xb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name, chunks in produce:
            want, rows, held = shapes[name], 0, False
            for t in chunks:
                if isinstance(t, Span):
                    if DTYPES.get(t.dtype) != dtypes[name] or t.shape != want:
                        raise CheckpointError(f"{name}: the plan gives it shape {t.shape}, "
                                              f"the pruned model {want}")
                    f.flush()
                    copy_span(t, f.fileno())
                    f.seek(0, os.SEEK_END)
                    rows += want[0] if want else 1
                    continue
                if t.dtype != dtypes[name] or tuple(t.shape[1:]) != want[1:] or t.dim() != len(
                        want):
                    raise CheckpointError(f"{name}: the plan gives it shape {tuple(t.shape)}, "
                                          f"the pruned model {want}")
                rows += t.shape[0] if t.dim() else 1
                held = True
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            if rows != (want[0] if want else 1):
                raise CheckpointError(f"{name}: the plan gives it {rows} rows, the pruned model "
                                      f"{want}")
            if held:
                trim()
        f.flush()
        os.fsync(f.fileno())


def _cuts_of(cuts: Mapping[tuple[str, int], torch.Tensor], key: str
              ) -> Callable[[int], torch.Tensor | None]:
    return lambda dim: cuts.get((key, dim))


class _Fused:
    """The stored tensors of one unit of fused model tensors (:meth:`Tensors.units`), pruned:
    made once (``make()``), when the first is written, and each given away as it is written,
    so one unit (a layer's experts) is in memory at a time."""

    def __init__(self, make: Callable[[], dict[str, torch.Tensor]]) -> None:
        self.make = make
        self.pieces: dict[str, torch.Tensor] | None = None

    def take(self, name: str) -> Iterator[torch.Tensor]:
        if self.pieces is None:
            self.pieces = self.make()
        yield self.pieces.pop(name)


def _pruned_unit(tensors: Tensors, unit: Sequence[str], after: Sequence[str],
                 first: Mapping[str, str], cuts: Mapping[tuple[str, int], torch.Tensor],
                 model: nn.Module) -> dict[str, torch.Tensor]:
    """The stored tensors of fused model tensors ``unit``: each read (made from its stored
    tensors), cut by the plan along every dim, named as after the plan (``after``), and split
    as the reader stores them for the pruned ``model``."""
    assert tensors.stored is not None
    made = {}
    read = tensors.read(unit)
    for old, new in zip(unit, after):
        t = read.pop(old)
        for dim in range(t.dim()):
            index = cuts.get((first.get(old, old), dim))
            if index is not None:
                t = t.index_select(dim, index)
        made[new] = t
    return tensors.stored.store(model, made)


def write_weights(tmp: Path, tensors: Tensors, names_after: Mapping[str, str | None],
                   first: Mapping[str, str], cuts: Mapping[tuple[str, int], torch.Tensor],
                   model: nn.Module, buffers: set[str], limit: int, progress: bool
                   ) -> list[str]:
    """Write the pruned tensors into ``tmp``, one tensor (one unit of fused ones) in memory at
    a time, in shards of at most ``limit`` bytes, under their names after the plan
    (``names_after``, by model name: ``None`` for a tensor of a dropped block, not written)
    as the reader stores them (a renamed or fused tensor: :meth:`StoredLayout.store` of the
    pruned meta ``model``, which gives the shapes). The stored ``buffers`` (loaded into the
    model, :func:`load_buffers`) are written as the plan resized them in ``model``. The
    file names written."""
    from ..console import track

    expected = _shapes(model)
    header = tensors.header()
    sizes: dict[str, int] = {}
    dtypes: dict[str, torch.dtype] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    produce: dict[str, Callable[[], Iterator[torch.Tensor | Span]]] = {}
    for unit in tensors.units():
        after = [names_after.get(n, n) for n in unit]
        if any(new is None for new in after):
            continue
        for name, new in zip(unit, after):
            if new not in expected:
                raise CheckpointError(f"{tensors.directory}: the weights hold {name}, which "
                                      "the model built from the config does not have")
        stored_as = (tensors.fused[unit[0]][0] if unit[0] in tensors.fused
                     else tensors.renamed.get(unit[0], unit[0]))
        dtype = header[stored_as][0]
        metas = {new: torch.empty(expected[new], dtype=dtype, device="meta")
                 for new in after if new is not None}
        outs = metas
        if tensors.stored is not None and (unit[0] in tensors.fused
                                           or unit[0] in tensors.renamed):
            outs = tensors.stored.store(model, metas)
        fused = (_Fused(partial(_pruned_unit, tensors, unit, list(metas), first, cuts, model))
                 if unit[0] in tensors.fused else None)
        cut = _cuts_of(cuts, first.get(unit[0], unit[0]))
        for out, t in outs.items():
            dtypes[out], shapes[out] = t.dtype, tuple(t.shape)
            sizes[out] = math.prod(t.shape) * t.element_size()
            produce[out] = (partial(fused.take, out) if fused is not None
                            else partial(_buffer, model, next(iter(metas)), dtype)
                            if unit[0] in buffers
                            else partial(tensors.rows, unit[0], cut))
    shards = _shard_plan(sizes, limit)
    names = [WEIGHTS] if len(shards) == 1 else [SHARD.format(k + 1, len(shards))
                                                for k in range(len(shards))]

    def pruned(members: Sequence[str]) -> Iterator[tuple[str, Iterator[torch.Tensor | Span]]]:
        for out in members:
            yield out, produce.pop(out)()

    pairs = list(zip(names, shards))
    for file, members in (track(pairs, description="writing", label=lambda fm: fm[0])
                          if progress else pairs):
        _write_shard(tmp / file, {n: dtypes[n] for n in members},
                     {n: shapes[n] for n in members}, pruned(members))
    if len(names) > 1:
        weight_map = {n: file for file, members in pairs for n in members}
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n",
                                 encoding="utf-8")
        names.append(INDEX)
    return names


def _buffer(model: nn.Module, name: str, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    yield model.get_buffer(name).to(dtype)


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter's and buffer's shape under each name holding it."""
    out = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: tuple(b.shape) for n, b in model.named_buffers(remove_duplicate=False)})
    return out


def tied_aliases(model: nn.Module, written: set[str]) -> dict[str, str]:
    """``{name: stored name}`` for every parameter name of ``model`` not written whose
    tensor is written under another of its names (a tied output head), as ``fxsym.save``
    records them for :func:`fxsym.load`."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    out: dict[str, str] = {}
    for group in names.values():
        stored = next((n for n in group if n in written), None)
        if stored is not None:
            out.update({n: stored for n in group if n not in written})
    return out
