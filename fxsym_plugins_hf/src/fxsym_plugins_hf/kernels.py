"""Sizes transformers' own kernels take (the ``fxsym_group_steps`` hook).

A mixture-of-experts layer whose class transformers decorates with
``use_experts_implementation`` stores its experts fused (``gate_up_proj`` ``[E, 2I, H]``,
``down_proj`` ``[E, H, I]``) and, by default, runs them through the ``grouped_mm`` experts
kernel: ``torch.nn.functional.grouped_mm`` over the fused tensors, which refuses a matrix
whose rows are not 16-byte aligned ("strides should be multiple of 16 bytes"). fxsym traces
the ``batched_mm`` kernel instead (:mod:`.context`), where any size runs, so the trace cannot
see this: the plugin says it. Every dim but the experts' of such a fused 3-D parameter (the
expert FFN width ``I`` and the hidden size ``H``) takes multiples of 8 entries: 16 bytes in
bfloat16 and float16, the narrowest dtypes the kernel takes (float32 needs 4; a checkpoint is
commonly pruned in one dtype and run in another), so a plan stays runnable in each.

The layers are found by what their class's ``forward`` dispatches through (transformers'
``ExpertsInterface``), never by family name; every family with fused experts (Mixtral,
Qwen2/3-MoE, OLMoE, GraniteMoE, PhiMoE, DeepSeek, GPT-OSS, ...) shares the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from fxsym.plugins.contracts import GroupStep

#: the alignment ``grouped_mm`` needs, in bytes, and the narrowest element it takes
ALIGN_BYTES = 16
NARROWEST_BYTES = 2
STEP = ALIGN_BYTES // NARROWEST_BYTES
REASON = (f"transformers' grouped_mm experts kernel needs 16-byte aligned rows of the fused "
          f"expert tensors: multiples of {STEP} entries in bfloat16/float16")


def group_steps(model: nn.Module, symmap: Any) -> dict[str, GroupStep]:
    """``{group name: GroupStep(entries, reason)}`` for the groups holding a non-expert dim of
    a fused expert tensor that transformers' experts kernels read (see the module
    docstring)."""
    dims = {(name, f"{pname}:{d}") for name, mod in _expert_kernel_modules(model)
            for pname, p in mod.named_parameters(recurse=False) if p.dim() == 3
            for d in (1, 2)}
    if not dims:
        return {}
    return {g.name: GroupStep(STEP, REASON) for g in symmap.groups()
            if dims.intersection(g.members)}


def _expert_kernel_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The modules whose class's ``forward`` dispatches through transformers'
    ``ExpertsInterface`` (``use_experts_implementation``)."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:  # a transformers without fused experts kernels
        return
    dispatching: dict[type, bool] = {}
    for name, mod in model.named_modules():
        cls = type(mod)
        if cls not in dispatching:
            cells = getattr(cls.forward, "__closure__", None) or ()
            dispatching[cls] = any(isinstance(_contents(c), ExpertsInterface) for c in cells)
        if dispatching[cls]:
            yield name, mod


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None
