"""``fxsym.save`` / ``fxsym.load``: a pruned model as safetensors weights plus its plan.

A saved directory holds two files and nothing executable:

* ``model.safetensors``: the state dict (a tensor shared by several names stored once);
* ``fxsym.json``: the :class:`~fxsym.planning.Plan` (after the plans applied before it, for a
  model pruned several times: ``history``), the names sharing a stored tensor, and how to build
  the unpruned model again when the caller said so (``source``, e.g. the
  ``torchvision:resnet18`` spec of the command line; a library never runs it by itself).

Saving is atomic and follows no link (:func:`replace_directory`): the new save is built in a
fresh sibling directory and swapped in, so the directory holds the old save or the complete new
one whenever the process stops; a directory holding anything but an earlier save is replaced
only when the caller says ``overwrite``.

Loading replays the plans on a freshly built model of the same architecture: for each, analyze
the model with example inputs of the recorded shapes, check the plan fits (:meth:`Plan.check
<fxsym.planning.Plan.check>`) and resize; the last plan's parameter shapes are checked against
the file's before it resizes (for a single plan: before anything is touched); then the weights
are loaded with ``strict=True``. Any misfit raises :class:`~fxsym.errors.PlanMismatchError`
naming the first difference, and the fresh model is left as it was (each resize is all or
nothing; a misfit found after one puts the module tree back, and resizes bind new tensors,
never write into the old ones). Nothing is ever unpickled: JSON and safetensors only.

Imports from fxsym: analysis, errors, modstate, planning, symbols.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .analysis import analyze
from .errors import PlanError, PlanMismatchError
from .modstate import ModuleTreeState
from .planning import Plan, inputs_from_spec
from .symbols import SymMap

__all__ = ["MANIFEST", "WEIGHTS", "is_saved", "load", "read_manifest", "replace_directory", "save"]

#: the file names inside a saved directory
MANIFEST = "fxsym.json"
WEIGHTS = "model.safetensors"
FORMAT = 1


def save(model: nn.Module, directory: str | os.PathLike[str], plan: Plan, *,
         source: str | None = None, history: Sequence[Plan] = (),
         overwrite: bool = False) -> Path:
    """Write ``model`` (pruned by ``plan``) to ``directory``: safetensors weights and
    ``fxsym.json``. ``source`` records how to build the unpruned model (free text for the
    caller, e.g. ``"timm:resnet18"``; the command line rebuilds from it); ``history`` the plans
    applied before ``plan``, first first (a model pruned again). Returns the directory.

    The save is atomic (see :func:`replace_directory`): ``directory`` holds the old save or
    the complete new one at every moment. It may be missing, empty or an earlier fxsym save
    (two regular files); anything else (other files, a symbolic link in it) raises
    :class:`~fxsym.errors.PlanError` unless ``overwrite``, which replaces the whole directory.
    A ``directory`` that is itself a symbolic link is refused. Raises
    :class:`~fxsym.errors.PlanError` too if the model's parameters do not have the plan's
    shapes (the plan was not applied)."""
    from safetensors.torch import save_file

    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, shape in plan.shapes.items():
        if shapes.get(name) != tuple(shape):
            raise PlanError(f"the model does not have the plan's shapes ({name}: "
                            f"{shapes.get(name)} vs {tuple(shape)}); apply the plan first")
    out = Path(directory)
    state = model.state_dict()
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               t.stride(), t.dtype) if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        stored[name] = t.detach().to("cpu").contiguous()
    manifest = {"fxsym": FORMAT, "source": source, "aliases": aliases,
                "history": [p.to_dict() for p in history], "plan": plan.to_dict()}
    with replace_directory(out, overwrite=overwrite, replaceable=(MANIFEST, WEIGHTS)) as tmp:
        _write_new(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        save_file(stored, str(tmp / WEIGHTS), metadata={"format": "pt", "producer": "fxsym"})
        # safetensors writes 0600; give the weights the manifest's usual 0666-less-umask mode
        os.chmod(tmp / WEIGHTS, stat.S_IMODE(os.lstat(tmp / MANIFEST).st_mode))
        _sync(tmp / WEIGHTS)
    return out


@contextlib.contextmanager
def replace_directory(directory: str | os.PathLike[str], *, overwrite: bool = False,
                      replaceable: Sequence[str] = ()) -> Iterator[Path]:
    """Build a directory's new contents in a fresh sibling (yielded) and put it in place of
    ``directory`` when the block ends; on an error in the block, remove the sibling and leave
    ``directory`` as it was.

    ``directory`` may be missing or empty; one holding anything but regular files named in
    ``replaceable`` (an earlier save of the same kind) is refused with
    :class:`~fxsym.errors.PlanError` before the block runs, unless ``overwrite``.

    The sibling is made with ``mkdir`` (mode 0777 less the umask; files written in it get
    the usual 0666 less the umask), so no link can be in it. It replaces a missing or empty
    ``directory`` with one ``rename``, a non-empty one by exchanging the two atomically
    (Linux ``renameat2(RENAME_EXCHANGE)``) and removing the old contents: whenever the process
    stops, ``directory`` holds the old contents or the complete new ones. Where the exchange
    is not available (another OS or file system) the old directory is moved aside first and
    moved back if the second rename fails; a crash between the two leaves it beside
    ``directory`` as ``.NAME.fxsym-*``. A ``directory`` that is a symbolic link is refused
    (:class:`~fxsym.errors.PlanError`): the link is never followed or replaced."""
    out = Path(directory)
    if out.is_symlink():
        raise PlanError(f"{out} is a symbolic link; give the directory itself")
    if out.exists() and not out.is_dir():
        raise PlanError(f"{out} exists and is not a directory")
    if not overwrite:
        other = [e for e in _entries(out)
                 if e not in replaceable or not stat.S_ISREG(os.lstat(out / e).st_mode)]
        if other:
            raise PlanError(f"{out} is not empty ({other[0]!r} is not part of an earlier save); "
                            "give an empty or new directory, or overwrite=True (--force) to "
                            "replace it whole")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_sibling(out)
    try:
        yield tmp
        _sync(tmp)
        try:
            os.rename(tmp, out)  # a missing or empty directory: replaced in one step
            replaced = None
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            replaced = _swap(tmp, out)
        _sync(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _fresh_sibling(out: Path) -> Path:
    """A new empty directory beside ``out``, named ``.NAME.fxsym-XXXXXXXX``."""
    for _ in range(100):
        tmp = out.parent / f".{out.name}.fxsym-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp
    raise PlanError(f"cannot make a temporary directory beside {out}")


def _swap(new: Path, out: Path) -> Path:
    """Put ``new`` in place of the non-empty directory ``out``; return where the old contents
    are now (under ``new``'s name)."""
    try:
        _exchange(new, out)
        return new
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
    aside = _fresh_sibling(out)
    try:
        os.rename(out, aside / "old")
        try:
            os.rename(new, out)
        except BaseException:
            os.rename(aside / "old", out)
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(aside)  # only if empty: the old contents, if still there, stay
        raise
    return aside


def _exchange(a: Path, b: Path) -> None:
    """Swap ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``); ``OSError`` with
    ``ENOSYS`` where there is no such call."""
    rename2 = getattr(_libc(), "renameat2", None) if sys.platform == "linux" else None
    if rename2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    at_fdcwd, rename_exchange = -100, 2
    if rename2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a file that must not exist yet (never through a link), durably."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync(path: Path) -> None:
    """``fsync`` a file or directory (its entries), where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def is_saved(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` looks like what :func:`save` writes."""
    path = Path(directory)
    return path.is_dir() and (path / MANIFEST).is_file()


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``fxsym.json`` of a saved directory, checked: ``source``, ``aliases``, ``plan`` (a
    :class:`~fxsym.planning.Plan`) and ``history`` (the plans before it)."""
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"{directory} is not an fxsym save: cannot read {MANIFEST}: {exc}"
                        ) from exc
    if not isinstance(data, dict) or data.get("fxsym") != FORMAT:
        raise PlanError(f"{path} is not an fxsym save of format {FORMAT}")
    aliases = data.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise PlanError(f"{path}: 'aliases' must be an object")
    history = data.get("history") or []
    if not isinstance(history, list):
        raise PlanError(f"{path}: 'history' must be a list of plans")
    return {"source": data.get("source"), "aliases": {str(k): str(v) for k, v in aliases.items()},
            "plan": Plan.from_dict(data.get("plan")),
            "history": [Plan.from_dict(p) for p in history]}


def load(model: nn.Module, directory: str | os.PathLike[str], *, example_inputs: Any = None,
         symmap: SymMap | None = None) -> nn.Module:
    """Replay the saved plans on ``model`` (freshly built, unpruned) and load the saved
    weights into it (``strict=True``); return it.

    The model is analyzed with example inputs of the shapes recorded in each plan (or
    ``example_inputs``; or pass the ``symmap`` of the fresh model). A plan that does not fit
    raises :class:`~fxsym.errors.PlanMismatchError` naming the first mismatch; the model is
    then as it was.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    manifest = read_manifest(directory)
    plans: list[Plan] = [*manifest["history"], manifest["plan"]]
    weights = Path(directory) / WEIGHTS
    try:
        with safe_open(str(weights), framework="pt") as f:
            file_shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:
        raise PlanError(f"cannot read {weights}: {exc}") from exc
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if kind != plans[0].model:
        raise PlanMismatchError(f"the plan is for a {plans[0].model}, the model is a {kind}")
    saved = ModuleTreeState(model)
    try:
        for i, plan in enumerate(plans):
            if symmap is None or i:
                inputs = (example_inputs if example_inputs is not None
                          else inputs_from_spec(plan.inputs))
                symmap = analyze(model, example_inputs=inputs,
                                 outputs=None if plan.outputs is None else list(plan.outputs))
            plan.check(model, symmap)
            if i == len(plans) - 1:
                _check_shapes(model, plan, file_shapes, manifest["aliases"])
            plan.apply(model, symmap)
        state = load_file(str(weights))
        for alias, name in manifest["aliases"].items():
            state[alias] = state[name]
        _check_state(model.state_dict(), state)
        model.load_state_dict(state, strict=True)
    except BaseException:
        saved.restore()
        raise
    return model


def _check_shapes(model: nn.Module, plan: Plan, file_shapes: Mapping[str, tuple[int, ...]],
                  aliases: Mapping[str, str]) -> None:
    """Every parameter of ``model`` is in the plan and the file, with the same shape after the
    plan; checked before anything is touched."""
    for name, _ in model.named_parameters():
        planned = plan.shapes.get(name)
        if planned is None:
            raise PlanMismatchError(f"parameter {name!r} of the model is not in the plan "
                                    "(renamed module or another architecture?)")
        stored = file_shapes.get(aliases.get(name, name))
        if stored is None:
            raise PlanMismatchError(f"parameter {name!r} is not in the saved weights")
        if tuple(stored) != tuple(planned):
            raise PlanMismatchError(f"parameter {name!r}: the plan gives {tuple(planned)}, the "
                                    f"saved weights hold {tuple(stored)}")


def _check_state(have: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]) -> None:
    """The same names and shapes, or PlanMismatchError naming the first difference."""
    for name, t in have.items():
        s = saved.get(name)
        if s is None:
            raise PlanMismatchError(f"{name!r} of the pruned model is not in the saved weights")
        if tuple(s.shape) != tuple(t.shape):
            raise PlanMismatchError(f"{name!r}: the pruned model has {tuple(t.shape)}, the saved "
                                    f"weights {tuple(s.shape)}")
    extra = [n for n in saved if n not in have]
    if extra:
        raise PlanMismatchError(f"the saved weights hold {extra[0]!r}, which the pruned model "
                                "does not have")
