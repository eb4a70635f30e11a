"""The experts of a mixture-of-experts layer scored by their use (the ``fxsym_usage_recorder``
hook): Minitron's expert importance, router load and routing-weighted output.

fxsym's activation importance (:class:`fxsym.importance.ActivationRecorder`) asks the plugins
for recorders of groups better scored by how a calibration run uses them than by their
activations; the hf plugin answers this one for any model with routed groups
(:attr:`fxsym.SymGroup.routed`), the experts found by what their module is called with
(:class:`ExpertRecorder`). Its records (``expert_load``, ``expert_activation``) go into the
plan's ``extra`` of a streamed checkpoint prune.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from fxsym.symbols import SymMap


class ExpertRecorder:
    """Per expert of each routed group of ``symmap`` (:attr:`SymGroup.routed`: the experts of
    a mixture-of-experts layer), how much the calibration tokens use it, recorded by forward
    hooks while the model (or pieces of it) runs: Minitron's expert importance.

    The experts are found by what their module is called with, not by names: a module holding
    a member of the group that is called with *positions* into the group (an integer
    ``[tokens, k]`` tensor, every entry below the group's number of experts: the router's
    pick of ``k`` experts per token), the
    *routing weights* (a floating tensor of the same shape) and the tokens' hidden states (a
    floating tensor with one row per token), and returns a tensor shaped like the hidden
    states. Per group and expert ``e``, over the ``N`` tokens it saw:

    * :attr:`load`: ``Σ w / N``, the tokens' routing weights on ``e`` (the share of the
      tokens routed to it, each counted by its weight);
    * :attr:`activation`: ``Σ ‖w · y‖₂ / n``, ModelOpt's Minitron score: the L2 norm of the
      expert's weighted output ``w · y`` over the ``n`` (token, pick) pairs routed to it. The
      outputs ``y`` of each (token, pick) come from one more call of the module on every
      token-pick pair as a row of its own (positions ``[T·k, 1]``, weights 1: the compute of
      the call itself); they are used only if their routing-weighted sum per token gives the
      module's output back (a module applying the weights otherwise, e.g. to its inputs, is
      scored by load alone: :attr:`linear` is false);
    * :meth:`scores`: ``Σ ‖w · y‖₂ / N``, the expert's mean contribution to the layer's
      output per calibration token (ModelOpt's score times the share of picks, so an expert
      seldom picked counts little however large its output); the load where the outputs
      could not be used.

    Where a unit of the group spans several experts (DeepSeek's routing groups,
    :attr:`SymGroup.unit`), the numbers are per unit: its experts' sums.
    """

    def __init__(self, model: nn.Module, symmap: SymMap) -> None:
        self.modules = dict(model.named_modules())
        self.groups = {g.name: g.size for g in symmap.groups() if g.routed and g.size >= 2}
        self.units = {g.name: g.unit for g in symmap.groups() if g.name in self.groups}
        self.owners: dict[str, list[str]] = {}
        for g in symmap.groups():
            if g.name in self.groups:
                for qualname in dict.fromkeys(q for q, _ in g.members):
                    if qualname in self.modules:
                        self.owners.setdefault(qualname, []).append(g.name)
        self.weight: dict[str, torch.Tensor] = {}
        self.output: dict[str, torch.Tensor] = {}
        self.picks: dict[str, torch.Tensor] = {}
        self.tokens: dict[str, int] = {}
        self.linear: dict[str, bool] = {}
        self.inside = False

    def attach(self, where: Callable[[str], bool] = lambda q: True
               ) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook the modules holding a routed group's members whose qualified names ``where``
        accepts; remove the handles returned when done."""
        return [self.modules[q].register_forward_hook(self._hook(q), with_kwargs=True)
                for q in self.owners if where(q)]

    def _hook(self, qualname: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            if self.inside or not isinstance(output, torch.Tensor):
                return
            for gname in self.owners[qualname]:
                found = _routing(args, kwargs, output, self.groups[gname] * self.units[gname])
                if found is not None:
                    self._record(mod, gname, args, kwargs, output, found)
                    return
        return hook

    def _record(self, mod: nn.Module, gname: str, args: tuple[Any, ...],
                kwargs: dict[str, Any], output: torch.Tensor, where: tuple[Any, Any, Any]
                ) -> None:
        x_at, p_at, w_at = where
        x, pos, w = _get(args, kwargs, x_at), _get(args, kwargs, p_at), _get(args, kwargs, w_at)
        size, k = self.groups[gname], pos.shape[-1]
        flat_pos = pos.reshape(-1).long().cpu() // self.units[gname]
        flat_w = w.detach().reshape(-1).double().cpu()
        new = gname not in self.weight
        if new:
            for acc in (self.weight, self.output, self.picks):
                acc[gname] = torch.zeros(size, dtype=torch.float64)
            self.tokens[gname] = 0
            self.linear[gname] = True
        self.weight[gname].index_add_(0, flat_pos, flat_w)
        self.picks[gname].index_add_(0, flat_pos, torch.ones_like(flat_w))
        self.tokens[gname] += pos.numel() // k
        if not self.linear[gname]:
            return
        rows = x.repeat_interleave(k, dim=0)
        one = torch.ones((pos.numel(), 1), dtype=w.dtype, device=w.device)
        a, kw = _put(args, kwargs, {x_at: rows, p_at: pos.reshape(-1, 1), w_at: one})
        self.inside = True
        try:
            y = mod(*a, **kw)
        except Exception:
            y = None
        finally:
            self.inside = False
        if not isinstance(y, torch.Tensor) or y.shape != (pos.numel(), *output.shape[1:]):
            self.linear[gname] = False
            return
        y = y.detach().double().cpu().reshape(pos.numel(), -1)
        weighted = y * flat_w[:, None]
        again = weighted.reshape(-1, k, weighted.shape[-1]).sum(1)
        want = output.detach().double().cpu().reshape(again.shape)
        tolerance = min(0.1, 100 * torch.finfo(output.dtype).eps)
        if float((again - want).norm()) > tolerance * float(want.norm()) + 1e-12:
            self.linear[gname] = False
            return
        self.output[gname].index_add_(0, flat_pos, weighted.norm(dim=1))

    @property
    def load(self) -> dict[str, list[float]]:
        return {g: (w / max(self.tokens[g], 1)).tolist() for g, w in self.weight.items()}

    @property
    def activation(self) -> dict[str, list[float]]:
        return {g: (self.output[g] / self.picks[g].clamp(min=1)).tolist()
                for g in self.weight if self.linear[g]}

    def scores(self) -> dict[str, torch.Tensor]:
        """``{routed group: one score per expert}`` for the groups whose experts ran."""
        return {g: (self.output[g] if self.linear[g] else w) / max(self.tokens[g], 1)
                for g, w in self.weight.items()}

    def records(self) -> dict[str, dict[str, list[float]]]:
        """``expert_load`` and ``expert_activation`` (:attr:`load`, :attr:`activation`)
        where some experts ran, else nothing."""
        return ({"expert_load": self.load, "expert_activation": self.activation}
                if self.weight else {})


def _routing(args: tuple[Any, ...], kwargs: Mapping[str, Any], output: torch.Tensor,
             size: int) -> tuple[Any, Any, Any] | None:
    """Where a call's hidden states, positions and routing weights are (index in ``args`` or
    keyword), if it was called with positions into a dim of ``size`` (see
    :class:`ExpertRecorder`)."""
    found: list[tuple[int | str, torch.Tensor]] = [
        (i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    found += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    for p_at, pos in found:
        if (pos.is_floating_point() or pos.dtype == torch.bool or pos.dim() != 2
                or not pos.numel() or int(pos.min()) < 0 or int(pos.max()) >= size):
            continue
        for w_at, w in found:
            if not (w.is_floating_point() and w.shape == pos.shape):
                continue
            for x_at, x in found:
                if (x_at != w_at and x.is_floating_point() and x.dim() == 2
                        and x.shape[0] == pos.shape[0] and output.shape == x.shape):
                    return x_at, p_at, w_at
    return None


def _get(args: tuple[Any, ...], kwargs: Mapping[str, Any], at: Any) -> torch.Tensor:
    value = args[at] if isinstance(at, int) else kwargs[at]
    assert isinstance(value, torch.Tensor)
    return value


def _put(args: tuple[Any, ...], kwargs: dict[str, Any], values: Mapping[Any, torch.Tensor]
         ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    a = [values.get(i, v) for i, v in enumerate(args)]
    return tuple(a), {k: values.get(k, v) for k, v in kwargs.items()}


