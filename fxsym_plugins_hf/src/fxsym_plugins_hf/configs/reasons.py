"""Why a config cannot describe the resized model, said to the user (:func:`undescribed`: a
size that differs between modules, a value the config's own checks refuse, or a value alike
everywhere that a model built from the config has otherwise, with the changed fields it
follows), and whether a model built from it would still hold every resized weight at its
shape (:func:`weights_fit`: then the fields keep their old values, so ``from_pretrained``
refuses the checkpoint instead of loading another model).

Imports from the plugin: configs.builds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from .builds import meta_build


def weights_fit(model: nn.Module, config: Any) -> bool:
    """Whether a model of ``model``'s class built from ``config`` (on the meta device) holds
    every parameter of ``model`` at its shape: then ``save_pretrained`` and ``from_pretrained``
    would load the weights into it without a word."""
    built = meta_build(model, config)
    if built is None:
        return False
    theirs = dict(built.named_parameters(remove_duplicate=False))
    return all(n in theirs and theirs[n].shape == p.shape
               for n, p in model.named_parameters(remove_duplicate=False))


def undescribed(model: nn.Module, before: Any, new: Any, changed: list[str],
                nonuniform: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the config ``new`` cannot describe, one phrase per entry of ``nonuniform``, from
    what the probes found: a size that differs between modules, a value the config's own
    checks refuse, or a value alike everywhere that a model built from ``new`` has otherwise
    (and the changed fields it follows when the model is built: ``before``'s value of each
    put back in turn)."""
    fresh = meta_build(model, new)
    built = {} if fresh is None else dict(fresh.named_modules())
    cls = type(model).__name__
    out: list[str] = []
    for key, where in nonuniform.items():
        places = list(where.items())
        if "" in where:
            out.append(f"{key} {_shown(where[''])}: {type(new).__name__}'s own checks refuse it")
            continue
        more = f" and {len(places) - 2} more" if len(places) > 2 else ""
        first: dict[str, str] = {}  # each value, where it is first
        for m, v in places:
            first.setdefault(_shown(v), m)
        if len(first) > 1:
            out.append(f"{key} differs between modules ("
                       + ", ".join(f"{v} in {m}" for v, m in list(first.items())[:3])
                       + (", ..." if len(first) > 3 else "") + ")")
            continue
        (module, value), shown = places[0], ", ".join(m for m, _ in places[:2]) + more
        own = _built_value(built, module, key)
        if own is None:
            out.append(f"{key} is {_shown(value)} in {shown}, which no field of the config "
                       "gives")
            continue
        follows = [f for f in changed if _built_value(_rebuilt(model, new, f, before), module,
                                                      key) not in (None, own)]
        out.append(f"{key} is {_shown(value)} in {shown}, but a {cls} built from the config "
                   f"has {_shown(own)}" + (f" (it follows {', '.join(follows)} when the "
                                            "model is built)" if follows else ""))
    return out


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _rebuilt(model: nn.Module, config: Any, field: str, before: Any) -> dict[str, nn.Module]:
    """The modules of the model built from ``config`` with ``field`` as in ``before``."""
    probe = copy.deepcopy(config)
    setattr(probe, field, getattr(before, field))
    fresh = meta_build(model, probe)
    return {} if fresh is None else dict(fresh.named_modules())


def _built_value(built: Mapping[str, nn.Module], module: str, key: str) -> Any:
    """``key`` (an attribute, or ``"<tensor>.shape"``) of ``module`` in a built model;
    ``None`` where it has none."""
    mod = built.get(module)
    if mod is None:
        return None
    if key.endswith(".shape"):
        name = key.removesuffix(".shape")
        tensors = {**dict(mod.named_parameters(recurse=False)),
                   **dict(mod.named_buffers(recurse=False))}
        return list(tensors[name].shape) if name in tensors else None
    return vars(mod).get(key)
