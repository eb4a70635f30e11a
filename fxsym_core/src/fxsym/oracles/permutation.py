"""The permutation oracle: permuting every sortable group's entries in all of its members at
once must leave the model's outputs unchanged.

Each seed draws, for every sortable group of at least two units, a permutation that moves at
least one entry (:func:`moving_permutation`: an identity permutation checks nothing); on a
mismatch each group is permuted alone, with the same permutation, to name the culprits. One
perturbed copy is alive at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..symbols import SymMap
from .perturb import PerturbedCopy
from .precision import _Precision
from .result import SEEDS, OracleResult
from .running import _bound, _close


def moving_permutation(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` that moves at least one entry (``n >= 2``)."""
    perm = torch.randperm(n, generator=gen)
    if bool((perm == torch.arange(n)).all()):
        perm = perm.roll(1)
    return perm


def check_permutation(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                      seeds: Iterable[int] = SEEDS, rtol: float | None = None,
                      atol: float | None = None, dtype: torch.dtype | None = None,
                      memory_budget: int | None = None) -> OracleResult:
    """Permute every sortable group at once on perturbed copies; name the failing groups.

    For each seed: a :func:`perturbed` copy is the reference; an identical copy has every
    sortable group of at least two units permuted by a :func:`moving_permutation`, in all
    members at once, and must give the same outputs. On a mismatch each group is permuted
    alone (with the same permutation) to name the culprits. The copies run in float64
    wherever the model runs in it, compared to :data:`VALUE_TOLERANCE` unless ``rtol`` and
    ``atol`` say otherwise (``atol`` relative to each output's largest entry). ``dtype`` and
    ``memory_budget`` are :class:`_Precision`'s: float64 unless its copies do not fit in the
    memory available (or the ``memory_budget``, in bytes), or ``dtype`` says otherwise.
    """
    symmap = _bound(model, symmap, example_inputs)
    names = [g.name for g in symmap.groups() if g.is_sortable and g.size > 1]
    seeds = tuple(seeds)
    result = OracleResult(checked=len(names), seeds=seeds)
    if not names:
        return result
    precision = _Precision(result, model=model, dtype=dtype, memory_budget=memory_budget)
    sizes = {g.name: g.size for g in symmap.groups()}

    def permuted(seed: int, perms: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return _permuted(model, symmap, example_inputs, seed, perms, precision)

    for seed in seeds:
        reference = precision.run(lambda: permuted(seed, {}))  # noqa: B023 (run at once)
        tol = precision.tolerance
        rtol_, atol_ = tol if rtol is None else rtol, tol if atol is None else atol
        gen = torch.Generator().manual_seed(seed)
        perms = {n: moving_permutation(sizes[n], gen) for n in names}
        if _close(reference, permuted(seed, perms), rtol_, atol_):
            continue
        culprits = [n for n in names if not _close(
            reference, permuted(seed, {n: perms[n]}), rtol_, atol_)]
        result.failed += [n for n in culprits if n not in result.failed]
        if not culprits:
            result.error = (f"seed {seed}: outputs changed with all groups permuted, "
                            "but with none alone")
    return result


def _permuted(model: nn.Module, symmap: SymMap, example_inputs: Any, seed: int,
              perms: dict[str, torch.Tensor], precision: _Precision) -> list[torch.Tensor]:
    """The outputs of the ``seed`` perturbed copy, in the ``precision``'s dtype, with
    ``perms`` applied. The copy is made afresh each time (the perturbation is deterministic)
    and freed after, so at most one copy of the model is alive at once (ViT-H has 2.5 GB of
    weights)."""
    with PerturbedCopy(model, seed, symmap, precision.dtype, perms) as c:
        return precision.forward(c.model, example_inputs, symmap.output_contract)
