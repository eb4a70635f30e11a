"""A checkpoint directory from a stranger (issue 29 §4): every case is one ``fxsym: ...`` line
on the command line and a typed :class:`fxsym.CheckpointError` from
:func:`fxsym.prune_checkpoint`, the input and the output left as they were, nothing allocated
that the files ask for; an output is never the input, and two writers of one output, or a
killed one, leave no mess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ckpt_helpers import checkpoint

import fxsym
from fxsym.cli import main


def _tree(path: Path) -> dict[str, object]:
    """Everything under ``path`` (links as their targets, never followed), to compare."""
    out: dict[str, object] = {}
    if not os.path.lexists(path):
        return out
    if path.is_symlink() or path.is_file():
        return {".": os.readlink(path) if path.is_symlink() else path.read_bytes()}
    for p in sorted(path.rglob("*")):
        key = str(p.relative_to(path))
        out[key] = (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file()
                    else "dir")
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("ckpt") / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    return src


def _cli_refuses(args: list[str], capsys: pytest.CaptureFixture[str], *says: str) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fxsym: ") and err.count("\n") == 1, err
    for s in says:
        assert s in err, err
    return err


# -- the output is not the input --------------------------------------------------------
@pytest.mark.parametrize("where", ["same", "inside", "holding", "link-to-it", "holds-a-blob"])
def test_the_output_never_overlaps_the_input_even_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """Before: ``-o CKPT --force`` replaced the input checkpoint with the pruned one."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2, with_tokenizer=False)
    blobs = tmp_path / "blobs"
    if where == "holds-a-blob":  # a hub-cache snapshot: the files are links to blobs
        blobs.mkdir()
        for f in sorted(src.iterdir()):
            f.rename(blobs / f.name)
            f.symlink_to(blobs / f.name)
    out = {"same": src, "inside": src / "pruned", "holding": tmp_path,
           "link-to-it": tmp_path / "link", "holds-a-blob": blobs}[where]
    if where == "link-to-it":
        out.symlink_to(src, target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(fxsym.CheckpointError, match="destroy the checkpoint"):
        fxsym.prune_checkpoint(src, out, layers=[0])
    assert _tree(tmp_path) == before
    _cli_refuses(["prune", str(src), "--layers", "0", "-o", str(out), "--force"], capsys,
                 "destroy the checkpoint", "also with --force")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_an_output_that_is_a_file_or_a_link_is_refused_before_any_work(
        tmp_path: Path, llama: Path, capsys: pytest.CaptureFixture[str], what: str) -> None:
    out = tmp_path / "out"
    if what == "file":
        out.write_bytes(b"mine")
    else:
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(fxsym.CheckpointError, match=r"not a directory|symbolic link"):
        fxsym.prune_checkpoint(llama, out, layers=[0])
    assert _tree(tmp_path) == before
    _cli_refuses(["prune", str(llama), "--layers", "0", "-o", str(out), "--force"], capsys)
    assert _tree(tmp_path) == before


# -- a killed writer, two writers -------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys, time
    from fxsym.persist import replace_directory
    with replace_directory(sys.argv[1]) as tmp:
        (tmp / "half.safetensors").write_bytes(b"half written")
        print("writing", flush=True)
        time.sleep(120)
""")


def _writer(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "FXSYM_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def test_a_writer_killed_mid_write_leaves_nothing_behind_for_good(
        tmp_path: Path, llama: Path) -> None:
    """kill -9 while the output is written: its temporary sibling stays until the next
    writer of that output, which removes it. Before: it stayed forever."""
    out = tmp_path / "out"
    proc = _writer(out)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = [p for p in os.listdir(tmp_path) if p.startswith(".out.fxsym-")]
    assert left  # the killed writer's sibling (and its lock file)
    fxsym.prune_checkpoint(llama, out, layers=[0])
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert (out / "model.safetensors").is_file()


def test_two_writers_of_one_output_cannot_both_win(
        tmp_path: Path, llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second prune into an output another process is writing is refused at once, naming
    that process. Before: both wrote, the last rename won silently."""
    out = tmp_path / "out"
    proc = _writer(out)
    try:
        with pytest.raises(fxsym.CheckpointError, match=f"another process \\(pid {proc.pid}"):
            fxsym.prune_checkpoint(llama, out, layers=[0])
        _cli_refuses(["prune", str(llama), "--layers", "0", "-o", str(out)], capsys,
                     f"pid {proc.pid}")
        assert not out.exists()
    finally:
        proc.kill()
        proc.wait()
