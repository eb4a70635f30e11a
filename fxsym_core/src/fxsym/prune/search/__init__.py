"""Targets: explicit architecture sizes, and the search for a parameter target (issue 22 §4).

**Roles** (:func:`fxsym.prune.roles.roles`). A size such as "the hidden size" or "the FFN width" is
mapped to groups by the roles the plugins declare (``fxsym_roles``): this package names none. A
role's kind says how it is used here: the *stream* role (one size for all its groups: the hf
plugin's ``hidden``), *width* roles (sized by the search, each of its width classes from its
own range: the hf plugin's ``ffn``, ``expert_ffn``, ``shared_ffn``), *counts* sized only when
asked (``heads``, ``experts``) and groups no size names; *layers* are the depth group's
blocks. So ``--hidden 3072 --ffn 9216 --heads 24 --kv-heads 8 --layers 28``
(:func:`sizes_for`, :mod:`.sizes`) keeps 3072 stream channels, 9216 units in every dense FFN
group, 8 key/value heads and 24 / 8 queries per key/value head in every attention (the hf
plugin's size rule of ``heads`` and ``kv_heads``), and 28 blocks. A size no group holds, or a
name no plugin declares, is an error.

**Search** (:func:`search`, :mod:`.run`): for a parameter target, a small space of *uniform*
candidates (every group of a role keeps the same size: :func:`candidates`, :mod:`.space`): a
few depths (all blocks, then 7/8, 3/4, 5/8 and 1/2 of them) times a few sizes of the stream
role (the same fractions, rounded down to a multiple of ``round_to``), each with the widest
widths of the width roles that meet the target (one fraction for every width class, each
class's width that fraction of its own, rounded down to its step and ``round_to``); the counts
stay whole. A candidate lands as close under the target as the steps allow (one further under
is not offered, see :func:`candidates`); a target above the model's (active) parameters is an
error; the kept plan records the target and the count reached (``extra["target"]``). Each
candidate is planned (blocks by block importance, units by ``importance``), applied to a copy
and scored by its loss on the calibration batches: the loss a plugin gives
(``fxsym_batch_loss``, :func:`batch_loss`: the hf plugin's next-token cross-entropy where the
model returns ``logits`` for ``input_ids``), else the mean squared error to the unpruned
model's output (:mod:`.losses`); only the ``shortlist`` candidates of lowest damage
(:mod:`fxsym.prune.shortlist`: estimated from the importance scores and block importance the
calibration already gave) are scored so, the others ranked by that estimate alone. The table
lists every candidate, its damage, its loss or "not scored" (:mod:`.results`); the plan of the
lowest loss is kept (Minitron's architecture search, in miniature: no distillation). The
candidates are counted from the parameters' metadata (:func:`candidates`, on a meta model
too); a checkpoint directory scores them by streaming instead of running a copy
(``evaluate_all``: :func:`fxsym.prune.checkpoint.stream_losses`).

*Non-embedding* parameters (``non_embedding=True``) are every parameter but the embedding
tables (tied to the head or not: :func:`fxsym.prune.embeddings.embedding_tables`), the count
model cards quote. *Active* parameters (``active=True``, :func:`active_params`,
:mod:`.active`) are those a token uses: every parameter but those only looked up, and of a MoE
layer's expert tensors only the share a router picks. The experts of each MoE layer are a
count role of the hf plugin, ``experts``, sized only when asked (:func:`sizes_for`); the
search keeps them (fewer experts lower the active count by the router's rows only).

The package's modules import one another downward in this order: ``sizes``, ``active``,
``results``, ``space``, ``losses``, ``run`` (``tests/test_layering.py`` checks it); this
``__init__`` only gives their public names.

Imports from fxsym: console, depth, embeddings, errors, importance, memo, paramlayout,
planning, plugins, roles, shortlist, symbols.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..roles import Roles, group_sources, roles
from .active import active_params, picked_shares
from .losses import batch_loss
from .results import Candidate, SearchResult, table, target_record
from .run import search
from .sizes import sizes_for
from .space import FRACTIONS, candidates

__all__ = ["FRACTIONS", "Candidate", "Roles", "SearchResult", "active_params", "batch_loss",
           "candidates", "group_sources", "picked_shares", "roles", "search", "sizes_for",
           "table", "target_record"]

#: the package's old public names, each kept as a deprecated alias: ``{old name: (what to use
#: instead, the value)}``; read by ``__getattr__`` with a ``DeprecationWarning``
DEPRECATED: dict[str, tuple[str, Callable[[], Any]]] = {
    "expert_shares": ("fxsym.prune.search.picked_shares", lambda: picked_shares),
    "next_token_loss": ("fxsym.prune.search.batch_loss (the plugins' fxsym_batch_loss) or "
                        "fxsym_plugins_hf.loss.next_token_loss", lambda: batch_loss),
}


def __getattr__(name: str) -> Any:
    if name in DEPRECATED:
        use, value = DEPRECATED[name]
        warnings.warn(f"fxsym.prune.search.{name} is deprecated: use {use}",
                      DeprecationWarning, stacklevel=2)
        return value()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
