"""Saving never loses what was there (issue 20 §2): links are never followed, an overwrite is
atomic at every step (faults injected at each file-system call), other files in the directory
are kept (or the directory replaced whole when asked), the command line refuses a non-empty
output unless --force, and files get the usual modes."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from torch import nn

import fxsym
from fxsym.errors import PlanError
from fxsym.prune import persist
from fxsym.prune.cli import main


def _seq() -> nn.Module:
    return nn.Sequential(OrderedDict([
        ("conv", nn.Conv2d(3, 8, 3)), ("bn", nn.BatchNorm2d(8)), ("relu", nn.ReLU()),
        ("pool", nn.AdaptiveAvgPool2d(1)), ("flat", nn.Flatten()),
        ("fc1", nn.Linear(8, 6)), ("act", nn.ReLU()), ("fc2", nn.Linear(6, 2))]))


X = torch.randn(2, 3, 8, 8)


def _pruned(ratio: float, shift: float) -> tuple[nn.Module, fxsym.Plan]:
    torch.manual_seed(0)
    model = _seq().eval()
    sm = fxsym.analyze(model, example_inputs=(X,))
    plan = fxsym.plan(model, sm, ratio=ratio, importance="l1")
    plan.apply(model, sm)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    return model, plan


def _loads_as(directory: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return fxsym.load(_seq().eval(), directory).state_dict()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_symlinked_manifest_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "save"
    out.mkdir()
    (out / "fxsym.json").symlink_to(victim)
    model, plan = _pruned(0.5, 0.0)
    fxsym.save(model, out, plan)
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["fxsym.json", "model.safetensors"]
    assert not (out / "fxsym.json").is_symlink()
    assert _same(_loads_as(out), model.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["save", "victim.txt"]


def test_a_symlinked_weights_file_or_directory_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    out = tmp_path / "save"
    out.mkdir()
    (out / "model.safetensors").symlink_to(victim)
    (out / "notes.txt").symlink_to(victim)  # another link: kept as a link, never followed
    model, plan = _pruned(0.5, 0.0)
    fxsym.save(model, out, plan)
    assert victim.read_bytes() == b"precious"
    assert not (out / "model.safetensors").is_symlink()
    assert (out / "notes.txt").is_symlink() and os.readlink(out / "notes.txt") == str(victim)
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(PlanError, match="symbolic link"):
        fxsym.save(model, link, plan)
    assert link.is_symlink() and not any(real.iterdir())


def test_other_files_are_kept_or_replaced_whole_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    (out / "sub").mkdir(parents=True)
    (out / "config.json").write_text('{"hidden_size": 8}')
    (out / "sub" / "tokenizer.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"weights save_pretrained wrote")
    model, plan = _pruned(0.5, 0.0)
    fxsym.save(model, out, plan)  # as after model.save_pretrained(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "fxsym.json", "model.safetensors", "sub"]
    assert (out / "config.json").read_text() == '{"hidden_size": 8}'
    assert (out / "sub" / "tokenizer.json").read_text() == "{}"
    assert _same(_loads_as(out), model.state_dict())
    fxsym.save(model, out, plan, keep_others=False)
    assert sorted(p.name for p in out.iterdir()) == ["fxsym.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_the_current_directory_is_never_replaced(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model, plan = _pruned(0.5, 0.0)
    (tmp_path / "inner").mkdir()
    monkeypatch.chdir(tmp_path / "inner")
    for where in (".", "..", str(tmp_path)):
        with pytest.raises(PlanError, match="current directory"):
            fxsym.save(model, where, plan)
    fxsym.save(model, "sub", plan)
    assert (tmp_path / "inner" / "sub" / "fxsym.json").is_file()
    assert sorted(p.name for p in (tmp_path / "inner").iterdir()) == ["sub"]


def test_files_have_the_usual_modes(tmp_path: Path) -> None:
    model, plan = _pruned(0.5, 0.0)
    old = os.umask(0o022)
    try:
        fxsym.save(model, tmp_path / "save", plan)
    finally:
        os.umask(old)
    for name in ("fxsym.json", "model.safetensors"):
        assert stat.S_IMODE(os.stat(tmp_path / "save" / name).st_mode) == 0o644, name
    assert stat.S_IMODE(os.stat(tmp_path / "save").st_mode) == 0o755
    os.chmod(tmp_path / "save", 0o700)
    fxsym.save(model, tmp_path / "save", plan)  # replaced: a private directory stays private
    assert stat.S_IMODE(os.stat(tmp_path / "save").st_mode) == 0o700


class _Died(BaseException):
    """The process stopped here (raised past every ``except Exception``)."""


#: every file-system step a save takes, as (owner, attribute)
_STEPS: list[tuple[Any, str]] = [
    (os, "mkdir"), (os, "open"), (os, "write"), (os, "fsync"), (os, "close"), (os, "rename"),
    (os, "replace"), (os, "unlink"), (os, "rmdir"), (os, "link"), (os, "symlink"),
    (shutil, "rmtree"), (shutil, "copy2"),
    (safetensors.torch, "save_file"), (persist, "_exchange")]


@contextlib.contextmanager
def _fault_at(k: int, *, crash: bool) -> Iterator[list[int]]:
    """Raise at the ``k``-th file-system step (1-based). ``crash``: every later step raises
    too, so nothing after the fault reaches the disk (as when the process is killed);
    otherwise only the ``k``-th step fails and the code's own clean-up runs."""
    calls = [0]
    dead = [False]

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if dead[0]:
                raise _Died
            calls[0] += 1
            if calls[0] == k:
                dead[0] = crash
                raise _Died
            return fn(*args, **kwargs)
        return step

    saved = [(owner, name, getattr(owner, name)) for owner, name in _STEPS]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, wrap(fn))
        yield calls
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


