"""``fxsym.prune_checkpoint``: a checkpoint directory in, a pruned checkpoint directory out,
streamed so that no step holds the whole model.

A *checkpoint directory* is what a library's ``save_pretrained`` writes: a config, the weights
as safetensors (one file, or shards and an index), tokenizer files. The core does not know any
library: a plugin's ``fxsym_checkpoint_reader`` hook gives a :class:`CheckpointReader`, which
builds the model with its parameters on the meta device (buffers real), says which file holds
each tensor, how tensors are stored where not under the model's names and layout (a
:class:`StoredLayout`: the hf plugin applies transformers' conversion mapping, which fuses a MoE
layer's per-expert tensors and splits a stored ``query_key_value`` into q, k and v) and
tokenises calibration text (the hf plugin: transformers' meta construction and the
checkpoint's own tokenizer).

The steps, none of which holds more than one decoder layer's weights:

1. **analysis** on the meta model (:func:`fxsym.analyze`), then the :class:`~fxsym.paramlayout.
   ParamLayout` of its groups;
2. **importance**, one of

   * *activation* (:func:`stream_activations`): every calibration batch runs the model's own
     ``forward``, the batches held in lock step at the model's repeated blocks (the
     ``nn.ModuleList`` holding most parameters: a decoder's layers; :mod:`fxsym.lockstep`):
     when every batch waits at block ``i``, its tensors are read with safetensors' lazy
     ``safe_open``, the batches pass it one after another while an
     :class:`~fxsym.importance.ActivationRecorder` watches its members, and its parameters
     go back to the meta device. Nothing is replayed: each block receives what the model
     gives it (per-layer masks, rotary tables, caches), so the run is the in-memory run. A
     module outside the blocks (embeddings, final norm, head) gets its tensors when it is
     first called and gives them back when the run opens its next block (every batch's
     embedding runs before the first block, every batch's head after the last: each read
     once, not once per batch). Per block, ``1 - cos`` between its input
     and output hidden states (ShortGPT's block importance) is kept too;
   * *weights* (``l1``, ``l2``): each parameter read, scored and dropped in turn, its memory
     given back before the next is read (:func:`fxsym.importance.element_scores` with a
     reader);

3. **planning** with those scores (:func:`fxsym.plan`; a number of ``layers`` kept by the
   block importance of the same run), or the architecture search for a parameter target
   (:func:`fxsym.search.search`), each uniform candidate scored by its next-token loss in the
   same lock-step run (:func:`_stream_together`, shared with the activations) of the meta
   model pruned by the candidate, each tensor read and cut as the output would hold it, all
   the candidates in one run that reads each tensor once (:func:`stream_losses`); the plan is
   applied to the meta model, whose resized config the plugins write
   (``fxsym_save_files``);
4. **writing**, tensor by tensor: each output tensor is the input tensor with the slices the
   plan keeps along each dim (the ParamLayout says which slice of which parameter belongs to which
   unit), renamed as the kept layers are renumbered (a dropped layer's tensors are not
   written), stored as the reader stores it (a fused tensor made whole, cut, and split again
   by :meth:`StoredLayout.store`: one layer's experts at a time; the parameters one stored
   tensor becomes, cut, and fused again), checked against the shape
   of the resized meta model, read in chunks of rows
   (safetensors' ``get_slice``; a tensor kept whole that the calibration pass read and
   checked, its file unchanged since, is the bytes of its file, copied by the kernel:
   :mod:`fxsym.spans`) and written straight into its
   shard (safetensors files of at most ``max_shard_size`` bytes,
   ``model-0000k-of-0000n.safetensors`` with a ``model.safetensors.index.json``, or one
   ``model.safetensors``): the shapes are known before any tensor is read, so each file's
   header goes first and its tensors follow one at a time (safetensors has no such writer;
   the format is a length, a JSON header, the bytes).

The directory is written atomically (:func:`fxsym.persist.replace_directory`): ``output``
holds what it held, or the complete pruned checkpoint, whatever fails. Beside the weights
and the plugin's config go the input's other files (tokenizer, chat template; the
generation config, which the plugin rewrites from the one it read), copied by chunks and
through links (a hub cache's snapshot links each file to a blob), but never weights the
prune did not write (``pytorch_model.bin``, ``*.gguf`` ...: they would be an unpruned copy);
``plan.extra["carried"]`` and ``plan.extra["left_out"]`` (with why) say which. Then
``fxsym.json`` with the plan. The calibration runs in the checkpoint's dtype. Peak memory is
about the largest block or module outside the blocks (an embedding, the head) plus the
calibration hidden states.

Imports from fxsym: analysis, depth, errors, importance, memo, paths, persist, phases,
planning, plugins, request, search, spans (console and lockstep inside functions).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, ParamSpec, Protocol, runtime_checkable

import torch
from torch import nn

from ..analysis import analyze
from ..analysis.options import checked_options
from ..errors import (
    CalibrationError,
    CheckpointError,
    ImportanceWarning,
    PlanError,
    PluginError,
    ResizeWarning,
)
from ..memo import one_run
from ..plugins import load_plugins
from ..plugins.calls import call_hook
from .depth import choose_blocks, renamed
from .importance import ActivationRecorder, ParamLayout, element_scores, layout
from .paths import kind, overlap, writing
from .persist import FORMAT, INDEX, MANIFEST, WEIGHTS, plugin_files, replace_directory
from .phases import phase
from .planning import Plan, plan
from .request import LENIENT, SHORTLIST, PruneRequest
from .search import batch_loss, candidates, sizes_for, target_record
from .search import search as architecture_search
from .spans import Span, copy_span, identity, offsets

__all__ = [
    "CheckpointReader",
    "StreamedScores",
    "apply_with_notes",
    "block_list",
    "kept_positions",
    "loading_note",
    "prune_checkpoint",
    "read_calibration_text",
    "stream_activations",
    "stream_loss",
    "stream_losses",
]

#: the name of one shard of ``n`` (beside ``INDEX``, the index; one file is ``WEIGHTS``)
SHARD = "model-{:05d}-of-{:05d}.safetensors"
DEFAULT_SHARD_BYTES = 5 * 10**9
#: :func:`prune_checkpoint`'s options left as they are when not given (the others: ``None``)
_UNGIVEN: dict[str, Any] = {"round_to": 1, "min_keep": 1, "exclude": ()}
#: the bytes of input rows read at a time while a tensor is written
CHUNK_BYTES = 2**25
#: the note of a plan made without the sizes the config describes, which reached no target
_UNDESCRIBED = ("no sizes the checkpoint's config can describe meet the target ({}); planned "
                "without them, so the output may be fxsym's own model type")


@runtime_checkable
class CheckpointReader(Protocol):
    """What a plugin knows about one checkpoint directory (``fxsym_checkpoint_reader``).

    Its methods raise :class:`~fxsym.errors.CheckpointError` (or its subclass
    :class:`~fxsym.errors.CalibrationError`) on bad input. A reader class that subclasses this
    protocol inherits :meth:`stored` and :meth:`ignored` answering "under the model's names"
    and "nothing"; a reader lacking a method is refused when the directory is opened."""

    directory: Path

    def build(self) -> nn.Module:
        """The model the directory describes, parameters on the meta device, buffers real,
        in eval mode; its parameters and persistent buffers named as in the weight files."""

    def tensor_files(self) -> dict[str, str]:
        """``{tensor name: file name}``: where each stored tensor is (files in
        ``directory``)."""

    def replaced_files(self) -> set[str]:
        """The input's files the output rewrites (config, weights, their index): not carried
        over."""

    def how_to_load(self, output: Path) -> str:
        """How the pruned directory ``output`` (written from this checkpoint) loads, said to
        the user: the library's own reader when the plugin's config describes the pruned
        model, else the reader that replays the plan (:func:`fxsym.load`)."""

    def calibration(self, texts: Sequence[str], *, tokens: int, seq_len: int) -> list[Any]:
        """Batches (arguments of the model, :func:`fxsym.importance.run_batch`) holding the
        first ``tokens`` tokens of ``texts`` in sequences of at most ``seq_len``, tokenised
        with the checkpoint's own tokenizer."""

    def stored(self, model: nn.Module) -> StoredLayout | None:
        """How the files store the tensors of ``model`` (:meth:`build`'s) where not under its
        names and layout, or ``None`` when they do."""
        return None

    def ignored(self, model: nn.Module, stored: Sequence[str]) -> set[str]:
        """Those of the ``stored`` tensors (by stored name) that the library ignores when it
        loads the directory into ``model`` (none by default): not model tensors, never read
        nor written, but not refused as tensors the model lacks either."""
        return set()


