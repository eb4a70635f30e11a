"""Correctness oracles for an analysis (see DESIGN.md, "Correctness oracles").

* :func:`check_permutation` — permuting every sortable group's entries in all of its members
  at once must leave the model's outputs unchanged; on a mismatch each group is retried alone
  to name the culprit.
* :func:`check_shrink` — halving every group must give a model that runs, keeps its output
  shapes, and whose every member has the chosen size.
* :func:`check_values` — dropping units of a group must compute what the full model computes
  with those units zeroed where they are read (a conv's or linear's input columns); a group
  whose dim meets an op that mixes its entries (a normalisation over it) is listed as not
  checked by value.
* :func:`probe_layout` — the reference of :func:`fxsym.paramlayout.layout` (where each
  group's units lie in the parameters), learned by trial resizes of whole-model probe copies
  without the analysis' segments; the tests compare the two.

Four rules make the oracles able to fail:

* **Perturbed weights.** Each check runs on :func:`perturbed` copies: every floating
  parameter and norm statistic gets noise scaled to that tensor. Constant initialisations
  (norm weights 1, biases 0, zero tables) are invariant under any permutation, so they would
  hide a member missing from a group; unscaled noise would overflow deep nets.
* **Permutations that move.** For every sortable group of at least two units, each seed draws
  a permutation that moves at least one entry (an identity permutation checks nothing).
* **Float64, tight tolerance.** The permutation and value oracles run in float64 wherever
  the model runs in it and compare at 1e-9 of the output's scale (:data:`VALUE_TOLERANCE`),
  so rounding neither hides a wrong group nor fails a right one; a model that fails in
  float64, or computes some values in float32 anyway, is compared at 1e-4, with a note. So
  is a model whose float64 copies do not fit in the memory available (or the caller's
  ``memory_budget``): ``result.dtype`` says which dtype the copies ran in.
* **Nothing checked is not ok.** A result has a ``status``: ``"ok"``, ``"failed"`` or
  ``"not checked"`` (no sortable group of size ≥ 2, or no group at all); ``ok`` is true only
  for ``"ok"``.

The oracles test the SymMap they are given (copied together with the model, so the copy's
groups are the caller's groups), work on deep copies put in eval mode, and never touch the
caller's model: not its weights, not its training flag, not its attributes. One copy is alive
at a time, built directly in the dtype it runs in, and its tensors are freed the moment it is
done with (:class:`PerturbedCopy`): a copy and its SymMap sit in reference cycles, which
Python frees only when its cyclic collector happens to run.

One idea per module:

* :mod:`.result` — :class:`OracleResult`, the default seeds;
* :mod:`.running` — a model run on example inputs, outputs compared, the SymMap bound;
* :mod:`.perturb` — :func:`perturbed` copies and :class:`PerturbedCopy`;
* :mod:`.precision` — float64 or float32, and the tolerance;
* :mod:`.permutation` — :func:`check_permutation`;
* :mod:`.shrink` — :func:`check_shrink`;
* :mod:`.valueplan`, :mod:`.zeroing`, :mod:`.mixing`, :mod:`.values` — :func:`check_values`:
  the graph walk, the dropped units zeroed or taken out, the module calls that mix them, the
  oracle;
* :mod:`.coverage` — :func:`coverage`;
* :mod:`.reference_layout` — :func:`probe_layout`.

Every public name is re-exported here: ``from fxsym.oracles import check_values``.

Imports from fxsym: analysis, errors, modstate, paramlayout, resizing, symbols.
"""

from __future__ import annotations

from .coverage import coverage
from .permutation import check_permutation, moving_permutation
from .perturb import NOISE, NOISE_FLOOR, NORM_STATISTICS, PerturbedCopy, perturbed
from .precision import FLOAT64_COPIES, VALUE_TOLERANCE, available_memory
from .reference_layout import probe_layout
from .result import SEEDS, OracleResult, Status
from .running import run_model
from .shrink import check_shrink
from .values import ROUTED, check_values

__all__ = ["FLOAT64_COPIES", "NOISE", "NOISE_FLOOR", "NORM_STATISTICS", "ROUTED", "SEEDS",
           "VALUE_TOLERANCE", "OracleResult", "PerturbedCopy", "Status", "available_memory",
           "check_permutation", "check_shrink", "check_values", "coverage",
           "moving_permutation", "perturbed", "probe_layout", "run_model"]
