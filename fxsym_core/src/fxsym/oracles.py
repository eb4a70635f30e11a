"""Correctness oracles for an analysis (see DESIGN.md, "Correctness oracles").

* :func:`check_permutation` — permuting every sortable group's entries in all of its members
  at once must leave the model's outputs unchanged; on a mismatch each group is retried alone
  to name the culprit.
* :func:`check_shrink` — halving every group must give a model that runs, keeps its output
  shapes, and whose every member has the chosen size.

Three rules make the oracles able to fail:

* **Perturbed weights.** Each check runs on :func:`perturbed` copies: every floating
  parameter and norm statistic gets noise scaled to that tensor. Constant initialisations
  (norm weights 1, biases 0, zero tables) are invariant under any permutation, so they would
  hide a member missing from a group; unscaled noise would overflow deep nets.
* **Permutations that move.** For every sortable group of at least two units, each seed draws
  a permutation that moves at least one entry (an identity permutation checks nothing).
* **Nothing checked is not ok.** A result has a ``status``: ``"ok"``, ``"failed"`` or
  ``"not checked"`` (no sortable group of size ≥ 2, or no group at all); ``ok`` is true only
  for ``"ok"``.

Both oracles test the SymMap they are given (copied together with the model, so the copy's
groups are the caller's groups), work on deep copies put in eval mode, and never touch the
caller's model: not its weights, not its training flag, not its attributes.

Imports from fxsym: analysis, resizing, symbols.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .analysis import analyze
from .analysis.analyzer import resolve_dim
from .analysis.outputs import Contract, select_outputs
from .resizing import resize
from .resizing.declared import symbol_sizes
from .symbols import ATTRIBUTE_PREFIX, SymMap, attribute_value

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
        if self.status == "ok":
            return f"ok ({self.checked} groups, seeds {list(self.seeds)})"
        if self.status == "not checked":
            return "not checked (no group to check)"
        shown = "; ".join(self.details[:5])
        return f"FAILED {self.failed[:5]} {self.error or ''} {shown}".strip()


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


def perturbed(model: nn.Module, seed: int, symmap: SymMap | None = None) -> Any:
    """A deep copy of ``model`` in eval mode whose weights carry noise scaled to each tensor.

    Every floating parameter and every norm statistic (:data:`NORM_STATISTICS`) gets Gaussian
    noise of standard deviation ``NOISE`` times the tensor's own scale: its standard deviation,
    else (a constant tensor) its mean absolute value, else :data:`NOISE_FLOOR`. A running
    variance is multiplied by ``exp(noise)`` instead, so it stays positive. Non-finite entries
    are left alone. Tied tensors stay tied (each is perturbed once, in the copy).

    With ``symmap`` (computed for ``model``), the copy and a copy of the SymMap are made
    together and returned as ``(model_copy, symmap_copy)``: the copy's groups are the given
    ones, bound to the copied modules.
    """
    if symmap is not None:
        clone, sm = copy.deepcopy((model, symmap))
    else:
        clone, sm = copy.deepcopy(model), None
    clone.eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in _perturbable(clone):
            _add_noise(tensor, gen, multiplicative=name.endswith("running_var"))
    return clone if sm is None else (clone, sm)


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


def _add_noise(tensor: torch.Tensor, gen: torch.Generator, *, multiplicative: bool) -> None:
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
    tensor.copy_(torch.where(finite, new.to(tensor.dtype), tensor))


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
            x.float(), y.float(), rtol=rtol, atol=atol * max(1.0, float(x.float().abs().max())))
        for x, y in zip(a, b)
    )


def _bound(model: nn.Module, symmap: SymMap, example_inputs: Any) -> SymMap:
    """``symmap`` if it was computed for ``model``, else a fresh analysis of ``model``."""
    if symmap.model is model:
        return symmap
    return analyze(model, example_inputs=example_inputs)


def check_permutation(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                      seeds: Iterable[int] = SEEDS, rtol: float = 1e-4,
                      atol: float = 1e-4) -> OracleResult:
    """Permute every sortable group at once on perturbed copies; name the failing groups.

    For each seed: a :func:`perturbed` copy is the reference; an identical copy has every
    sortable group of at least two units permuted by a :func:`moving_permutation`, in all
    members at once, and must give the same outputs. On a mismatch each group is permuted
    alone (with the same permutation) to name the culprits.
    """
    symmap = _bound(model, symmap, example_inputs)
    names = [g.name for g in symmap.groups() if g.is_sortable and g.size > 1]
    seeds = tuple(seeds)
    result = OracleResult(checked=len(names), seeds=seeds)
    if not names:
        return result
    sizes = {g.name: g.size for g in symmap.groups()}
    for seed in seeds:
        reference = _permuted(model, symmap, example_inputs, seed, {})
        gen = torch.Generator().manual_seed(seed)
        perms = {n: moving_permutation(sizes[n], gen) for n in names}
        if _close(reference, _permuted(model, symmap, example_inputs, seed, perms), rtol, atol):
            continue
        culprits = [n for n in names if not _close(
            reference, _permuted(model, symmap, example_inputs, seed, {n: perms[n]}), rtol,
            atol)]
        result.failed += [n for n in culprits if n not in result.failed]
        if not culprits:
            result.error = (f"seed {seed}: outputs changed with all groups permuted, "
                            "but with none alone")
    return result


def _permuted(model: nn.Module, symmap: SymMap, example_inputs: Any, seed: int,
              perms: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of the ``seed`` perturbed copy with ``perms`` applied. The copy is made
    afresh each time (the perturbation is deterministic) and dropped after, so at most one
    copy of the model is alive at once (ViT-H has 2.5 GB of weights)."""
    clone, sm = perturbed(model, seed, symmap)
    if perms:
        resize(clone, sm, perms)
    return run_model(clone, example_inputs, symmap.output_contract)


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
    clone, sm = perturbed(model, seed, symmap)
    reference = run_model(clone, example_inputs, symmap.output_contract)
    chosen = {g.name: max(1, g.size // 2) for g in groups}
    modules = dict(clone.named_modules())
    members = {m for g in groups for m in g.members}
    owners = {q for q, _ in members if q in modules}
    before = {q: _weight_shapes(modules[q]) for q in owners}
    attrs = {q: _int_attributes(modules[q]) for q in owners}
    expected = _expected_lengths(sm, chosen)
    param_members = sm.analysis.param_members if sm.analysis else frozenset()
    declared = _declared_values(sm, modules, members - param_members, expected)
    try:
        resize(clone, sm, chosen)
    except Exception as exc:
        result.error = f"resize failed: {type(exc).__name__}: {exc}"
        return result
    observed: dict[tuple[str, str], set[int]] = {}
    handles = _measure(sm, modules, observed, {k for k in expected if k not in param_members})
    try:
        out = run_model(clone, example_inputs, symmap.output_contract)
    except Exception as exc:
        result.error = f"the shrunk model fails: {type(exc).__name__}: {exc}"
        return result
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
    return result


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
    always counts against it.
    """
    producers = {(name, s) for name, syms in symmap.named_sym_dicts()
                 for s, sym in syms.items() if sym.is_outgoing}
    analysis = symmap.analysis
    if analysis is not None:
        producers |= analysis.param_producers
    if not producers:
        return 0.0
    modules = {name for name, _ in producers}
    live = {name for g in symmap.groups() for name, s in g.members if (name, s) in producers}
    return len(live) / len(modules)


__all__ = ["NOISE", "NOISE_FLOOR", "NORM_STATISTICS", "SEEDS", "OracleResult",
           "check_permutation", "check_shrink", "coverage", "moving_permutation", "perturbed",
           "run_model"]