#: what :class:`CheckpointReader` asks of a reader
_READER_MEMBERS = ("directory", "build", "tensor_files", "replaced_files", "how_to_load",
                   "calibration", "stored", "ignored")


class StoredLayout(Protocol):
    """The tensors a checkpoint stores under other names or in another layout than the model
    holds them (the hf plugin: transformers' checkpoint conversion mapping; a MoE layer's
    experts, fused in the model, are one tensor per expert in the files; a ``query_key_value``
    of the files is q, k and v in the model).

    Names here are the model's (parameters and buffers of :meth:`CheckpointReader.build`'s
    model) or the files' (*stored* names)."""

    @property
    def renamed(self) -> Mapping[str, str]:
        """``{model tensor: stored tensor}``: stored whole under another name."""

    @property
    def fused(self) -> Mapping[str, Sequence[str]]:
        """``{model tensor: its stored tensors}``: made of several, or with others of one
        (:meth:`load`); the model tensors made together have the same stored tensors."""

    def load(self, name: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Model tensor ``name`` of :attr:`fused` made from its stored tensors (by stored
        name)."""

    def store(self, model: nn.Module, tensors: Mapping[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
        """The stored tensors (by stored name) of ``tensors`` (tensors of ``model`` by name: a
        renamed one, or every tensor made of the same stored ones), for ``model`` pruned;
        on meta tensors, the names and shapes. A layout that cannot hold them (they would not
        load back as they are) raises :class:`~fxsym.errors.CheckpointError`."""


def open_checkpoint(directory: str | os.PathLike[str]) -> CheckpointReader:
    """The reader a plugin gives for ``directory``; :class:`~fxsym.errors.CheckpointError` if
    it is not a directory, holds an entry that is neither a regular file nor a folder (a FIFO,
    a device, a socket, or a link to one: :func:`fxsym.paths.kind`, nothing opened) or no
    plugin knows its kind."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"{directory}: not a directory (give what save_pretrained wrote)")
    for entry in sorted(os.listdir(path)):
        what = kind(path / entry)
        if what is not None and not what.startswith(("a link to nothing", "missing")):
            raise CheckpointError(f"{path / entry} is {what}: a checkpoint directory holds "
                                  "regular files and folders (it was not opened)")
    reader: CheckpointReader | None = call_hook("fxsym_checkpoint_reader", load_plugins(),
                                                directory=path)
    if reader is None:
        raise CheckpointError(f"{directory}: no plugin reads this directory as a checkpoint "
                              "(a Hugging Face one holds config.json; pip install "
                              "fxsym-plugins-hf)")
    if not isinstance(reader, CheckpointReader):
        missing = sorted(set(_READER_MEMBERS) - set(dir(reader)))
        raise PluginError(f"the reader a plugin gave for {directory} "
                          f"({type(reader).__qualname__}) lacks {', '.join(missing)} of "
                          "fxsym.prune.checkpoint.CheckpointReader (subclass it for the defaults "
                          "of stored and ignored)")
    return reader


# -- calibration text ---------------------------------------------------------------------
#: the most bytes of a calibration file read (:func:`read_calibration_text`); a prune reads
#: :func:`calibration_bytes` of its tokens
MAX_CALIBRATION_BYTES = 256 * 2**20


def calibration_bytes(tokens: int) -> int:
    """The bytes of calibration text read for ``tokens`` tokens: 64 a token (a token is a few
    bytes of text as a rule), at least 4 MiB, at most :data:`MAX_CALIBRATION_BYTES`."""
    return min(MAX_CALIBRATION_BYTES, max(4 * 2**20, 64 * tokens))


def read_calibration_text(path: str | os.PathLike[str], *,
                          limit: int = MAX_CALIBRATION_BYTES) -> list[str]:
    """The texts of a calibration file: JSON lines (every non-empty line an object with a
    string ``text``; a ``.jsonl`` file must be such) or plain text (the whole file, one
    text). :class:`~fxsym.errors.CalibrationError` for a missing, empty, whitespace-only or
    non-UTF-8 file, a binary one (a NUL byte), and JSON lines without ``text``.

    At most ``limit`` bytes are read (the calibration takes the first tokens; a longer file's
    rest is never read, its last partial line or character dropped), by chunks of 1 MiB, each
    checked as it comes: a binary or NUL-filled file (a 1 GB sparse one) is refused at its
    first chunk, never held whole."""
    import codecs

    p = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    parts: list[str] = []
    size = 0
    try:
        with open(p, "rb") as f:
            while size < limit:
                chunk = f.read(min(2**20, limit - size))
                if not chunk:
                    break
                if b"\0" in chunk:
                    at = size + chunk.index(b"\0")
                    raise CalibrationError(f"calibration file {path} holds a NUL byte (at byte "
                                           f"{at}): a binary file, not text")
                try:
                    parts.append(decoder.decode(chunk))
                except UnicodeDecodeError as exc:
                    raise CalibrationError(f"calibration file {path} is not UTF-8 text "
                                           f"({exc.reason} at byte {size + exc.start})") from exc
                size += len(chunk)
            cut = size >= limit and bool(f.read(1))
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration file {path}: {exc}") from exc
    if not cut:
        try:
            parts.append(decoder.decode(b"", final=True))
        except UnicodeDecodeError as exc:
            raise CalibrationError(f"calibration file {path} is not UTF-8 text ({exc.reason} "
                                   "at its end)") from exc
    text = "".join(parts)
    if cut and "\n" in text:
        text = text[:text.rindex("\n") + 1]  # the last line, cut by the limit, dropped
    if not text.strip():
        raise CalibrationError(f"calibration file {path} "
                               + ("is empty (only whitespace)" if text else "is empty"))
    lines = [line for line in text.splitlines() if line.strip()]
    looks_json = p.suffix.lower() in (".jsonl", ".ndjson") or lines[0].lstrip().startswith("{")
    if not looks_json:
        return [text]
    texts = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if p.suffix.lower() not in (".jsonl", ".ndjson"):
                return [text]  # plain text whose first line happens to start with a brace
            raise CalibrationError(f"{path}, line {number}: not JSON ({exc.msg})") from exc
        value = record.get("text") if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise CalibrationError(f"{path}, line {number}: a JSON line needs a string "
                                   "\"text\" field")
        texts.append(value)
    if not any(t.strip() for t in texts):
        raise CalibrationError(f"calibration file {path} holds no text")
    return texts


# -- reading tensors lazily ---------------------------------------------------------------
class _Tensors:
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
                        out[name] = _finite(t, self.directory / f, name)
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
        without reading them again."""
        from safetensors import safe_open

        name = self.renamed.get(name, name)
        path = self.directory / self.files[name]
        span = self.checked_span(name)
        if span is not None and all(cut(d) is None for d in range(len(span.shape))):
            self.bytes_read += span.size  # the kernel reads them
            yield span
            return
        try:
            with safe_open(str(path), framework="pt") as handle:
                part = handle.get_slice(name)
                shape = tuple(part.get_shape())
                if len(shape) < 2:
                    t = handle.get_tensor(name)
                    self.bytes_read += t.numel() * t.element_size()
                    t = _finite(t, path, name)
                    index = cut(0) if t.dim() else None
                    yield t if index is None else t.index_select(0, index)
                    return
                kept = cut(0)
                positions = torch.arange(shape[0]) if kept is None else kept
                row = math.prod(shape[1:]) * _DTYPES[part.get_dtype()].itemsize
                step = max(1, CHUNK_BYTES // max(row, 1))
                for j in range(0, positions.numel(), step):
                    p = positions[j:j + step]
                    lo, hi = int(p.min()), int(p.max()) + 1
                    t = part[lo:hi]
                    self.bytes_read += t.numel() * t.element_size()
                    t = _finite(t, path, name)
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
                        if code not in _DTYPES:
                            raise CheckpointError(
                                f"{path}: {name} is stored as {code}, which fxsym does not "
                                f"prune (it reads {', '.join(_DTYPES)})")
                        out[name] = (_DTYPES[code], tuple(s.get_shape()))
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
        # a buffer the model does not save (GPT-2's causal mask, stored by old checkpoints
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
                        f"{_CODES[dtype]}, where the model holds {t.dtype} (weights of "
                        "another kind are never cast or pruned)")
        names: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(n)
        for group in names.values():
            if not any(self.has(n) for n in group):
                raise CheckpointError(f"{self.directory}: no weight file holds {group[0]}, "
                                      "which the model built from the config has (does "
                                      "config.json give the checkpoint's layers and sizes?)")


def _finite(t: torch.Tensor, path: Path, name: str) -> torch.Tensor:
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


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


# -- loading pieces of the meta model -----------------------------------------------------
def block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` of ``model`` holding the most parameters (a decoder's layers),
    with its qualified name; ``None`` if no list holds any."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod):
            count = sum(p.numel() for p in mod.parameters())
            if count and (best is None or count > best[0]):
                best = (count, name, mod)
    return None if best is None else (best[1], best[2])


class _Unread(nn.Parameter):
    """Stands, during a streamed run, for a parameter whose tensor is not in memory: it has the
    parameter's shape and dtype on the CPU (one number, expanded), so code reading its device,
    dtype or shape sees what the loaded model shows (transformers' Llama 4 moves the token ids
    to its embedding's device before calling it), and any other use raises
    :class:`~fxsym.errors.CheckpointError` naming it. A value read outside the call of a module
    holding it is not streamed, and never guessed: a meta tensor there gave uninitialised
    memory (torch's embedding of meta indices returns a CPU tensor of garbage)."""

    #: what may be read of it: metadata only
    METADATA = frozenset({"device", "dtype", "shape", "is_meta", "requires_grad", "ndim",
                          "layout", "is_cuda", "is_sparse", "is_quantized", "is_nested", "size",
                          "dim", "numel", "is_floating_point", "is_complex", "element_size",
                          "get_device", "grad_fn", "grad", "is_leaf", "names"})
    fxsym_name: str

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        what = (getattr(getattr(func, "__self__", None), "__name__", None)
                if getattr(func, "__name__", None) == "__get__"
                else getattr(func, "__name__", None))
        if what in cls.METADATA:
            return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]
        name = next((a.fxsym_name for a in args if isinstance(a, _Unread)), "a parameter")
        raise CheckpointError(f"{name} was used ({what}) while no module holding it was "
                              "running: the model's code reads it outside the modules' "
                              "calls, so it cannot be streamed a block at a time")


class _Loader:
    """Puts checkpoint tensors into the meta model's parameters and takes them out again.

    A parameter is known by its first qualified name; loading it gives the tensor (in the meta
    parameter's dtype) to every place holding it, so tied weights stay tied, and reads it
    under whichever of its names the files hold. During a run (:meth:`begin` to :meth:`end`)
    a parameter not loaded is an :class:`_Unread` in every place: releasing puts it back,
    freeing the tensor; :meth:`end` puts the model's own meta parameters back."""

    def __init__(self, model: nn.Module, tensors: _Source) -> None:
        self.tensors = tensors
        self.places: dict[str, list[tuple[nn.Module, str, str]]] = {}
        self.first: dict[tuple[int, str], str] = {}
        self.meta: dict[str, nn.Parameter] = {}
        self.unread: dict[str, _Unread] = {}
        self.loaded: set[str] = set()
        #: the parameters of modules outside the blocks kept after their call, until
        #: :meth:`drop_held` (:meth:`on_call`)
        self.held: set[str] = set()
        by_id: dict[int, str] = {}
        for qual, mod in model.named_modules(remove_duplicate=False):
            for attr, p in mod.named_parameters(recurse=False, remove_duplicate=False):
                name = f"{qual}.{attr}" if qual else attr
                first = by_id.setdefault(id(p), name)
                self.places.setdefault(first, []).append((mod, attr, name))
                self.first[(id(mod), attr)] = first
                self.meta[first] = p

    def names(self, module: nn.Module, *, recurse: bool = True) -> list[str]:
        """The first names of ``module``'s parameters (its own only, without ``recurse``)."""
        mods = module.modules() if recurse else [module]
        return list(dict.fromkeys(self.first[(id(m), attr)] for m in mods
                                  for attr, _ in m.named_parameters(recurse=False)))

    def _put(self, first: str, p: nn.Parameter) -> None:
        for mod, attr, _ in self.places[first]:
            setattr(mod, attr, p)

    def begin(self) -> None:
        """Every parameter an :class:`_Unread` until loaded."""
        for first, meta in self.meta.items():
            if first not in self.unread:
                placeholder = _Unread(torch.zeros((), dtype=meta.dtype).expand(meta.shape),
                                      requires_grad=False)
                placeholder.fxsym_name = first
                self.unread[first] = placeholder
            self._put(first, self.unread[first])

    def end(self) -> None:
        """The model's own meta parameters back in every place; every tensor freed."""
        for first, meta in self.meta.items():
            self._put(first, meta)
        self.held.clear()
        if self.loaded:
            self.loaded.clear()
            _trim()

    def load(self, names: Sequence[str]) -> None:
        wanted: list[tuple[str, str]] = []
        for first in names:
            if first in self.loaded:
                continue
            places = self.places[first]
            stored = next((n for _, _, n in places if self.tensors.has(n)), None)
            if stored is None:
                raise CheckpointError(f"{self.tensors.directory}: no weight file holds {first}")
            wanted.append((first, stored))
        got = self.tensors.read([stored for _, stored in wanted])
        for first, stored in wanted:
            meta = self.meta[first]
            t = got.pop(stored)
            if t.shape != meta.shape:
                raise CheckpointError(f"{stored}: the weights hold shape {tuple(t.shape)}, the "
                                      f"model built from the config {tuple(meta.shape)}")
            self._put(first, nn.Parameter(t.to(meta.dtype), requires_grad=False))
            self.loaded.add(first)

    def release(self, names: Sequence[str]) -> None:
        freed = [first for first in names if first in self.loaded]
        for first in freed:
            self._put(first, self.unread[first])
            self.loaded.discard(first)
        if freed:
            _trim()

    def on_call(self, modules: Sequence[nn.Module]) -> list[Any]:
        """Hooks loading each module's own parameters when it is called and keeping them
        when it returns, until :meth:`drop_held` (the modules outside the blocks: the
        streamed run drops them when it opens its next block, so the batches that call one
        in turn, such as every batch's embedding before the first block and head after the
        last, read its tensors once, and no more is in memory at once than the block the
        batches have just passed beside it); remove the handles returned when done."""
        handles = []
        for mod in modules:
            own = self.names(mod, recurse=False)
            if own:
                handles.append(mod.register_forward_pre_hook(
                    lambda m, args, own=own: self.load(own)))
                handles.append(mod.register_forward_hook(
                    lambda m, args, out, own=own: self.held.update(own)))
        return handles

    def drop_held(self) -> None:
        """Release the parameters :meth:`on_call` kept."""
        if self.held:
            held, self.held = list(self.held), set()
            self.release(held)


def _trim() -> None:
    """Give the memory just freed back to the system where the C library keeps it (glibc's
    ``malloc_trim``: the tensors of a layer, freed, would otherwise stay resident)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


# -- streamed activation importance -------------------------------------------------------
@dataclass
class StreamedScores:
    """What a streamed calibration run gives: per group, one score per unit; per block of
    the block list (:func:`block_list`), ``1 - cos`` of its input and output hidden states
    averaged over the tokens (ShortGPT's block importance: low is a block that changes little);
    what the plugins' usage recorders record beside their scores (``usage``: ``{name: {group:
    one number per unit}}``, :meth:`fxsym.importance.ActivationRecorder.records`; the hf
    plugin's ``expert_load`` and ``expert_activation``, each expert's router load and Minitron
    activation).
    """

    scores: dict[str, torch.Tensor]
    block_importance: list[float] = field(default_factory=list)
    blocks: str = ""
    usage: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> dict[str, list[float]]:
        """The old fields ``expert_load`` and ``expert_activation``: ``usage[name]``, with a
        ``DeprecationWarning``."""
        if name in ("expert_load", "expert_activation"):
            warnings.warn(f"StreamedScores.{name} is deprecated: read "
                          f"StreamedScores.usage[{name!r}]", DeprecationWarning, stacklevel=2)
            usage: dict[str, dict[str, list[float]]] = vars(self).get("usage", {})
            return usage.get(name, {})
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _hidden(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """A block's carried hidden states: its first positional argument, else its first
    floating-point tensor keyword argument."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise CheckpointError("cannot tell which argument of a block carries the hidden states "
                          "(no tensor argument)")


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise CheckpointError(f"a block returned a {type(out).__name__}, not hidden states")


