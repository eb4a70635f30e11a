"""``fxsym.save`` / ``fxsym.load``: a pruned model as safetensors weights plus its plan.

A saved directory holds two files of fxsym's:

* ``model.safetensors``: the state dict (a tensor shared by several names stored once);
* ``fxsym.json``: the :class:`~fxsym.prune.planning.Plan` (after the plans applied before it, for a
  model pruned several times: ``history``), the names sharing a stored tensor, the other files
  written (``files``), and how to build the unpruned model again when the caller said so
  (``source``, e.g. the ``torchvision:resnet18`` spec of the command line; a library never runs
  it by itself);

and the files plugins add so that the model's own library reads the directory too (the
``fxsym_save_files`` hook: a Hugging Face model's ``config.json``). Loading with fxsym reads
fxsym's two files only.

Saving is atomic and follows no link (:func:`replace_directory`): the new save is built in a
fresh sibling directory (the directory's other files carried over, or not: ``keep_others``)
and swapped in, so the directory holds the old save or the complete new one whenever the
process stops.

Loading replays the plans on a freshly built model of the same architecture: for each, analyze
the model with example inputs of the recorded shapes, check the plan fits (:meth:`Plan.check
<fxsym.prune.planning.Plan.check>`) and resize; the last plan's parameter shapes are checked against
the file's before it resizes (for a single plan: before anything is touched); then the weights
are loaded with ``strict=True``. The weights may also be sharded (:func:`weight_files`: an
index and the files it names, as ``save_pretrained`` and :func:`fxsym.prune_checkpoint` write
them). Any misfit raises :class:`~fxsym.errors.PlanMismatchError`
naming the first difference, and the fresh model is left as it was (each resize is all or
nothing; a misfit found after one puts the module tree back, and resizes bind new tensors,
never write into the old ones). Nothing is ever unpickled: JSON and safetensors only. A
directory may come from a stranger: its files must be regular and its JSON strict and typed
(:func:`read_manifest`), the inputs it records are bounded, and the weights' header must give
every tensor of the resized model its name, shape and dtype before a tensor is read.

Imports from fxsym: analysis, depth, errors, modstate, paths, planning, plugins, symbols.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..analysis import analyze
from ..errors import PlanError, PlanMismatchError
from ..modstate import ModuleTreeState
from ..plugins import get_plugin_manager
from ..plugins.calls import call_each
from ..symbols import SymMap
from .depth import renamed
from .paths import fresh_sibling, writing
from .planning import Plan, analysis_options, inputs_from_spec, strict_loads

__all__ = ["MANIFEST", "WEIGHTS", "is_saved", "load", "read_manifest", "replace_directory", "save",
           "weight_files"]

#: the file names inside a saved directory
MANIFEST = "fxsym.json"
WEIGHTS = "model.safetensors"
FORMAT = 1


def save(model: nn.Module, directory: str | os.PathLike[str], plan: Plan, *,
         source: str | None = None, history: Sequence[Plan] = (),
         keep_others: bool = True) -> Path:
    """Write ``model`` (pruned by ``plan``) to ``directory``: safetensors weights and
    ``fxsym.json``. ``source`` records how to build the unpruned model (free text for the
    caller, e.g. ``"timm:resnet18"``; the command line rebuilds from it); ``history`` the plans
    applied before ``plan``, first first (a model pruned again). Returns the directory.

    The save is atomic (see :func:`replace_directory`): ``directory`` holds what it held or
    the complete new save at every moment, and no link is followed (a link named
    ``fxsym.json`` is replaced, not written through). Its other files (a ``save_pretrained``
    checkpoint's ``config.json``, say) are kept with ``keep_others`` (the default), else the
    directory is replaced whole; the files the plugins give (``fxsym_save_files``) and those
    an earlier save's manifest lists are never kept. A ``directory`` that is itself a symbolic
    link is refused with :class:`~fxsym.errors.PlanError`; so is a model whose parameters do
    not have the plan's shapes (the plan was not applied)."""
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
    files = plugin_files(model, plan)
    manifest = {"fxsym": FORMAT, "source": source, "aliases": aliases, "files": sorted(files),
                "history": [p.to_dict() for p in history], "plan": plan.to_dict()}
    ours = {MANIFEST, WEIGHTS, *files, *_earlier_files(out)}
    with replace_directory(out, keep=(lambda n: n not in ours) if keep_others else None) as tmp:
        _write_new(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        save_file(stored, str(tmp / WEIGHTS), metadata={"format": "pt", "producer": "fxsym"})
        # safetensors writes 0600; give the weights the manifest's usual 0666-less-umask mode
        os.chmod(tmp / WEIGHTS, stat.S_IMODE(os.lstat(tmp / MANIFEST).st_mode))
        _sync(tmp / WEIGHTS)
        for name, data in files.items():
            _write_new(tmp / name, data)
    return out


@contextlib.contextmanager
def replace_directory(directory: str | os.PathLike[str], *,
                      keep: Callable[[str], bool] | None = None) -> Iterator[Path]:
    """Build a directory's new contents in a fresh sibling (yielded) and put it in place of
    ``directory`` when the block ends; on an error in the block, remove the sibling and leave
    ``directory`` as it was.

    The entries of ``directory`` whose names ``keep`` accepts are carried into the sibling
    before the block runs (hard links to the same files, a symbolic link as a link to the
    same target, a folder as such a copy: nothing is read or followed; a regular file is
    copied where the file system has no hard links); without ``keep`` none are.

    The sibling is made with ``mkdir`` (the mode of the directory it replaces, else 0777 less
    the umask; files written in it get the usual 0666 less the umask), so no link can be in
    it. It replaces a missing or empty
    ``directory`` with one ``rename``, a non-empty one by exchanging the two atomically
    (Linux ``renameat2(RENAME_EXCHANGE)``) and removing the old contents: whenever the process
    stops, ``directory`` holds the old contents or the complete new ones. Where the exchange
    is not available (another OS or file system) the old directory is moved aside first and
    moved back if the second rename fails; a crash between the two leaves it beside
    ``directory`` as ``.NAME.fxsym-*/old``. A ``directory`` that is a symbolic link is refused
    (:class:`~fxsym.errors.PlanError`): the link is never followed or replaced.

    The block runs holding the lock of ``directory`` (:func:`fxsym.prune.paths.writing`): another
    process writing it at the same time is refused (:class:`~fxsym.errors.PlanError` naming its
    pid), and the temporary siblings a killed writer left are removed first."""
    out = Path(os.path.abspath(directory))
    here = os.getcwd()
    if not out.name or here == str(out) or here.startswith(str(out) + os.sep):
        raise PlanError(f"{directory} is the current directory or holds it; give another one "
                        "(it is replaced by a new directory)")
    if out.is_symlink():
        raise PlanError(f"{out} is a symbolic link; give the directory itself")
    if out.exists() and not out.is_dir():
        raise PlanError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with writing(out):
        tmp = fresh_sibling(out)
        try:
            if out.exists():  # a private directory stays private
                os.chmod(tmp, stat.S_IMODE(os.lstat(out).st_mode))
            if keep is not None:
                for name in _entries(out):
                    if keep(name):
                        _carry(out / name, tmp / name)
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


def _carry(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` without reading or following it (see :func:`replace_directory`)."""
    info = os.lstat(src)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISDIR(info.st_mode):
        os.mkdir(dst, stat.S_IMODE(info.st_mode))
        for name in _entries(src):
            _carry(src / name, dst / name)
    else:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            if not stat.S_ISREG(info.st_mode):
                raise
            shutil.copy2(src, dst, follow_symlinks=False)


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _swap(new: Path, out: Path) -> Path:
    """Put ``new`` in place of the non-empty directory ``out``; return where the old contents
    are now (under ``new``'s name)."""
    try:
        _exchange(new, out)
        return new
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
    aside = fresh_sibling(out)
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


def plugin_files(model: nn.Module, plan: Plan) -> dict[str, bytes]:
    """The files the plugins' ``fxsym_save_files`` hooks add to a save of ``model``: checked
    plain file names, one plugin each; :class:`~fxsym.errors.PlanError` if a plugin failed
    (it is disabled) or gave a bad name."""
    pm = get_plugin_manager()
    failed = len(pm.failed)
    files: dict[str, bytes] = {}
    for plugin, given in call_each(pm, "fxsym_save_files",
                                   lambda _: {"model": model, "plan": plan}):
        for name, data in (given or {}).items():
            if (not isinstance(name, str) or name in (MANIFEST, WEIGHTS, "", ".", "..")
                    or Path(name).name != name or "\\" in name or name in files
                    or not isinstance(data, bytes)):
                raise PlanError(f"plugin {plugin!r} gave a file fxsym cannot save: {name!r}")
            files[name] = data
    if len(pm.failed) > failed:
        failure = pm.failed[failed]
        raise PlanError(f"plugin {failure.name!r} failed to give its files: {failure.error}")
    return files


def _earlier_files(directory: Path) -> tuple[str, ...]:
    """The plugins' files an earlier save in ``directory`` lists (``files`` in its manifest, a
    regular file), which a new save may replace; none if there is no such save."""
    try:
        data = strict_loads(_read_regular(directory / MANIFEST, MAX_MANIFEST_BYTES))
    except (PlanError, ValueError):
        return ()
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return ()
    return tuple(f for f in files if isinstance(f, str) and f and Path(f).name == f)


def is_saved(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` looks like what :func:`save` writes (its manifest a regular
    file; nothing is opened)."""
    path = Path(directory)
    return path.is_dir() and (path / MANIFEST).is_file()


#: the largest ``fxsym.json`` read (a plan of a large model with its kept indices is a few MB)
MAX_MANIFEST_BYTES = 64 * 2**20
#: the most plans a saved directory may ask to replay (each one is an analysis)
MAX_PLANS = 32


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``fxsym.json`` of a saved directory, checked: ``source`` (a string or ``None``),
    ``aliases`` (names to names), ``plan`` (a :class:`~fxsym.prune.planning.Plan`) and ``history``
    (the plans before it).

    Read as a file from a stranger: a regular file of at most :data:`MAX_MANIFEST_BYTES`
    (opened without blocking, so a FIFO or a device is refused, never read), strict JSON
    (:func:`~fxsym.prune.planning.strict_loads`), each field of its one type
    (:meth:`Plan.from_dict <fxsym.prune.planning.Plan.from_dict>`), at most :data:`MAX_PLANS`
    plans. Anything else raises :class:`~fxsym.errors.PlanError`."""
    path = Path(directory) / MANIFEST
    text = _read_regular(path, MAX_MANIFEST_BYTES)
    try:
        data = strict_loads(text)
    except ValueError as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or type(data.get("fxsym")) is not int \
            or data["fxsym"] != FORMAT:
        raise PlanError(f"{path} is not an fxsym save of format {FORMAT}")
    source = data.get("source")
    if source is not None and not isinstance(source, str):
        raise PlanError(f"{path}: 'source' must be a string")
    aliases = data.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise PlanError(f"{path}: 'aliases' must map names to names")
    history = data.get("history") or []
    if not isinstance(history, list):
        raise PlanError(f"{path}: 'history' must be a list of plans")
    if len(history) >= MAX_PLANS:
        raise PlanError(f"{path} asks to replay {len(history) + 1} plans, more than {MAX_PLANS}")
    return {"source": source, "aliases": dict(aliases),
            "plan": Plan.from_dict(data.get("plan")),
            "history": [Plan.from_dict(p) for p in history]}


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes, else
    :class:`~fxsym.errors.PlanError`; opened with ``O_NONBLOCK`` so a FIFO cannot hang."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PlanError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PlanError(f"{path} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(2**20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise PlanError(f"{path} is larger than {limit:,} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise PlanError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


#: safetensors' name of each torch dtype
_STORED_DTYPES = {getattr(torch, name): code for name, code in (
    ("float64", "F64"), ("float32", "F32"), ("float16", "F16"), ("bfloat16", "BF16"),
    ("int64", "I64"), ("int32", "I32"), ("int16", "I16"), ("int8", "I8"), ("uint8", "U8"),
    ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("bool", "BOOL"),
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("complex64", "C64"))
    if hasattr(torch, name)}


def _stored(weights: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's shape and dtype in the safetensors file, from its header only
    (``safe_open``: nothing is read past it); the file must be a regular one."""
    from safetensors import safe_open

    try:
        if not stat.S_ISREG(os.stat(weights).st_mode):
            raise PlanError(f"{weights} is not a regular file")
        with safe_open(str(weights), framework="pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype()))
                    for k in f.keys()}
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(f"cannot read {weights}: {exc}") from exc


#: the index of weights in several files (``save_pretrained``'s and the streamed writer's)
INDEX = "model.safetensors.index.json"
#: the largest index read, and the most weight files an index may name
MAX_INDEX_BYTES = 64 * 2**20
MAX_SHARDS = 10_000


def weight_files(directory: str | os.PathLike[str]
                 ) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, Path]]:
    """The saved tensors of ``directory`` (name: shape and dtype, from the headers only) and
    the file holding each: ``model.safetensors``, or the files ``model.safetensors.index.json``
    maps each tensor to (sharded weights, as ``save_pretrained`` and
    :func:`fxsym.prune_checkpoint` write them).

    Read as files from a stranger: the index is a regular file of at most
    :data:`MAX_INDEX_BYTES` in strict JSON whose ``weight_map`` maps names to plain file names
    in the directory (at most :data:`MAX_SHARDS` of them, each a regular safetensors file),
    and every file holds exactly the tensors the index gives it. A directory holding both
    kinds, or neither, is refused: :class:`~fxsym.errors.PlanError`."""
    path = Path(directory)
    single, index = path / WEIGHTS, path / INDEX
    if os.path.lexists(single) and os.path.lexists(index):
        raise PlanError(f"{path} holds both {WEIGHTS} and {INDEX}; which weights are meant?")
    if not os.path.lexists(index):
        one = _stored(single)
        return one, dict.fromkeys(one, single)
    try:
        data = strict_loads(_read_regular(index, MAX_INDEX_BYTES))
    except ValueError as exc:
        raise PlanError(f"{index} is not valid JSON: {exc}") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) and f not in ("", ".", "..", MANIFEST, INDEX)
            and Path(f).name == f and "\\" not in f for f in weight_map.values()):
        raise PlanError(f"{index}: 'weight_map' must map tensor names to file names in "
                        f"{path}")
    shards = sorted(set(weight_map.values()))
    if len(shards) > MAX_SHARDS:
        raise PlanError(f"{index} names {len(shards):,} weight files, more than {MAX_SHARDS:,}")
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    where: dict[str, Path] = {}
    for shard in shards:
        for name, entry in _stored(path / shard).items():
            if weight_map.get(name) != shard:
                raise PlanError(f"{path / shard} holds {name!r}, which {INDEX} puts "
                                f"{'nowhere' if name not in weight_map else 'elsewhere'}")
            stored[name], where[name] = entry, path / shard
    missing = next((n for n in weight_map if n not in stored), None)
    if missing is not None:
        raise PlanError(f"{INDEX} puts {missing!r} in {weight_map[missing]}, which does not "
                        "hold it")
    return stored, where


def load(model: nn.Module, directory: str | os.PathLike[str], *, example_inputs: Any = None,
         symmap: SymMap | None = None) -> nn.Module:
    """Replay the saved plans on ``model`` (freshly built, unpruned) and load the saved
    weights into it (``strict=True``); return it.

    The model is analyzed with example inputs of the shapes recorded in each plan (or
    ``example_inputs``; or pass the ``symmap`` of the fresh model). The weights are
    ``model.safetensors`` or shards (:func:`weight_files`). A plan that does not fit
    raises :class:`~fxsym.errors.PlanMismatchError` naming the first mismatch; the model is
    then as it was.

    The directory may come from a stranger (:func:`read_manifest`): the recorded inputs are
    bounded (:func:`~fxsym.prune.planning.inputs_from_spec`), and every tensor's name, shape and
    dtype in the weights' header must be the resized model's before a tensor is read (a
    float16 or int64 tensor is never cast into a float32 parameter). Every failure is an
    :class:`~fxsym.errors.FxsymError`.
    """
    from safetensors.torch import load_file

    manifest = read_manifest(directory)
    plans: list[Plan] = [*manifest["history"], manifest["plan"]]
    stored, where = weight_files(directory)
    aliases: dict[str, str] = manifest["aliases"]
    for alias, name in aliases.items():
        if name not in stored or alias in stored:
            raise PlanMismatchError(f"the saved alias {alias!r} -> {name!r} does not name one "
                                    "stored tensor")
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if kind != plans[0].model:
        raise PlanMismatchError(f"the plan is for a {plans[0].model}, the model is a {kind}")
    saved = ModuleTreeState(model)
    try:
        for i, plan in enumerate(plans):
            if symmap is None or i:
                inputs = (example_inputs if example_inputs is not None
                          else inputs_from_spec(plan.inputs))
                options: dict[str, Any] = analysis_options(plan)
                symmap = analyze(model, example_inputs=inputs,
                                 outputs=None if plan.outputs is None else list(plan.outputs),
                                 **options)
            plan.check(model, symmap)
            if i == len(plans) - 1:
                _check_shapes(model, symmap, plan, {k: v[0] for k, v in stored.items()},
                              aliases)
            plan.apply(model, symmap)
        _check_state(model.state_dict(), stored, aliases)
        state: dict[str, torch.Tensor] = {}
        for weights in sorted(set(where.values())):
            try:
                state.update(load_file(str(weights)))
            except Exception as exc:
                raise PlanError(f"cannot read {weights}: {exc}") from exc
        for alias, name in aliases.items():
            state[alias] = state[name]
        model.load_state_dict(state, strict=True)
    except BaseException:
        saved.restore()
        raise
    return model


def _check_shapes(model: nn.Module, symmap: SymMap, plan: Plan,
                  file_shapes: Mapping[str, tuple[int, ...]], aliases: Mapping[str, str]) -> None:
    """Every parameter of ``model`` is in the plan and the file, with the same shape after the
    plan (under its name after the plan's blocks are dropped, if it stays); checked before
    anything is touched."""
    kept = {d.name: d.keep for d in plan.depth}
    for before, _ in model.named_parameters():
        name = renamed(before, symmap.depth_groups(), kept)
        if name is None:
            continue
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


def _check_state(have: Mapping[str, torch.Tensor],
                 stored: Mapping[str, tuple[tuple[int, ...], str]],
                 aliases: Mapping[str, str]) -> None:
    """The resized model's state and the file's header (through ``aliases``) hold the same
    names, shapes and dtypes; else PlanMismatchError naming the first difference."""
    used: set[str] = set()
    for name, t in have.items():
        key = aliases.get(name, name)
        entry = stored.get(key)
        if entry is None:
            raise PlanMismatchError(f"{name!r} of the pruned model is not in the saved weights")
        used.add(key)
        shape, dtype = entry
        if shape != tuple(t.shape):
            raise PlanMismatchError(f"{name!r}: the pruned model has {tuple(t.shape)}, the saved "
                                    f"weights {shape}")
        if dtype != _STORED_DTYPES.get(t.dtype):
            raise PlanMismatchError(f"{name!r}: the model holds {t.dtype}, the saved weights "
                                    f"{dtype} (never cast)")
    extra = [n for n in [*stored, *aliases] if n not in used and n not in have]
    if extra:
        raise PlanMismatchError(f"the saved weights hold {extra[0]!r}, which the pruned model "
                                "does not have")
