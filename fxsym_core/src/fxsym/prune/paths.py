"""Paths from a stranger and the directories fxsym writes: what a path is, whether an output
overlaps an input, and who is writing an output now. Nothing here imports torch, so the command
line answers these before its first minute of imports.

* :func:`kind` says what a path is without opening it (``os.stat`` follows a link but reads
  nothing): a FIFO, a device or a socket is never opened (a FIFO may block forever, a device
  may never end), and the message says which it is.
* :func:`overlap` compares resolved real paths (links followed): an output equal to an input,
  inside it or holding it, or holding a file the input links to (a hub cache's blobs), would
  be destroyed by the output's replacement.
* :func:`check_new_output`: an output a tool writes without a ``--force`` (a converted or a
  distilled checkpoint) is new or an empty directory, never a link or a file.
* :func:`writing` holds the lock of an output directory while it is written: the file
  ``.NAME.fxsym-lock`` beside it, locked with ``flock`` (which the kernel releases when the
  process ends, ``kill -9`` included) and holding the writer's pid. A second writer of the same
  output is refused, naming the first; the first writer to take the lock after a crash removes
  the temporary siblings (``.NAME.fxsym-XXXXXXXX``, :func:`fresh_sibling`) the crashed one left,
  which no live writer owns since the lock is held. Kept: a sibling holding only ``old`` when
  the output is missing (the old contents of a replacement stopped between its two renames,
  see :func:`fxsym.prune.persist.replace_directory`). Where ``fcntl`` is missing (Windows), there is
  no lock and no cleaning.

Imports from fxsym: errors.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import CheckpointError, FxsymError, PlanError

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["check_new_output", "fresh_sibling", "kind", "overlap", "writing"]

#: the temporary siblings of an output (``.NAME.fxsym-`` and 8 hex digits) and its lock
_SIBLING = re.compile(r"\.(?P<name>.+)\.fxsym-[0-9a-f]{8}")
LOCK = ".{}.fxsym-lock"

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(path: str | os.PathLike[str]) -> str | None:
    """``None`` for a regular file or a directory (or a link to one), else what ``path`` is,
    said for a message (``"a link to a FIFO (named pipe), /tmp/x"``, ``"a link to nothing"``,
    ``"missing"``); nothing is opened."""
    p = Path(path)
    try:
        info = os.stat(p)
    except FileNotFoundError:
        if p.is_symlink():
            return f"a link to nothing ({os.readlink(p)})"
        return "missing"
    except OSError as exc:
        return f"a path that cannot be followed ({exc.strerror})"
    if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
        return None
    what = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    if p.is_symlink():
        return f"a link to {what}, {os.path.realpath(p)}"
    return what


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def overlap(source: str | os.PathLike[str], output: str | os.PathLike[str]) -> str | None:
    """Why writing ``output`` would touch the input directory ``source`` (``None`` if it
    would not): the two are the same directory, one holds the other, or ``output`` holds a
    file an entry of ``source`` links to. Real paths are compared, links followed."""
    src, out = os.path.realpath(source), os.path.realpath(output)
    if src == out:
        return f"{output} is the input directory {source}"
    if _inside(out, src):
        return f"{output} is inside the input directory {source}"
    if _inside(src, out):
        return f"{output} holds the input directory {source}"
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(src)):
            target = os.path.realpath(os.path.join(src, entry))
            if _inside(target, out):
                return (f"{output} holds {target}, which {os.path.join(source, entry)} links "
                        "to")
    return None


def check_new_output(out: Path) -> None:
    """:class:`~fxsym.errors.CheckpointError` unless ``out`` is new or an empty directory (a
    link or a file is refused: nothing is overwritten)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise CheckpointError(f"{out} exists and is not a directory; give a new directory")
    if out.is_dir() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty; give a new or empty directory "
                              "(nothing is overwritten)")


def fresh_sibling(out: Path) -> Path:
    """A new empty directory beside ``out``, named ``.NAME.fxsym-XXXXXXXX``."""
    for _ in range(100):
        tmp = out.parent / f".{out.name}.fxsym-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp
    raise PlanError(f"cannot make a temporary directory beside {out}")


#: the outputs this process holds the lock of, and the thread holding each
_held: dict[str, int] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def writing(directory: str | os.PathLike[str], *,
            error: type[FxsymError] = PlanError) -> Iterator[None]:
    """Hold the lock of the output ``directory`` for the block (see the module docstring);
    ``error`` if another process or thread holds it. Re-entrant in one thread. The folders
    made to hold ``directory`` are removed again if it was not written (a refused prune
    leaves no trace)."""
    out = Path(os.path.abspath(directory))
    key = str(out)
    me = threading.get_ident()
    with _held_lock:
        if _held.get(key) == me:
            mine = False
        elif key in _held:
            raise error(f"{directory} is being written by another thread of this process; "
                        "write elsewhere or wait for it")
        else:
            mine = True
    if not mine or fcntl is None:
        yield
        return
    made = [p for p in [out.parent, *out.parent.parents] if not os.path.lexists(p)]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = out.parent / LOCK.format(out.name)
        fd = _take(lock, out, error)
        with _held_lock:
            _held[key] = me
        try:
            _clean_stale(out)
            yield
        finally:
            with _held_lock:
                _held.pop(key, None)
            _release(lock, fd, unlink=True)
    finally:
        if not os.path.lexists(out):  # nothing written: the folders made for it go too
            for folder in made:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)


def _release(lock: Path, fd: int, *, unlink: bool) -> None:
    """Close the lock's descriptor (which releases the ``flock``), after removing the lock
    file if this process holds it (``unlink``)."""
    try:
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(lock)
    finally:
        os.close(fd)


def _take(lock: Path, out: Path, error: type[FxsymError]) -> int:
    """An open descriptor of ``lock`` holding its ``flock``, the pid written in it."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        try:
            fd = os.open(lock, flags, 0o644)
        except OSError as exc:
            raise error(f"cannot lock {out} for writing ({lock}: {exc.strerror})") from exc
        locked = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                raise error(f"{out} is being written by another process (pid {pid}, which "
                            f"holds {lock}); wait for it to finish, or write elsewhere") from None
            except OSError as exc:
                raise error(f"cannot lock {out} for writing ({lock}: {exc.strerror})") from exc
            locked = True
            try:
                now = os.stat(lock, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            held = os.fstat(fd)
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
            locked = False  # the lock file was removed by the writer that just finished
        except BaseException:
            _release(lock, fd, unlink=locked)
            raise
        os.close(fd)
    raise error(f"cannot lock {out} for writing ({lock} keeps changing)")


def _clean_stale(out: Path) -> None:
    """Remove the temporary siblings of ``out`` an earlier writer left (the lock is held: no
    live writer owns them), but a replacement's old contents when ``out`` is missing."""
    for entry in sorted(os.listdir(out.parent)):
        found = _SIBLING.fullmatch(entry)
        if found is None or found.group("name") != out.name:
            continue
        path = out.parent / entry
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            continue
        if not os.path.lexists(out) and os.listdir(path) == ["old"]:
            continue
        shutil.rmtree(path, ignore_errors=True)
