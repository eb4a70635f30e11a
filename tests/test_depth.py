"""Depth as a symbol (issue 22 §3): a ModuleList of blocks the analysis proves residual is a
depth group whose units are the blocks; dropping a block equals replacing it by the identity."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxsym


class Residual(nn.Module):
    def __init__(self, width: int = 8, out: int | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(width, out or width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Plain(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module], width: int = 8, last: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(4, width)
        self.blocks = nn.ModuleList(blocks)
        self.out = nn.Linear(last, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


INPUTS = (torch.randn(2, 5, 4),)


def _reason(sm: fxsym.SymMap, where: str) -> str:
    lines = [e.message for e in sm.trace_report.of_kind("depth") if e.where == where]
    assert lines, sm.trace_report.format()
    return lines[0]


def test_residual_stack_is_a_depth_group() -> None:
    sm = fxsym.analyze(Stack([Residual() for _ in range(4)]), example_inputs=INPUTS)
    (g,) = sm.depth_groups()
    assert g.name == "blocks.depth"
    assert g.container == "blocks"
    assert g.size == 4
    assert g.blocks == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert sm.depth_group("blocks.depth") is g
    assert [x.name for x in sm.groups()]  # width groups unchanged
    assert all("depth" not in x.name for x in sm.groups())


def test_non_residual_stack_has_no_depth_group() -> None:
    sm = fxsym.analyze(Stack([Plain() for _ in range(3)]), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "not residual" in _reason(sm, "blocks")


def test_a_block_changing_width_has_no_depth_group() -> None:
    class Block(nn.Module):
        def __init__(self, width: int, out: int) -> None:
            super().__init__()
            self.fc = nn.Linear(width, out)
            self.repeat = out // width

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.repeat == 1:
                return x + self.fc(x)
            return torch.cat([x] * self.repeat, -1) + self.fc(x)

    blocks = [Block(8, 8), Block(8, 16), Block(16, 16)]
    sm = fxsym.analyze(Stack(blocks, last=16), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "blocks.1" in _reason(sm, "blocks")


def test_a_sequential_of_layers_is_silent() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    sm = fxsym.analyze(Net(), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert not [e for e in sm.trace_report.entries if e.kind == "depth"]


def test_blocks_not_applied_in_sequence_have_no_depth_group() -> None:
    class Parallel(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            return self.out(sum(b(h) for b in self.blocks))

    sm = fxsym.analyze(Parallel([Residual() for _ in range(3)]), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "previous block's output" in _reason(sm, "blocks")


def test_a_block_output_read_elsewhere_has_no_depth_group() -> None:
    class Dense(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            first = self.blocks[0](h)
            h = first
            for b in self.blocks[1:]:
                h = b(h)
            return self.out(h + first)

    sm = fxsym.analyze(Dense([Residual() for _ in range(3)]), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "blocks.0" in _reason(sm, "blocks")


def test_a_block_reading_its_position_has_no_depth_group() -> None:
    class Counted(Residual):
        def __init__(self, idx: int) -> None:
            super().__init__()
            self.layer_idx = idx

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.fc(x)) * (self.layer_idx + 1)

    sm = fxsym.analyze(Stack([Counted(i) for i in range(3)]), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "layer_idx" in _reason(sm, "blocks")


def _identity_for(model: nn.Module, container: str, dropped: list[int]) -> list[object]:
    blocks = model.get_submodule(container)
    return [blocks[i].register_forward_hook(lambda m, a, o: a[0]) for i in dropped]


@pytest.mark.parametrize("kept", [[0, 2, 3], [1], [0, 3]])
def test_dropping_blocks_equals_skipping_them(kept: list[int]) -> None:
    torch.manual_seed(0)
    model = Stack([Residual() for _ in range(4)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    ref_model = Stack([Residual() for _ in range(4)]).eval()
    ref_model.load_state_dict(model.state_dict())
    order = sorted(kept)
    _identity_for(ref_model, "blocks", [i for i in range(4) if i not in kept])
    with torch.no_grad():
        ref = ref_model(*INPUTS)
    fxsym.resize(model, sm, {"blocks.depth": kept})
    assert len(model.blocks) == len(kept)
    assert sm.is_stale
    with torch.no_grad():
        torch.testing.assert_close(model(*INPUTS), ref)
    assert [n for n, _ in model.named_parameters() if n.startswith("blocks.")][-1].startswith(
        f"blocks.{len(order) - 1}.")


def test_position_attributes_are_renumbered() -> None:
    class Counted(Residual):
        def __init__(self, idx: int) -> None:
            super().__init__()
            self.layer_idx = idx
            self.inner = nn.Identity()
            self.inner.layer_idx = idx  # type: ignore[assignment]
            self.width = 8

    model = Stack([Counted(i) for i in range(4)])
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    (g,) = sm.depth_groups()
    assert set(g.positions) == {("", "layer_idx"), ("inner", "layer_idx")}
    fxsym.resize(model, sm, {"blocks.depth": [1, 3]})
    assert [b.layer_idx for b in model.blocks] == [0, 1]
    assert [b.inner.layer_idx for b in model.blocks] == [0, 1]
    assert [b.width for b in model.blocks] == [8, 8]


class Gated(nn.Module):
    """A residual block of another class than :class:`Residual` (a hybrid stack's mixer)."""

    def __init__(self, idx: int, width: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(width, width)
        self.mixer = nn.Identity()
        self.mixer.layer_idx = idx  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.sigmoid(self.gate(x)) * x


class Attending(Residual):
    """A residual block holding its position in a submodule only it has (an attention)."""

    def __init__(self, idx: int) -> None:
        super().__init__()
        self.attn = nn.Identity()
        self.attn.layer_idx = idx  # type: ignore[assignment]


def test_a_stack_of_blocks_of_two_classes_is_a_depth_group() -> None:
    """Blocks of several classes, each residual, are a depth group (Jamba's attention and
    Mamba layers; before: silently none). ``layer_idx`` sits in the attention of one and the
    mixer of the others: a position wherever a block holds it, renumbered."""
    torch.manual_seed(0)
    model = Stack([Gated(0), Attending(1), Gated(2), Gated(3)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    (g,) = sm.depth_groups()
    assert set(g.positions) == {("mixer", "layer_idx"), ("attn", "layer_idx")}
    ref = copy.deepcopy(model)
    _identity_for(ref, "blocks", [0, 3])
    fxsym.resize(model, sm, {"blocks.depth": [1, 2]})
    assert model.blocks[0].attn.layer_idx == 0 and model.blocks[1].mixer.layer_idx == 1
    with torch.no_grad():
        torch.testing.assert_close(model(*INPUTS), ref(*INPUTS))


def test_blocks_sharing_a_parameter_have_no_depth_group() -> None:
    """Blocks holding one parameter in common (Zamba2's shared transformer) are refused,
    naming the shared parameter: what the shared part holds per block would not follow."""
    blocks = [Residual() for _ in range(3)]
    blocks[2].fc.weight = blocks[0].fc.weight
    sm = fxsym.analyze(Stack(blocks), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    assert "blocks.0 and blocks.2 share the parameter fc.weight" in _reason(sm, "blocks")


def test_unlike_blocks_holding_parts_they_do_not_run_have_no_depth_group() -> None:
    """A block of a stack of several classes holding a parameter its forward never reads
    (Zamba2's adapters of the other hybrid positions, the one run picked by position):
    refused, naming it."""
    mixer = Gated(1)
    mixer.unused = nn.Linear(8, 8)
    sm = fxsym.analyze(Stack([Residual(), mixer, Residual()]), example_inputs=INPUTS)
    assert sm.depth_groups() == []
    (line,) = [e for e in sm.trace_report.entries if e.kind == "depth" and e.where == "blocks"]
    assert "blocks.1 holds unused.weight, which the traced forward never reads" in line.message
    assert line.detail  # a list of unlike blocks: shown with verbose


def test_bad_depth_choices_touch_nothing() -> None:
    model = Stack([Residual() for _ in range(3)])
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for bad in ([], [0, 0], [5], [1.5], [2, 0], 2):
        with pytest.raises(fxsym.ResizeError):
            fxsym.resize(model, sm, {"blocks.depth": bad})
    assert len(model.blocks) == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_depth_and_width_in_one_resize() -> None:
    torch.manual_seed(0)
    model = Stack([Residual() for _ in range(3)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    width = sm.groups()[0].name
    fxsym.resize(model, sm, {width: 4, "blocks.depth": [0, 2]})
    assert len(model.blocks) == 2
    assert model.blocks[1].fc.in_features == 4
    with torch.no_grad():
        assert model(*INPUTS).shape == (2, 5, 3)


class Damped(Residual):
    """A residual block whose branch is scaled by ``gain``: a small gain barely turns the
    stream (block influence near 0)."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * torch.relu(self.fc(self.norm(x)))


def test_plan_keeps_the_most_influential_blocks_and_round_trips(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gains = [1.0, 1e-3, 2.0, 1e-2, 0.5]
    model = Stack([Damped(g) for g in gains]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    scores = fxsym.depth.block_importance([INPUTS, (torch.randn(3, 7, 4),)])(model, sm)
    assert scores["blocks.depth"].argsort().tolist()[:2] == [1, 3]
    plan = fxsym.plan(model, sm, layers=3)
    assert plan.depth == (fxsym.prune.planning.DepthChoice("blocks.depth", 5, (0, 2, 4)),)
    assert plan.params_after < plan.params_before
    assert plan.choices() == {"blocks.depth": [0, 2, 4]}
    assert "blocks.2.fc.weight" in plan.shapes and "blocks.3.fc.weight" not in plan.shapes
    again = fxsym.Plan.from_json(plan.to_json())
    assert again == plan
    ref = copy.deepcopy(model)
    _identity_for(ref, "blocks", [1, 3])
    plan.apply(model, sm)
    assert plan.params_after == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(*INPUTS), ref(*INPUTS))
    fxsym.save(model, tmp_path / "out", plan)
    fresh = Stack([Damped(g) for g in gains]).eval()
    fxsym.load(fresh, tmp_path / "out")
    assert len(fresh.blocks) == 3
    with torch.no_grad():
        torch.testing.assert_close(fresh(*INPUTS), model(*INPUTS))


def test_plan_with_a_user_list_and_a_parameter_target() -> None:
    model = Stack([Residual() for _ in range(4)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    plan = fxsym.plan(model, sm, layers=[0, 3], target_params=200, scope="uniform")
    assert plan.depth[0].keep == (0, 3)
    assert plan.params_after <= 200
    plan.apply(model, sm)
    assert sum(p.numel() for p in model.parameters()) == plan.params_after
    with pytest.raises(fxsym.PlanError, match="depth group"):
        fxsym.plan(model, fxsym.analyze(model, example_inputs=INPUTS), layers={"x": 1})


def test_plan_layers_without_a_depth_group_says_why() -> None:
    sm_model = Stack([Plain() for _ in range(3)])
    sm = fxsym.analyze(sm_model, example_inputs=INPUTS)
    with pytest.raises(fxsym.PlanError, match="not residual"):
        fxsym.plan(sm_model, sm, layers=2)


def make_tower() -> nn.Module:
    torch.manual_seed(0)
    return Stack([Damped(g) for g in (1.0, 1e-3, 2.0, 1e-2)]).eval()


def test_cli_layers_and_target_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    from fxsym.prune.cli import main

    assert main(["prune", "test_depth:make_tower", "--layers", "2", "--input-shape", "2,5,4",
                 "-o", str(tmp_path / "two")]) == 0
    text = capsys.readouterr().out
    assert "blocks.depth" in text and "0 2" in text
    before = sum(p.numel() for p in make_tower().parameters())
    assert main(["prune", "test_depth:make_tower", "--target-params", str(before // 2),
                 "--round-to", "4", "--input-shape", "2,5,4", "-o", str(tmp_path / "half"),
                 "--json"]) == 0
    plan = fxsym.Plan.from_json(capsys.readouterr().out)
    assert plan.params_after <= before // 2
    assert main(["prune", "test_depth:make_tower", "--target-params", str(before // 2),
                 "--round-to", "4", "--input-shape", "2,5,4", "-o", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    assert "candidates for" in text and "calib loss" in text and "<- kept" in text
    assert main(["prune", "test_depth:make_tower", "--experts", "2", "--input-shape", "2,5,4",
                 "-o", str(tmp_path / "x")]) == 2
    assert "no group of the model holds experts" in capsys.readouterr().err


class _AttentionNeeded:
    """A plugin saying, as a hybrid's library would, that a stack must keep one block
    holding an ``attn`` (found on the blocks, as the hf plugin probes its configs)."""

    @fxsym.hookimpl
    def fxsym_depth_kinds(self, model: nn.Module, group: Any) -> Any:
        blocks = list(model.get_submodule(group.container).children())
        held = [i for i, b in enumerate(blocks) if hasattr(b, "attn")]
        return {"attn blocks": (held, "the cache needs one")} if held else None


@pytest.fixture
def attention_needed() -> Iterator[None]:
    pm = fxsym.load_plugins()
    pm.register(_AttentionNeeded(), name="attention-needed")
    try:
        yield
    finally:
        pm.unregister(name="attention-needed")


def test_a_count_keeps_a_block_of_each_needed_kind(attention_needed: None) -> None:
    """Ranked by importance, the two blocks kept would be the gated ones (0, 2); a plugin
    says one attention block must stay: the best-ranked of them (3) replaces the
    lowest-ranked kept (2), the plan says so, and the model is the original with blocks 1
    and 2 skipped (before: [0, 2], no attention left)."""
    torch.manual_seed(0)
    model = Stack([Gated(0), Attending(1), Gated(2), Attending(3)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    scores = {"blocks.depth": torch.tensor([0.9, 0.1, 0.8, 0.2])}
    plan = fxsym.plan(model, sm, layers=2, depth_importance=scores)
    assert plan.depth[0].keep == (0, 3)
    (note,) = plan.extra["notes"]
    assert note.startswith("layers=2 keeps block 3 of blocks in place of block 2 (the "
                           "lowest-ranked kept): it is the best-ranked of the kind attn blocks "
                           "(positions [1, 3]), of which one must stay (the cache needs one)")
    assert fxsym.plan(model, sm, layers=1, depth_importance=scores).depth[0].keep == (3,)
    ref = copy.deepcopy(model)
    _identity_for(ref, "blocks", [1, 2])
    plan.apply(model, sm)
    with torch.no_grad():
        torch.testing.assert_close(model(*INPUTS), ref(*INPUTS))


def test_positions_losing_a_needed_kind_are_refused(attention_needed: None) -> None:
    """Keeping the gated blocks 0 and 2 only loses every attention block: a PlanError naming
    the kind and where it is (before: planned)."""
    model = Stack([Gated(0), Attending(1), Gated(2), Attending(3)]).eval()
    sm = fxsym.analyze(model, example_inputs=INPUTS)
    with pytest.raises(fxsym.PlanError, match=r"keeping the blocks \[0, 2\] of blocks keeps no "
                       r"block of the kind attn blocks \(positions \[1, 3\]\): the cache needs "
                       r"one; keep one of them"):
        fxsym.plan(model, sm, layers=[0, 2])
    assert fxsym.plan(model, sm, layers=[0, 1]).depth[0].keep == (0, 1)


def test_top_blocks_keeps_the_last_block_of_another_kind() -> None:
    """Two kinds needed: swapping in a block of the second must not drop the only block of
    the first; fewer blocks than kinds is refused."""
    group = fxsym.symbols.DepthGroup("s.depth", "s", 4, ("s.0", "s.1", "s.2", "s.3"))
    kinds = [fxsym.depth.BlockKind("a", (0,), "a needed"),
             fxsym.depth.BlockKind("b", (3,), "b needed")]
    kept, notes = fxsym.depth.top_blocks(group, 2, torch.tensor([0.5, 0.9, 0.8, 0.1]), kinds)
    assert kept == [0, 3] and len(notes) == 2
    with pytest.raises(fxsym.PlanError, match=r"layers=1: s must keep a block of each of 2 "
                       r"kinds \(a; b\): keep at least 2"):
        fxsym.depth.top_blocks(group, 1, torch.zeros(4), kinds)