@pytest.mark.parametrize(("crash", "exchange"), [(True, True), (False, True), (False, False)],
                         ids=["killed", "interrupted", "interrupted-without-renameat2"])
def test_an_overwrite_stopped_at_any_step_leaves_the_old_or_the_new_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: bool, exchange: bool) -> None:
    if not exchange:  # another OS or file system: move aside, move in, move back on failure
        def no_exchange(a: Path, b: Path) -> None:
            raise OSError(errno.ENOSYS, "no renameat2")
        monkeypatch.setattr(persist, "_exchange", no_exchange)
    old_model, old_plan = _pruned(0.25, 0.0)
    new_model, new_plan = _pruned(0.5, 1.0)
    old, new = old_model.state_dict(), new_model.state_dict()
    assert old["conv.weight"].shape != new["conv.weight"].shape  # a mix cannot load
    outcomes: list[str] = []
    k = 0
    while True:
        k += 1
        parent = tmp_path / f"k{k}"
        out = parent / "save"
        fxsym.save(old_model, out, old_plan)
        (out / "config.json").write_text("kept")
        with _fault_at(k, crash=crash) as calls:
            try:
                fxsym.save(new_model, out, new_plan)
                finished = True
            except _Died:
                finished = False
        state = _loads_as(out)
        outcome = "new" if _same(state, new) else "old" if _same(state, old) else "neither"
        assert outcome != "neither", k
        assert (out / "config.json").read_text() == "kept", k
        assert finished <= (outcome == "new"), k
        left = sorted(p.name for p in parent.iterdir() if p.name != "save")
        if not crash:  # cleaned up after itself, but for old contents it was removing
            assert not left or (outcome == "new" and left[0].startswith(".save.fxsym-")), k
        outcomes.append(outcome)
        if finished:
            break
        assert k < 50, "the save never finished"
    assert calls[0] == k - 1 and outcomes[-1] == "new"
    assert "old" in outcomes and len(outcomes) >= 5  # faults really hit before the swap


def test_cli_refuses_a_non_empty_output_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"a save_pretrained checkpoint")
    (out / "config.json").write_text("{}")
    args = ["prune", "fxsym.prune.demo:DemoNet", "--ratio", "0.5", "--input-shape", "1,3,16,16",
            "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--force" in err and err.count("\n") == 1, err
    assert (out / "model.safetensors").read_bytes() == b"a save_pretrained checkpoint"
    assert (out / "config.json").read_text() == "{}"

    assert main([*args, "--force"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["fxsym.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]



def test_cli_prunes_a_save_again_into_itself_only_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    out = tmp_path / "r18"
    assert main(["prune", "torchvision:resnet18", "--ratio", "0.5", "--input-shape",
                 "1,3,32,32", "-o", str(out)]) == 0
    again = ["prune", str(out), "--ratio", "0.5", "--scope", "uniform", "-o", str(out)]
    before = (out / "fxsym.json").read_bytes()
    assert main(again) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "fxsym.json").read_bytes() == before
    assert main([*again, "--force"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out), "--json"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["r18"]


def test_cli_writes_into_a_new_or_empty_directory(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (empty, tmp_path / "new" / "deeper"):
        assert main(["prune", "fxsym.prune.demo:DemoNet", "--ratio", "0.5", "--input-shape",
                     "1,3,16,16", "-o", str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["fxsym.json", "model.safetensors"]
    capsys.readouterr()
