"""fxsym prune, and saved directories as MODEL for analyze and prune (issue 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxsym.cli import main

pytest.importorskip("torchvision")


def test_prune_writes_a_directory_analyze_and_prune_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r18"
    assert main(["prune", "torchvision:resnet18", "--ratio", "0.5", "--importance", "l2",
                 "--input-shape", "1,3,32,32", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "parameters" in text and "MACs" in text and "11,689,512" in text
    assert "conv1.out_channels" in text and "params removed alone" in text
    manifest = json.loads((out / "fxsym.json").read_text())
    assert manifest["source"] == "torchvision:resnet18"
    sizes = {g["name"]: len(g["keep"] or range(g["size"])) for g in manifest["plan"]["groups"]}

    assert main(["analyze", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {g["name"]: g["size"] for g in data["groups"]} == sizes

    again = tmp_path / "again"
    assert main(["prune", str(out), "--ratio", "0.5", "--scope", "uniform", "-o",
                 str(again)]) == 0
    capsys.readouterr()
    assert len(json.loads((again / "fxsym.json").read_text())["history"]) == 1
    assert main(["analyze", str(again), "--json"]) == 0
    halved = {g["name"]: g["size"] for g in json.loads(capsys.readouterr().out)["groups"]}
    assert all(halved[n] == (s + 1) // 2 for n, s in sizes.items())


def test_a_saved_directory_never_names_code_to_run(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["prune", "fxsym.demo:DemoNet", "--ratio", "0.5", "--input-shape", "1,3,16,16",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 2
    assert "records no torchvision:NAME or timm:NAME model" in capsys.readouterr().err


def test_ratio_counts_units_and_param_ratio_counts_parameters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fraction of units" in text and "not of parameters" in text
    assert "--param-ratio" in text
    assert main(["prune", "fxsym.demo:DemoNet", "--param-ratio", "0.5", "--input-shape",
                 "1,3,16,16", "-o", str(tmp_path / "half"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    before, after = plan["params"]["before"], plan["params"]["after"]
    assert after <= before // 2 and after > before * 0.4
    assert main(["prune", "fxsym.demo:DemoNet", "--param-ratio", "0.5", "--ratio", "0.5",
                 "-o", str(tmp_path / "x")]) == 2
    assert "exactly one of" in capsys.readouterr().err
