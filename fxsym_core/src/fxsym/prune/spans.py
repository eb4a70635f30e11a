"""A tensor of a safetensors file as a byte range, copied into another file by the kernel.

Design. A safetensors file is an 8-byte little-endian length, a JSON header giving each
tensor's dtype, shape and ``data_offsets`` (from the end of the header), then the bytes. A
tensor written unchanged (a prune keeps all of it) is the same bytes in the output as in the
input, so it need not pass through Python: :func:`offsets` reads a file's header once, a
:class:`Span` names the bytes, and :func:`copy_span` copies them with
``os.copy_file_range`` (no page of them mapped or copied into the process; a plain read and
write by chunks where the call is missing or refused, e.g. across file systems). Nothing here
checks the values: the caller copies only bytes it has checked (:mod:`fxsym.prune.checkpoint`
records which tensors it read and checked finite, with the file's identity then).

Imports from fxsym: errors.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

__all__ = ["Span", "copy_span", "identity", "offsets"]

#: the largest header read (safetensors refuses larger ones too)
MAX_HEADER = 100 * 2**20
_CHUNK = 2**24


@dataclass(frozen=True)
class Span:
    """The bytes ``[start, start + size)`` of ``path``: one tensor of dtype code ``dtype``
    (``"F32"`` ...) and ``shape``."""

    path: Path
    start: int
    size: int
    dtype: str
    shape: tuple[int, ...]


def identity(path: Path) -> tuple[int, int, int, int]:
    """What tells a file changed: device, inode, size and modification time (ns)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def offsets(path: Path) -> dict[str, Span]:
    """Every tensor of the safetensors file ``path`` as a :class:`Span`; empty on a
    big-endian machine (the file's bytes are little-endian, a tensor's in memory not)."""
    if sys.byteorder != "little":
        return {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= MAX_HEADER:
            raise CheckpointError(f"{path}: a header of {n:,} bytes is not a safetensors one")
        header = json.loads(f.read(n))
    base = 8 + n
    out: dict[str, Span] = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        lo, hi = entry["data_offsets"]
        out[name] = Span(path, base + int(lo), int(hi) - int(lo), str(entry["dtype"]),
                         tuple(int(d) for d in entry["shape"]))
    return out


def copy_span(span: Span, out: int) -> None:
    """Append the bytes of ``span`` to the file open as descriptor ``out`` (at its
    position)."""
    with open(span.path, "rb") as src:
        fd, at, left = src.fileno(), span.start, span.size
        copy = getattr(os, "copy_file_range", None)
        while left and copy is not None:
            try:
                done = copy(fd, out, left, at)
            except OSError:
                break  # refused (another file system, an old kernel): the plain way below
            if done <= 0:
                break
            at, left = at + done, left - done
        while left:
            data = os.pread(fd, min(left, _CHUNK), at)
            if not data:
                raise CheckpointError(f"{span.path} ends before the bytes its header gives")
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            at, left = at + len(data), left - len(data)
