"""The lock-step streamed run: every calibration batch through the model's own ``forward``,
the model's parameters on the meta device and read from the checkpoint only when needed.

The batches are held in lock step at the model's repeated blocks (:func:`block_list`: the
``nn.ModuleList`` holding most parameters, a decoder's layers; :mod:`fxsym.prune.lockstep`):
when every batch waits at block ``i``, its tensors are read (a :class:`Loader` from a
:class:`Source`), the batches pass it one after another while a :class:`Watch` looks on, and
its parameters go back to being unread. Nothing is replayed: each block receives what the
model gives it (per-layer masks, rotary tables, caches), so the run is the in-memory run. A
module outside the blocks (embeddings, final norm, head) gets its tensors when it is first
called and gives them back when the run opens its next block (every batch's embedding runs
before the first block, every batch's head after the last: each read once, not once per
batch). A parameter not in memory is an :class:`Unread` (its metadata, an error for any other
use: never a made-up value). :func:`stream_together` runs several models at once (the search's
candidates), one lock step whose gates open in the order of the checkpoint's blocks, so a
source shared by their loaders reads each block once for all of them.

Imports from fxsym: errors (console, importance and lockstep inside functions).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ...errors import CheckpointError
from .memory import trim


def block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` of ``model`` holding the most parameters (a decoder's layers),
    with its qualified name; ``None`` if no list holds any."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod):
            count = sum(p.numel() for p in mod.parameters())
            if count and (best is None or count > best[0]):
                best = (count, name, mod)
    return None if best is None else (best[1], best[2])


class Unread(nn.Parameter):
    """Stands, during a streamed run, for a parameter whose tensor is not in memory: it has the
    parameter's shape and dtype on the CPU (one number, expanded), so code reading its device,
    dtype or shape sees what the loaded model shows (transformers' Llama 4 moves the token ids
    to its embedding's device before calling it), and any other use raises
    :class:`~fxsym.errors.CheckpointError` naming it. A value read outside the call of a module
    holding it is not streamed, and never guessed: a meta tensor there gave uninitialised
    memory (torch's embedding of meta indices returns a CPU tensor of garbage)."""

    #: what may be read of it: metadata only
    METADATA = frozenset({"device", "dtype", "shape", "is_meta", "requires_grad", "ndim",
                          "layout", "is_cuda", "is_sparse", "is_quantized", "is_nested", "size",
                          "dim", "numel", "is_floating_point", "is_complex", "element_size",
                          "get_device", "grad_fn", "grad", "is_leaf", "names"})
    fxsym_name: str

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        what = (getattr(getattr(func, "__self__", None), "__name__", None)
                if getattr(func, "__name__", None) == "__get__"
                else getattr(func, "__name__", None))
        if what in cls.METADATA:
            return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]
        name = next((a.fxsym_name for a in args if isinstance(a, Unread)), "a parameter")
        raise CheckpointError(f"{name} was used ({what}) while no module holding it was "
                              "running: the model's code reads it outside the modules' "
                              "calls, so it cannot be streamed a block at a time")


class Loader:
    """Puts checkpoint tensors into the meta model's parameters and takes them out again.

    A parameter is known by its first qualified name; loading it gives the tensor (in the meta
    parameter's dtype) to every place holding it, so tied weights stay tied, and reads it
    under whichever of its names the files hold. During a run (:meth:`begin` to :meth:`end`)
    a parameter not loaded is an :class:`Unread` in every place: releasing puts it back,
    freeing the tensor; :meth:`end` puts the model's own meta parameters back."""

    def __init__(self, model: nn.Module, tensors: Source) -> None:
        self.tensors = tensors
        self.places: dict[str, list[tuple[nn.Module, str, str]]] = {}
        self.first: dict[tuple[int, str], str] = {}
        self.meta: dict[str, nn.Parameter] = {}
        self.unread: dict[str, Unread] = {}
        self.loaded: set[str] = set()
        #: the parameters of modules outside the blocks kept after their call, until
        #: :meth:`drop_held` (:meth:`on_call`)
        self.held: set[str] = set()
        by_id: dict[int, str] = {}
        for qual, mod in model.named_modules(remove_duplicate=False):
            for attr, p in mod.named_parameters(recurse=False, remove_duplicate=False):
                name = f"{qual}.{attr}" if qual else attr
                first = by_id.setdefault(id(p), name)
                self.places.setdefault(first, []).append((mod, attr, name))
                self.first[(id(mod), attr)] = first
                self.meta[first] = p

    def names(self, module: nn.Module, *, recurse: bool = True) -> list[str]:
        """The first names of ``module``'s parameters (its own only, without ``recurse``)."""
        mods = module.modules() if recurse else [module]
        return list(dict.fromkeys(self.first[(id(m), attr)] for m in mods
                                  for attr, _ in m.named_parameters(recurse=False)))

    def _put(self, first: str, p: nn.Parameter) -> None:
        for mod, attr, _ in self.places[first]:
            setattr(mod, attr, p)

    def begin(self) -> None:
        """Every parameter an :class:`Unread` until loaded."""
        for first, meta in self.meta.items():
            if first not in self.unread:
                placeholder = Unread(torch.zeros((), dtype=meta.dtype).expand(meta.shape),
                                      requires_grad=False)
                placeholder.fxsym_name = first
                self.unread[first] = placeholder
            self._put(first, self.unread[first])

    def end(self) -> None:
        """The model's own meta parameters back in every place; every tensor freed."""
        for first, meta in self.meta.items():
            self._put(first, meta)
        self.held.clear()
        if self.loaded:
            self.loaded.clear()
            trim()

    def load(self, names: Sequence[str]) -> None:
        wanted: list[tuple[str, str]] = []
        for first in names:
            if first in self.loaded:
                continue
            places = self.places[first]
            stored = next((n for _, _, n in places if self.tensors.has(n)), None)
            if stored is None:
                raise CheckpointError(f"{self.tensors.directory}: no weight file holds {first}")
            wanted.append((first, stored))
        got = self.tensors.read([stored for _, stored in wanted])
        for first, stored in wanted:
            meta = self.meta[first]
            t = got.pop(stored)
            if t.shape != meta.shape:
                raise CheckpointError(f"{stored}: the weights hold shape {tuple(t.shape)}, the "
                                      f"model built from the config {tuple(meta.shape)}")
            self._put(first, nn.Parameter(t.to(meta.dtype), requires_grad=False))
            self.loaded.add(first)

    def release(self, names: Sequence[str]) -> None:
        freed = [first for first in names if first in self.loaded]
        for first in freed:
            self._put(first, self.unread[first])
            self.loaded.discard(first)
        if freed:
            trim()

    def on_call(self, modules: Sequence[nn.Module]) -> list[Any]:
        """Hooks loading each module's own parameters when it is called and keeping them
        when it returns, until :meth:`drop_held` (the modules outside the blocks: the
        streamed run drops them when it opens its next block, so the batches that call one
        in turn, such as every batch's embedding before the first block and head after the
        last, read its tensors once, and no more is in memory at once than the block the
        batches have just passed beside it; a parameter several of them hold, such as an
        embedding tied to the head, is kept from its first call to :meth:`end`, so it is read
        once, not again for the head); remove the handles returned when done."""
        handles = []
        owned = [self.names(mod, recurse=False) for mod in modules]
        holders = Counter(name for own in owned for name in own)
        for mod, own in zip(modules, owned):
            if own:
                dropped = [name for name in own if holders[name] == 1]
                handles.append(mod.register_forward_pre_hook(
                    lambda m, args, own=own: self.load(own)))
                handles.append(mod.register_forward_hook(
                    lambda m, args, out, dropped=dropped: self.held.update(dropped)))
        return handles

    def drop_held(self) -> None:
        """Release the parameters :meth:`on_call` kept."""
        if self.held:
            held, self.held = list(self.held), set()
            self.release(held)


def _hidden(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    """A block's carried hidden states: its first positional argument, else its first
    floating-point tensor keyword argument."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise CheckpointError("cannot tell which argument of a block carries the hidden states "
                          "(no tensor argument)")


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise CheckpointError(f"a block returned a {type(out).__name__}, not hidden states")


class Watch:
    """What a streamed run (:func:`stream`) does besides running the model: the hooks
    attached while block ``i`` is loaded and for the whole run (handles, removed after), each
    block's input and output hidden states, the model's output for each batch (told as the
    batch ends and dropped: a run of many batches, or of many candidates, never holds all
    their logits)."""

    def block(self, i: int) -> list[Any]:
        return []

    def pair(self, i: int, h: torch.Tensor, o: torch.Tensor) -> None:
        pass

    def rest(self) -> list[Any]:
        return []

    def output(self, batch: Any, out: Any) -> None:
        pass


class Source(Protocol):
    """Where :class:`Loader` reads tensors by the model's names (:class:`~.tensors.Tensors`;
    the search's pruned copies read theirs through :mod:`.losses`)."""

    directory: Path

    def has(self, name: str) -> bool: ...

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]: ...


def stream(model: nn.Module, loader: Loader, batches: Sequence[Any], watch: Watch, *,
            progress: bool = False, description: str = "calibration") -> None:
    """Run ``model`` (parameters on the meta device, read by ``loader`` when needed) on
    ``batches``, every batch through the model's own ``forward``, held in lock step at the
    blocks of its block list (:func:`fxsym.lockstep.run_in_lockstep`): a block's tensors are
    read once, when the batches reach it, and given back when they have all passed it; a
    module outside the blocks gets its tensors when it is called and gives them back when the
    next block is opened (:meth:`Loader.on_call`). ``watch`` is told; ``model``'s
    parameters are on the meta device again when this returns."""
    stream_together([Trial(model, loader, watch)], batches, progress=progress,
                     description=description)


@dataclass
class Trial:
    """A meta model streamed on the calibration batches (:func:`stream_together`): where its
    tensors come from, what watches it, and for each of its blocks the block of the checkpoint
    it is read from (``None``: its own positions)."""

    model: nn.Module
    loader: Loader
    watch: Watch
    sources: Sequence[int] | None = None


def stream_together(trials: Sequence[Trial], batches: Sequence[Any], *,
                     reached: Callable[[int], None] = lambda source: None,
                     progress: bool = False, description: str = "calibration") -> None:
    """:func:`stream` of several models at once: every batch through every model, in one lock
    step whose gates are all the models' blocks, opened in the order of the checkpoint's
    blocks they are read from (``reached(i)`` before each gate of checkpoint block ``i``): a
    source shared by the loaders reads each block once for all the models."""
    import contextlib

    from ..console import steps
    from ..importance import run_batch
    from ..lockstep import run_in_lockstep

    gates: list[nn.Module] = []
    owners: list[tuple[Trial, int]] = []
    labels: list[str] = []
    order: list[int] = []
    handles: list[Any] = []
    for t, trial in enumerate(trials):
        found = block_list(trial.model)
        if found is None:
            raise CheckpointError("the model holds no list of blocks to stream through")
        prefix, blocks = found
        sources = list(range(len(blocks))) if trial.sources is None else trial.sources
        gates += blocks
        owners += [(trial, i) for i in range(len(blocks))]
        which = f", candidate {t + 1} of {len(trials)}" if len(trials) > 1 else ""
        labels += [f"{prefix}.{k}{which}" for k in sources]
        order += sources
        block_ids = {id(m) for b in blocks for m in b.modules()}
        handles += trial.loader.on_call([m for m in trial.model.modules()
                                         if id(m) not in block_ids])
    jobs = [(trial, batch) for trial in trials for batch in batches]
    attached: list[Any] = []

    def enter(g: int) -> None:
        trial, i = owners[g]
        for t in trials:
            t.loader.drop_held()
        reached(order[g])
        step(labels[g])
        trial.loader.load(trial.loader.names(gates[g]))
        attached.extend(trial.watch.block(i))

    def leave(g: int) -> None:
        while attached:
            attached.pop().remove()
        trial = owners[g][0]
        trial.loader.release(trial.loader.names(gates[g]))

    def passed(g: int, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        trial, i = owners[g]
        trial.watch.pair(i, _hidden(args, kwargs), _first(out))

    def run(job: tuple[Trial, Any]) -> None:  # the output told and dropped at once
        trial, batch = job
        trial.watch.output(batch, run_batch(trial.model, batch))

    try:
        for trial in trials:
            trial.model.eval()
            trial.loader.begin()
            handles += trial.watch.rest()
        with (steps(len(gates), description=description) if progress
              else contextlib.nullcontext(lambda label: None)) as step:
            run_in_lockstep(run, jobs, gates, enter=enter, leave=leave, on_pass=passed,
                            order=order)
    finally:
        for h in handles:
            h.remove()
        for trial in trials:
            trial.loader.end()
