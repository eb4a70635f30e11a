"""Loads a Hugging Face checkpoint that fxsym pruned to sizes differing between layers.

This file is saved with such a checkpoint as ``fxsym_pruned.py`` (``auto_map`` in its
``config.json`` names the two classes below), so that
``AutoModelFor...from_pretrained(directory, trust_remote_code=True)`` returns the pruned model:
a model of the original transformers class, built from the unpruned config the checkpoint
records, with fxsym's plan replayed on it and the saved weights loaded. The work is done by
the installed ``fxsym-plugins-hf`` (``fxsym_plugins_hf.checkpoint``); this file holds no more
than the entry points transformers asks for.
"""

from types import ModuleType

from transformers import PreTrainedConfig

_fxsym: ModuleType | None
try:  # transformers checks the imports of this file; a missing fxsym is said below instead
    from fxsym_plugins_hf import checkpoint as _fxsym
except ImportError:
    _fxsym = None

MISSING = ("this checkpoint was pruned by fxsym to sizes that differ between layers; loading "
           "it needs fxsym: pip install fxsym fxsym-plugins-nn fxsym-plugins-hf")


class FxsymPrunedConfig(PreTrainedConfig):  # type: ignore[no-untyped-call]
    """The checkpoint's ``config.json``: the unpruned config, the class, the sizes per module."""

    model_type = "fxsym_pruned"


class FxsymPrunedModel:
    """What ``AutoModelFor...`` calls: ``from_pretrained`` returns the pruned model, an
    instance of the original transformers class (not of this one)."""

    config_class = FxsymPrunedConfig

    @classmethod
    def register_for_auto_class(cls, auto_class: object = "AutoModel") -> None:
        """Nothing to register: the model returned is of a transformers class."""

    @classmethod
    def from_pretrained(cls, directory: str, *args: object, config: object = None,
                        **kwargs: object) -> object:
        if _fxsym is None:
            raise ImportError(MISSING)
        return _fxsym.load_pretrained(directory, config=config, **kwargs)
