"""torch's own forward pre-hooks that compute a module's weight, declared as derived tensors.

``torch.nn.utils.weight_norm``, ``spectral_norm`` and ``torch.nn.utils.prune`` (the hook
versions, not ``parametrizations``) replace a module's ``weight`` parameter by sources and
recompute ``weight`` from them before every forward. The module's family (a convolution, a
linear layer) still reads ``weight``, so its SymInfo describes it; what a resize must change is
the sources (:class:`fxsym.plugins.hookroles.DerivedTensors`):

* ``weight_norm``: ``weight = g * v / ||v||``, the norm taken over every dim but ``dim`` (over
  all of them for ``dim=None``). Keeping entries along ``dim`` keeps them in ``g`` and ``v``;
  along another dim it keeps them in ``v`` and scales ``g`` by ``||v_kept|| / ||v||``, so
  that every entry kept is what it was: the resized weight is the sliced one. A slice whose
  kept entries of ``v`` are all zero cannot be written that way (``0 / 0``) and is refused.
* ``prune``: ``weight = weight_orig * weight_mask``: both keep the entries.
* ``spectral_norm``: ``weight = weight_orig / sigma``, sigma estimated by power iteration
  from ``weight_orig`` and the vectors ``weight_u``/``weight_v``. A resize changes sigma
  (and, in training, the power iteration's fixed point), so no slicing of the sources is
  proven to give the sliced weight: declared without ``keep``, which pins the module's groups.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from fxsym.errors import ResizeError
from fxsym.plugins.hookroles import DerivedTensors
from fxsym.resizing import keep_entries


def derived_tensors(hook: Any) -> DerivedTensors | None:
    """What ``hook`` computes, if it is one of torch's weight-computing pre-hooks."""
    if isinstance(hook, WeightNorm):
        return DerivedTensors((hook.name,), (f"{hook.name}_g", f"{hook.name}_v"),
                              keep=_keep_weight_norm)
    if isinstance(hook, BasePruningMethod) and getattr(hook, "_tensor_name", None):
        name = hook._tensor_name
        return DerivedTensors((name,), (f"{name}_orig", f"{name}_mask"), keep=_keep_pruned)
    if isinstance(hook, SpectralNorm):
        return DerivedTensors(
            (hook.name,), (f"{hook.name}_orig", f"{hook.name}_u", f"{hook.name}_v"),
            reason="torch.nn.utils.spectral_norm divides it by a spectral norm estimated from "
                   "all of its entries (power iteration): a resize changes that estimate, and "
                   "no resize of its sources is proven to keep the entries kept")
    return None


def _keep_weight_norm(module: nn.Module, hook: Any, name: str, dim: int,
                      index: torch.Tensor) -> None:
    g_name, v_name = f"{hook.name}_g", f"{hook.name}_v"
    v, g = getattr(module, v_name), getattr(module, g_name)
    d = dim % v.dim()
    norm_dim = hook.dim  # -1: the norm over the whole tensor (torch.norm_except_dim)
    keep_entries(module, v_name, d, index)
    if norm_dim != -1 and d == norm_dim % v.dim():
        keep_entries(module, g_name, d, index)
    elif not v.is_meta:
        new_v = getattr(module, v_name)
        with torch.no_grad():
            old = torch.norm_except_dim(v.detach().double(), 2, norm_dim)
            new = torch.norm_except_dim(new_v.detach().double(), 2, norm_dim)
            if bool(((new == 0) & (old != 0)).any()):
                raise ResizeError(
                    f"{name} of {type(module).__name__} is computed by weight_norm: the entries "
                    f"kept along dim {d} are all zero in a slice along dim {norm_dim}, which "
                    "weight_norm cannot write (0/0); keep other entries or remove_weight_norm")
            ratio = torch.where(old == 0, torch.ones_like(old), new / old.clamp_min(1e-300))
            scaled = (g.detach().double() * ratio).to(g.dtype)
        setattr(module, g_name, nn.Parameter(scaled, requires_grad=g.requires_grad))
    with torch.no_grad():  # a leaf tensor, as after a forward without grad
        setattr(module, name, hook.compute_weight(module))


def _keep_pruned(module: nn.Module, hook: Any, name: str, dim: int,
                 index: torch.Tensor) -> None:
    keep_entries(module, f"{name}_orig", dim, index)
    keep_entries(module, f"{name}_mask", dim, index)
    with torch.no_grad():
        setattr(module, name, hook.apply_mask(module))
