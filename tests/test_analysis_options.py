"""Analysis options are the plugins' (issue 32 §1: the kernel names no role): a plugin declares
a keyword of :func:`fxsym.analyze` (``fxsym_analysis_options``, an
:class:`~fxsym.plugins.contracts.AnalysisOption`), and the kernel's own mechanism for a group
picked by value and split into blocks (keep the number of blocks, one position of every
block a unit) is asked for by whichever option declares the value that keeps them. The nn
plugin's ``routing_groups="keep"`` is one such value; a third party's option of another name
gives the same analysis. A keyword no plugin declares is refused with a typed error.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxsym
from fxsym.plugins.contracts import AnalysisOption


class BlockPicked(nn.Module):
    """Items scored, viewed as ``blocks`` blocks; the best block is picked (``topk`` over the
    blocks' maxima), the items outside it masked, and ``top_k`` items picked by value."""

    def __init__(self, items: int = 8, blocks: int = 2, top_k: int = 2) -> None:
        super().__init__()
        self.num_items, self.num_blocks, self.top_k = items, blocks, top_k
        self.score = nn.Parameter(torch.randn(items, 4))
        self.table = nn.Parameter(torch.randn(items, 4))
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.linear(x, self.score)
        per = self.num_items // self.num_blocks
        best = s.view(-1, self.num_blocks, per).topk(1, dim=-1)[0].sum(dim=-1)
        mask = torch.zeros_like(best)
        mask.scatter_(1, torch.topk(best, k=1, dim=-1)[1], 1)
        mask = mask.unsqueeze(-1).expand(-1, self.num_blocks, per).reshape(-1, self.num_items)
        s = s.masked_fill(~mask.bool(), float("-inf"))
        w, idx = torch.topk(s, k=self.top_k, dim=-1)
        y = (self.table[idx.reshape(-1)].view(x.shape[0], self.top_k, -1)
             * w.softmax(dim=-1).unsqueeze(-1)).sum(dim=1)
        return self.out(y)


class Positions:
    """A third party's plugin declaring an option of its own name that keeps the blocks."""

    @fxsym.hookimpl
    def fxsym_analysis_options(self) -> tuple[AnalysisOption, ...]:
        return (AnalysisOption("score_blocks", ("whole", "positions"), "how scored blocks "
                               "change", keeps_picked_blocks="positions"),)


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),)


def _group(sm: fxsym.SymMap) -> fxsym.SymGroup:
    (g,) = [g for g in sm.groups() if ("", "score:0") in g.members]
    return g


def test_a_plugins_option_keeps_the_blocks_of_picked_groups() -> None:
    """A third party's ``score_blocks="positions"``, declared with ``keeps_picked_blocks``,
    gives the analysis of the nn plugin's ``routing_groups="keep"``: the unit is one position
    of every block (4 positions of 2 blocks), ``num_blocks`` stays; the model pruned to
    positions ``[3, 0]`` equals, in float64, one built from the rows of those positions in
    each block. Without the option the unit is a whole block."""
    torch.manual_seed(0)
    model = BlockPicked().double()
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(Positions(), name="positions")
    with fxsym.use_plugins(pm):
        whole = _group(fxsym.analyze(model, example_inputs=_inputs()))
        sm = fxsym.analyze(model, example_inputs=_inputs(), score_blocks="positions")
        keep = _group(fxsym.analyze(model, example_inputs=_inputs(), routing_groups="keep"))
    assert (whole.size, whole.unit) == (2, 4)
    group = _group(sm)
    assert sm.analysis_options == {"score_blocks": "positions"}
    assert group.routed and (group.size, group.unit) == (4, 1) == (keep.size, keep.unit)
    assert sorted(group.members) == sorted(keep.members)
    assert ("", "attr:num_items") in group.members
    rows = [b * 4 + p for b in range(2) for p in (3, 0)]
    reference = BlockPicked(items=4).double()
    with torch.no_grad():
        reference.score.copy_(model.score[rows])
        reference.table.copy_(model.table[rows])
        reference.out.load_state_dict(model.out.state_dict())
    fxsym.resize(model, sm, {group.name: [3, 0]})
    assert (model.num_items, model.num_blocks) == (4, 2)
    torch.testing.assert_close(model(*_inputs()), reference(*_inputs()), rtol=0, atol=1e-12)


