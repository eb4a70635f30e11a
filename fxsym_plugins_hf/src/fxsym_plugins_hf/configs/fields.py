"""The config fields that hold sizes, and what a traced model reads of its config.

:data:`FIELDS`: what a config field sizes -> the names families give it, found on a config
through its ``attribute_map`` (:func:`size_fields`; a field named ``encoder_*``/``decoder_*``
counts only the modules of that stack, :func:`field_scope`). :data:`NONUNIFORM` is the
config attribute recording sizes the config cannot hold as one value, :data:`UNPRUNED` the
model attribute holding the config the model had before fxsym first resized it.
:func:`attributes_read` gives the module attributes the traced ``forward`` reads, and
:func:`read_fields` the config fields among them (only the resize itself may change those).

Imports from the plugin: nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the config attribute that records sizes the config cannot hold as one value
NONUNIFORM = "fxsym_nonuniform"
#: the model attribute holding the config the model had before fxsym first resized it
UNPRUNED = "_fxsym_unpruned_config"

#: what a config field sizes -> the names families give it (canonical name first)
FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "n_embed"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads",
                            "encoder_attention_heads", "decoder_attention_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim", "d_kv", "kv_channels"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim",
                          "encoder_ffn_dim", "decoder_ffn_dim", "ffn_hidden_size"),
    "embedding_size": ("embedding_size", "word_embed_proj_dim"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
}


Sizes = Mapping[tuple[str, str], tuple[int, int]]


def size_fields(config: Any, names: tuple[str, ...]) -> list[str]:
    """The config's own attributes among ``names`` (``attribute_map`` aliases followed),
    once each."""
    aliases: Mapping[str, str] = getattr(config, "attribute_map", {}) or {}
    out: list[str] = []
    for name in names:
        real = aliases.get(name, name)
        if real in vars(config) and real not in out:
            value = vars(config)[real]
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                out.append(real)
    return out


def field_scope(field: str) -> str | None:
    """The stack a field is about (``encoder_ffn_dim``: the encoder's), or ``None``."""
    prefix = field.partition("_")[0]
    return prefix if prefix in ("encoder", "decoder") else None


def old_value(config: Any, field: str | None) -> int | None:
    value = getattr(config, field, None) if field else None
    return value if isinstance(value, int) else None


def derived_mlp(config: Any) -> int | None:
    """Four times the hidden size: the MLP width GPT-2 and its relatives derive from an
    intermediate field left ``None``."""
    hidden_fields = size_fields(config, FIELDS["hidden_size"])
    hidden = old_value(config, hidden_fields[0] if hidden_fields else None)
    return None if hidden is None else 4 * hidden


def attributes_read(symmap: Any) -> frozenset[str]:
    """The qualified names of the module attributes the model's ``forward`` is known to read:
    the ``get_attr`` targets of the traced graph (parameters, buffers, the int attributes read
    as sizes) and the attributes each leaf's SymInfo declares (a leaf's ``num_heads``)."""
    read: set[str] = set()
    graph = getattr(symmap, "graph", None)  # not graph_module: that generates its code
    if graph is not None:
        read.update(str(n.target) for n in graph.nodes if n.op == "get_attr")
    if hasattr(symmap, "named_modules"):
        for name, mod in symmap.named_modules():
            read.update(f"{name}.{attr}".lstrip(".")
                        for attr in symmap.sym_info(mod).attributes)
    return frozenset(read)


def read_fields(read: frozenset[str]) -> set[str]:
    """The config fields a traced ``forward`` reads at run time (``attn.config.num_heads``):
    changing one changes what the resized model computes, so only the resize itself may."""
    return {f".{t}".rpartition(".config.")[2] for t in read if f".{t}".count(".config.") == 1}
