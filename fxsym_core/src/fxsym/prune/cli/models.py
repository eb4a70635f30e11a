"""What a command's MODEL names, checked before torch is imported where it can be: a
``SOURCE:NAME`` spec (:func:`load_model`), a directory written by ``fxsym prune`` (rebuilt from
the ``torchvision:``/``timm:`` spec it records, :func:`load_saved`: nothing unpickled, no code
it names imported) or a checkpoint directory (:func:`is_checkpoint_dir`); and the example
inputs the model is analyzed with (``--input-shape``, those it came with, or a 224x224 image).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .failure import CliError, _one_line

if TYPE_CHECKING:
    from torch import nn


def load_model(spec: str) -> nn.Module:
    """``torchvision:resnet50``, ``timm:resnet18`` or ``package.module:factory`` (a module
    instance, or a callable returning one when called without arguments); a directory written
    by ``fxsym prune`` is :func:`load_saved`'s."""
    from torch import nn

    check_spec(spec)
    source, _, name = spec.partition(":")
    try:
        if source == "torchvision":
            import torchvision

            vision_model: nn.Module = torchvision.models.get_model(name, weights=None)
            return vision_model
        if source == "timm":
            import timm

            return timm.create_model(name, pretrained=False)
        obj: Any = importlib.import_module(source)
        for part in name.split("."):
            obj = getattr(obj, part)
    except ModuleNotFoundError as exc:
        hint = ("; is the directory holding it on PYTHONPATH? (the fxsym command does not "
                "look in the current directory: PYTHONPATH=. fxsym ...)") if exc.name and (
            source == exc.name or source.startswith(f"{exc.name}.")) else ""
        raise CliError(f"cannot load {spec}: {_one_line(exc)}{hint}") from exc
    except Exception as exc:
        raise CliError(f"cannot load {spec}: {_one_line(exc)}") from exc
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise CliError(f"{spec} is a {type(obj).__name__}, not a model or a model factory")
    try:
        model = obj()
    except Exception as exc:
        raise CliError(f"{spec} is not a model factory: calling it without arguments "
                       f"failed: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise CliError(f"{spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def check_spec(spec: str) -> None:
    """A model spec is ``SOURCE:NAME``, both given (checked before anything is imported)."""
    source, _, name = spec.partition(":")
    if not source or not name:
        raise CliError(f"MODEL must look like 'torchvision:resnet50' or "
                       f"'package.module:factory' (or name a directory), got {spec!r}")


#: model sources a saved directory may name: rebuilding one runs no code from the directory
SAFE_SOURCES = ("torchvision", "timm")


def is_saved_dir(spec: str) -> bool:
    """Whether ``spec`` names a directory written by ``fxsym prune`` / ``fxsym.save``."""
    from ..persist import is_saved

    return is_saved(spec)


def _load(spec: str) -> tuple[nn.Module, Any, dict[str, Any] | None]:
    """The model ``spec`` names, the example inputs it comes with and its manifest: a saved
    directory's (:func:`load_saved`), else ``None`` and ``None``."""
    from ..console import status

    if is_saved_dir(spec):
        return load_saved(spec)
    with status(f"loading {spec}"):
        return load_model(spec).eval(), None, None


def _example_inputs(input_shape: str | None, inputs: Any, source: str | None) -> Any:
    """``--input-shape`` if given, else the inputs the model came with, else a 224x224 image
    for a ``torchvision:``/``timm:`` model, else ``None`` (the plugins' defaults)."""
    import torch

    if input_shape:
        return (torch.randn(*_input_shape(input_shape)),)
    if inputs is None and source and source.partition(":")[0] in SAFE_SOURCES:
        return (torch.randn(1, 3, 224, 224),)
    return inputs


def load_saved(path: str) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The model of a saved directory: built again from the ``torchvision:``/``timm:`` spec it
    records, its plans replayed, its weights loaded (JSON and safetensors: nothing is
    unpickled, no code named by the directory is imported); with the example inputs of its
    last plan and its manifest."""
    from ..console import status
    from ..persist import load, read_manifest
    from ..planning import inputs_from_spec

    manifest = read_manifest(path)
    source = manifest["source"]
    if not isinstance(source, str) or not _registered(source):
        raise CliError(f"{path} records no torchvision:NAME or timm:NAME model to rebuild "
                       f"(source: {source!r}); build the model in Python and call "
                       f"fxsym.load(model, {path!r})")
    model = load_model(source).eval()
    with status(f"replaying the plan of {path}"):
        load(model, path)
    return model, inputs_from_spec(manifest["plan"].inputs), manifest


def _registered(source: str) -> bool:
    """Whether ``source`` is ``torchvision:NAME`` or ``timm:NAME`` with a NAME its library
    registers: building it fetches nothing and reads no file (a saved directory's
    ``timm:hf-hub:...`` would contact the Hub, ``timm:local-dir:/path`` read any path)."""
    lib, _, name = source.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        return False
    if lib == "torchvision":
        import torchvision

        return name in torchvision.models.list_models()
    if lib == "timm":
        import timm

        return bool(timm.is_model(name))
    return False


def _input_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: integers separated by commas."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise CliError(f"--input-shape must be integers separated by commas, like "
                       f"1,3,224,224; got {text!r}") from exc


def is_checkpoint_dir(spec: str) -> bool:
    """Whether ``spec`` is a directory to prune as a checkpoint (:func:`fxsym.prune_checkpoint`):
    one holding a ``config.json``, or any directory not written by ``fxsym.save``."""
    path = Path(spec)  # fxsym.save's manifest named here: no torch imported before a usage error
    return path.is_dir() and ((path / "config.json").is_file()
                              or not (path / "fxsym.json").is_file())
