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

Imports from fxsym: analysis, modstate, resizing, symbols.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import fx, nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .analysis import TensorLayout, analyze
from .analysis.analyzer import resolve_dim
from .analysis.outputs import Contract, select_outputs
from .modstate import CACHE, computed_tensors
from .resizing import resize
from .resizing.declared import symbol_sizes
from .symbols import ATTRIBUTE_PREFIX, SymGroup, SymMap, attribute_value

Status = Literal["ok", "failed", "not checked"]

#: the seeds each oracle runs with by default
SEEDS = (0, 1, 2)

#: noise relative to a tensor's own scale
NOISE = 0.1
#: the scale used for a tensor that is constant zero (biases, zero-initialised tables)
NOISE_FLOOR = 0.02

#: buffers perturbed along with the parameters (the statistics a norm layer uses in eval mode)
NORM_STATISTICS = ("running_mean", "running_var")


@dataclass
class OracleResult:
    """What an oracle checked and which groups failed it.

    ``checked`` counts the groups the oracle exercised; ``failed`` names the groups that broke
    it; ``error`` says what went wrong when no single group can be blamed (or in addition);
    ``details`` lists every individual mismatch found (a member of the wrong size, ...);
    ``notes`` lists doubts that do not fail the check (see :func:`check_shrink`).
    """

    checked: int = 0
    failed: list[str] = field(default_factory=list)
    error: str | None = None
    details: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeds: tuple[int, ...] = ()
    #: groups the oracle could not check, with the reason (:func:`check_values`: a group
    #: whose dim meets a normalisation is not checked by value)
    unchecked: dict[str, str] = field(default_factory=dict)
    #: the dtype the copies were compared in (float64 unless a note says why not; ``None``
    #: when no copy ran)
    dtype: torch.dtype | None = None

    @property
    def status(self) -> Status:
        if self.failed or self.error is not None:
            return "failed"
        return "ok" if self.checked else "not checked"

    @property
    def ok(self) -> bool:
        """True only when something was checked and nothing failed."""
        return self.status == "ok"

    def __str__(self) -> str:
        lowered = self.dtype is not None and self.dtype != torch.float64
        precision = f", in {str(self.dtype).removeprefix('torch.')}" if lowered else ""
        if self.status == "ok":
            text = f"ok ({self.checked} groups, seeds {list(self.seeds)}{precision})"
            return text + (f", {len(self.unchecked)} not checked" if self.unchecked else "")
        if self.status == "not checked":
            if self.unchecked:
                return f"not checked ({len(self.unchecked)} groups: {self.unchecked})"
            return "not checked (no group to check)"
        shown = "; ".join(self.details[:5])
        return f"FAILED{precision} {self.failed[:5]} {self.error or ''} {shown}".strip()


def run_model(model: nn.Module, example_inputs: Any,
              contract: Contract | None = None) -> list[torch.Tensor]:
    """Run ``model`` on example inputs; the tensors of the outputs in ``contract`` (default:
    every output; see :mod:`fxsym.analysis.outputs`), flattened."""
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            out = model(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            out = model(*example_inputs)
        else:
            out = model(example_inputs)
    if contract is None:
        picked = [out.to_tuple() if hasattr(out, "to_tuple") else out]
    else:
        picked = select_outputs(out, contract, strict=False)
    return [t for t in pytree.tree_leaves(picked) if isinstance(t, torch.Tensor)]


def perturbed(model: nn.Module, seed: int, symmap: SymMap | None = None, *,
              dtype: torch.dtype | None = None) -> Any:
    """A deep copy of ``model`` in eval mode whose weights carry noise scaled to each tensor.

    Every floating parameter and every norm statistic (:data:`NORM_STATISTICS`) gets Gaussian
    noise of standard deviation ``NOISE`` times the tensor's own scale: its standard deviation,
    else (a constant tensor) its mean absolute value, else :data:`NOISE_FLOOR`. A running
    variance is multiplied by ``exp(noise)`` instead, so it stays positive. Non-finite entries
    are left alone. Tied tensors stay tied (each is perturbed once, in the copy).

    With ``symmap`` (computed for ``model``), the copy and a copy of the SymMap are made
    together and returned as ``(model_copy, symmap_copy)``: the copy's groups are the given
    ones, bound to the copied modules; and the caches the trace found
    (:attr:`SymMap.derived_state`, filled from the weights before the noise) are emptied, so
    the copy recomputes them from its own weights.

    With ``dtype``, the copy's floating parameters and buffers are built in that dtype, equal
    to ``perturbed(model, seed).to(dtype)`` (the noise rounded to each tensor's own dtype
    first) without a copy in the model's own dtype in between (ViT-H's float32 copy is 2.5
    GB).

    A tensor attribute computed with grad (``weight_norm``'s ``weight`` before a forward
    without grad), which ``deepcopy`` refuses, is copied detached: its forward pre-hook
    computes it again.
    """
    memo: dict[int, Any] = {}
    native: dict[int, torch.dtype] = {}
    if dtype is not None:
        for tensor in _floating_tensors(model):
            memo[id(tensor)] = _converted(tensor, dtype)
            native[id(memo[id(tensor)])] = tensor.dtype
    memo.update(computed_tensors(model))
    if symmap is not None:
        clone, sm = copy.deepcopy((model, symmap), memo)
    else:
        clone, sm = copy.deepcopy(model, memo), None
    clone.eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in _perturbable(clone):
            _add_noise(tensor, gen, multiplicative=name.endswith("running_var"),
                       rounded=native.get(id(tensor), tensor.dtype))
    if sm is None:
        return clone
    modules = dict(clone.named_modules())
    for qualname, attrs in sm.derived_state.items():
        for attr, kind in attrs.items():
            container = vars(modules[qualname]).get(attr) if qualname in modules else None
            if kind == CACHE and isinstance(container, (dict, list, set)):
                container.clear()
    return clone, sm


def _floating_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The floating parameters and buffers of ``model`` holding data, each once (what
    ``model.to(dtype)`` converts)."""
    seen: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point() and not t.is_meta and not isinstance(
                t, (UninitializedParameter, UninitializedBuffer)):
            seen.setdefault(id(t), t)
    return list(seen.values())


def _converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of ``tensor`` in ``dtype``; a parameter's copy a parameter of its class (as its
    ``__deepcopy__`` makes it)."""
    data = tensor.detach().to(dtype, copy=True)
    if isinstance(tensor, nn.Parameter):
        return type(tensor)(data, tensor.requires_grad)
    return data


def _perturbable(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    named: list[tuple[str, torch.Tensor]] = [*model.named_parameters(remove_duplicate=False)]
    named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False)
              if n.rpartition(".")[2] in NORM_STATISTICS]
    for name, tensor in named:
        if id(tensor) in seen or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        seen.add(id(tensor))
        yield name, tensor


