"""The hf plugin's declarations, importing no torch (:mod:`fxsym.declarations`): the sizes a
request gives by a transformer's roles (``fxsym_size_options``), which the command line turns
into ``--hidden``, ``--ffn``, ``--expert-ffn``, ``--shared-ffn``, ``--heads``, ``--kv-heads``
and ``--experts``. Each is the name of a role :mod:`.roles` finds in a model (``kv_heads`` is
its size rule's name for the heads' groups, :func:`.roles.head_sizes`). Named under the
``fxsym.declarations`` entry-point group, so that ``fxsym prune --help`` lists the flags
without loading the plugin; the plugin's hook answers the same objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxsym.declarations import SizeOption

#: the sizes by role, in the order of the command line's help
SIZES = (
    SizeOption("hidden", "hidden size (the residual stream's width)"),
    SizeOption("ffn", "dense FFN width of every block (an MLP outside routed experts)"),
    SizeOption("expert_ffn", "FFN width of every routed expert (a MoE's "
               "moe_intermediate_size)"),
    SizeOption("shared_ffn", "FFN width of every shared expert (the MLP beside routed "
               "experts that every token uses)"),
    SizeOption("heads", "attention (query) heads of every block"),
    SizeOption("kv_heads", "key/value heads of every block"),
    SizeOption("experts", "MoE experts per layer (at least the number a router picks)"),
)


def fxsym_size_options() -> Sequence[SizeOption]:
    """The hf plugin's size options (the ``fxsym.declarations`` entry point's answer; the
    plugin's hook gives the same)."""
    return SIZES