def _under(prefix: str) -> Callable[[str], bool]:
    return lambda qualname: qualname.startswith(prefix)


class _Watch:
    """What a streamed run (:func:`_stream`) does besides running the model: the hooks
    attached while block ``i`` is loaded and for the whole run (handles, removed after), each
    block's input and output hidden states, the model's output for each batch (told as the
    batch ends and dropped: a run of many batches, or of many candidates, never holds all
    their logits)."""

    def block(self, i: int) -> list[Any]:
        return []

    def pair(self, i: int, h: torch.Tensor, o: torch.Tensor) -> None:
        pass

    def rest(self) -> list[Any]:
        return []

    def output(self, batch: Any, out: Any) -> None:
        pass


class _Source(Protocol):
    """Where :class:`_Loader` reads tensors by the model's names (:class:`_Tensors`,
    :class:`_Pruned`)."""

    directory: Path

    def has(self, name: str) -> bool: ...

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]: ...


def _stream(model: nn.Module, loader: _Loader, batches: Sequence[Any], watch: _Watch, *,
            progress: bool = False, description: str = "calibration") -> None:
    """Run ``model`` (parameters on the meta device, read by ``loader`` when needed) on
    ``batches``, every batch through the model's own ``forward``, held in lock step at the
    blocks of its block list (:func:`fxsym.lockstep.run_in_lockstep`): a block's tensors are
    read once, when the batches reach it, and given back when they have all passed it; a
    module outside the blocks gets its tensors when it is called and gives them back when the
    next block is opened (:meth:`_Loader.on_call`). ``watch`` is told; ``model``'s
    parameters are on the meta device again when this returns."""
    _stream_together([_Trial(model, loader, watch)], batches, progress=progress,
                     description=description)