def _add_noise(tensor: torch.Tensor, gen: torch.Generator, *, multiplicative: bool,
               rounded: torch.dtype) -> None:
    finite = torch.isfinite(tensor)
    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
    if multiplicative:
        new = tensor.float() * torch.exp(NOISE * noise)
    else:
        values = tensor.detach().float()[finite]
        scale = float(values.std()) if values.numel() > 1 else 0.0
        if not scale > 0:
            scale = float(values.abs().mean()) if values.numel() else 0.0
        if not scale > 0:
            scale = NOISE_FLOOR / NOISE
        new = tensor.float() + NOISE * scale * noise
    tensor.copy_(torch.where(finite, new.to(rounded).to(tensor.dtype), tensor))


class PerturbedCopy:
    """A :func:`perturbed` copy of the model and its SymMap (``model``, ``symmap``) in
    ``dtype`` (default: the model's own), resized by ``choices`` if given, used in a ``with``
    block; every tensor it held is freed when it is done with. The oracles use it, and so
    does anything else that makes copies of a model to resize and drop
    (``benchmarks/shrink_coverage.py``).

    Dropping the copy is not enough: the copy and its SymMap form reference cycles (the traced
    graph, the symbols), so their tensors would live until Python's cyclic collector runs, and
    the float64 copies of a large model piled up (vit_b_16: 3 GB above the model's own 0.35
    GB). Freeing means rebinding each parameter's and buffer's data to an empty tensor: the
    copy is never run again and nothing outside it holds its tensors. A resize builds its new
    tensors beside the old ones (it is atomic), so a copy to resize is resized in the model's
    own dtype and converted after, which holds half the bytes of resizing a float64 copy;
    :meth:`resize` frees the tensors a resize replaced (the SymMap's traced modules still point
    at them)."""

    def __init__(self, model: nn.Module, seed: int, symmap: SymMap, dtype: torch.dtype | None,
                 choices: dict[str, Any] | None = None) -> None:
        self.model, self.symmap = perturbed(model, seed, symmap,
                                            dtype=None if choices else dtype)
        self._held = _tensors(self.model)
        if choices:
            try:
                self.resize(choices)
            except BaseException:
                self.__exit__()
                raise
            if dtype is not None:
                self.model.to(dtype)
                self._held.update(_tensors(self.model))

    def __enter__(self) -> PerturbedCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        _free([*self._held.values(), *_tensors(self.model).values()])
        self._held = {}

    def resize(self, choices: dict[str, Any]) -> None:
        resize(self.model, self.symmap, choices)
        now = _tensors(self.model)
        _free([t for key, t in self._held.items() if key not in now])
        self._held = now


def _tensors(model: nn.Module) -> dict[int, torch.Tensor]:
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {id(t): t for _, t in named}


def _free(tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        if not t.is_meta:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)


