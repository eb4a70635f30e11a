"""What a plugin knows about a checkpoint directory: :class:`CheckpointReader` (and the
:class:`StoredLayout` of tensors stored otherwise than the model holds them), found by
:func:`open_checkpoint`.

A *checkpoint directory* is what a library's ``save_pretrained`` writes: a config, the weights
as safetensors (one file, or shards and an index), tokenizer files. The core does not know any
library: a plugin's ``fxsym_checkpoint_reader`` hook gives a :class:`CheckpointReader`, which
builds the model with its parameters on the meta device (buffers real), says which file holds
each tensor, how tensors are stored where not under the model's names and layout (a
:class:`StoredLayout`: the hf plugin applies transformers' conversion mapping, which fuses a MoE
layer's per-expert tensors and splits a stored ``query_key_value`` into q, k and v) and
tokenises calibration text (the hf plugin: transformers' meta construction and the
checkpoint's own tokenizer). A directory holding anything but regular files and folders is
refused before any plugin opens it.

Imports from fxsym: errors, paths, plugins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ...errors import CheckpointError, PluginError
from ...plugins import load_plugins
from ...plugins.calls import call_hook
from ..paths import kind


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


def loading_note(directory: str | os.PathLike[str], output: str | os.PathLike[str]) -> str:
    """How ``output``, pruned from the checkpoint ``directory``, loads (the reader's
    :meth:`~CheckpointReader.how_to_load`)."""
    return open_checkpoint(directory).how_to_load(Path(output))
