"""``fxsym.load`` of a directory whose weights are sharded (``model.safetensors.index.json``
and the files it names, as ``save_pretrained`` and ``fxsym.prune_checkpoint`` write them):
loads as the single file does, and a crafted index or shard is a typed error with the fresh
model untouched, nothing read outside the directory, nothing blocking."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_load_refused, save_pruned_small_seq, small_seq
from safetensors.torch import load_file, save_file
from torch import nn

import fxsym
from fxsym.errors import PlanError, PlanMismatchError
from fxsym.prune import persist

X = torch.randn(2, 3, 8, 8)
INDEX = "model.safetensors.index.json"


def _reshard(directory: Path) -> dict[str, str]:
    """Split ``model.safetensors`` into two files and an index; the weight map."""
    state = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    names = sorted(state)
    half = len(names) // 2
    weight_map: dict[str, str] = {}
    for k, part in enumerate((names[:half], names[half:])):
        file = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, str(directory / file))
        weight_map.update(dict.fromkeys(part, file))
    _index(directory, weight_map)
    return weight_map


def _index(directory: Path, weight_map: Any) -> None:
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, nn.Module]:
    out = tmp_path / "save"
    model = save_pruned_small_seq(out, X)
    _reshard(out)
    return out, model


def test_sharded_weights_load_as_one_file_does(saved: tuple[Path, nn.Module]) -> None:
    out, model = saved
    assert not (out / "model.safetensors").exists()
    fresh = fxsym.load(small_seq().eval(), out)
    with torch.no_grad():
        torch.testing.assert_close(fresh(X), model(X), rtol=0, atol=0)


@pytest.mark.parametrize("bad", ["../elsewhere.safetensors", "/etc/passwd", "sub/x.safetensors",
                                 "fxsym.json", "..", "", 7])
def test_the_index_names_only_files_of_the_directory(saved: tuple[Path, nn.Module],
                                                     bad: Any) -> None:
    out, _ = saved
    weight_map = json.loads((out / INDEX).read_text())["weight_map"]
    weight_map[next(iter(weight_map))] = bad
    _index(out, weight_map)
    assert_load_refused(out, PlanError, "weight_map")


@pytest.mark.parametrize("change, says", [
    (lambda m: m.pop(next(iter(m))), "puts nowhere"),
    (lambda m: m.__setitem__("ghost.weight", next(iter(m.values()))), "does not hold it"),
    (lambda m: m.__setitem__(next(iter(m)), sorted(set(m.values()))[-1]), "elsewhere"),
], ids=["unlisted", "missing", "moved"])
def test_index_and_shards_agree(saved: tuple[Path, nn.Module], change: Any, says: str) -> None:
    out, _ = saved
    weight_map = json.loads((out / INDEX).read_text())["weight_map"]
    change(weight_map)
    _index(out, weight_map)
    assert_load_refused(out, PlanError, says)


@pytest.mark.parametrize("text, says", [
    ('{"weight_map": {"a": "x", "a": "y"}}', "appears twice"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "weight_map"),
    ("[]", "weight_map"),
    ('{"weight_map": {"a": NaN}}', "not a JSON number"),
])
def test_the_index_is_strict_json(saved: tuple[Path, nn.Module], text: str, says: str) -> None:
    out, _ = saved
    (out / INDEX).write_text(text)
    assert_load_refused(out, PlanError, says)


def test_a_huge_index_is_refused_unread(saved: tuple[Path, nn.Module]) -> None:
    out, _ = saved
    with (out / INDEX).open("r+b") as f:
        f.truncate(persist.MAX_INDEX_BYTES + 1)
    assert_load_refused(out, PlanError, "larger than")


def test_a_fifo_shard_is_refused_without_blocking(saved: tuple[Path, nn.Module]) -> None:
    out, _ = saved
    shard = out / "model-00002-of-00002.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    assert_load_refused(out, PlanError, "not a regular file")


def test_a_fifo_index_is_refused_without_blocking(saved: tuple[Path, nn.Module]) -> None:
    out, _ = saved
    (out / INDEX).unlink()
    os.mkfifo(out / INDEX)
    assert_load_refused(out, PlanError, "not a regular file")


def test_both_kinds_of_weights_are_ambiguous(saved: tuple[Path, nn.Module]) -> None:
    out, _ = saved
    save_file({"x": torch.zeros(1)}, str(out / "model.safetensors"))
    assert_load_refused(out, PlanError, "both")


def test_a_shard_of_another_dtype_is_never_cast(saved: tuple[Path, nn.Module]) -> None:
    out, _ = saved
    weight_map = json.loads((out / INDEX).read_text())["weight_map"]
    file = out / weight_map["fc1.weight"]
    state = load_file(str(file))
    state["fc1.weight"] = state["fc1.weight"].double()
    save_file(state, str(file))
    assert_load_refused(out, PlanMismatchError, "never cast")
