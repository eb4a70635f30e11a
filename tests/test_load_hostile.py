"""Loading a directory from a stranger (issue 20 §3): every crafted manifest or weights file
is a typed error with the model untouched; nothing is allocated because the file asks,
nothing hangs, nothing is cast, no socket is opened and no path outside is read."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_load_refused, save_pruned_small_seq, small_seq
from safetensors.torch import load_file, save_file

import fxsym
from fxsym.errors import PlanError, PlanMismatchError
from fxsym.prune import persist
from fxsym.prune.cli import main

X = torch.randn(2, 3, 8, 8)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    out = tmp_path / "save"
    save_pruned_small_seq(out, X, source="torchvision:resnet18")
    return out


def _edit(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = directory / "fxsym.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _group(data: dict[str, Any], name: str = "conv.out_channels") -> dict[str, Any]:
    return next(g for g in data["plan"]["groups"] if g["name"] == name)


def test_the_untouched_save_loads(saved: Path) -> None:
    fxsym.load(small_seq(), saved)


@pytest.mark.parametrize("shape, says", [
    ([1, 3, 16000, 16000], "768,000,000 elements"),
    ([1, 3, 2**21, 2**21], "elements, more than"),
    ([1, -3, 8, 8], "integer >= 0"),
    ([1, 3, 8.0, 8], "integer >= 0"),
    ([1, 3, "8", 8], "integer >= 0"),
    ([1, 3, True, 8], "integer >= 0"),
], ids=["3GB", "12TB", "negative", "float", "string", "bool"])
def test_recorded_input_shapes_are_bounded_and_typed(saved: Path, shape: list[Any],
                                                     says: str) -> None:
    _edit(saved, lambda d: d["plan"]["inputs"]["args"][0].__setitem__("tensor", shape))
    assert_load_refused(saved, PlanError, says)


@pytest.mark.parametrize("dtype", ["load", "Tensor", "float33", "__class__", 7])
def test_a_recorded_input_dtype_is_a_dtype_name(saved: Path, dtype: Any) -> None:
    _edit(saved, lambda d: d["plan"]["inputs"]["args"][0].__setitem__("dtype", dtype))
    assert_load_refused(saved, PlanError, "dtype")


def test_recorded_keyword_inputs_are_named_by_identifiers(saved: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["plan"]["inputs"] = {"kwargs": {'x=print("PWNED")': d["plan"]["inputs"]["args"][0]}}

    _edit(saved, change)
    assert_load_refused(saved, PlanError, "not a parameter name")


def _returns_within(fn: Callable[[], None], seconds: float = 120) -> None:
    """``fn`` returns (it may raise) instead of blocking: run on a daemon thread."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), "blocked"


@pytest.mark.parametrize("name", ["fxsym.json", "model.safetensors"])
def test_a_fifo_is_refused_without_blocking(saved: Path, name: str) -> None:
    (saved / name).unlink()
    os.mkfifo(saved / name)
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            assert_load_refused(saved, PlanError, "not a regular file")
        except BaseException as exc:
            errors.append(exc)

    _returns_within(attempt)
    assert not errors, errors


@pytest.mark.parametrize("name", ["fxsym.json", "model.safetensors"])
def test_a_link_to_a_device_is_refused(saved: Path, name: str) -> None:
    (saved / name).unlink()
    (saved / name).symlink_to("/dev/urandom")
    assert_load_refused(saved, PlanError, "not a regular file")


def test_a_huge_manifest_is_refused_unread(saved: Path) -> None:
    path = saved / "fxsym.json"
    with path.open("r+b") as f:
        f.truncate(persist.MAX_MANIFEST_BYTES + 1)  # sparse: nothing really written
    assert_load_refused(saved, PlanError, "larger than")


@pytest.mark.parametrize("text, says", [
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested deeper"),
    ('{"fxsym": 1, "extra": ' + "[" * 40 + "]" * 40 + "}", "nested deeper"),
    ('{"fxsym": 1, "x": 1e400}', "out of range"),
    ('{"fxsym": 1, "x": NaN}', "not a JSON number"),
    ('{"fxsym": 1, "x": -Infinity}', "not a JSON number"),
    ('{"fxsym": 1, "fxsym": 1}', "appears twice"),
    (b'{"fxsym": 1, "source": "\xff"}', "utf-8"),
], ids=["deep", "deeper-than-limit", "1e400", "nan", "infinity", "duplicate-key", "not-utf8"])
def test_manifest_json_is_strict(saved: Path, text: str | bytes, says: str) -> None:
    path = saved / "fxsym.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert_load_refused(saved, PlanError, says)