@dataclass
class _Trial:
    """A meta model streamed on the calibration batches (:func:`_stream_together`): where its
    tensors come from, what watches it, and for each of its blocks the block of the checkpoint
    it is read from (``None``: its own positions)."""

    model: nn.Module
    loader: _Loader
    watch: _Watch
    sources: Sequence[int] | None = None


def _stream_together(trials: Sequence[_Trial], batches: Sequence[Any], *,
                     reached: Callable[[int], None] = lambda source: None,
                     progress: bool = False, description: str = "calibration") -> None:
    """:func:`_stream` of several models at once: every batch through every model, in one lock
    step whose gates are all the models' blocks, opened in the order of the checkpoint's
    blocks they are read from (``reached(i)`` before each gate of checkpoint block ``i``): a
    source shared by the loaders reads each block once for all the models."""
    import contextlib

    from .console import steps
    from .importance import run_batch
    from .lockstep import run_in_lockstep

    gates: list[nn.Module] = []
    owners: list[tuple[_Trial, int]] = []
    labels: list[str] = []
    order: list[int] = []
    handles: list[Any] = []
    for t, trial in enumerate(trials):
        found = block_list(trial.model)
        if found is None:
            raise CheckpointError("the model holds no list of blocks to stream through")
        prefix, blocks = found
        sources = list(range(len(blocks))) if trial.sources is None else trial.sources
        gates += blocks
        owners += [(trial, i) for i in range(len(blocks))]
        which = f", candidate {t + 1} of {len(trials)}" if len(trials) > 1 else ""
        labels += [f"{prefix}.{k}{which}" for k in sources]
        order += sources
        block_ids = {id(m) for b in blocks for m in b.modules()}
        handles += trial.loader.on_call([m for m in trial.model.modules()
                                         if id(m) not in block_ids])
    jobs = [(trial, batch) for trial in trials for batch in batches]
    attached: list[Any] = []

    def enter(g: int) -> None:
        trial, i = owners[g]
        for t in trials:
            t.loader.drop_held()
        reached(order[g])
        step(labels[g])
        trial.loader.load(trial.loader.names(gates[g]))
        attached.extend(trial.watch.block(i))

    def leave(g: int) -> None:
        while attached:
            attached.pop().remove()
        trial = owners[g][0]
        trial.loader.release(trial.loader.names(gates[g]))

    def passed(g: int, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        trial, i = owners[g]
        trial.watch.pair(i, _hidden(args, kwargs), _first(out))

    def run(job: tuple[_Trial, Any]) -> None:  # the output told and dropped at once
        trial, batch = job
        trial.watch.output(batch, run_batch(trial.model, batch))

    try:
        for trial in trials:
            trial.model.eval()
            trial.loader.begin()
            handles += trial.watch.rest()
        with (steps(len(gates), description=description) if progress
              else contextlib.nullcontext(lambda label: None)) as step:
            run_in_lockstep(run, jobs, gates, enter=enter, leave=leave, on_pass=passed,
                            order=order)
    finally:
        for h in handles:
            h.remove()
        for trial in trials:
            trial.loader.end()


class _Activations(_Watch):
    """Minitron's activation importance of the members inside each block while it runs and
    outside the blocks in the last run; ShortGPT's ``1 - cos`` per block."""

    def __init__(self, recorder: ActivationRecorder, prefix: str, n: int) -> None:
        self.recorder, self.prefix = recorder, prefix
        self.inside = [f"{prefix}.{i}." for i in range(n)]
        self.cos = [0.0] * n
        self.count = [0] * n

    def block(self, i: int) -> list[Any]:
        return self.recorder.attach(_under(self.inside[i]))

    def pair(self, i: int, h: torch.Tensor, o: torch.Tensor) -> None:
        sim = nn.functional.cosine_similarity(h.flatten(0, -2).double(),
                                              o.flatten(0, -2).double(), dim=-1)
        self.cos[i] += float(sim.sum())
        self.count[i] += sim.numel()

    def rest(self) -> list[Any]:
        return self.recorder.attach(lambda q: not any(q.startswith(p) for p in self.inside)
                                    and q != self.prefix)

    def importance(self) -> list[float]:
        return [1 - c / max(n, 1) for c, n in zip(self.cos, self.count)]


def stream_activations(model: nn.Module, symmap: Any, tensors: _Tensors, batches: Sequence[Any],
                       *, consumers_only: bool = True, progress: bool = False
                       ) -> StreamedScores:
    """Activation importance of the groups of ``symmap`` (the meta ``model``'s analysis) on
    ``batches``, computed block by block (see the module docstring). ``model``'s parameters
    are on the meta device again when this returns."""
    found = block_list(model)
    if found is None:
        raise CheckpointError("the model holds no list of blocks to stream through")
    recorder = ActivationRecorder(model, symmap, consumers_only=consumers_only)
    watch = _Activations(recorder, found[0], len(found[1]))
    _stream(model, _Loader(model, tensors), batches, watch, progress=progress)
    return StreamedScores(recorder.scores(), watch.importance(), found[0], recorder.records())


class _Loss(_Watch):
    """The mean loss of the model's outputs a plugin gives (:func:`fxsym.search.batch_loss`)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def output(self, batch: Any, out: Any) -> None:
        value = batch_loss(out, batch)
        if value is None:
            raise CheckpointError("the search scores a candidate by the loss a plugin gives "
                                  "for the model's output on the calibration batches "
                                  "(fxsym_batch_loss), and no plugin gives one for this model")
        self.values.append(value)


class _Pruned:
    """The checkpoint's tensors as a plan makes them, by their names in the pruned model: the
    input tensor (``before``: its name in the unpruned model) with the positions the plan
    keeps along each dim (``cuts``, by the ParamLayout's first names ``first``)."""

    def __init__(self, tensors: _Source, before: Mapping[str, str], first: Mapping[str, str],
                 cuts: Mapping[tuple[str, int], torch.Tensor]) -> None:
        self.tensors, self.before, self.first, self.cuts = tensors, before, first, cuts
        self.directory = tensors.directory

    def has(self, name: str) -> bool:
        return name in self.before

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        got = self.tensors.read([self.before[n] for n in names])
        out = {}
        for n in names:
            old = self.before[n]
            t = got.pop(old)
            for dim in range(t.dim()):
                index = self.cuts.get((self.first.get(old, old), dim))
                if index is not None:
                    t = t.index_select(dim, index)
            out[n] = t
        return out


def stream_loss(model: nn.Module, symmap: Any, tensors: _Tensors, lay: ParamLayout, chosen: Plan,
                batches: Sequence[Any], *, progress: bool = False) -> float:
    """The mean next-token loss on ``batches`` of the meta ``model`` pruned by ``chosen``
    (applied to a copy), run block by block on the pruned tensors: the checkpoint's, cut as
    the written checkpoint would be (``lay``: ``model``'s ParamLayout), one block's in memory at a
    time. ``model`` is not changed."""
    return stream_losses(model, symmap, tensors, lay, [chosen], batches, progress=progress)[0]


def stream_losses(model: nn.Module, symmap: Any, tensors: _Tensors, lay: ParamLayout,
                  plans: Sequence[Plan], batches: Sequence[Any], *, progress: bool = False
                  ) -> list[float]:
    """:func:`stream_loss` of each of ``plans``, all in one streamed run that reads each
    tensor of the checkpoint once: the pruned copies run in one lock step
    (:func:`_stream_together`) whose gates open in the order of the checkpoint's blocks, each
    block read when the first copy keeping it reaches it and freed when the run moves to the
    next, every copy's tensors cut from it (a block a copy drops is never read for it). The
    tensors of the modules outside the blocks are kept for the whole run: in memory at once,
    one block and those (the embedding, the head), plus each copy's hidden states."""
    import copy

    first = _first_names(model)
    depth_groups = symmap.depth_groups()
    found = block_list(model)
    if found is None:
        raise CheckpointError("the model holds no list of blocks to stream through")
    prefix = found[0]
    kept = _Kept(tensors, f"{prefix}.")
    trials, watches = [], []
    for chosen in plans:
        blocks = {d.name: list(d.keep) for d in chosen.depth}
        before: dict[str, str] = {}
        for unit in tensors.units():
            for n in unit:
                new = renamed(n, depth_groups, blocks)
                if new is not None:
                    before[new] = n
        trial, trial_map = copy.deepcopy((model, symmap))
        chosen.apply(trial, trial_map)
        watch = _Loss()
        cuts = kept_positions(lay, chosen.choices())
        sources = next((keep for d, keep in blocks.items()
                        if symmap.depth_group(d).container == prefix), None)
        trials.append(_Trial(trial, _Loader(trial, _Pruned(kept, before, first, cuts)), watch,
                             sources))
        watches.append(watch)
    try:
        _stream_together(trials, batches, reached=kept.reached, progress=progress,
                         description="scoring")
    finally:
        kept.clear()
    return [sum(w.values) / len(w.values) for w in watches]


class _Kept:
    """The checkpoint's tensors, each read once for several pruned copies
    (:func:`stream_losses`): a block's (named under ``prefix``) kept until the run reaches
    the next block (:meth:`reached`), the others until :meth:`clear`."""

    def __init__(self, tensors: _Tensors, prefix: str) -> None:
        self.tensors, self.prefix = tensors, prefix
        self.directory = tensors.directory
        self.held: dict[str, torch.Tensor] = {}
        self.block = f"{prefix}-1."

    def has(self, name: str) -> bool:
        return self.tensors.has(name)

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        missing = [n for n in names if n not in self.held]
        if missing:
            self.held.update(self.tensors.read(missing))
        return {n: self.held[n] for n in names}

    def reached(self, block: int) -> None:
        """The run is at checkpoint block ``block``: the tensors of the one before go."""
        if self.block == f"{self.prefix}{block}.":
            return
        gone = [n for n in self.held if n.startswith(self.block)]
        for n in gone:
            del self.held[n]
        self.block = f"{self.prefix}{block}."
        if gone:
            _trim()

    def clear(self) -> None:
        self.held.clear()
        _trim()


def _weight_scores(model: nn.Module, symmap: Any, tensors: _Tensors, name: str, lay: ParamLayout,
                   *, progress: bool = False) -> dict[str, torch.Tensor]:
    """``l1`` / ``l2`` of the checkpoint's weights, one parameter in memory at a time (a step
    of the progress bar each: the parameters the groups slice, ``lay``). The memory a
    parameter's scores took is given back (:func:`_trim`) before the next is read: the C
    library kept it otherwise, and the peak grew with every layer scored (a Mixtral-shaped
    checkpoint: 97 MiB more at 10 layers than at 3; 5 MiB with the trim)."""
    import contextlib

    from .console import steps

    read = len({s.param for g in symmap.groups() if g.size >= 2
                for s in lay.slices.get(g.name, ())})
    with (steps(read, description=f"scoring the weights ({name})") if progress
          else contextlib.nullcontext(lambda label: None)) as step:
        def one(n: str) -> torch.Tensor:
            step(n)
            _trim()
            return tensors.one(n)

        if name == "l1":
            return element_scores(model, symmap, lambda n, p: p.double().abs(), tensors=one)
        return element_scores(model, symmap, lambda n, p: p.double().square(), torch.sqrt,
                              tensors=one)


# -- writing ------------------------------------------------------------------------------
def kept_positions(lay: ParamLayout, choices: Mapping[str, Sequence[int]]
                   ) -> dict[tuple[str, int], torch.Tensor]:
    """For every ``(parameter, dim)`` a choice cuts, the positions kept along it, in order:
    a slice stays when every group it belongs to keeps its unit (the same rule as
    :meth:`~fxsym.paramlayout.ParamLayout.shapes_after`)."""
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for group, keep in choices.items():
        kept = torch.as_tensor(list(keep), dtype=torch.long)
        for s in lay.slices.get(group, ()):
            key = (s.param, s.dim)
            mask = masks.get(key)
            if mask is None:
                mask = masks[key] = torch.ones(lay.shapes[s.param][s.dim], dtype=torch.bool)
            mask[s.index[~torch.isin(s.unit, kept)]] = False
    return {key: mask.nonzero().flatten() for key, mask in masks.items()}


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


_CODES = {v: k for k, v in _DTYPES.items()}


def _write_shard(path: Path, dtypes: Mapping[str, torch.dtype],
                 shapes: Mapping[str, tuple[int, ...]],
                 produce: Iterator[tuple[str, Iterator[torch.Tensor | Span]]]) -> None:
    """Write one safetensors file whose tensors (names, dtypes and shapes known in advance)
    ``produce`` yields one at a time (in the order of ``shapes``), each as chunks of rows, so
    neither the file nor a large tensor is ever held in memory whole: the header first (the
    format's: an 8-byte little-endian length, then JSON padded to 8 bytes), then each tensor's
    bytes in order (a :class:`~fxsym.spans.Span`, a whole input tensor, copied from its file
    by the kernel). A tensor that does not have its announced dtype and shape raises
    :class:`~fxsym.errors.CheckpointError`."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "producer": "fxsym"}}
    offset = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * torch.empty((), dtype=dtypes[name]).element_size()
        header[name] = {"dtype": _CODES[dtypes[name]], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "xb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name, chunks in produce:
            want, rows = shapes[name], 0
            for t in chunks:
                if isinstance(t, Span):
                    if _DTYPES.get(t.dtype) != dtypes[name] or t.shape != want:
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
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            if rows != (want[0] if want else 1):
                raise CheckpointError(f"{name}: the plan gives it {rows} rows, the pruned model "
                                      f"{want}")
            _trim()
        f.flush()
        os.fsync(f.fileno())


def _cuts_of(cuts: Mapping[tuple[str, int], torch.Tensor], key: str
              ) -> Callable[[int], torch.Tensor | None]:
    return lambda dim: cuts.get((key, dim))


class _Fused:
    """The stored tensors of one unit of fused model tensors (:meth:`_Tensors.units`), pruned:
    made once (``make()``), when the first is written, and each given away as it is written,
    so one unit (a layer's experts) is in memory at a time."""

    def __init__(self, make: Callable[[], dict[str, torch.Tensor]]) -> None:
        self.make = make
        self.pieces: dict[str, torch.Tensor] | None = None

    def take(self, name: str) -> Iterator[torch.Tensor]:
        if self.pieces is None:
            self.pieces = self.make()
        yield self.pieces.pop(name)


def _pruned_unit(tensors: _Tensors, unit: Sequence[str], after: Sequence[str],
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


def _write_weights(tmp: Path, tensors: _Tensors, names_after: Mapping[str, str | None],
                   first: Mapping[str, str], cuts: Mapping[tuple[str, int], torch.Tensor],
                   model: nn.Module, buffers: set[str], limit: int, progress: bool
                   ) -> list[str]:
    """Write the pruned tensors into ``tmp``, one tensor (one unit of fused ones) in memory at
    a time, in shards of at most ``limit`` bytes, under their names after the plan
    (``names_after``, by model name: ``None`` for a tensor of a dropped block, not written)
    as the reader stores them (a renamed or fused tensor: :meth:`StoredLayout.store` of the
    pruned meta ``model``, which gives the shapes). The stored ``buffers`` (loaded into the
    model, :func:`_load_buffers`) are written as the plan resized them in ``model``. The
    file names written."""
    from .console import track

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


def _load_buffers(model: nn.Module, tensors: _Tensors) -> set[str]:
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


def _buffer(model: nn.Module, name: str, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    yield model.get_buffer(name).to(dtype)


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter's and buffer's shape under each name holding it."""
    out = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: tuple(b.shape) for n, b in model.named_buffers(remove_duplicate=False)})
    return out


def _aliases(model: nn.Module, written: set[str]) -> dict[str, str]:
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


def _first_names(model: nn.Module) -> dict[str, str]:
    """Every parameter name, mapped to the first name of its parameter (the ParamLayout's)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out[n] = first.setdefault(id(p), n)
    return out


# -- the whole thing ----------------------------------------------------------------------
def check_output(directory: str | os.PathLike[str], output: str | os.PathLike[str]) -> None:
    """:class:`~fxsym.errors.CheckpointError` unless ``output`` may be written with the
    checkpoint ``directory`` as input: it must not be that directory, be inside it, hold it, or
    hold a file it links to (real paths compared, :func:`fxsym.paths.overlap`: the output is
    replaced whole), nor be a symbolic link or an existing file."""
    why = overlap(directory, output)
    if why is not None:
        raise CheckpointError(f"{why}: the output is replaced whole, so it would destroy the "
                              "checkpoint it is pruned from; give a directory outside it")
    out = Path(output)
    if out.is_symlink():
        raise CheckpointError(f"{output} is a symbolic link; give the directory itself")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{output} exists and is not a directory; give a directory")


_P = ParamSpec("_P")


def _guarding_output(prune: Callable[_P, Plan]) -> Callable[_P, Plan]:
    """``prune`` (:func:`prune_checkpoint`) run after :func:`check_output`, holding the lock
    of its output (:func:`fxsym.paths.writing`) from the first step, so a second prune of the
    same output is refused before it works, not at its end."""
    import functools
    import inspect

    signature = inspect.signature(prune)

    @functools.wraps(prune)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> Plan:
        bound = signature.bind(*args, **kwargs)
        directory, output = bound.arguments["directory"], bound.arguments["output"]
        check_output(directory, output)
        with writing(output, error=CheckpointError):
            return prune(*args, **kwargs)

    return run


@_guarding_output
@one_run  # the plugins' probes asked again in the run answered once (fxsym.memo)
def prune_checkpoint(
    directory: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    calibration: str | os.PathLike[str] | Sequence[str] | None = None,
    calibration_tokens: int | None = None,
    seq_len: int | None = None,
    importance: str | None = None,
    ratio: float | None = None,
    target_params: int | None = None,
    param_ratio: float | None = None,
    target_active_params: int | None = None,
    search: bool | None = None,
    layers: int | Sequence[int] | None = None,
    sizes: Mapping[str, int] | None = None,
    scope: str | None = None,
    round_to: int = 1,
    min_keep: int = 1,
    exclude: Sequence[str] = (),
    describable: bool | None = None,
    max_shard_size: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
    status: Callable[[str], Any] | None = None,
    routing_groups: str | None = None,
    target_non_embedding_params: int | None = None,
    request: PruneRequest | None = None,
    shortlist: int | Literal["all"] | None = SHORTLIST,
) -> Plan:
    """Prune the checkpoint in ``directory`` into ``output`` (see the module docstring);
    return the plan.

    ``calibration`` is a text file (:func:`read_calibration_text`) or the texts themselves;
    ``importance`` is ``"activation"`` (the default with calibration text: Minitron's, on the
    consumers' inputs), ``"l1"`` or ``"l2"`` (the default without, with an
    :class:`~fxsym.errors.ImportanceWarning` where units are ranked: weight magnitude is far
    worse on a pretrained LLM). ``param_ratio`` is the
    fraction of parameters to remove (a ``target_params`` of the rest). ``layers`` keeps that
    many decoder layers (ranked by the block importance of the calibration run: calibration
    text needed) or the layers at those positions (:func:`fxsym.plan`'s ``layers``); the
    tensors of the layers kept are renamed as the layers are renumbered. ``sizes`` gives
    architecture sizes by role instead of an amount (``{"hidden": 48, "experts": 3}``; roles
    ``hidden``, ``ffn``, ``expert_ffn``, ``shared_ffn``, ``heads``, ``kv_heads``, ``experts``:
    :func:`fxsym.search.sizes_for`),
    each group keeping its units of highest importance. A parameter target with calibration
    text (``target_params`` or ``param_ratio``; or ``target_active_params``, parameters a
    token uses: :func:`fxsym.search.active_params`) is searched unless ``search`` is
    ``False`` (:func:`fxsym.options.searches`, the command line's meaning too): the plan is
    the best of a few uniform candidate architectures meeting the target
    (:func:`fxsym.search.search`), each scored by its next-token loss on the calibration text
    computed layer by layer on its pruned tensors (:func:`stream_loss`); a number of
    ``layers`` with it fixes the candidates' depth (a width-only search); the candidates are
    recorded as ``plan.extra["search"]`` (:meth:`fxsym.search.SearchResult.rows`). Only the
    ``shortlist`` candidates the calibration pass estimates least damaged
    (:func:`fxsym.shortlist.damage`) are scored by their loss (``None`` or ``"all"``: every
    candidate; ``fxsym prune --shortlist K|all``), in
    one streamed run (:func:`stream_losses`); the rows of the others say ``scored`` false.
    ``plan.extra["read"]`` gives the bytes of tensor data read from the checkpoint
    (``bytes``: the calibration run, the search's scoring run and the writing each read what
    they use) and the bytes it holds (``checkpoint``).
    ``ratio``, ``target_params``, ``scope``, ``round_to``, ``min_keep`` and ``exclude`` are
    :func:`fxsym.plan`'s (the search gives ``exclude`` and ``min_keep`` to every candidate: an
    excluded group keeps its size in all of them). ``describable`` (default: for a uniform
    plan) keeps the sizes the checkpoint's config can describe (:func:`fxsym.plan`'s
    ``describable``: Llama's hidden size a multiple of its heads), so the output loads with
    the library's own reader; where no such sizes meet the target, the plan is made without
    and ``plan.extra["notes"]`` says so (the output is then fxsym's own model type).
    ``target_non_embedding_params`` counts every parameter but the embedding tables (tied
    or not, :mod:`fxsym.embeddings`; the count model cards quote), searched or planned as
    ``target_params`` is. ``routing_groups`` is :func:`fxsym.analyze`'s (``"keep"``:
    DeepSeek's experts drop the same positions of every routing group, ``n_group`` kept).
    ``status(message)`` (a context manager factory, e.g. a spinner) is entered around each
    step. Raises
    :class:`~fxsym.errors.CheckpointError` /
    :class:`~fxsym.errors.CalibrationError` on bad input and
    :class:`~fxsym.errors.PlanError` for a target the model cannot meet (sizes no group can
    take, more layers than it has, a parameter target no candidate reaches: found before the
    calibration runs) or an argument nothing would use (``search`` without a parameter
    target; calibration text that neither the importance, the search nor a number of
    ``layers`` reads), before ``output`` is touched. ``output`` is checked first
    (:func:`check_output`: never the input, inside it or holding it; not a file or a link)
    and locked for the whole run (:func:`fxsym.paths.writing`: a second prune into it is
    refused at once, naming the process writing it).

    The options are checked together before anything is read
    (:meth:`fxsym.request.PruneRequest.check`, the rules and messages ``fxsym prune`` uses);
    ``request`` (a :class:`~fxsym.request.PruneRequest` with ``checkpoint=True``) gives them
    all at once instead of the keyword arguments (``calibration_tokens`` 8192, ``seq_len``
    512 and ``scope`` ``"uniform"`` when left out; one given without what uses it is
    refused).
    """
    import contextlib

    told = status or (lambda message: contextlib.nullcontext())

    @contextlib.contextmanager
    def step(message: str, name: str) -> Iterator[None]:
        with told(message), phase(name):
            yield

    options: dict[str, Any] = dict(
        calibration=calibration, calibration_tokens=calibration_tokens, seq_len=seq_len,
        importance=importance, ratio=ratio, target_params=target_params,
        param_ratio=param_ratio, target_non_embedding_params=target_non_embedding_params,
        target_active_params=target_active_params, search=search,
        layers=tuple(layers) if isinstance(layers, Sequence) else layers, sizes=sizes,
        scope=scope, round_to=round_to, min_keep=min_keep, exclude=tuple(exclude),
        describable=describable, routing_groups=routing_groups,
        max_shard_size=None if max_shard_size == DEFAULT_SHARD_BYTES else max_shard_size,
        shortlist=None if shortlist == SHORTLIST else "all" if shortlist is None else shortlist)
    if request is None:
        request = PruneRequest(checkpoint=True, **options)
        checked = request.check(lenient=LENIENT)
    elif also := [k for k, v in options.items() if v != _UNGIVEN.get(k)]:
        raise PlanError(f"give the request or its options ({', '.join(also)}), not both")
    else:
        checked = request.check()
    for unused in checked.deprecated:
        warnings.warn(f"{unused} (left out for now; refused in a later version, as fxsym "
                      "prune and a PruneRequest refuse it)", DeprecationWarning, stacklevel=3)
    if not request.checkpoint:
        raise PlanError("the request is a model in memory's (checkpoint=False); a checkpoint "
                        "directory is pruned by a request with checkpoint=True")
    checked_options(routing_groups=request.routing_groups or "follow")
    calibration, importance, searching = request.calibration, checked.importance, \
        bool(checked.searching)
    calibration_tokens, seq_len, scope = checked.calibration_tokens, checked.seq_len, \
        checked.scope or "uniform"
    ratio, target_params, param_ratio = request.ratio, request.target_params, \
        request.param_ratio
    target_active_params, sizes = request.target_active_params, request.sizes
    target_non_embedding_params = request.target_non_embedding_params
    layers = list(request.layers) if isinstance(request.layers, tuple) else request.layers
    round_to, min_keep, exclude = request.round_to, request.min_keep, request.exclude
    describable, routing_groups = request.describable, request.routing_groups or "follow"
    max_shard_size = request.max_shard_size or DEFAULT_SHARD_BYTES
    shortlist = checked.shortlist
    reader = open_checkpoint(directory)
    if checked.warning:
        warnings.warn(checked.warning, ImportanceWarning, stacklevel=2)
    texts: Sequence[str] | None = None
    if calibration is not None:
        with phase("reading the calibration text"):
            texts = (read_calibration_text(calibration,
                                           limit=calibration_bytes(max(calibration_tokens, 1)))
                     if isinstance(calibration, (str, os.PathLike)) else list(calibration))
        if not texts or not any(t.strip() for t in texts):
            raise CalibrationError("the calibration text is empty")
    with step(f"building {directory} on the meta device", "building on meta"):
        model = reader.build()
        stored = reader.stored(model)
        held = reader.tensor_files()
        ignored = reader.ignored(model, list(held))
        if stored is not None:  # what the model is made of is never ignored
            ignored -= {*stored.renamed.values(), *(n for v in stored.fused.values() for n in v)}
        tensors = _Tensors(reader.directory, held, stored, sorted(ignored))
        tensors.check(model)
        buffers = _load_buffers(model, tensors)
    with phase("tokenising"):
        batches = (reader.calibration(texts, tokens=calibration_tokens, seq_len=seq_len)
                   if texts is not None and (importance == "activation" or searching
                                             or isinstance(layers, int)) else None)
    if batches is not None and not batches:
        raise CalibrationError("the calibration text gave no tokens")
    if param_ratio is not None:
        target_params = int(sum(p.numel() for p in model.parameters()) * (1 - param_ratio))
    whole = sum(p.numel() for p in model.parameters())
    if target_params is not None and target_params > whole:
        raise PlanError(f"target_params {target_params:,} is above the checkpoint's {whole:,} "
                        f"parameters: nothing to prune; give a target under {whole:,}")
    with step("analyzing", "analysing"):
        sm = analyze(model, routing_groups=routing_groups)
    with phase("roles and sizes"):
        sized = None if sizes is None else sizes_for(sm, **sizes)
    if layers is not None:
        choose_blocks(sm, layers, {g.name: torch.zeros(g.size) for g in sm.depth_groups()},
                      model=model)  # refused before any read: positions losing a needed kind
    target, counted = checked.target
    target, non_embedding = target_params if counted == "params" else target, \
        counted == "non_embedding"
    depths = None if not isinstance(layers, int) else (layers,)
    describe = describable if describable is not None else scope == "uniform"
    notes: list[str] = []
    if searching:
        assert target is not None
        meeting = partial(candidates, model, sm, target_params=target, round_to=round_to,
                          active=target_active_params is not None,
                          non_embedding=non_embedding, depths=depths, exclude=exclude,
                          min_keep=min_keep)
        try:
            meeting(describable=describe)
        except PlanError as refused:
            if not describe:
                raise
            meeting()
            describe = False
            notes.append(_UNDESCRIBED.format(refused))
    with step("mapping the groups onto the parameters", "layout"):
        lay = layout(model, sm)
    extra: dict[str, Any] = {}
    depth_scores: dict[str, torch.Tensor] | None = None
    if batches is not None:
        with phase("calibration pass"):
            streamed = stream_activations(model, sm, tensors, batches, progress=progress)
        extra = {"blocks": streamed.blocks, "block_importance": streamed.block_importance}
        extra.update(streamed.usage)
        depth_scores = {g.name: torch.tensor(streamed.block_importance, dtype=torch.float64)
                        for g in sm.depth_groups() if g.container == streamed.blocks}
    if batches is not None and importance == "activation":
        scores = streamed.scores
    else:
        with phase("weight scores"):
            scores = _weight_scores(model, sm, tensors, importance, lay, progress=progress)

    def given(m: nn.Module, s: Any) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = importance
    first = _first_names(model)
    if searching:
        assert target is not None and batches is not None
        with phase("search"):
            found = architecture_search(
                model, sm, target_params=target, active=target_active_params is not None,
                non_embedding=non_embedding, round_to=round_to, importance=given,
                block_scores=depth_scores or {},
                evaluate_all=lambda plans: stream_losses(model, sm, tensors, lay, plans,
                                                         batches, progress=progress),
                depths=depths, describable=describe, exclude=exclude, min_keep=min_keep,
                progress=progress, shortlist=shortlist)
        chosen = found.plan
        extra["search"] = found.rows()
        notes += [f"the search skipped {why}" for why in found.skipped]
    else:
        with step("planning", "planning"):
            chosen, note = _describable_plan(
                describe, model, sm, ratio=ratio, target_params=target_params,
                target_non_embedding_params=target_non_embedding_params, importance=given,
                scope=scope, round_to=round_to, min_keep=min_keep, exclude=exclude,
                layers=layers, depth_importance=depth_scores, sizes=sized)
        notes += [note] if note else []
        if target is not None:
            extra["target"] = target_record(
                target, False, chosen.extra["non_embedding"]["after"] if non_embedding
                else chosen.params_after, non_embedding=non_embedding)
    if notes:
        extra["notes"] = notes
    if extra:
        from .planning import with_extra

        chosen = with_extra(chosen, **extra)
    with phase("resizing the meta model"):
        cuts = kept_positions(lay, chosen.choices())
        depth_groups = sm.depth_groups()
        blocks = {d.name: list(d.keep) for d in chosen.depth}
        names = {n: renamed(n, depth_groups, blocks) for unit in tensors.units() for n in unit}
        chosen = apply_with_notes(chosen, model, sm)
        files = plugin_files(model, chosen)
    aliases = _aliases(model, {n for n in names.values() if n is not None})
    carried, left_out = _carried(reader, files)
    from .planning import with_extra

    chosen = with_extra(chosen, carried=carried, left_out=left_out)
    manifest = {"fxsym": FORMAT, "source": None, "aliases": aliases, "files": sorted(files),
                "history": [], "plan": chosen.to_dict()}
    with phase("putting the output in place"), replace_directory(output) as tmp:
        with phase("writing the weights"):
            _write_weights(tmp, tensors, names, first, cuts, model, buffers, max_shard_size,
                           progress)
        chosen = with_extra(chosen, read={"bytes": tensors.bytes_read,
                                          "checkpoint": tensors.stored_bytes()})
        manifest["plan"] = chosen.to_dict()
        with phase("writing the other files"):
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            for name in carried:
                _copy(reader.directory / name, tmp / name)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return chosen


def _describable_plan(describable: bool, model: nn.Module, symmap: Any, **kwargs: Any
                      ) -> tuple[Plan, str | None]:
    """:func:`fxsym.plan` keeping the sizes the model's config describes if ``describable``;
    where that plan cannot be made (no such sizes reach the target), the plan without, and a
    note saying so."""
    if not describable:
        return plan(model, symmap, **kwargs), None
    try:
        return plan(model, symmap, describable=True, **kwargs), None
    except PlanError as refused:
        why = str(refused)
    return plan(model, symmap, **kwargs), _UNDESCRIBED.format(why)


def apply_with_notes(chosen: Plan, model: nn.Module, symmap: Any) -> Plan:
    """Apply ``chosen`` to ``model``; return it with what the resize warned (a plugin's
    :class:`~fxsym.errors.ResizeWarning`: the model's config cannot describe the result, and
    why) added to ``extra["notes"]``, so the summary and the saved plan say it. Every warning
    goes on as it was issued too."""
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        chosen.apply(model, symmap)
    said = [str(w.message) for w in issued if issubclass(w.category, ResizeWarning)]
    for w in issued:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if not said:
        return chosen
    from .planning import with_extra

    return with_extra(chosen, notes=[*(chosen.extra.get("notes") or ()), *said])


def loading_note(directory: str | os.PathLike[str], output: str | os.PathLike[str]) -> str:
    """How ``output``, pruned from the checkpoint ``directory``, loads (the reader's
    :meth:`~CheckpointReader.how_to_load`)."""
    return open_checkpoint(directory).how_to_load(Path(output))


#: how files of tensors end (other formats than the one the prune writes, and their indexes
#: ``NAME.index.json``): never carried, they would be an unpruned copy beside the pruned one
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".h5",
                   ".keras", ".msgpack", ".onnx", ".npz", ".npy", ".pkl", ".pickle", ".tflite",
                   ".mlmodel", ".ot", ".nemo", ".pb")


def _carried(reader: CheckpointReader, files: Mapping[str, bytes]
             ) -> tuple[list[str], dict[str, str]]:
    """The input's files copied to the output (a link to a regular file is carried as a
    file: a hub cache's snapshot links every file to a blob), and those left out with why:
    weights (:data:`WEIGHT_SUFFIXES`: the prune wrote its own), folders, links to nothing.
    Not listed: the weights read, what the reader says the output rewrites, the plugins'
    files and an earlier fxsym manifest."""
    skip = set(reader.tensor_files().values()) | reader.replaced_files() | set(files)
    skip.add(MANIFEST)
    carried: list[str] = []
    left: dict[str, str] = {}
    for name in sorted(os.listdir(reader.directory)):
        path = reader.directory / name
        if name in skip:
            continue
        if name.removesuffix(".index.json").endswith(WEIGHT_SUFFIXES):
            left[name] = "weights this prune did not write (an unpruned copy)"
        elif path.is_dir():
            left[name] = "a folder"
        elif kind(path) is not None:
            left[name] = kind(path) or ""
        else:
            carried.append(name)
    return carried, left


def _copy(source: Path, target: Path) -> None:
    """Copy the regular file ``source`` (a link followed) into the new file ``target`` by
    chunks, never whole in memory; opened without blocking and checked regular, so a file
    swapped for a FIFO since it was listed is refused, not waited on."""
    import shutil
    import stat

    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{source} is no longer a regular file")
        with open(target, "xb") as dst:
            shutil.copyfileobj(src, dst, CHUNK_BYTES)


