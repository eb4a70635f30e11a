"""The output directory of a prune (checked with the request,
:meth:`fxsym.prune.request.PruneRequest.check_output`, and locked for the whole run by
:func:`fxsym.prune.paths.writing`) given the input's other
files (tokenizer, chat template ...: :func:`carried_files`), copied by chunks and through
links (a hub cache's snapshot links each file to a blob, :func:`copy_file`), but never weights
the prune did not write (``pytorch_model.bin``, ``*.gguf`` ...: :data:`WEIGHT_SUFFIXES`, they
would be an unpruned copy).

Imports from fxsym: errors, paths, persist, request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import CheckpointError
from ..paths import kind
from ..persist import MANIFEST
from ..request import PruneRequest
from .reader import CheckpointReader
from .tensors import CHUNK_BYTES

if TYPE_CHECKING:
    pass


def check_output(directory: str | os.PathLike[str], output: str | os.PathLike[str]) -> None:
    """:class:`~fxsym.errors.CheckpointError` unless ``output`` may be written with the
    checkpoint ``directory`` as input (replacing what it holds): the request's rules
    (:meth:`fxsym.prune.request.PruneRequest.check_output` with ``force``)."""
    PruneRequest(checkpoint=True, source=directory, output=output, force=True).check_output()


#: how files of tensors end (other formats than the one the prune writes, and their indexes
#: ``NAME.index.json``): never carried, they would be an unpruned copy beside the pruned one
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".h5",
                   ".keras", ".msgpack", ".onnx", ".npz", ".npy", ".pkl", ".pickle", ".tflite",
                   ".mlmodel", ".ot", ".nemo", ".pb")


def carried_files(reader: CheckpointReader, files: Mapping[str, bytes]
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


def copy_file(source: Path, target: Path) -> None:
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