@pytest.mark.parametrize("field, value, says", [
    ("keep", "0123456", "keep must be a JSON array"),
    ("keep", [0, 1.0, 2], r"keep\[1\] must be an integer"),
    ("keep", [0, "1"], r"keep\[1\] must be an integer"),
    ("keep", [0, True], r"keep\[1\] must be an integer"),
    ("size", 16.9, "size must be an integer"),
    ("size", "8", "size must be an integer"),
    ("size", 0, "size must be an integer >= 1"),
    ("unit", 1e3, "unit must be an integer"),
    ("name", 7, "name must be a string"),
], ids=["keep-string", "keep-float", "keep-str-item", "keep-bool", "size-float", "size-str",
        "size-zero", "unit-float", "name-int"])
def test_plan_fields_have_their_one_json_type(saved: Path, field: str, value: Any,
                                              says: str) -> None:
    _edit(saved, lambda d: _group(d).__setitem__(field, value))
    assert_load_refused(saved, PlanError, says)


@pytest.mark.parametrize("change, says", [
    (lambda d: d["plan"]["params"].__setitem__("after", -1), "params.after"),
    (lambda d: d["plan"]["shapes"].__setitem__("conv.weight", [4, 3, 3, -3]), "shapes"),
    (lambda d: d["plan"].__setitem__("outputs", [None]), "outputs"),
    (lambda d: d["plan"].__setitem__("format", True), "format"),
    (lambda d: d.__setitem__("fxsym", True), "not an fxsym save"),
    (lambda d: d.__setitem__("source", ["timm:resnet18"]), "'source' must be a string"),
    (lambda d: d.__setitem__("aliases", {"a": 1}), "'aliases' must map"),
    (lambda d: d.__setitem__("history", [d["plan"]] * 40), "more than 32"),
], ids=["negative-count", "negative-shape", "outputs", "format-bool", "fxsym-bool",
        "source-list", "aliases", "history"])
def test_manifest_fields_have_their_one_json_type(saved: Path, change: Any, says: str) -> None:
    _edit(saved, change)
    assert_load_refused(saved, PlanError, says)


def test_a_group_listed_twice_is_refused(saved: Path) -> None:
    _edit(saved, lambda d: d["plan"]["groups"].append(dict(_group(d))))
    assert_load_refused(saved, PlanError, "listed twice")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int64, torch.bool])
def test_weights_of_another_dtype_are_never_cast(saved: Path, dtype: torch.dtype) -> None:
    path = saved / "model.safetensors"
    state = load_file(str(path))
    state["fc1.weight"] = state["fc1.weight"].to(dtype)
    save_file(state, str(path))
    assert_load_refused(saved, PlanMismatchError, r"'fc1.weight': the model holds torch.float32")


def test_extra_or_dangling_aliases_are_refused(saved: Path) -> None:
    _edit(saved, lambda d: d.__setitem__("aliases", {"fc2.bias": "nowhere"}))
    assert_load_refused(saved, PlanMismatchError, "alias")
    _edit(saved, lambda d: d.__setitem__("aliases", {"ghost": "fc2.bias"}))
    assert_load_refused(saved, PlanMismatchError, "'ghost'")


def test_a_truncated_weights_file_is_a_typed_error(saved: Path) -> None:
    path = saved / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    assert_load_refused(saved, PlanError, "cannot read")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every socket connection attempt is recorded and fails."""
    tried: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        tried.append(address)
        raise OSError("the test allows no network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield tried


@pytest.mark.parametrize("source", [
    "timm:hf-hub:someone/model", "timm:local-dir:/etc", "timm:../../etc/passwd",
    "torchvision:resnet18/../x", "timm:nonexistent_model_name", "torchvision:", "hf:gpt2",
])
def test_a_saved_source_never_fetches_or_reads_outside(
        saved: Path, no_network: list[Any], source: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm")
    pytest.importorskip("torchvision")
    _edit(saved, lambda d: d.__setitem__("source", source))
    for command in (["analyze", str(saved)], ["prune", str(saved), "--ratio", "0.5", "-o",
                                               str(saved.parent / "out")]):
        assert main(command) == 2
        assert "records no torchvision:NAME or timm:NAME model" in capsys.readouterr().err
    assert no_network == []
    assert not (saved.parent / "out").exists()
