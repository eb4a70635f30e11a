"""An explicit-size prune of a checkpoint near its floor (issue 31 §4): where its time goes is
measured (``fxsym prune --times``, :func:`fxsym.prune.phases.recording`), and what was slow is made
cheaper without dropping the check it made: the finiteness of every weight read, and the
loading note's auto class (found for the checkpoint's own model type, without importing every
model module of transformers). ``benchmarks/prune_floor.py`` measures the ratio to the floor
on a real checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import checkpoint

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.phases import recording

STEPS = ("building on meta", "tokenising", "analysing", "calibration pass", "planning",
         "writing the weights")


def test_times_print_the_steps_of_a_checkpoint_prune(
        tmp_path: Path, calib: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--times``: one line a step on stderr after the prune, with the imports, the note of
    how the output loads and the time in no step; the API records the same steps."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    capsys.readouterr()
    assert main(["prune", str(src), "--ffn", "96", "--calib", str(calib), "--calib-tokens",
                 "64", "--seq-len", "16", "-o", str(tmp_path / "out"), "--times"]) == 0
    err = capsys.readouterr().err
    at = err.index("time by step (")
    lines = err[at:].splitlines()[1:]
    shown = [line.split("  ")[1].strip() for line in lines if "%" in line]
    assert shown[0] == "importing torch and fxsym" and shown[-1] == "(in no phase)", err
    assert "saying how the output loads" in shown
    assert all(s in shown for s in STEPS), shown
    with recording() as seconds:
        fxsym.prune_checkpoint(src, tmp_path / "api", calibration=calib,
                               calibration_tokens=64, seq_len=16, sizes={"ffn": 96})
    assert all(s in seconds for s in STEPS) and all(v >= 0 for v in seconds.values())
    assert main(["prune", str(src), "--ffn", "96", "--calib", str(calib), "--calib-tokens",
                 "64", "--seq-len", "16", "-o", str(tmp_path / "quiet")]) == 0
    assert "time by step" not in capsys.readouterr().err


def _half_checkpoint(directory: Path, big: str, value: float) -> None:
    """A tiny float16 llama checkpoint whose tensor ``big`` holds ``value`` everywhere but
    at one place, which holds 60000 (a large finite float16)."""
    import torch

    model = checkpoint(directory.with_name(f"{directory.name}-float32"), "llama",
                       num_hidden_layers=2).half()
    with torch.no_grad():
        p = model.get_parameter(big)
        p.fill_(60000.0)
        p[3, 5] = value
    model.save_pretrained(directory)


def test_large_finite_weights_pass_the_finiteness_check_and_damaged_ones_do_not(
        tmp_path: Path) -> None:
    """The check sums a tensor first (a NaN or an infinity makes the sum so): float16
    weights of 60000, whose sum overflows, are checked value by value and pruned as they
    are; one infinity among them is still refused."""
    import torch
    from safetensors.torch import load_file

    name = "model.layers.1.mlp.down_proj.weight"
    src = tmp_path / "in"
    _half_checkpoint(src, name, 60000.0)
    with pytest.warns(fxsym.ImportanceWarning):
        fxsym.prune_checkpoint(src, tmp_path / "out", sizes={"ffn": 96})
    written = load_file(str(tmp_path / "out" / "model.safetensors"))[name]
    assert written.dtype == torch.float16 and written.shape == (64, 96)
    assert bool((written == 60000.0).all())
    bad = tmp_path / "bad"
    _half_checkpoint(bad, name, float("inf"))
    with pytest.raises(fxsym.CheckpointError, match=f"{name} holds infinite"), \
            pytest.warns(fxsym.ImportanceWarning):
        fxsym.prune_checkpoint(bad, tmp_path / "out2", sizes={"ffn": 96})
    assert not (tmp_path / "out2").exists()


def test_healthy_weights_are_checked_without_a_mask_of_every_value(
        tmp_path: Path, calib: Path) -> None:
    """Every tensor read (the calibration pass's and the writer's) is checked finite by its
    sum: ``torch.isfinite`` runs on sums (and on 1-d scores, by the planner), never on a
    weight matrix (10-40x slower than a sum on a CPU). Before: on every tensor read."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Masks(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.isfinite:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    with Masks() as masks:
        fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib,
                               calibration_tokens=64, seq_len=16, sizes={"ffn": 96})
    assert masks.shapes and not [s for s in masks.shapes if len(s) >= 2]  # scores are 1-d


