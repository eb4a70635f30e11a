"""A checkpoint's tensors read lazily, by the model's names (:class:`Tensors`).

Each file is opened with safetensors' ``safe_open`` for one read and closed (no mapping of a
whole shard stays resident); a renamed tensor is read under its stored name, a fused one made
from its stored tensors (the reader's :class:`~fxsym.prune.checkpoint.reader.StoredLayout`).
Every tensor read is checked finite (:func:`finite`: a damaged checkpoint is refused, not
pruned; bytes read again from a file unchanged since they were checked are not checked
again), every header checked against the meta model before any tensor is read
(:meth:`Tensors.check`). A tensor can be read in chunks of rows of about :data:`CHUNK_BYTES`
(:meth:`Tensors.rows`, for the writer), or, kept whole, read and checked before and its file
unchanged since, given as its bytes in the file (:class:`fxsym.prune.spans.Span`), which the
writer copies through the kernel. The stored values of the model's persistent buffers are
put into the meta model (:func:`load_buffers`).

Imports from fxsym: errors, paths, spans.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...errors import CheckpointError
from ..paths import kind
from ..spans import Span, identity, offsets

if TYPE_CHECKING:
    from .reader import StoredLayout

#: the bytes of input rows read at a time while a tensor is written
CHUNK_BYTES = 2**25


class Tensors:
    """Tensors of a checkpoint read on demand with safetensors' ``safe_open`` (each file
    opened for one read and closed, so no mapping of a whole shard stays resident), by the
    model's names: a renamed tensor read under its stored name, a fused one made from its
    stored tensors (``stored``, the reader's :class:`StoredLayout`)."""

    def __init__(self, directory: Path, files: Mapping[str, str],
                 stored: StoredLayout | None = None, ignored: Sequence[str] = ()) -> None:
        self.directory = directory
        #: stored tensors the model's library ignores when it loads the directory: neither
        #: read nor written, but a file may hold them
        self.ignored = frozenset(ignored)
        self.files = {k: v for k, v in files.items() if k not in self.ignored}
        self.stored = stored
        self.renamed: dict[str, str] = dict(stored.renamed) if stored is not None else {}
        self.fused: dict[str, list[str]] = ({n: list(s) for n, s in stored.fused.items()}
                                            if stored is not None else {})
        #: the bytes of tensor data read from the files so far (as stored, before any cut or
        #: conversion): what a run costs in reads, against :meth:`stored_bytes`
        self.bytes_read = 0
        #: by file: its identity before it was read (:func:`fxsym.spans.identity`) and the
        #: tensors read from it whole and checked finite since
        self.checked: dict[str, tuple[tuple[int, ...], set[str]]] = {}
        self._spans: dict[str, dict[str, Span]] = {}

    def stored_bytes(self) -> int:
        """The bytes of tensor data the files hold (the tensors read or written; from the
        headers)."""
        return sum(math.prod(shape) * dtype.itemsize for dtype, shape in self.header().values())

    def has(self, name: str) -> bool:
        """Whether the files hold model tensor ``name``."""
        return name in self.files or name in self.renamed or name in self.fused

    def units(self) -> list[list[str]]:
        """The model tensors the files hold, in the files' order: one a unit, but the fused
        tensors made of the same stored tensors together."""
        taken = set(self.renamed.values())
        by_source: dict[str, list[str]] = {}
        for name, sources in self.fused.items():
            taken.update(sources)
            by_source.setdefault(sources[0], []).append(name)
        model_name = {s: n for n, s in self.renamed.items()}
        out: list[list[str]] = []
        for key in sorted(self.files, key=lambda n: (self.files[n], n)):
            if key in by_source:
                out.append(by_source[key])
            elif key in model_name:
                out.append([model_name[key]])
            elif key not in taken:
                out.append([key])
        return out

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        fused = [n for n in names if n in self.fused]
        plain = [n for n in names if n not in self.fused]
        got = self._read([self.renamed.get(n, n) for n in plain])
        out = {n: got.pop(self.renamed.get(n, n)) for n in plain}
        by_sources: dict[tuple[str, ...], list[str]] = {}
        for name in fused:  # the model tensors made of the same stored ones: read once
            by_sources.setdefault(tuple(self.fused[name]), []).append(name)
        for sources, made in by_sources.items():
            assert self.stored is not None
            held = self._read(sources)
            for name in made:
                out[name] = self.stored.load(name, held)
        return out

    def _read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        for name in names:
            f = self.files.get(name)
            if f is None:
                raise CheckpointError(f"{self.directory}: no weight file holds {name}")
            by_file.setdefault(f, []).append(name)
        out: dict[str, torch.Tensor] = {}
        for f, group in by_file.items():
            try:
                before = identity(self.directory / f)
                with safe_open(str(self.directory / f), framework="pt") as handle:
                    for name in group:
                        t = handle.get_tensor(name)
                        self.bytes_read += t.numel() * t.element_size()
                        out[name] = finite(t, self.directory / f, name)
            except CheckpointError:
                raise
            except Exception as exc:
                raise CheckpointError(f"{self.directory / f}: cannot read {group[0]}: "
                                      f"{exc}") from exc
            seen = self.checked.get(f)
            if seen is None or seen[0] != before:
                self.checked[f] = seen = (before, set())
            seen[1].update(group)
        return out

    def checked_span(self, name: str) -> Span | None:
        """Stored tensor ``name`` as the bytes of its file (:class:`fxsym.spans.Span`), if it
        was read whole and checked finite (:meth:`_read`) and its file has not changed since
        (same identity); else ``None``."""
        f = self.files.get(name)
        seen = self.checked.get(f) if f is not None else None
        if f is None or seen is None or name not in seen[1]:
            return None
        try:
            if identity(self.directory / f) != seen[0]:
                return None
            spans = self._spans.get(f)
            if spans is None:
                spans = self._spans[f] = offsets(self.directory / f)
        except (OSError, ValueError, KeyError, TypeError, CheckpointError):
            return None
        return spans.get(name)

    def one(self, name: str) -> torch.Tensor:
        return self.read([name])[name]

    def rows(self, name: str, cut: Callable[[int], torch.Tensor | None]
             ) -> Iterator[torch.Tensor | Span]:
        """Tensor ``name`` with the positions ``cut(dim)`` kept along each dim (all where it
        gives ``None``), in chunks of rows of about :data:`CHUNK_BYTES` read one at a time (a
        range of rows with ``get_slice``), so a large tensor is never in memory whole. A
        tensor kept whole that was read and checked before, its file unchanged
        (:meth:`checked_span`), is its bytes in the file instead, which the writer copies
        without reading them again; one cut is read again but not checked finite again (the
        same bytes were)."""
        from safetensors import safe_open

        name = self.renamed.get(name, name)
        path = self.directory / self.files[name]
        span = self.checked_span(name)
        if span is not None and all(cut(d) is None for d in range(len(span.shape))):
            self.bytes_read += span.size  # the kernel reads them
            yield span
            return
        checked = span is not None
        try:
            with safe_open(str(path), framework="pt") as handle:
                part = handle.get_slice(name)
                shape = tuple(part.get_shape())
                if len(shape) < 2:
                    t = handle.get_tensor(name)
                    self.bytes_read += t.numel() * t.element_size()
                    t = t if checked else finite(t, path, name)
                    index = cut(0) if t.dim() else None
                    yield t if index is None else t.index_select(0, index)
                    return
                kept = cut(0)
                positions = torch.arange(shape[0]) if kept is None else kept
                row = math.prod(shape[1:]) * DTYPES[part.get_dtype()].itemsize
                step = max(1, CHUNK_BYTES // max(row, 1))
                for j in range(0, positions.numel(), step):
                    p = positions[j:j + step]
                    lo, hi = int(p.min()), int(p.max()) + 1
                    t = part[lo:hi]
                    self.bytes_read += t.numel() * t.element_size()
                    t = t if checked else finite(t, path, name)
                    if kept is not None:
                        t = t.index_select(0, p - lo)
                    for dim in range(1, t.dim()):
                        index = cut(dim)
                        if index is not None:
                            t = t.index_select(dim, index)
                    yield t
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read {name}: {exc}") from exc

    def header(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Every tensor's dtype and shape, from the files' headers (no tensor read); each
        file must hold exactly the tensors :attr:`files` puts in it (an index naming a tensor
        its file lacks, or a file holding one the index puts elsewhere or nowhere, is refused)
        in a dtype fxsym reads."""
        from safetensors import safe_open

        out: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        by_file: dict[str, list[str]] = {}
        for name, f in self.files.items():
            by_file.setdefault(f, []).append(name)
        for f, group in by_file.items():
            path = self.directory / f
            what = kind(path)
            if what is not None:
                raise CheckpointError(f"{path}, which holds {group[0]}, is {what} (not opened)")
            try:
                with safe_open(str(path), framework="pt") as handle:
                    held = set(handle.keys())
                    for name in group:
                        if name not in held:
                            raise CheckpointError(f"{path} does not hold {name}, which the "
                                                  "index puts there")
                        s = handle.get_slice(name)
                        code = s.get_dtype()
                        if code not in DTYPES:
                            raise CheckpointError(
                                f"{path}: {name} is stored as {code}, which fxsym does not "
                                f"prune (it reads {', '.join(DTYPES)})")
                        out[name] = (DTYPES[code], tuple(s.get_shape()))
            except CheckpointError:
                raise
            except Exception as exc:
                raise CheckpointError(f"{path}: not a readable safetensors file: {exc}") from exc
            stray = sorted(n for n in held if self.files.get(n) != f and n not in self.ignored)
            if stray:
                where = self.files.get(stray[0])
                raise CheckpointError(f"{path} holds {stray[0]}, which the index puts "
                                      f"{'nowhere' if where is None else 'in ' + where}: "
                                      "which weights are meant?")
        return out

    def check(self, model: nn.Module) -> None:
        """Every stored tensor's header against ``model`` (the meta model the config builds),
        before any tensor is read: each stored tensor is a tensor of the model (through the
        :class:`StoredLayout`: a renamed one, or one of those a fused tensor is made of, whose
        stored shapes :meth:`StoredLayout.store` of the model gives) of its shape, a float
        where the model holds a float (any float dtype: the model's is the config's) and of
        the model's dtype otherwise (a buffer the model does not save: its name only); every
        parameter is stored. A
        :class:`~fxsym.errors.CheckpointError` names the first tensor that differs."""
        header = self.header()
        want: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
        want.update(model.named_buffers(remove_duplicate=False))
        # a buffer the model does not save (a causal mask some old checkpoints stored
        # in another dtype) is not read into the model: its name is checked, not its header
        loose = {n for n, _ in model.named_buffers(remove_duplicate=False)} - set(
            model.state_dict(keep_vars=True))
        for unit in self.units():
            missing = next((n for n in unit if n not in want), None)
            if missing is not None:
                raise CheckpointError(f"{self.directory}: the weights hold {missing}, which "
                                      f"the model built from the config does not have (does "
                                      f"config.json give the checkpoint's layers and sizes?)")
            if unit[0] in self.fused:
                assert self.stored is not None
                metas = {n: torch.empty(want[n].shape, dtype=want[n].dtype, device="meta")
                         for n in unit}
                stored = self.stored.store(model, metas)
            else:
                stored = {self.renamed.get(unit[0], unit[0]): want[unit[0]]}
            if unit[0] in loose:
                continue
            for name, t in stored.items():
                got = header.get(name)
                if got is None:
                    raise CheckpointError(f"{self.directory}: no weight file holds {name}, "
                                          f"which {unit[0]} is made of")
                dtype, shape = got
                if shape != tuple(t.shape):
                    raise CheckpointError(
                        f"{self.directory / self.files[name]}: {name} has shape {shape} in "
                        f"its header, the model built from the config {tuple(t.shape)} "
                        "(config.json and the weights disagree; nothing was read)")
                if (dtype.is_floating_point != t.is_floating_point()
                        or (not t.is_floating_point() and dtype != t.dtype)):
                    raise CheckpointError(
                        f"{self.directory / self.files[name]}: {name} is stored as "
                        f"{CODES[dtype]}, where the model holds {t.dtype} (weights of "
                        "another kind are never cast or pruned)")
        names: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(n)
        for group in names.values():
            if not any(self.has(n) for n in group):
                raise CheckpointError(f"{self.directory}: no weight file holds {group[0]}, "
                                      "which the model built from the config has (does "
                                      "config.json give the checkpoint's layers and sizes?)")


def finite(t: torch.Tensor, path: Path, name: str) -> torch.Tensor:
    """``t`` (read from ``path`` as ``name``), if it holds no NaN nor infinity; else
    :class:`~fxsym.errors.CheckpointError`: a damaged checkpoint gives meaningless scores
    and a pruned copy as damaged, so it is refused, not pruned with a warning.

    The sum decides first: it is finite only if every value is (a NaN makes it NaN, an
    infinity infinite or NaN), and it is one vectorised pass, where ``torch.isfinite(t)``
    writes a mask of every value (10-40x slower on a CPU, and it ran on every tensor read:
    twice per weight in a calibrated prune). Only a sum that overflowed (large finite values,
    in float16) is checked value by value."""
    if (t.is_floating_point() and not bool(torch.isfinite(t.sum()))
            and not bool(torch.isfinite(t).all())):
        bad = "NaN" if bool(torch.isnan(t).any()) else "infinite"
        raise CheckpointError(f"{path}: {name} holds {bad} values: the checkpoint is damaged "
                              "(its scores would be meaningless and the pruned copy as "
                              "damaged); refused")
    return t


DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


CODES = {v: k for k, v in DTYPES.items()}


def load_buffers(model: nn.Module, tensors: Tensors) -> set[str]:
    """Put the stored values of ``model``'s persistent buffers into it (the reader built them
    with their initial values; a router's score correction bias, read when tokens are routed,
    is stored); the names of those loaded. A plan resizes them with the model, and the writer
    writes them as resized."""
    loaded: set[str] = set()
    persistent = set(model.state_dict(keep_vars=True))
    for name, current in list(model.named_buffers(remove_duplicate=False)):
        if name not in persistent or not tensors.has(name):
            continue
        t = tensors.one(name)
        if t.shape != current.shape:
            raise CheckpointError(f"{name}: the weights hold shape {tuple(t.shape)}, the model "
                                  f"built from the config {tuple(current.shape)}")
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, t.to(current.dtype))
        loaded.add(name)
    return loaded
