"""``model.config`` after :func:`fxsym.resize` (the ``fxsym_after_resize`` hook).

A Hugging Face model is rebuilt from its config (``from_pretrained``, ``from_config``), so after
a resize the config must describe the resized model. :func:`update_config` (:mod:`.update`)
reads the sizes from the resized modules, not from the groups chosen, so any resize (heads,
``head_dim``, hidden size, MLP) is seen the same way (:mod:`.measuring`: attention layouts,
the dims that follow a field when the model is built on the meta device, :mod:`.prober`,
attention traced through, the input embeddings).

Where a model built from the config so updated still holds other parameter shapes, any other
int field whose value was the old length of a dimension the resize changed (DeBERTa's
``pooler_hidden_size``) is measured where it sizes something (:mod:`.inferred`); a family
deriving ``head_dim`` from ``hidden // heads`` but reading a ``head_dim`` attribute of its
config first is given one where the model built from the config then matches.

A config the class's own checks refuse (Llama's ``hidden_size`` 39 with 4 heads of
``head_dim`` 16) cannot describe the model either: each field changed counts as one size for
the whole model (module ``""``).

Each config field that holds one of these sizes (:data:`FIELDS`, through the config's
``attribute_map``; a field named ``encoder_*``/``decoder_*`` counts only the modules of that
stack: :mod:`.fields`) is set where the size is alike in every module. Where it differs, or
where the config has no field for it and the value the family derives (``head_dim = hidden //
heads``, ``intermediate = 4 * hidden``) is not the measured one, the config says so in
:data:`NONUNIFORM`: ``{field: {module qualname: size}}`` (the field itself holds the largest
size), and a :class:`fxsym.ResizeWarning` names the fields (:mod:`.reasons`).

Such a config must not load a model as the original architecture: :func:`fxsym.save` writes
it as a checkpoint of fxsym's own model type, with the sizes per module and a loader
(:mod:`fxsym_plugins_hf.checkpoint`). Where the largest sizes would fail the config class's
own checks (``hidden_size`` a multiple of the heads), the fields keep their values from before
the resize, so the config can still be copied, validated and written. They keep them too
where a model built from the config would hold the resized weights (every parameter at its
shape) but compute something else (Gemma's embeddings scaled by ``sqrt`` of the new hidden
size, where the resized model keeps the old scale): transformers' own ``save_pretrained`` then
writes a checkpoint whose weights no model of that config fits, so ``from_pretrained`` refuses
it instead of loading another model.

The config is copied, never changed in place: every module holding the old config (or one of
its sub-configs) is given the copy, so a failing resize transaction restores the old one. A
copy of the config the model had before fxsym first resized it (the fields a resize wrote in
place put back) stays on the model as :data:`UNPRUNED` (removed with the module's other new
attributes if the resize fails): a checkpoint whose config cannot describe the model is loaded
by building that one and replaying the plan.

Every probe builds the model on the meta device through :func:`meta_build` (:mod:`.builds`,
remembered within a run). The package's modules import one another downward in this order:
``fields``, ``builds``, ``prober``, ``measuring``, ``inferred``, ``reasons``, ``update``
(``tests/test_layering.py`` checks it); this ``__init__`` only gives their public names.
"""

from __future__ import annotations

from .builds import (
    attention_layouts,
    config_accepted,
    config_differences,
    differences_from,
    meta_build,
    meta_shapes,
    tensor_shapes,
)
from .fields import FIELDS, NONUNIFORM, UNPRUNED, Sizes, attributes_read, size_fields
from .reasons import undescribed
from .update import update_config

__all__ = [
    "FIELDS",
    "NONUNIFORM",
    "UNPRUNED",
    "Sizes",
    "attention_layouts",
    "attributes_read",
    "config_accepted",
    "config_differences",
    "differences_from",
    "meta_build",
    "meta_shapes",
    "size_fields",
    "tensor_shapes",
    "undescribed",
    "update_config",
]