def test_the_loading_note_imports_only_the_checkpoints_own_model_module(
        tmp_path: Path) -> None:
    """The note of how a pruned checkpoint loads names its auto class, found for the
    config's own model type: transformers' other model modules are not imported (before:
    every one, by reading the auto mappings' values; longer than the prune itself)."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2, with_tokenizer=False)
    with pytest.warns(fxsym.ImportanceWarning):
        fxsym.prune_checkpoint(src, tmp_path / "out", sizes={"ffn": 96})
    code = ("import json, sys\n"
            "from fxsym.prune.checkpoint import loading_note\n"
            f"note = loading_note({str(src)!r}, {str(tmp_path / 'out')!r})\n"
            "print(json.dumps([note, sorted({m.split('.')[2] for m in sys.modules\n"
            "    if m.startswith('transformers.models.') and m.count('.') >= 2})]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                          check=True)
    note, families = json.loads(done.stdout.splitlines()[-1])
    assert "load it with AutoModelForCausalLM.from_pretrained(" in note
    assert set(families) <= {"auto", "llama"}, families


def test_a_tensor_kept_whole_is_copied_as_checked_not_read_again(
        tmp_path: Path, calib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a calibrated prune every stored tensor is read (and checked finite) by the
    calibration pass; the writer copies those it keeps whole from the file by the kernel
    (fxsym.prune.spans), unchanged, and reads again only those it cuts. Before: the writer read
    every tensor again."""
    import collections
    import contextlib
    from collections.abc import Iterator

    import torch
    from ckpt_helpers import on_reads
    from safetensors.torch import load_file

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    reads: collections.Counter[str] = collections.Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    calibrated: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def status(message: str) -> Iterator[None]:
        if message == "planning":  # after the calibration pass, before the writing
            calibrated.update(reads)
        yield

    fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib, calibration_tokens=64,
                           seq_len=16, sizes={"ffn": 96}, status=status)
    before = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in
              load_file(str(f)).items()}
    after = {k: v for f in sorted((tmp_path / "out").glob("*.safetensors")) for k, v in
             load_file(str(f)).items()}
    assert set(after) == set(before) and set(calibrated) == set(before)
    written = reads - calibrated
    whole = [n for n in before if ".mlp." not in n]
    assert whole and not [n for n in whole if written[n]], written
    assert all(torch.equal(after[n], before[n]) for n in whole)
    assert all(written[n] >= 1 for n in before if ".mlp." in n)


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_proj.weight",
                                  "model.layers.1.mlp.down_proj.weight"])
def test_a_file_changed_after_the_calibration_pass_is_read_and_checked_again(
        tmp_path: Path, calib: Path, name: str) -> None:
    """The writer trusts the calibration pass's check of a tensor, kept whole (copied unread)
    or cut (read again in chunks), only while its file is the one read (device, inode, size,
    modification time): a NaN written into it after the pass is read by the writer and
    refused, the output not written."""
    import contextlib
    from collections.abc import Iterator

    import torch
    from safetensors.torch import load_file, save_file

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    shard = src / json.loads((src / "model.safetensors.index.json").read_text())[
        "weight_map"][name]

    @contextlib.contextmanager
    def status(message: str) -> Iterator[None]:
        if message == "planning":  # after the calibration pass, before the writing
            tensors = load_file(str(shard))
            tensors[name][1, :] = torch.nan  # a row: some of it kept whatever the cut
            save_file(tensors, str(shard), metadata={"format": "pt"})
        yield

    with pytest.raises(fxsym.CheckpointError, match=f"{name} holds NaN"):
        fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib,
                               calibration_tokens=64, seq_len=16, sizes={"ffn": 96},
                               status=status)
    assert not (tmp_path / "out").exists()


