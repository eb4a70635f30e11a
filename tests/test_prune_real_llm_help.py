"""``benchmarks/prune_real_llm.py`` starts: its ``--help`` runs (the benchmark itself converts and
prunes a 135M-parameter model for many minutes and is not run here)."""

from __future__ import annotations

import pathlib
import subprocess
import sys


def test_prune_real_llm_help_runs() -> None:
    script = pathlib.Path(__file__).parents[1] / "benchmarks" / "prune_real_llm.py"
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "--seeds" in done.stdout
