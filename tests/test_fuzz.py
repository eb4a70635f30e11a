"""The fuzzer: random small nets (``tests/fuzz_nets.py``), analyzed and put through the three
oracles — permutation, shrink runs, shrink values.

The default suite runs :data:`DEFAULT` nets; ``pytest -m zoo`` runs the rest of :data:`ZOO`. A net
may have no group (every size pinned) — the oracles then report "not checked", which passes —
but no oracle may fail. The forms of issue 19 (branches and values on sizes, sizes merged
from the input's shape, caches) are put into ten more nets each; the value oracle is the one
that fails on the branch and value forms when the analysis keeps a group a guard read. So are
the ``unflatten`` forms of issue 30 (each way of writing the split, each tail in turn): there
the value oracle fails, and the shrink oracle crashes, when the split's units disagree with
the number the program splits by.
"""

from __future__ import annotations

import pytest
from fuzz_nets import GUARDED, HOOKED, IDENTITY, STEPS, SplitChannels, random_net

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values

#: nets in the default suite (seeds ``0..DEFAULT-1``), and in all with ``-m zoo``
DEFAULT = 60
ZOO = 200


def _check(seed: int, forms: tuple[str, ...] = ()) -> fxsym.SymMap:
    net, x = random_net(seed, forms)
    inputs = (x,)
    sm = fxsym.analyze(net, example_inputs=inputs)
    perm = check_permutation(net, sm, inputs, seeds=(0,))
    assert perm.status != "failed", f"seed {seed} {net.steps}: permutation oracle: {perm}"
    shrink = check_shrink(net, sm, inputs)
    assert shrink.status != "failed", f"seed {seed} {net.steps}: shrink oracle: {shrink}"
    values = check_values(net, sm, inputs)
    assert values.status != "failed", f"seed {seed} {net.steps}: value oracle: {values}"
    return sm


@pytest.mark.parametrize("block", range(DEFAULT // 10))
def test_fuzzed_nets(block: int) -> None:
    for seed in range(block * 10, block * 10 + 10):
        _check(seed)


@pytest.mark.zoo
@pytest.mark.parametrize("block", range(DEFAULT // 10, ZOO // 10))
def test_fuzzed_nets_zoo(block: int) -> None:
    for seed in range(block * 10, block * 10 + 10):
        _check(seed)


def test_the_draw_reaches_every_form() -> None:
    """Every step kind appears among the default nets."""
    kinds = {step[0] for seed in range(DEFAULT) for step in random_net(seed)[0].steps}
    assert set(STEPS) <= kinds


@pytest.mark.parametrize("form", GUARDED)
def test_fuzzed_nets_with_issue19_forms(form: str) -> None:
    """Ten nets, each with ``form`` once among its random steps."""
    for seed in range(10):
        _check(1000 + seed, (form,))


@pytest.mark.parametrize("form", SplitChannels.FORMS)
def test_fuzzed_nets_with_unflatten(form: str) -> None:
    """Ten nets, each with channels split by ``unflatten`` written as ``form`` (issue 30),
    each tail in turn."""
    for seed in range(10):
        _check(2000 + seed, (f"unflatten/{form}/{SplitChannels.TAILS[seed % 4]}",))


@pytest.mark.parametrize("form", HOOKED)
def test_fuzzed_nets_with_hooks(form: str) -> None:
    """Ten nets, each with ``form`` once among its random steps: a ``weight_norm`` conv
    keeps its groups and resizes ``weight_g``/``weight_v`` with them; a user's hook that
    does not run in the trace pins the groups around its conv (issue 30, sections 2, 3)."""
    for seed in range(10):
        sm = _check(2000 + seed, (form,))
        hidden = sm.trace_report.of_kind("hidden-hook")
        assert bool(hidden) == (form != "weight_norm"), hidden


@pytest.mark.parametrize("form", IDENTITY)
def test_fuzzed_nets_with_identity_branches(form: str) -> None:
    """Ten nets, each with a module whose forward branches on which module it is (issue 30,
    section 4): the trace takes the model's branch, so the oracles hold."""
    for seed in range(10):
        _check(3000 + seed, (form,))