def test_an_option_no_plugin_declares_is_refused() -> None:
    """A keyword of :func:`fxsym.analyze` no plugin declares is an AnalysisError naming the
    declared ones; a declared option's value outside its values is one too."""
    model = BlockPicked()
    inputs = (torch.randn(5, 4),)
    with pytest.raises(fxsym.AnalysisError, match=r"unknown analysis option 'score_blocks'.*"
                       r"norm_groups, routing_groups"):
        fxsym.analyze(model, example_inputs=inputs, score_blocks="positions")
    with pytest.raises(fxsym.AnalysisError, match="norm_groups must be one of"):
        fxsym.analyze(model, example_inputs=inputs, norm_groups="drop")


def test_the_option_readers_of_fxsym_analysis_are_deprecated() -> None:
    """``fxsym.analysis.norm_groups`` (and any declared option's name) still gives a reader of
    the option, with a DeprecationWarning naming ``analysis_option``; it reads the default
    outside an analysis."""
    import fxsym.analysis

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = fxsym.analysis.norm_groups
    assert reader() == "follow"
    assert any(issubclass(w.category, DeprecationWarning)
               and "analysis_option('norm_groups')" in str(w.message) for w in caught)
    with pytest.raises(AttributeError):
        fxsym.analysis.no_such_option  # noqa: B018


def test_a_fresh_process_checks_options_before_anything_is_traced() -> None:
    """A prune checks its analysis options before it traces anything (``prune_checkpoint``'s
    first step): in a fresh interpreter the declarations load the plugins' entry points as a
    trace does (before: 'unknown analysis option routing_groups: the plugins declare none',
    so ``fxsym.prune_checkpoint`` failed in any process that had traced nothing)."""
    import json
    import subprocess
    import sys

    code = ("import json; from fxsym.analysis.options import checked_options; "
            "print(json.dumps(checked_options(routing_groups='keep', norm_groups='follow')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"routing_groups": "keep"}


def test_the_request_checks_its_analysis_options() -> None:
    """``PruneRequest(analysis_options=...)`` is checked against the declarations, in the
    caller's words: a declared option and value pass; an undeclared name or value is an
    ``AnalysisError`` naming the declared ones (``--routing-group`` on the command line); an
    option whose declaration refuses checkpoints (the nn plugin's ``norm_groups``) is refused
    there with its reason; ``prune_checkpoint`` refuses a keyword that is no declared option as
    Python does (a declared one is the deprecated spelling)."""
    from fxsym.prune.cli import flags
    from fxsym.prune.request import PruneRequest

    fxsym.load_plugins()
    asked = PruneRequest(ratio=0.5, analysis_options={"routing_groups": "keep"}).check()
    assert asked.request.analysis_options == {"routing_groups": "keep"}
    with pytest.raises(fxsym.AnalysisError, match="unknown analysis option routing_group: "
                       "the plugins declare norm_groups, routing_groups"):
        PruneRequest(ratio=0.5, analysis_options={"routing_group": "keep"}).check()
    with pytest.raises(fxsym.AnalysisError, match="unknown analysis option --routing-group: "
                       "the plugins declare --norm-groups, --routing-groups"):
        PruneRequest(ratio=0.5, analysis_options={"routing_group": "keep"}).check(flags())
    with pytest.raises(fxsym.AnalysisError, match="norm_groups must be one of 'follow', "
                       "'keep', got 'split'"):
        PruneRequest(ratio=0.5, analysis_options={"norm_groups": "split"}).check()
    with pytest.raises(fxsym.PlanError, match="norm_groups keep is not available for a "
                       "checkpoint directory: it is analyzed in the default mode"):
        PruneRequest(checkpoint=True, ratio=0.5, analysis_options={"norm_groups": "keep"}
                     ).check()
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        fxsym.prune_checkpoint("in", "out", ratio=0.5, colour="blue")
