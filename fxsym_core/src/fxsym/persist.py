"""``fxsym.save`` / ``fxsym.load``: a pruned model as safetensors weights plus its plan.

A saved directory holds two files and nothing executable:

* ``model.safetensors``: the state dict (a tensor shared by several names stored once);
* ``fxsym.json``: the :class:`~fxsym.planning.Plan`, the names sharing a stored tensor, and
  how to build the unpruned model again when the caller said so (``source``, e.g. the
  ``torchvision:resnet18`` spec of the command line; a library never runs it by itself).

Loading replays the plan on a freshly built model of the same architecture: analyze it with
example inputs of the recorded shapes, check the plan fits (:meth:`Plan.check
<fxsym.planning.Plan.check>`), check every parameter's shape after the plan against the file's,
resize, then load the weights with ``strict=True``. Any misfit raises
:class:`~fxsym.errors.PlanMismatchError` naming the first difference, and the fresh model is
left as it was (the resize is all or nothing; a state-dict misfit found after it puts the
module tree back). Nothing is ever unpickled: JSON and safetensors only.

Imports from fxsym: analysis, errors, modstate, planning, symbols.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .analysis import analyze
from .errors import PlanError, PlanMismatchError
from .modstate import ModuleTreeState
from .planning import Plan, inputs_from_spec
from .symbols import SymMap

__all__ = ["MANIFEST", "WEIGHTS", "is_saved", "load", "read_manifest", "save"]

#: the file names inside a saved directory
MANIFEST = "fxsym.json"
WEIGHTS = "model.safetensors"
FORMAT = 1


def save(model: nn.Module, directory: str | os.PathLike[str], plan: Plan, *,
         source: str | None = None) -> Path:
    """Write ``model`` (pruned by ``plan``) to ``directory``: safetensors weights and
    ``fxsym.json``. ``source`` records how to build the unpruned model (free text for the
    caller, e.g. ``"timm:resnet18"``; the command line rebuilds from it). Raises
    :class:`~fxsym.errors.PlanError` if the model's parameters do not have the plan's shapes
    (the plan was not applied). Returns the directory."""
    from safetensors.torch import save_file

    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, shape in plan.shapes.items():
        if shapes.get(name) != tuple(shape):
            raise PlanError(f"the model does not have the plan's shapes ({name}: "
                            f"{shapes.get(name)} vs {tuple(shape)}); apply the plan first")
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
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(out / WEIGHTS), metadata={"format": "pt", "producer": "fxsym"})
    manifest = {"fxsym": FORMAT, "source": source, "aliases": aliases, "plan": plan.to_dict()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return out


def is_saved(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` looks like what :func:`save` writes."""
    path = Path(directory)
    return path.is_dir() and (path / MANIFEST).is_file()


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``fxsym.json`` of a saved directory, checked: ``source``, ``aliases`` and ``plan``
    (a :class:`~fxsym.planning.Plan`)."""
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
    return {"source": data.get("source"), "aliases": {str(k): str(v) for k, v in aliases.items()},
            "plan": Plan.from_dict(data.get("plan"))}


def load(model: nn.Module, directory: str | os.PathLike[str], *, example_inputs: Any = None,
         symmap: SymMap | None = None) -> nn.Module:
    """Replay the saved plan on ``model`` (freshly built, unpruned) and load the saved weights
    into it (``strict=True``); return it.

    The model is analyzed with example inputs of the shapes recorded in the plan (or
    ``example_inputs``; or pass its ``symmap``). A plan that does not fit raises
    :class:`~fxsym.errors.PlanMismatchError` naming the first mismatch; the model is then as
    it was.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    manifest = read_manifest(directory)
    plan: Plan = manifest["plan"]
    weights = Path(directory) / WEIGHTS
    try:
        with safe_open(str(weights), framework="pt") as f:
            file_shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:
        raise PlanError(f"cannot read {weights}: {exc}") from exc
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if kind != plan.model:
        raise PlanMismatchError(f"the plan is for a {plan.model}, the model is a {kind}")
    if symmap is None:
        inputs = example_inputs if example_inputs is not None else inputs_from_spec(plan.inputs)
        symmap = analyze(model, example_inputs=inputs,
                         outputs=None if plan.outputs is None else list(plan.outputs))
    plan.check(model, symmap)
    _check_shapes(model, plan, file_shapes, manifest["aliases"])
    saved = ModuleTreeState(model)
    plan.apply(model, symmap)
    try:
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