def _columns_kept(before: Any, after: Any, dim: int) -> bool:
    """Whether ``after`` is ``before`` with some of its entries along ``dim`` kept, in order
    (each entry of ``after`` equal to a later entry of ``before`` than the last)."""
    import torch

    at = 0
    for i in range(after.shape[dim]):
        line = after.select(dim, i)
        while at < before.shape[dim] and not torch.equal(before.select(dim, at), line):
            at += 1
        if at == before.shape[dim]:
            return False
        at += 1
    return True


def test_a_cut_tensor_read_again_is_not_checked_finite_again(
        tmp_path: Path, calib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer reads again each tensor it cuts (in chunks of rows, one tensor in memory),
    but the calibration pass read the same bytes whole and checked them finite, their file
    unchanged since: it does not sum them again. What it writes is the stored tensor's
    entries kept, values unchanged. Before: every chunk of every cut tensor was summed again
    (an explicit-size prune of SmolLM2 sums 320 MB of its FFN twice)."""
    import contextlib
    from collections.abc import Iterator

    from safetensors.torch import load_file

    import fxsym.prune.checkpoint.tensors as tensors_module

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    real = tensors_module.finite
    checked: list[str] = []
    writing = [False]

    def spy(t: Any, path: Path, name: str) -> Any:
        if writing[0]:
            checked.append(name)
        return real(t, path, name)

    monkeypatch.setattr(tensors_module, "finite", spy)

    @contextlib.contextmanager
    def status(message: str) -> Iterator[None]:
        if message == "planning":  # after the calibration pass, before the writing
            writing[0] = True
        yield

    fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib, calibration_tokens=64,
                           seq_len=16, sizes={"ffn": 96}, status=status)
    assert writing[0] and checked == [], checked
    before = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in
              load_file(str(f)).items()}
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    cut = sorted(n for n in before if ".mlp." in n)
    assert len(cut) == 6 and all(after[n].shape != before[n].shape for n in cut)
    for n in cut:  # down_proj keeps columns, gate and up rows
        dim = 1 if "down_proj" in n else 0
        assert after[n].shape[dim] == 96 and _columns_kept(before[n], after[n], dim), n


def test_the_writer_gives_memory_back_after_the_tensors_it_held_only(
        tmp_path: Path, calib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer gives the memory of a tensor's chunks back to the system after writing it
    (``trim``: the peak stays one tensor); a tensor copied by the kernel from its file (kept
    whole, checked before) took none, so no trim follows it. Before: one trim after every
    tensor (181 of SmolLM2's 272 are copied)."""
    import fxsym.prune.checkpoint.writing as writing_module

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    real = writing_module.trim
    trims = [0]

    def counted() -> None:
        trims[0] += 1
        real()

    monkeypatch.setattr(writing_module, "trim", counted)
    fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib, calibration_tokens=64,
                           seq_len=16, sizes={"ffn": 96})
    assert trims[0] == 6  # the two layers' gate, up and down projections, cut


def test_the_objects_alive_before_a_prune_are_not_scanned_by_the_collector(
        tmp_path: Path, calib: Path) -> None:
    """A prune runs with the objects alive before it frozen out of the garbage collector's
    scans (a full collection over the ~440k objects of transformers' imports costs 0.6-1 s,
    :mod:`fxsym.prune.collector`); cyclic garbage it makes is still collected inside it, the
    freeze ends with it, even when it fails, and a process's own freeze is left as it was."""
    import gc

    from fxsym.prune.collector import old_objects_frozen

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    seen: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        seen.append(gc.get_freeze_count())

    gc.callbacks.append(watch)
    try:
        fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib,
                               calibration_tokens=64, seq_len=16, sizes={"ffn": 96})
    finally:
        gc.callbacks.remove(watch)
    assert max(seen, default=0) > 1000, seen
    assert gc.get_freeze_count() == 0

    with old_objects_frozen():
        frozen = gc.get_freeze_count()
        Cycle()
        assert frozen > 1000 and gc.collect() >= 1
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), old_objects_frozen():
        raise KeyError("a failing run")
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        own = gc.get_freeze_count()
        with old_objects_frozen():
            pass
        assert gc.get_freeze_count() == own
    finally:
        gc.unfreeze()
