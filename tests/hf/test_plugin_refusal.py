"""A plugin's planned refusal is not a crash (issue 29 §5): a typed fxsym error a hook raises
on purpose reaches the caller as it is and leaves the plugin enabled, so the next, valid
checkpoint prune of the same process still finds its reader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import checkpoint

import fxsym


class _RefusesMarked:
    """Reads no checkpoint, but refuses (on purpose) any directory holding ``refuse.txt``."""

    @fxsym.hookimpl(tryfirst=True)
    def fxsym_checkpoint_reader(self, directory: Any) -> Any:
        if (Path(directory) / "refuse.txt").exists():
            raise fxsym.CheckpointError(f"{directory}: refused on purpose")
        return None


class _RefusesDepth:
    """Refuses (on purpose) every depth prune, as a plugin whose config cannot describe the
    kept blocks does."""

    @fxsym.hookimpl
    def fxsym_after_depth(self, model: Any, group: Any, kept: Any) -> None:
        raise fxsym.ResizeError("these blocks cannot be described (refused on purpose)")


@pytest.fixture
def refusing() -> Iterator[fxsym.PluginManager]:
    pm = fxsym.load_plugins()
    pm.register(_RefusesMarked(), name="refuses-marked")
    pm.register(_RefusesDepth(), name="refuses-depth")
    yield pm
    for name in ("refuses-marked", "refuses-depth"):
        if pm.has_plugin(name):
            pm.unregister(name=name)
    pm.failed = [f for f in pm.failed if not f.name.startswith("refuses-")]
    fxsym.load_plugins()


def test_a_readers_refusal_reaches_the_caller_and_the_plugin_stays(
        tmp_path: Path, refusing: fxsym.PluginManager) -> None:
    """Before: the refusal disabled the plugin (a PluginWarning) and the hook was asked again
    without it, so the directory it refused was pruned anyway."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2, with_tokenizer=False)
    (src / "refuse.txt").write_text("no")
    with pytest.raises(fxsym.CheckpointError, match="refused on purpose"):
        fxsym.prune_checkpoint(src, tmp_path / "out", ratio=0.5)
    assert not (tmp_path / "out").exists()
    assert refusing.has_plugin("refuses-marked") and refusing.has_plugin("hf")
    assert not refusing.failed
    with pytest.raises(fxsym.CheckpointError, match="refused on purpose"):  # asked again
        fxsym.prune_checkpoint(src, tmp_path / "out", ratio=0.5)


def test_a_refused_depth_prune_leaves_the_plugins_for_the_next_prune(
        tmp_path: Path, refusing: fxsym.PluginManager) -> None:
    """One process: a depth prune a plugin refuses, then a valid prune of a plain llama.
    Before: the refusal disabled the refusing plugin; a refusal of the hf plugin disabled hf,
    and the next prune failed with 'no plugin reads this directory'."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=3, with_tokenizer=False)
    with pytest.raises(fxsym.ResizeError, match="refused on purpose"):
        fxsym.prune_checkpoint(src, tmp_path / "out", layers=[0, 1])
    assert not (tmp_path / "out").exists()
    assert refusing.has_plugin("refuses-depth") and refusing.has_plugin("hf")
    assert not refusing.failed
    refusing.unregister(name="refuses-depth")
    fxsym.prune_checkpoint(src, tmp_path / "out", layers=[0, 1])
    assert (tmp_path / "out" / "config.json").is_file()
