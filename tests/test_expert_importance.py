"""Minitron's expert importance (issue 22 §2): the experts of a mixture-of-experts layer (a
routed group) are ranked by how the calibration tokens use them: the routing weight each gets
(router load) and the norm of its weighted output, recorded on the module the router's picks
are passed to (found by what it is called with, not by names). Calibration here makes experts
1 and 3 the only ones ever picked, while experts 0 and 2 hold the largest weights: activation
importance keeps 1 and 3, weight norms (and ties) do not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import group_with
from torch import nn

import fxsym
from fxsym.prune.importance import ActivationRecorder, run_batch
from fxsym.prune.search import sizes_for
from fxsym_plugins_hf.experts import ExpertRecorder

H, INTER, E, K = 8, 6, 4, 2


class Experts(nn.Module):
    """Experts fused into 3-D tensors, called with the tokens, the router's picks and their
    weights (transformers 5's experts interface); ``weigh_inputs`` applies the weights to the
    inputs instead of the outputs (not a weighted sum of the experts' outputs)."""

    def __init__(self, weigh_inputs: bool = False) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(E, 2 * INTER, H))
        self.down = nn.Parameter(torch.randn(E, H, INTER) / 4)
        self.weigh_inputs = weigh_inputs

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        k = idx.shape[1]
        flat = idx.reshape(-1)
        h = x.repeat_interleave(k, dim=0)
        if self.weigh_inputs:
            h = h * weights.reshape(-1, 1)
        gate, up = torch.bmm(self.gate_up[flat], h.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        y = torch.bmm(self.down[flat], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        if not self.weigh_inputs:
            y = y * weights.reshape(-1, 1)
        return y.view(x.shape[0], k, -1).sum(dim=1)


class MoE(nn.Module):
    def __init__(self, weigh_inputs: bool = False) -> None:
        super().__init__()
        self.router = nn.Linear(H, E, bias=False)
        self.experts = Experts(weigh_inputs)
        self.out = nn.Linear(H, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, idx = torch.topk(self.router(tokens).softmax(dim=-1), K, dim=-1)
        y = self.experts(tokens, idx, weights)
        return self.out(y.reshape(x.shape))


def busy_one_and_three(weigh_inputs: bool = False) -> tuple[MoE, list[torch.Tensor]]:
    """Channel 0 of every calibration token is large and positive; the router reads only it,
    up for experts 1 and 3, down for 0 and 2; experts 0 and 2 have the largest weights."""
    torch.manual_seed(0)
    model = MoE(weigh_inputs).eval()
    with torch.no_grad():
        model.router.weight.zero_()
        model.router.weight[:, 0] = torch.tensor([-5.0, 2.0, -5.0, 1.0])
        for e in (0, 2):
            model.experts.gate_up[e] *= 3
            model.experts.down[e] *= 3
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        x = torch.randn(2, 5, H, generator=g)
        x[..., 0] = 2 + torch.rand(2, 5, generator=g)
        batches.append(x)
    return model, batches


def _kept(model: MoE, sm: fxsym.SymMap, importance: object) -> list[int]:
    experts = group_with(sm, "router", "out_features")
    plan = fxsym.plan(model, sm, importance=importance,  # type: ignore[arg-type]
                      sizes=sizes_for(sm, experts=2))
    keep = {c.name: c.keep for c in plan.groups}[experts.name]
    assert keep is not None
    return sorted(keep)


def test_activation_importance_keeps_the_experts_the_calibration_routes_to() -> None:
    model, batches = busy_one_and_three()
    sm = fxsym.analyze(model, example_inputs=(batches[0],))
    experts = group_with(sm, "router", "out_features")
    assert experts.routed and experts.size == E
    assert _kept(model, sm, fxsym.importance.activation(batches, consumers_only=True)) == [1, 3]
    assert _kept(model, sm, "l2") == [0, 2]
    uniform = {g.name: torch.ones(g.size) for g in sm.groups()}
    assert _kept(model, sm, uniform) != [1, 3]


def _experts(recorder: ActivationRecorder) -> ExpertRecorder:
    """The hf plugin's usage recorder among the activation recorder's
    (``fxsym_usage_recorder``)."""
    return next(u for u in recorder.usage if isinstance(u, ExpertRecorder))


def test_router_load_and_weighted_output_norms_by_hand() -> None:
    """The recorder's numbers against a loop over every token and pick: load = Σ w / N, the
    Minitron (ModelOpt) activation Σ ‖w·y‖ / n over the n picks of an expert, the score
    Σ ‖w·y‖ / N."""
    model, batches = busy_one_and_three()
    sm = fxsym.analyze(model, example_inputs=(batches[0],))
    name = group_with(sm, "router", "out_features").name
    recorder = ActivationRecorder(model, sm, consumers_only=True)
    handles = recorder.attach()
    with torch.no_grad():
        for b in batches:
            run_batch(model, b)
    for h in handles:
        h.remove()
    load, norms, picks, tokens = torch.zeros(E), torch.zeros(E), torch.zeros(E), 0
    with torch.no_grad():
        for b in batches:
            t = b.reshape(-1, H)
            weights, idx = torch.topk(model.router(t).softmax(-1), K, dim=-1)
            for i in range(t.shape[0]):
                for j in range(K):
                    e = int(idx[i, j])
                    y = model.experts(t[i:i + 1], idx[i:i + 1, j:j + 1], weights[i:i + 1, j:j + 1])
                    load[e] += weights[i, j]
                    norms[e] += y.norm()
                    picks[e] += 1
            tokens += t.shape[0]
    assert picks[0] == picks[2] == 0 and picks[1] == picks[3] == tokens
    experts = _experts(recorder)
    assert experts.linear[name]
    assert experts.load[name] == pytest.approx((load / tokens).tolist(), rel=1e-5)
    assert experts.activation[name] == pytest.approx(
        (norms / picks.clamp(min=1)).tolist(), rel=1e-5)
    assert recorder.scores()[name].tolist() == pytest.approx((norms / tokens).tolist(),
                                                             rel=1e-5)


def test_experts_weighing_their_inputs_are_ranked_by_router_load() -> None:
    """The weights applied to the experts' inputs: one call per pick does not sum back to the
    module's output, so the outputs are not used; the load still ranks the experts."""
    model, batches = busy_one_and_three(weigh_inputs=True)
    sm = fxsym.analyze(model, example_inputs=(batches[0],))
    name = group_with(sm, "router", "out_features").name
    recorder = ActivationRecorder(model, sm, consumers_only=True)
    handles = recorder.attach()
    with torch.no_grad():
        run_batch(model, batches[0])
    for h in handles:
        h.remove()
    experts = _experts(recorder)
    assert not experts.linear[name] and name not in experts.activation
    scores = recorder.scores()[name]
    assert torch.equal(scores, torch.tensor(experts.load[name], dtype=torch.float64))
    assert _kept(model, sm, fxsym.importance.activation(batches, consumers_only=True)) == [1, 3]



def test_the_moved_recorder_is_a_deprecated_alias_of_the_plugins() -> None:
    """``fxsym.importance.ExpertRecorder`` moved into the hf plugin: the old name still gives
    the class, with a ``DeprecationWarning`` naming where it went (the core's README lists
    fxsym-plugins-hf as used when present for it; tests/test_distributions.py checks that)."""
    import fxsym.prune.importance as importance

    with pytest.warns(DeprecationWarning, match=r"fxsym_plugins_hf\.experts\.ExpertRecorder"):
        assert importance.ExpertRecorder is ExpertRecorder
