"""Models built from a config on the meta device, and what they hold.

:func:`meta_build` builds a model of a model's class from a config (a transformers config
object, or a diffusers mapping) on the meta device, remembered within a run of the workflow
(:func:`fxsym.memo.remembered`) and with no weight initialiser run
(:func:`..metainit.no_meta_init`); every probe of the config modules builds with it. What a
build shows: its tensor shapes (:func:`tensor_shapes`, :func:`meta_shapes`), its modules' int
attributes (:func:`meta_modules`), its attention layouts (:func:`attention_layouts`), whether
the config class's own checks accept a config (:func:`config_accepted`), and what a model
built from a config holds differently from the resized model (:func:`config_differences`,
:func:`differences_from`: the check of every config written).

Imports from the plugin: attention, metainit.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch import nn

from fxsym.memo import remembered

from ..attention import current_layout
from ..metainit import no_meta_init


def config_accepted(config: Any) -> bool:
    """Whether the config class's own checks accept ``config`` (``save_pretrained`` runs
    them)."""
    validate = getattr(config, "validate", None)
    if validate is None:
        return True
    try:
        validate()
    except Exception:  # any failing check: huggingface_hub wraps each in its own error type
        return False
    return True


def meta_build(model: nn.Module, config: Any) -> nn.Module | None:
    """A model of ``model``'s class built from ``config`` on the meta device: a transformers
    config object is passed to the class, a mapping (a diffusers config) to its
    ``from_config``. ``None`` if it cannot be built (a config the class's own checks refuse,
    or a class that cannot be built on meta). The probes of every config module (fields,
    depth, diffusers fields) build with this.

    Inside a run of the workflow (:func:`fxsym.memo.remembering`: a checkpoint prune, a
    search) a config equal to one built before in the run (the class, the default dtype and
    the config's pickled state alike) gives the model built then: a search probes the same
    few configs for every candidate. The model may be shared, so callers read it and never
    change it."""
    return remembered("meta_build", _build_key(model, config),
                      lambda: _meta_build(model, config))


def _build_key(model: nn.Module, config: Any) -> Hashable | None:
    """What a meta build reads: the class, the default dtype and the config's state; ``None``
    (never remembered) where the config cannot be pickled."""
    try:
        state = pickle.dumps(dict(config) if isinstance(config, Mapping) else config)
    except Exception:  # a config holding something pickle refuses: built every time
        return None
    return (type(model), torch.get_default_dtype(), state)


def _meta_build(model: nn.Module, config: Any) -> nn.Module | None:
    try:
        with torch.device("meta"), no_meta_init(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = (type(model).from_config(dict(config))  # type: ignore[attr-defined]
                     if isinstance(config, Mapping) else type(model)(config))
    except Exception:  # a config the class refuses, or a class that cannot be built on meta
        return None
    return built if isinstance(built, nn.Module) else None


def meta_modules(model: nn.Module, config: Any) -> dict[str, dict[str, int]] | None:
    """The int attributes of every module of :func:`meta_build`'s model, by module
    qualname; ``None`` if it cannot be built."""
    fresh = meta_build(model, config)
    if fresh is None:
        return None
    return {name: {k: v for k, v in vars(mod).items() if type(v) is int and not k.startswith(
        "_")} for name, mod in fresh.named_modules()}


def tensor_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter and buffer of ``model`` by qualified name (each place of a shared
    one): its shape."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {name: tuple(t.shape) for name, t in named}


def meta_shapes(model: nn.Module, config: Any) -> dict[str, tuple[int, ...]] | None:
    """:func:`tensor_shapes` of :func:`meta_build`'s model; ``None`` if it cannot be built."""
    fresh = meta_build(model, config)
    return None if fresh is None else tensor_shapes(fresh)


def attention_layouts(model: nn.Module) -> dict[str, tuple[int, int, int, int]]:
    out: dict[str, tuple[int, int, int, int]] = {}
    for name, mod in model.named_modules():
        layout = current_layout(mod)
        if layout is not None:
            out[name] = layout
    return out


def config_differences(model: nn.Module, config: Any, read: frozenset[str] = frozenset()
                 ) -> dict[str, dict[str, Any]]:
    """What a model of ``model``'s class built from ``config`` (on the meta device, no
    weights) holds differently from ``model``: ``{name: {module qualname: value in model}}``
    for float attributes (a ``scaling`` of ``1/sqrt(head_dim)`` computed from the old
    ``head_dim``), for int and int-tuple attributes the traced ``forward`` reads (``read``:
    T5's ``model_dim`` in its output scale; one a resize leaves stale and nothing reads, such
    as ``mlp.intermediate_size``, does not count), and for parameter and buffer shapes
    (``"<name>.shape"``); empty if it cannot be built."""
    try:
        with torch.device("meta"):
            fresh = type(model)(config)
    except Exception:  # a class that cannot be built on meta: nothing to compare with
        return {}
    return differences_from(model, fresh, read)


def differences_from(model: nn.Module, fresh: nn.Module, read: frozenset[str] = frozenset()
                     ) -> dict[str, dict[str, Any]]:
    """What ``fresh`` (a model of ``model``'s class built from a config on the meta device)
    holds differently from ``model``, as :func:`config_differences` says."""
    out: dict[str, dict[str, Any]] = {}
    built = dict(fresh.named_modules())
    for name, mod in model.named_modules():
        other = built.get(name)
        if other is None:
            continue
        theirs = vars(other)
        for attr, value in vars(mod).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, float):
                if not isinstance(theirs.get(attr), float) or abs(theirs[attr] - value) > (
                        1e-6 * max(1.0, abs(value))):
                    out.setdefault(attr, {})[name] = value
            elif (isinstance(value, (int, tuple)) and f"{name}.{attr}".lstrip(".") in read
                  and theirs.get(attr) != value):
                out.setdefault(attr, {})[name] = value
        tensors = dict(other.named_parameters(recurse=False))
        tensors.update(other.named_buffers(recurse=False))
        for pname, t in [*mod.named_parameters(recurse=False),
                         *mod.named_buffers(recurse=False)]:
            if pname in tensors and tensors[pname].shape != t.shape:
                out.setdefault(f"{pname}.shape", {})[name] = list(t.shape)
    return out
