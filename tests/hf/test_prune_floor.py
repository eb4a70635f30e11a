"""An explicit-size prune of a checkpoint near its floor (issue 31 §4): where its time goes is
measured (``fxsym prune --times``, :func:`fxsym.phases.recording`), and what was slow is made
cheaper without dropping the check it made: the finiteness of every weight read, and the
loading note's auto class (found for the checkpoint's own model type, without importing every
model module of transformers). ``benchmarks/prune_floor.py`` measures the ratio to the floor
on a real checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_helpers import checkpoint

import fxsym
from fxsym.cli import main
from fxsym.phases import recording

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
