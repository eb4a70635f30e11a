"""A pruned Hugging Face model saved as a checkpoint its ecosystem reads correctly.

:func:`fxsym.save` of a transformers model writes, beside the weights (``model.safetensors``,
which ``from_pretrained`` reads) and ``fxsym.json``, what ``save_pretrained`` writes besides
its weights (the ``fxsym_save_files`` hook, :func:`save_files`):

* when ``model.config`` describes the pruned model (every uniform plan the config can express):
  that config as ``config.json`` (with ``architectures``, as ``save_pretrained`` sets it) and
  ``generation_config.json``: a plain checkpoint, read by ``from_pretrained`` and every other
  reader of ``config.json``;
* when it cannot (sizes that differ between layers, ``config.fxsym_nonuniform``): a
  ``config.json`` of a model type and architecture of fxsym's own (``fxsym_pruned``,
  ``FxsymPruned<Class>``), so that no reader mistakes it for the original and every reader
  that does not know it fails, plus ``fxsym_pruned.py`` (:mod:`.remote_loader`), which its
  ``auto_map`` names. The config holds the sizes explicitly: ``pruned_config`` (the model's
  config, whose ``fxsym_nonuniform`` gives each module's size where they differ; without a
  ``model_type``, so that a config class looking for its own type among nested configs does
  not take it) and ``unpruned_config`` with ``model_class`` (a reader of the original type that
  takes this nested config builds the unpruned model, which the weights do not fit), from
  which :func:`load_pretrained` (what
  ``AutoModelFor...from_pretrained(directory, trust_remote_code=True)`` calls through
  ``fxsym_pruned.py``) builds the unpruned model, replays the plan and loads the weights
  (:func:`fxsym.load`).

The unpruned config is the one the model had before fxsym first resized it, which the config
update records on the model (:data:`UNPRUNED`, see :mod:`.configs`).

Loading builds only transformers' own classes, named by the file and checked to be
``PreTrainedModel`` subclasses of the ``transformers`` package, from configs of a model type
transformers knows; the directory's own code is never imported by it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from .configs import NONUNIFORM, UNPRUNED

#: the model type and the module name of a checkpoint whose config cannot describe the model
MODEL_TYPE = "fxsym_pruned"
MODULE = "fxsym_pruned"
#: the auto classes whose mapping is looked up for the model's class (``auto_map`` entries)
AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM",
                "AutoModelForSeq2SeqLM", "AutoModelForSequenceClassification",
                "AutoModelForTokenClassification", "AutoModelForQuestionAnswering",
                "AutoModelForImageClassification")


def save_files(model: nn.Module) -> dict[str, bytes] | None:
    """``{file name: contents}`` for a save of ``model`` (``None`` for a model that is not a
    transformers ``PreTrainedModel``)."""
    import transformers

    if not isinstance(model, transformers.PreTrainedModel):
        return None
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.dtype = str(model.dtype).removeprefix("torch.")
    files: dict[str, bytes] = {}
    generation = getattr(model, "generation_config", None)
    if model.can_generate() and generation is not None:
        files["generation_config.json"] = generation.to_json_string(use_diff=True).encode()
    if not getattr(config, NONUNIFORM, None):
        files["config.json"] = config.to_json_string(use_diff=True).encode()
        return files
    unpruned = vars(model).get(UNPRUNED)
    if unpruned is None:
        raise ValueError(f"{type(model).__name__}.config cannot describe the pruned model and "
                         "the config it had before fxsym resized it is unknown")
    base = copy.deepcopy(unpruned)
    base.architectures = [type(model).__name__]
    auto = {name: f"{MODULE}.FxsymPrunedModel" for name in _auto_classes(model)}
    data = {
        "model_type": MODEL_TYPE,
        "architectures": [f"FxsymPruned{type(model).__name__}"],
        "auto_map": {"AutoConfig": f"{MODULE}.FxsymPrunedConfig", **auto},
        "model_class": type(model).__name__,
        "unpruned_config": _json(base),
        "pruned_config": {k: v for k, v in _json(config).items() if k != "model_type"},
        "transformers_version": transformers.__version__,
    }
    files["config.json"] = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
    files[f"{MODULE}.py"] = (Path(__file__).with_name("remote_loader.py")).read_bytes()
    return files


def _json(config: Any) -> dict[str, Any]:
    """``config`` as ``save_pretrained`` writes it (the fields that differ from the class's
    defaults; infinities and NaNs encoded as transformers encodes them)."""
    data: dict[str, Any] = json.loads(config.to_json_string(use_diff=True))
    data.pop("transformers_version", None)
    return data


def _auto_classes(model: nn.Module) -> list[str]:
    """The auto classes whose mapping gives ``model``'s class for its config class."""
    import transformers

    out = []
    for name in AUTO_CLASSES:
        mapping = getattr(getattr(transformers, name, None), "_model_mapping", None)
        try:
            found = mapping[type(model.config)] if mapping is not None else None
        except KeyError:
            continue
        if found is type(model):
            out.append(name)
    return out


