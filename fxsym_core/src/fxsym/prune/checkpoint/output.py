"""The output directory of a prune: checked before anything is read (:func:`check_output`:
never the input, inside it or holding it; not a file or a link), locked for the whole run
(:func:`guarding_output`, :func:`fxsym.prune.paths.writing`), and given the input's other
files (tokenizer, chat template ...: :func:`carried_files`), copied by chunks and through
links (a hub cache's snapshot links each file to a blob, :func:`copy_file`), but never weights
the prune did not write (``pytorch_model.bin``, ``*.gguf`` ...: :data:`WEIGHT_SUFFIXES`, they
would be an unpruned copy).

Imports from fxsym: errors, paths, persist.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec

from ...errors import CheckpointError
from ..paths import kind, overlap, writing
from ..persist import MANIFEST
from .reader import CheckpointReader
from .tensors import CHUNK_BYTES

if TYPE_CHECKING:
    from ..planning import Plan


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


def guarding_output(prune: Callable[_P, Plan]) -> Callable[_P, Plan]:
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