def moving_permutation(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` that moves at least one entry (``n >= 2``)."""
    perm = torch.randperm(n, generator=gen)
    if bool((perm == torch.arange(n)).all()):
        perm = perm.roll(1)
    return perm


def _close(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], rtol: float, atol: float) -> bool:
    # summation order changes under a permutation: tolerate float error relative to the
    # output's scale (random-weight models can have large logits)
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(
            x.double(), y.double(), rtol=rtol,
            atol=atol * max(1.0, float(x.double().abs().max()) if x.numel() else 1.0))
        for x, y in zip(a, b)
    )


def _bound(model: nn.Module, symmap: SymMap, example_inputs: Any) -> SymMap:
    """``symmap`` if it was computed for ``model``, else a fresh analysis of ``model``."""
    if symmap.model is model:
        return symmap
    return analyze(model, example_inputs=example_inputs)


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


def check_shrink(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                 seed: int = 0) -> OracleResult:
    """Halve every group of a perturbed copy; it must run, keep its output shapes, and every
    member must have the chosen size.

    The members are checked three ways, none of which knows a module family:

    * a parameter member ``(owner, "name:dim")``: the tensor's ``shape[dim]``; an attribute
      member ``(owner, "attr:name")`` (an int attribute read as a size): its value; an
      attribute a leaf's SymInfo declares (:meth:`fxsym.SymInfo.declare`): its value must be
      its expression over the symbols' chosen sizes;
    * a module member with a cross-layer symbol: on a run of the shrunk copy, the size of the
      input (INCOMING) or output (OUTGOING) dimension the symbol's ``elastic_dims`` name, at
      every call — the module's weights must have produced or accepted it;
    * every resized module's integer attributes: one that equalled the size of a weight
      dimension that changed must still equal the size of one of the dimensions it equalled
      (``Conv2d.out_channels`` follows ``weight.shape[0]``; a stale attribute is a bug even
      when the forward pass happens to run). This fails the check for an attribute named
      like one of the module's SymInfo symbols or declared by it (its resize owns it); any other
      attribute — of such a module, or of a module that only owns parameter members
      (``(owner, "name:dim")``, resized entry by entry) — may equal a weight dimension by
      coincidence (a window of 3 beside 3 heads), so it is listed in ``notes``.

    The expected size of a member's dimension follows its layout: the chosen share of each
    group laid along it, fixed entries unchanged.
    """
    symmap = _bound(model, symmap, example_inputs)
    groups = symmap.groups()
    result = OracleResult(checked=len(groups), seeds=(seed,))
    if not groups:
        return result
    with PerturbedCopy(model, seed, symmap, None) as c:
        _shrink(c, groups, example_inputs, symmap.output_contract, result)
    return result


def _shrink(c: PerturbedCopy, groups: list[SymGroup], example_inputs: Any,
            contract: Contract | None, result: OracleResult) -> None:
    """:func:`check_shrink` on the copy ``c``."""
    clone, sm = c.model, c.symmap
    reference = run_model(clone, example_inputs, contract)
    chosen = {g.name: max(g.min_size, g.size // 2) for g in groups}
    modules = dict(clone.named_modules())
    members = {m for g in groups for m in g.members}
    owners = {q for q, _ in members if q in modules}
    before = {q: _weight_shapes(modules[q]) for q in owners}
    attrs = {q: _int_attributes(modules[q]) for q in owners}
    expected = _expected_lengths(sm, chosen)
    param_members = sm.analysis.param_members if sm.analysis else frozenset()
    declared = _declared_values(sm, modules, members - param_members, expected)
    try:
        c.resize(chosen)
    except Exception as exc:
        result.error = f"resize failed: {type(exc).__name__}: {exc}"
        return
    observed: dict[tuple[str, str], set[int]] = {}
    handles = _measure(sm, modules, observed, {k for k in expected if k not in param_members})
    try:
        out = run_model(clone, example_inputs, contract)
    except Exception as exc:
        result.error = f"the shrunk model fails: {type(exc).__name__}: {exc}"
        return
    finally:
        for h in handles:
            h.remove()
    if [t.shape for t in out] != [t.shape for t in reference]:
        result.error = f"output shapes changed: {[tuple(t.shape) for t in out]}"
    group_of = {m: g.name for g in groups for m in g.members}
    for key, length in expected.items():
        qualname, sname = key
        got: set[int] | None
        if key in param_members:
            pname, _, dim = sname.rpartition(":")
            if not dim.isdigit():  # an int attribute read as a size: "attr:hidden_dim"
                value = attribute_value(modules.get(qualname), dim)
                got = {value} if isinstance(value, int) else None
                if got is None:
                    result.details.append(f"{qualname}.{dim}: no longer an int ({value!r})")
                    _blame(result, group_of.get(key, qualname))
            else:
                tensor = _attribute(modules.get(qualname), pname)
                got = ({int(tensor.shape[int(dim)])} if isinstance(tensor, torch.Tensor)
                       else None)
        else:
            got = observed.get(key)
        if got is not None and got != {length}:
            result.details.append(f"{qualname}.{sname}: size {sorted(got)}, expected {length}")
            _blame(result, group_of.get(key, qualname))
    for (qualname, sname), value in declared.items():
        attr = sname.removeprefix(ATTRIBUTE_PREFIX)
        got_value = getattr(modules[qualname], attr, None)
        if got_value != value:
            result.details.append(f"{qualname}.{attr}: {got_value!r}, declared {value}")
            _blame(result, group_of.get((qualname, sname), qualname))
    for q in owners:
        described = modules[q] in sm
        symbols = set(sm[modules[q]]) if described else set()
        if described:
            symbols |= set(sm.sym_info(modules[q]).attributes)
        for attr, problem in _stale_attributes(modules[q], before[q], attrs[q]):
            if attr.partition("[")[0] not in symbols:
                # not a size the SymInfo names (or no SymInfo, so no resize rule that could
                # keep it up to date): equal to a weight dim maybe only by coincidence
                result.notes.append(f"{q}.{attr}: {problem}")
                continue
            result.details.append(f"{q}.{attr}: {problem}")
            _blame(result, next((g for (m, _), g in group_of.items() if m == q), q))


def _declared_values(sm: SymMap, modules: dict[str, nn.Module],
                     members: set[tuple[str, str]],
                     lengths: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Each declared attribute member ``(module, "attr:name")``: its expression over the
    module's symbols once ``lengths`` (entries of each resized symbol) apply."""
    out: dict[tuple[str, str], int] = {}
    for qualname, sname in members:
        mod = modules.get(qualname)
        if not sname.startswith(ATTRIBUTE_PREFIX) or mod is None or mod not in sm:
            continue
        expr = sm.sym_info(mod).attributes.get(sname.removeprefix(ATTRIBUTE_PREFIX))
        if expr is None:
            continue
        sizes = symbol_sizes(sm, mod, lengths)
        if all(s in sizes for s in expr.symbols):
            out[(qualname, sname)] = expr.evaluate(sizes)[0]
    return out


def _blame(result: OracleResult, name: str) -> None:
    if name not in result.failed:
        result.failed.append(name)


def _attribute(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def _expected_lengths(sm: SymMap, chosen: dict[str, int]) -> dict[tuple[str, str], int]:
    """For every symbol laid along a group: its dimension's length once ``chosen`` applies."""
    analysis = sm.analysis
    if analysis is None:
        return {}
    table = analysis.table
    units = {g.id: (g.size, chosen[g.name]) for g in analysis.groups if g.name in chosen}
    out: dict[tuple[str, str], int] = {}
    for key, dim in analysis.symbol_dims.items():
        total, touched = 0, False
        for seg in dim:
            root = table.find(seg.group) if seg.group is not None else None
            if root in units:
                old, new = units[root]
                total += seg.units * new // old * seg.block
                touched = True
            else:
                total += seg.units * seg.block
        if touched:
            out[key] = total
    return out


def _measure(sm: SymMap, modules: dict[str, nn.Module],
             observed: dict[tuple[str, str], set[int]],
             keys: set[tuple[str, str]]) -> list[Any]:
    """Forward hooks recording the size of each member's input or output dimension."""
    by_module: dict[str, list[tuple[str, Any]]] = {}
    for qualname, sname in keys:
        mod = modules.get(qualname)
        if mod is None or mod not in sm:
            continue
        sym = sm.get_symbol(mod, sname)
        if sym.is_cross_layer:
            by_module.setdefault(qualname, []).append((sname, sym))

    def hook_for(qualname: str, symbols: list[tuple[str, Any]]) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if isinstance(output, (tuple, list)) and output:
                output = output[0]
            for sname, sym in symbols:
                value = tensors[0] if sym.is_incoming and tensors else output
                if not isinstance(value, torch.Tensor):
                    continue
                d = resolve_dim(sym.elastic_dims, value.dim())
                if d is not None:
                    observed.setdefault((qualname, sname), set()).add(int(value.shape[d]))
        return hook

    return [modules[q].register_forward_hook(hook_for(q, syms), with_kwargs=True)
            for q, syms in by_module.items()]


def _weight_shapes(mod: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
    return {n: tuple(t.shape) for n, t in tensors if t is not None}


def _int_attributes(mod: nn.Module) -> dict[str, tuple[int, ...]]:
    """The module's integer attributes (tuples of ints element by element)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, value in vars(mod).items():
        if name.startswith("_"):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = (value,)
        elif isinstance(value, (tuple, list)) and value and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[name] = tuple(value)
    return out


def _stale_attributes(mod: nn.Module, before: dict[str, tuple[int, ...]],
                      attrs: dict[str, tuple[int, ...]]) -> list[tuple[str, str]]:
    after = _weight_shapes(mod)
    problems: list[tuple[str, str]] = []
    now = _int_attributes(mod)
    for attr, values in attrs.items():
        current = now.get(attr)
        if current is None or len(current) != len(values):
            continue
        for i, (old, new) in enumerate(zip(values, current)):
            places = [(n, d) for n, shape in before.items() if n in after
                      and len(after[n]) == len(shape) for d, size in enumerate(shape)
                      if size == old]
            if not places or all(after[n][d] == before[n][d] for n, d in places):
                continue  # no weight dimension of that size changed
            if not any(after[n][d] == new for n, d in places):
                where = ", ".join(f"{n}.shape[{d}]={after[n][d]}" for n, d in places)
                label = attr if len(values) == 1 else f"{attr}[{i}]"
                problems.append((label, f"is {new} but the weights it sized are now {where}"))
    return problems


# -- the value oracle -------------------------------------------------------------------------

#: the tolerance of the value oracle, relative to each output's largest entry, by the dtype it
#: ran in (float64 wherever the model runs in it)
VALUE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}

#: ops that only pass some entries of their input on: a group's entries they leave out are
#: discarded, not read (which the comparison checks: a wrong layout moves what they keep)
_DISCARDING = frozenset({"getitem", "narrow", "split", "chunk", "tensor_split", "unbind",
                         "split_with_sizes", "select", "index_select", "hsplit", "vsplit"})
#: ops whose every output entry is a sum of products with the entries of the dims they
#: contract: dropping an entry equals zeroing it in a parameter operand
_LINEAR_READS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addmv", "mv",
                           "einsum", "tensordot", "conv1d", "conv2d", "conv3d",
                           "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})


@dataclass
class _Read:
    """Where the value oracle zeroes a group's dropped entries in the reference: the
    ``arg``-th input (a position or a keyword) of the ``call``-th call of module ``target``,
    or (``arg is None``) the parameter or buffer ``target`` itself; ``dims`` are the tensor
    dims carrying the group, with their layouts."""

    target: str
    arg: int | str | None
    dims: tuple[tuple[int, Sequence[Any]], ...]
    call: int = 0


@dataclass
class _Call:
    """The ``call``-th call of module ``target`` in the graph: the layouts of its tensor
    arguments (by position or keyword) and of its output, and the groups it meets."""

    target: str
    call: int
    args: dict[int | str, Any]
    output: Any
    roots: set[int]


@dataclass
class _ValuePlan:
    """Per group root: the reads to zero, or the reason it is not checked by value; and the
    module calls, which :func:`_mixing_modules` probes."""

    reads: dict[int, list[_Read]] = field(default_factory=dict)
    unchecked: dict[int, str] = field(default_factory=dict)
    calls: list[_Call] = field(default_factory=list)


def check_values(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                 seeds: Iterable[int] = (0, 1), tolerance: float | None = None,
                 dtype: torch.dtype | None = None, memory_budget: int | None = None
                 ) -> OracleResult:
    """Drop units of every group and compare by value with the model whose consumers no
    longer read those units.

    For each seed a :func:`perturbed` copy, in float64 wherever the model runs in it, gives
    two models: the copy resized to keep every group but some of its units (seed 0 drops one
    unit, seed 1 and later half of them, at random places, the blocks of a ``chunk`` alike),
    and the full copy in which every read of a dropped unit sees zero: the inputs of every
    module call that reads the group (a conv's or a linear's input: zeroing a unit there is
    zeroing its columns) and the parameter operands of functional linear ops (``F.linear``,
    ``matmul``...) where the group's dim is contracted. Where the analysis is right the
    dropped units have no other way to the outputs, so both models compute the same outputs,
    to :data:`VALUE_TOLERANCE` relative to each output's scale. A window that a resize moves
    (a slice counted from the end whose tail was left free), a branch on a size, a size used
    as a number all change the outputs. On a mismatch each group is dropped alone to name
    the culprits.

    Where a group's dim meets an op that mixes its entries (a normalisation over it, a
    softmax along it, a reduction or a product of two activations over it), dropping is not
    zeroing even for a right group: the group is *not checked by value*, listed with the reason
    in ``unchecked``, and counts neither way; ``status`` is ``"not checked"`` when no group
    was checked. The layouts come from the analysis (``GroupAnalysis.node_layouts``). A
    *routed* group (``SymGroup.routed``: the experts a router's ``topk`` picks among) is not
    checked either: dropping an expert changes which experts are picked, by design.

    The copies run in float64 unless they do not fit in the memory available (or the
    ``memory_budget``, in bytes) or ``dtype`` says otherwise (:class:`_Precision`); in float32
    the tolerance is float32's and a note says why.
    """
    symmap = _bound(model, symmap, example_inputs)
    seeds = tuple(seeds)
    result = OracleResult(seeds=seeds)
    analysis = symmap.analysis
    graph = symmap.graph
    groups = [g for g in symmap.groups() if g.size > 1]
    if analysis is None or graph is None or not groups:
        return result
    plan = _value_plan(symmap, graph)
    by_name = {g.name: g for g in symmap.groups()}
    modules = dict(symmap.model.named_modules())
    classes: list[list[SymGroup]] = []
    seen: set[str] = set()
    for g in groups:
        if g.name in seen:
            continue
        members = [g, *(by_name[n] for n in g.same_size if n in by_name)]
        seen.update(m.name for m in members)
        why = next((f"{m.name}: {ROUTED}" for m in members if m.routed), None)
        if why is None:
            why = next((f"{m.name}: {plan.unchecked[m.id]}" for m in members
                        if m.id in plan.unchecked), None)
        if why is None:
            why = next((w for m in members if (w := _inside_leaf(symmap, modules, m))), None)
        if why is None and any(m.size < 2 for m in members):
            why = "a block of a chunk has one unit"
        if why is not None:
            for m in members:
                result.unchecked[m.name] = why
            continue
        classes.append(members)
    precision = _Precision(result, tolerance, model=model, dtype=dtype,
                           memory_budget=memory_budget)
    if classes:
        gen = torch.Generator().manual_seed(seeds[0] if seeds else 0)
        mixing = _mixing_modules(model, symmap, example_inputs, plan, seeds[0] if seeds else 0,
                                 precision, [d for c in classes for d in _drops(c, 0, gen)])
        for c in [c for c in classes if any(m.id in mixing for m in c)]:
            why = next(f"{m.name}: {mixing[m.id]}" for m in c if m.id in mixing)
            result.unchecked.update({m.name: why for m in c})
            classes.remove(c)
    result.checked = sum(len(c) for c in classes)
    if not classes:
        return result
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        drops = {c[0].name: _drops(c, seed, gen) for c in classes}
        if _same_values(model, symmap, example_inputs, seed, precision, plan,
                        [d for c in classes for d in drops[c[0].name]], result):
            continue
        culprits = [c for c in classes if not _same_values(
            model, symmap, example_inputs, seed, precision, plan, drops[c[0].name], None)]
        for c in culprits:
            for m in c:
                _blame(result, m.name)
        if not culprits:
            result.error = (f"seed {seed}: outputs changed with every group dropped at once, "
                            "but with none alone")
    return result


#: why the value oracle does not check a routed group (``SymGroup.routed``)
ROUTED = ("a router picks its entries by value: dropping one changes the routing by design "
          "(checked by the permutation and shrink oracles only)")


def _inside_leaf(symmap: SymMap, modules: dict[str, nn.Module], group: SymGroup) -> str | None:
    """Why ``group`` cannot be checked by value if a member sizes something inside a module
    called as a leaf (heads inside an attention module): the graph does not show its reads."""
    analysis = symmap.analysis
    for qualname, sname in group.members:
        mod = modules.get(qualname)
        if (analysis is not None and (qualname, sname) in analysis.param_members) or (
                sname.startswith(ATTRIBUTE_PREFIX) or mod is None or mod not in symmap):
            continue
        if sname in symmap[mod] and not symmap.get_symbol(mod, sname).is_cross_layer:
            return f"{qualname}.{sname} sizes the inside of a leaf module, whose reads " \
                   "the traced graph does not show"
    return None


def _drops(members: list[SymGroup], seed: int, gen: torch.Generator
           ) -> list[tuple[SymGroup, list[int]]]:
    """The units each group of a same-size class drops for ``seed``: one for seed 0, half for
    the others, at random places, as many in every group of the class."""
    size = members[0].size
    count = 1 if seed == 0 else max(1, size // 2)
    return [(m, sorted(torch.randperm(m.size, generator=gen)[:count].tolist()))
            for m in members]


def _same_values(model: nn.Module, symmap: SymMap, example_inputs: Any, seed: int,
                 precision: _Precision, plan: _ValuePlan,
                 drops: list[tuple[SymGroup, list[int]]], result: OracleResult | None) -> bool:
    """Whether the copy with ``drops`` resized away computes what the full copy computes with
    those units zeroed where they are read; mismatches are described in ``result``."""
    dropped = {g.id: torch.tensor(units) for g, units in drops}

    def zeroed_run() -> list[torch.Tensor]:
        with PerturbedCopy(model, seed, symmap, precision.dtype) as c:
            table = c.symmap.analysis.table if c.symmap.analysis else None
            handles = _zero_reads(c.model, plan, dropped, table)
            try:
                return precision.forward(c.model, example_inputs, symmap.output_contract)
            finally:
                for h in handles:
                    h.remove()

    reference = precision.run(zeroed_run)
    dtype, tol = precision.dtype, precision.tolerance
    keep = {g.name: [u for u in range(g.size) if u not in set(units)] for g, units in drops}
    try:
        with PerturbedCopy(model, seed, symmap, dtype, keep) as c:
            out = precision.forward(c.model, example_inputs, symmap.output_contract)
    except Exception as exc:
        if result is not None:
            result.details.append(f"seed {seed}: the dropped model fails: "
                                  f"{type(exc).__name__}: {exc}")
        return False
    if len(out) != len(reference):
        return False
    same = True
    for i, (a, b) in enumerate(zip(out, reference)):
        scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
        if a.shape != b.shape or not torch.allclose(a.to(dtype), b.to(dtype), rtol=tol,
                                                     atol=tol * scale):
            same = False
            if result is not None:
                diff = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
                result.details.append(f"seed {seed}: output {i} differs by {diff:.3g} "
                                      f"(scale {scale:.3g})")
    return same


#: float64 copies of the model's floating tensors an oracle may hold at its peak, above the
#: model itself: one copy, the copy in the model's dtype a resized copy is converted from,
#: the activations and the value oracle's records (measured: 1.95 on vit_b_16, 1.7 on ViT-H)
FLOAT64_COPIES = 2.5


class _Precision:
    """The dtype the oracles run in and the tolerance that goes with it.

    Float64 unless ``dtype`` says otherwise, or its copies do not fit: :data:`FLOAT64_COPIES`
    times the model's floating parameters and buffers at 8 bytes each, against the
    ``memory_budget`` in bytes (default: the memory the system has available,
    :func:`available_memory`); then float32, with a note giving both figures. A float64 run
    that fails falls back to float32 too; the float32 tolerance is also used where a float64
    run computes some of its values in a lower precision (a norm that casts to float32 inside,
    a table kept in float32), seen by watching every op of the first run. Each fallback leaves
    a note in the result, and ``result.dtype`` is the dtype the copies ran in."""

    def __init__(self, result: OracleResult, tolerance: float | None = None, *,
                 model: nn.Module | None = None, dtype: torch.dtype | None = None,
                 memory_budget: int | None = None) -> None:
        if dtype not in (None, torch.float64, torch.float32):
            raise ValueError(f"the oracles compare in float64 or float32, not {dtype}")
        self.result = result
        self._tolerance = tolerance
        self._lowered = False
        self._watched = False
        self.dtype = torch.float64 if dtype is None else dtype
        if dtype == torch.float32:
            result.notes.append("float32: asked by the caller")
        elif dtype is None and model is not None:
            need = FLOAT64_COPIES * 8 * sum(t.numel() for t in _floating_tensors(model))
            available = available_memory() if memory_budget is None else memory_budget
            if available is not None and need > available:
                self.dtype = torch.float32
                result.notes.append(f"float32: float64 copies need {need / 1e9:.1f} GB, "
                                    f"{available / 1e9:.1f} GB available")
        result.dtype = self.dtype

    @property
    def tolerance(self) -> float:
        if self._tolerance is not None:
            return self._tolerance
        return VALUE_TOLERANCE[torch.float32 if self._lowered else self.dtype]

    def run(self, fn: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
        """``fn()`` (which runs a copy through :meth:`forward`), again in float32 if it fails
        in float64."""
        try:
            return fn()
        except Exception as exc:
            if self.dtype != torch.float64:
                raise
            self.dtype = self.result.dtype = torch.float32
            self.result.notes.append(f"the model does not run in float64 ({type(exc).__name__}"
                                     f": {exc}): compared in float32")
            return fn()

    def forward(self, model: nn.Module, inputs: Any,
                contract: Contract | None) -> list[torch.Tensor]:
        """:func:`run_model` on ``inputs`` cast to :attr:`dtype`; the first run in float64 is
        watched for values computed in a lower precision."""
        inputs = _cast_inputs(inputs, self.dtype)
        if self._watched or self.dtype != torch.float64:
            return run_model(model, inputs, contract)
        watch = _LowerPrecision()
        with watch:
            out = run_model(model, inputs, contract)
        self._watched = True
        if watch.seen is not None:
            self._lowered = True
            self.result.notes.append(f"the model computes some values in {watch.seen[1]} in "
                                     f"float64 ({watch.seen[0]}): compared at the float32 "
                                     "tolerance")
        return out


def available_memory() -> int | None:
    """The bytes the system can give without swapping (``MemAvailable`` of /proc/meminfo,
    else psutil's figure where it is installed); ``None`` when neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


class _LowerPrecision(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees the first op whose floating result is not float64: ``(op, dtype)``."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: tuple[str, str] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.seen is None:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and (
                        t.dtype != torch.float64):
                    self.seen = (str(func), str(t.dtype).removeprefix("torch."))
                    break
        return out


def _cast_inputs(example_inputs: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor)
                           and t.is_floating_point() else t, example_inputs)


def _entries(table: Any, dim: Sequence[Any], dropped: dict[int, torch.Tensor]) -> torch.Tensor:
    """The entries of a dim laid out as ``dim`` that belong to the ``dropped`` units (by
    group root)."""
    parts: list[torch.Tensor] = []
    offset = 0
    for seg in dim:
        length = seg.units * seg.block
        root = table.find(seg.group) if seg.group is not None else None
        units = dropped.get(root) if root is not None else None
        if units is not None and len(units):
            per_unit = seg.units // table.units[root]
            fine = (units[:, None] * per_unit + torch.arange(per_unit)[None, :]).flatten()
            block = torch.arange(seg.block)
            parts.append((fine[:, None] * seg.block + block[None, :]).flatten() + offset)
        offset += length
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _zeroed(t: Any, dims: Sequence[tuple[int, Sequence[Any]]], table: Any,
            dropped: dict[int, torch.Tensor]) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    for d, dim in dims:
        idx = _entries(table, dim, dropped)
        if idx.numel() and d < t.dim() and t.shape[d] == sum(s.units * s.block for s in dim):
            t = t.index_fill(d, idx.to(t.device), 0)
    return t


def _zero_reads(clone: nn.Module, plan: _ValuePlan, dropped: dict[int, torch.Tensor],
                table: Any) -> list[Any]:
    """Zero the dropped units where ``plan`` says they are read: parameters in place (the
    copy's), module inputs by forward pre-hooks; the hooks' handles."""
    calls: dict[str, dict[int, list[_Read]]] = {}
    for root, reads in plan.reads.items():
        if root not in dropped:
            continue
        for r in reads:
            if r.arg is None:
                tensor = _attribute(clone, r.target)
                if isinstance(tensor, torch.Tensor):
                    with torch.no_grad():
                        tensor.copy_(_zeroed(tensor, r.dims, table, {root: dropped[root]}))
            else:
                calls.setdefault(r.target, {}).setdefault(r.call, []).append(r)
    modules = dict(clone.named_modules())
    handles = []
    for target, by_call in calls.items():
        count = [0]

        def pre_hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     by_call: dict[int, list[_Read]] = by_call,
                     count: list[int] = count) -> tuple[tuple[Any, ...], dict[str, Any]]:
            reads = by_call.get(count[0], [])
            count[0] += 1
            new_args, new_kwargs = list(args), dict(kwargs)
            for r in reads:
                if isinstance(r.arg, int) and r.arg < len(new_args):
                    new_args[r.arg] = _zeroed(new_args[r.arg], r.dims, table, dropped)
                elif isinstance(r.arg, str) and r.arg in new_kwargs:
                    new_kwargs[r.arg] = _zeroed(new_kwargs[r.arg], r.dims, table, dropped)
            return tuple(new_args), new_kwargs

        if target in modules:
            handles.append(modules[target].register_forward_pre_hook(pre_hook,
                                                                     with_kwargs=True))
    return handles


def _value_plan(symmap: SymMap, graph: Any) -> _ValuePlan:
    """Walk the traced graph: for every searchable group, the reads to zero and the ops that
    mix its entries (see :func:`check_values`)."""
    analysis = symmap.analysis
    assert analysis is not None
    table = analysis.table
    layouts = analysis.node_layouts
    roots = {g.id for g in symmap.groups()}
    plan = _ValuePlan()
    calls: dict[str, int] = {}

    def carried(layout: Any) -> dict[int, list[tuple[int, Sequence[Any]]]]:
        out: dict[int, list[tuple[int, Sequence[Any]]]] = {}
        if not isinstance(layout, TensorLayout):
            return out
        for d, dim in enumerate(layout):
            for seg in dim:
                root = table.find(seg.group) if seg.group is not None else None
                if root in roots and (d, dim) not in out.get(root, []):
                    out.setdefault(root, []).append((d, dim))
        return out

    def unchecked(root: int, why: str) -> None:
        plan.unchecked.setdefault(root, why)

    for node in graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        outputs = _tensor_layouts(layouts.get(node.name))
        out_roots = {r for lay in outputs for r in carried(lay)}
        name = _node_op(node)
        if node.op == "call_module":
            call = calls.get(node.target, 0)
            calls[node.target] = call + 1
            args = [*enumerate(node.args), *node.kwargs.items()]
            inputs = {key: carried(layouts.get(a.name)) for key, a in args
                      if isinstance(a, fx.Node)}
            for key, found in inputs.items():
                for root, dims in found.items():
                    plan.reads.setdefault(root, []).append(
                        _Read(node.target, key, tuple(dims), call))
            met = {r for found in inputs.values() for r in found} | out_roots
            if met:  # a producer too: a recurrent one reads its own units
                plan.calls.append(_Call(
                    node.target, call,
                    {key: layouts.get(a.name) for key, a in args if isinstance(a, fx.Node)},
                    layouts.get(node.name), met))
            continue
        if not outputs or not any(carried(layouts.get(a.name)) for a in node.all_input_nodes):
            continue  # no group read; or a size, a dtype: a guard, which the comparison sees
        first = node.args[0] if node.args else None
        mixed = _function_mixes(node, name, _ndim(layouts, node))
        exits: set[int] = set()
        for source in node.all_input_nodes:
            for root, dims in carried(layouts.get(source.name)).items():
                if source is first and any(d in mixed for d, _ in dims):
                    unchecked(root, f"{name} at {node.name} mixes its entries")
                elif root not in out_roots and name not in _DISCARDING:
                    exits.add(root)
        for root in exits:
            params = [a for a in node.all_input_nodes if a.op == "get_attr"
                      and root in carried(layouts.get(a.name))]
            if name not in _LINEAR_READS or not params:
                unchecked(root, f"{name} at {node.name} reads it")
                continue
            for p in params:
                plan.reads.setdefault(root, []).append(
                    _Read(p.target, None, tuple(carried(layouts.get(p.name))[root])))
    return plan


def _ndim(layouts: Any, node: Any) -> int:
    """The number of dims of the node's first input (0 if it is not a traced tensor)."""
    first = node.args[0] if node.args else None
    layout = layouts.get(first.name) if isinstance(first, fx.Node) else None
    return len(layout) if isinstance(layout, TensorLayout) else 0


def _tensor_layouts(layout: Any) -> list[Any]:
    if isinstance(layout, TensorLayout):
        return [layout]
    if isinstance(layout, (tuple, list)):
        return [t for item in layout for t in _tensor_layouts(item)]
    if isinstance(layout, dict):
        return [t for item in layout.values() for t in _tensor_layouts(item)]
    return []


def _node_op(node: Any) -> str:
    if node.op == "call_method":
        return str(node.target)
    return str(getattr(node.target, "__name__", node.target)).lstrip("_")


def _arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _function_mixes(node: Any, name: str, ndim: int) -> set[int]:
    """The dims of its first input whose entries a normalising op mixes (``softmax`` along
    a dim, ``layer_norm`` over its last dims, ``normalize``, ``group_norm`` over channels,
    attention over the features of its heads)."""
    every = set(range(ndim))

    def dims(value: Any) -> set[int]:
        if isinstance(value, int) and ndim:
            return {value % ndim}
        return every

    if name in ("softmax", "log_softmax", "softmin", "normalize"):
        default = 1 if name == "normalize" else None
        at = 2 if name == "normalize" else 1
        return dims(_arg(node, at, "dim", default))
    if name in ("layer_norm", "rms_norm"):
        shape = _arg(node, 1, "normalized_shape")
        k = len(shape) if isinstance(shape, (tuple, list)) else 1
        return set(range(ndim - k, ndim))
    if name in ("group_norm", "local_response_norm"):
        return {1} if ndim > 1 else every
    if name == "instance_norm":
        return set(range(2, ndim))
    if name == "scaled_dot_product_attention":
        return {ndim - 1} if ndim else every
    return set()


def _mixing_modules(model: nn.Module, symmap: SymMap, example_inputs: Any, plan: _ValuePlan,
                    seed: int, precision: _Precision, drops: list[tuple[SymGroup, list[int]]]
                    ) -> dict[int, str]:
    """The groups met by a module call where dropping units is not zeroing them, with the
    reason: every module call that meets a dropped group is run once more, resized, on its
    input in the full copy with the dropped entries taken out, and must give that call's
    output with them taken out. A per-channel module (a batch norm, a depthwise conv) and a
    linear reader (a conv, a linear: its input is zeroed where the group is read) pass; a
    layer norm over the group's dim, an attention module whose output channels read every head
    do not. Modules are probed, not named."""
    analysis = symmap.analysis
    assert analysis is not None
    table = analysis.table
    dropped = {g.id: torch.tensor(units) for g, units in drops}
    probed = [c for c in plan.calls if c.roots & dropped.keys()]
    if not probed:
        return {}
    records: dict[tuple[str, int], tuple[Any, Any, Any]] = {}

    def recorded_run() -> list[torch.Tensor]:
        records.clear()
        with PerturbedCopy(model, seed, symmap, precision.dtype) as full:
            modules = dict(full.model.named_modules())
            handles = _zero_reads(full.model, plan, dropped, table)
            copies = _Snapshots()
            for target in {c.target for c in probed}:
                if target in modules:
                    handles += _recorder(modules[target], target, records, copies)
            try:
                return precision.forward(full.model, example_inputs, symmap.output_contract)
            finally:
                for h in handles:
                    h.remove()

    precision.run(recorded_run)
    keep = {g.name: [u for u in range(g.size) if u not in set(units)] for g, units in drops}
    try:
        small = PerturbedCopy(model, seed, symmap, precision.dtype, keep)
    except Exception:
        return {}  # the comparison reports it
    with small:
        return _probe(small.model, probed, records, table, dropped, precision)


def _probe(small: nn.Module, probed: list[_Call],
           records: dict[tuple[str, int], tuple[Any, Any, Any]], table: Any,
           dropped: dict[int, torch.Tensor], precision: _Precision) -> dict[int, str]:
    """:func:`_mixing_modules`' comparison of each probed call of the resized copy
    ``small`` with its ``records``."""
    modules = dict(small.named_modules())
    mixing: dict[int, str] = {}
    for c in probed:
        record = records.get((c.target, c.call))
        mod = modules.get(c.target)
        if record is None or mod is None:
            continue
        args, kwargs, output = record
        try:
            with torch.no_grad():
                got = mod(*(_kept(a, c.args.get(i), table, dropped) for i, a in enumerate(args)),
                          **{k: _kept(v, c.args.get(k), table, dropped)
                             for k, v in kwargs.items()})
            same = _same_tree(got, _kept(output, c.output, table, dropped),
                              precision.tolerance)
        except Exception:
            same = False
        if not same:
            for root in sorted(c.roots & dropped.keys()):
                mixing.setdefault(root, f"{c.target} ({type(mod).__name__}) mixes the units "
                                        "it reads: dropping them is not zeroing them there")
    return mixing


class _Snapshots:
    """Copies of the tensors the probed calls see, one per tensor and version: the output of
    a call that the next probed call reads unchanged (a linear's output into its activation)
    is copied once. The records of every call of a large model are as large as its weights
    (vit_b_16 at 224: 0.7 GB in float64)."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}

    def __call__(self, value: Any) -> Any:
        return pytree.tree_map(self._copy, value)

    def _copy(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        hit = self._copies.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        copied = t.clone()
        self._copies[id(t)] = (weakref.ref(t), t._version, copied)
        return copied


def _recorder(mod: nn.Module, target: str,
              records: dict[tuple[str, int], tuple[Any, Any, Any]],
              copied: _Snapshots) -> list[Any]:
    """Hooks recording each call's inputs (as the module gets them, after the zeroing
    pre-hooks) and output, copied (:class:`_Snapshots`): an in-place module
    (``ReLU(inplace=True)``) or op downstream rewrites them."""
    calls: list[tuple[Any, Any]] = []

    def before(mod: nn.Module, args: Any, kwargs: Any) -> None:
        calls.append(copied((args, kwargs)))

    def after(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        call = len(outputs)
        outputs.append(copied(output))
        records[(target, call)] = (*calls[call], outputs[call])

    outputs: list[Any] = []

    return [mod.register_forward_pre_hook(before, with_kwargs=True),
            mod.register_forward_hook(after, with_kwargs=True)]


def _kept(value: Any, layout: Any, table: Any, dropped: dict[int, torch.Tensor]) -> Any:
    """``value`` without the entries of the dropped units, as ``layout`` lays them out."""
    if isinstance(value, torch.Tensor) and isinstance(layout, TensorLayout):
        for d, dim in enumerate(layout):
            gone = _entries(table, dim, dropped)
            if gone.numel() and d < value.dim():
                keep = torch.ones(value.shape[d], dtype=torch.bool)
                keep[gone] = False
                value = value.index_select(d, keep.nonzero().flatten().to(value.device))
        return value
    if isinstance(value, (tuple, list)) and isinstance(layout, (tuple, list)) and not (
            isinstance(layout, TensorLayout)) and len(value) == len(layout):
        return type(value)(_kept(v, lay, table, dropped) for v, lay in zip(value, layout))
    return value


def _same_tree(a: Any, b: Any, tol: float) -> bool:
    xs = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    ys = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    return len(xs) == len(ys) and all(
        x.shape == y.shape and torch.allclose(
            x.double(), y.double(), rtol=tol,
            atol=tol * max(1.0, float(y.double().abs().max()) if y.numel() else 1.0))
        for x, y in zip(xs, ys))


def coverage(symmap: SymMap) -> float:
    """The share of *producing* modules whose output belongs to a searchable group.

    A module produces a dimension when it creates that dimension's entries from its own
    weights: it has an OUTGOING symbol in its SymInfo (a conv's ``out_channels``), or it is
    traced into and owns a parameter that an op rule made the producer of a dim
    (``GroupAnalysis.param_producers``: the weight of a functional ``linear``, ``conv``,
    ``embedding`` or ``matmul``, as in a ``Linear`` subclass with its own ``forward``). It
    counts as covered when one of those symbols or parameters is a member of a searchable
    group. Parameters that only follow a dimension something else produces (a class token
    concatenated to it, a position embedding or a layer scale applied to it) are members of
    its groups but not producers, so they count neither way. For a CNN this is the share of
    convs and linears that can be pruned; the head (whose output is the model's output)
    always counts against it. A module the traced graph reached only through its parameters
    (transformers' Mamba mixers run ``self.conv1d`` as ``F.conv1d(x, self.conv1d.weight,
    ...)``, so its symbols have no dim) counts as covered when one of its parameters' dims is
    a member of a searchable group, against it otherwise.
    """
    producers = {(name, s) for name, syms in symmap.named_sym_dicts()
                 for s, sym in syms.items() if sym.is_outgoing}
    analysis = symmap.analysis
    if analysis is not None:
        producers |= analysis.param_producers
    if not producers:
        return 0.0
    modules = {name for name, _ in producers}
    # a module the graph reached through its parameters only (a conv whose weight a
    # functional conv1d reads): its symbols have no dim, its weight's dims say where its
    # output channels went
    by_params: set[str] = set() if analysis is None else {
        name for name in modules
        if not any((name, s) in analysis.symbol_dims for n, s in producers if n == name)}
    params = frozenset() if analysis is None else analysis.param_members
    live = {name for g in symmap.groups() for name, s in g.members
            if (name, s) in producers or (name in by_params and (name, s) in params)}
    return len(live) / len(modules)


__all__ = ["FLOAT64_COPIES", "NOISE", "NOISE_FLOOR", "NORM_STATISTICS", "SEEDS",
           "VALUE_TOLERANCE", "OracleResult", "PerturbedCopy", "available_memory",
           "check_permutation", "check_shrink", "check_values", "coverage",
           "moving_permutation", "perturbed", "run_model"]