def loading_note(directory: Path) -> str:
    """How the checkpoint :func:`save_files` wrote into ``directory`` loads, in one or two
    sentences for the command line: a plain checkpoint of its architecture, or one of
    :data:`MODEL_TYPE` (read from its ``config.json``)."""
    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return f"load it with fxsym.load(model, {str(directory)!r})"
    if data.get("model_type") != MODEL_TYPE:
        arch = (data.get("architectures") or ["the model's class"])[0]
        auto = _auto_class_of(str(arch), data.get("model_type"))
        return (f"{directory} is a checkpoint of {arch} whose config.json gives the pruned "
                f"sizes: load it with {auto}.from_pretrained({str(directory)!r}) (the plan is "
                "in fxsym.json)")
    named = [k for k in data.get("auto_map") or {} if k != "AutoConfig"]
    auto = named[0] if named else "AutoModel"
    pruned = data.get("pruned_config")
    what = pruned.get(NONUNIFORM) if isinstance(pruned, dict) else None
    which = (f" ({', '.join(map(str, what))}: the plan's notes say why)"
             if isinstance(what, dict) else "")
    return (f"{directory} is an fxsym checkpoint (model type {MODEL_TYPE}): its config cannot "
            f"describe the pruned model{which}, so no reader mistakes it for a "
            f"{data.get('model_class')}; load "
            f"it with {auto}.from_pretrained({str(directory)!r}, trust_remote_code=True) (its "
            f"{MODULE}.py calls the installed fxsym) or with fxsym.load(model built from "
            "unpruned_config, directory)")


def _auto_class_of(arch: str, model_type: object) -> str:
    """The first auto class whose mapping gives the transformers class named ``arch`` for the
    config class of ``model_type``. Only that config's entry is looked up (one model module
    imported): the mappings' values import every model module transformers has, which took
    longer than the whole prune of a 135M checkpoint."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type] if isinstance(model_type, str) else None
    except KeyError:
        config_class = None
    if config_class is None:
        return f"transformers.{arch}"
    for name in AUTO_CLASSES:
        mapping = getattr(getattr(transformers, name, None), "_model_mapping", None)
        try:
            found = mapping[config_class] if mapping is not None else None
        except Exception:
            continue
        if getattr(found, "__name__", None) == arch:
            return name
    return f"transformers.{arch}"


def load_pretrained(directory: str | os.PathLike[str], config: Any = None,
                    **kwargs: Any) -> nn.Module:
    """The pruned model of a checkpoint :func:`save_files` wrote for a config that cannot
    describe it: the unpruned model built from ``unpruned_config`` (a transformers class),
    the plan of ``fxsym.json`` replayed, the weights loaded (the model built in the dtype they
    were saved in); in eval mode, of ``dtype`` if given. ``config`` is the checkpoint's config
    as transformers read it (else ``config.json`` is read); other keyword arguments of
    ``from_pretrained`` are ignored."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import fxsym

    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"{directory}: an fxsym-pruned checkpoint loads from a local directory")
    data = (config.to_dict() if config is not None
            else json.loads((path / "config.json").read_text(encoding="utf-8")))
    if data.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{directory} is not a checkpoint of model type {MODEL_TYPE!r}")
    unpruned, class_name = data.get("unpruned_config"), data.get("model_class")
    if not isinstance(unpruned, dict) or unpruned.get("model_type") not in CONFIG_MAPPING:
        raise ValueError(f"{directory}: config.json has no unpruned_config of a model type "
                         "this transformers knows")
    cls = getattr(transformers, class_name, None) if isinstance(class_name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and cls.__module__.startswith("transformers.")):
        raise ValueError(f"{directory}: model_class {class_name!r} is not a transformers model")
    base = CONFIG_MAPPING[unpruned["model_type"]].from_dict(unpruned)
    model: nn.Module = cls(base)
    pruned = data.get("pruned_config")
    stored = getattr(torch, str(pruned.get("dtype")), None) if isinstance(pruned, dict) else None
    if isinstance(stored, torch.dtype):  # the weights' dtype (fxsym.load never casts)
        model.to(stored)
    fxsym.load(model, path)
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        model.to(dtype)
    return model.eval()
