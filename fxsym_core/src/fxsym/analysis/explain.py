"""Report lines that explain pins, written after the walk.

Two explanations need the whole run: :meth:`Explanations.explain_fixed_sizes` names the model
input dims that set the fixed sizes groups were pinned at (:mod:`.input_sizes`, which may run
shadows of modules with a SymInfo on fake tensors: :meth:`Explanations._may_run_fake`), and
:meth:`Explanations.explain_no_group`, for a model left with no searchable group, names the
boundaries that pinned most of its producers, or says that nothing produces a resizable size.
:func:`fxsym.analysis.api.analyze` calls them on the run it keeps.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from .input_sizes import FIXED_DIM, describe, fixed_candidates, input_dims
from .state import AnalyzerBase


class Explanations(AnalyzerBase):
    """The part of the analyzer that explains pins once the walk is done."""

    def explain_fixed_sizes(self) -> None:
        """Name the model input dims that set the fixed sizes groups were pinned at
        (:mod:`.input_sizes`)."""
        meets = [(node, g, size) for node, g, size in self.fixed_meets
                 if self.table.reason(g) == FIXED_DIM]
        if not meets:
            return
        candidates = {(node, g): fixed_candidates(node, size, self.env)
                      for node, g, size in meets}
        found = input_dims(self.gm, [c for cs in candidates.values() for c in cs],
                           self._may_run_fake)
        for (node, g), cs in candidates.items():
            hit = next((c for c in cs if c in found), None)
            if hit is not None:
                self.reword_pin(node, g, FIXED_DIM, describe(*hit, found[hit]))

    def _may_run_fake(self, mod: torch.nn.Module) -> bool:
        """Whether :mod:`.input_sizes` may call (a shadow of) ``mod`` on fake tensors: a
        family with a SymInfo, in eval mode, and no global hook (process-wide, the user's)."""
        if mod not in self.symmap or _global_forward_hooks or _global_forward_pre_hooks:
            return False
        return not any(m.training for m in mod.modules())

    def explain_no_group(self) -> None:
        """Report, for a model left with no searchable group, what pinned its producers (the
        boundaries that reached most of them), or that nothing produces a resizable size."""
        find = self.table.find
        pinned: dict[str, tuple[int, str]] = {}  # reason -> (groups, first place)
        producers = 0
        for root, found in self.table.producers.items():
            if find(root) != root or not any(ok for *_, ok in found):
                continue
            producers += 1
            where, reason = next(((w, r) for g, w, r in self.pin_sites if find(g) == root),
                                 ("", self.table.reasons.get(root, "unknown")))
            count, first = pinned.get(reason, (0, where))
            pinned[reason] = (count + 1, first or where)
        if not producers:
            self.report.add("no-group", "model", (
                "no group: nothing in the graph produces a resizable size (no module with a "
                "SymInfo was called, and no op rule declared a parameter a producer)"))
            return
        top = sorted(pinned.items(), key=lambda kv: -kv[1][0])[:3]
        where = "; ".join(f"{reason!r} ({n}, first at {w or 'the group table'})"
                          for reason, (n, w) in top)
        self.report.add("no-group", "model", (
            f"no group: all {producers} producing groups are constant; pinned by {where}"))
