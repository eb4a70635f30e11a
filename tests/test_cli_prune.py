"""fxsym prune, and saved directories as MODEL for analyze and prune (issue 12)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fxsym.prune.cli import main

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
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--ratio", "0.5", "--input-shape",
                 "1,3,16,16", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 2
    assert "records no torchvision:NAME or timm:NAME model" in capsys.readouterr().err


def test_an_in_memory_prune_ends_with_how_to_load_it_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the output ended with ``saved to DIR``: the last line now says how the
    directory loads, and loading it so works."""
    import fxsym
    from fxsym.prune.demo import DemoNet

    out = tmp_path / "demo"
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--ratio", "0.5", "--input-shape",
                 "1,3,16,16", "-o", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert (f"fxsym.load(model, {str(out)!r}) on a fresh model built as "
            "fxsym.prune.demo:DemoNet") in last
    model = fxsym.load(DemoNet(), out)
    assert sum(p.numel() for p in model.parameters()) < sum(
        p.numel() for p in DemoNet().parameters())
    r18 = tmp_path / "r18"
    assert main(["prune", "torchvision:resnet18", "--ratio", "0.5", "--input-shape",
                 "1,3,32,32", "-o", str(r18)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert (f"fxsym.load(model, {str(r18)!r}) on a fresh torchvision.models.get_model("
            "'resnet18', weights=None)") in last and f"fxsym analyze {r18}" in last


def test_ratio_counts_units_and_param_ratio_counts_parameters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fraction of units" in text and "not of parameters" in text
    assert "--param-ratio" in text
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--param-ratio", "0.5", "--input-shape",
                 "1,3,16,16", "-o", str(tmp_path / "half"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    before, after = plan["params"]["before"], plan["params"]["after"]
    assert after <= before // 2 and after > before * 0.4
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--param-ratio", "0.5", "--ratio", "0.5",
                 "-o", str(tmp_path / "x")]) == 2
    assert "exactly one of" in capsys.readouterr().err


def test_norm_groups_reach_analyze_and_prune_and_the_plan_records_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--norm-groups keep`` is ``fxsym.analyze(norm_groups="keep")``: ``num_groups`` stays,
    every norm group loses as many channels; the plan records it and ``fxsym.load`` replays
    it. ``follow`` (the default) drops whole norm groups."""
    from group_norm_nets import ConvGN

    import fxsym
    from fxsym_plugins_nn.options import NORM_GROUPS

    spec, shape = "group_norm_nets:ConvGN", ["--input-shape", "1,3,8,8"]
    assert main(["analyze", spec, *shape, "--norm-groups", "keep", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (g,) = data["groups"]
    assert (g["size"], g["unit"], data["analysis"]) == (4, 1, {"norm_groups": "keep"})
    assert ["norm", "attr:num_groups"] not in g["members"]
    assert main(["analyze", spec, *shape, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (g,) = data["groups"]
    assert (g["size"], g["unit"], data["analysis"]) == (4, 4, {})
    assert ["norm", "attr:num_groups"] in g["members"]

    for mode, num_groups in (("keep", 4), ("follow", 2)):
        out = tmp_path / mode
        assert main(["prune", spec, *shape, "--norm-groups", mode, "--ratio", "0.5",
                     "-o", str(out), "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["extra"].get("analysis", {}) == (
            {"norm_groups": "keep"} if mode == "keep" else {})
        fresh = ConvGN()
        fxsym.load(fresh, out)
        assert (fresh.norm.num_groups, fresh.norm.num_channels) == (num_groups, 8)

    assert main(["analyze", spec, *shape, "--norm-groups", "split"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'split'" in err and all(v in err for v in NORM_GROUPS.values)

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    assert main(["prune", str(checkpoint), "--norm-groups", "keep", "--ratio", "0.5",
                 "-o", str(tmp_path / "pruned")]) == 2
    assert "not available for a checkpoint directory" in capsys.readouterr().err


def tiny_vae() -> Any:
    """A diffusers ``AutoencoderKL`` (one input tensor) of two blocks of 16 and 32 channels
    under ``norm_num_groups=8``, random weights."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=1,
        latent_channels=4, norm_num_groups=8, sample_size=16,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2).eval()


def test_describable_keeps_whole_what_the_config_cannot_follow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--describable`` is ``fxsym.plan(describable=True)``: the groups the model's config
    could not describe stay whole (their reasons in the plan), so the pruned model round-trips
    through its library's own ``save_pretrained``/``from_pretrained``."""
    diffusers = pytest.importorskip("diffusers")
    import fxsym

    out = tmp_path / "vae"
    assert main(["prune", "test_cli_prune:tiny_vae", "--input-shape", "1,3,16,16",
                 "--norm-groups", "keep", "--describable", "--ratio", "0.5", "--scope",
                 "uniform", "-o", str(out), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    kept_whole = plan["extra"]["undescribed"]
    assert kept_whole and plan["extra"]["analysis"] == {"norm_groups": "keep"}
    changed = [g for g in plan["groups"] if g["keep"] is not None]
    assert changed and not {g["name"] for g in changed} & set(kept_whole)
    model = tiny_vae()
    fxsym.load(model, out)
    model.save_pretrained(tmp_path / "pretrained")
    loaded = diffusers.AutoencoderKL.from_pretrained(tmp_path / "pretrained").eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).sample, model(x).sample)

    with pytest.warns(fxsym.ResizeWarning, match="config cannot describe"):
        assert main(["prune", "test_cli_prune:tiny_vae", "--input-shape", "1,3,16,16",
                     "--norm-groups", "keep", "--ratio", "0.5", "--scope", "uniform",
                     "-o", str(tmp_path / "plain"), "--json"]) == 0
    assert "undescribed" not in json.loads(capsys.readouterr().out)["extra"]


def test_a_saved_directory_is_analyzed_in_the_mode_its_plan_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fxsym analyze DIR`` and ``fxsym prune DIR`` without ``--norm-groups`` analyze in the
    mode DIR's plan was made in (its groups are that mode's); the option still overrides."""
    pytest.importorskip("timm")
    out, again = tmp_path / "keep", tmp_path / "again"
    assert main(["prune", "timm:test_efficientnet_gn", "--input-shape", "1,3,32,32",
                 "--norm-groups", "keep", "--ratio", "0.5", "-o", str(out)]) == 0
    capsys.readouterr()
    for option, mode in (([], {"norm_groups": "keep"}), (["--norm-groups", "follow"], {})):
        assert main(["analyze", str(out), *option, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["analysis"] == mode
    assert main(["prune", str(out), "--ratio", "0.5", "-o", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["extra"]["analysis"] == {"norm_groups": "keep"}


def test_a_plan_to_a_parameter_target_says_the_target_and_what_it_reached(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An in-memory model without blocks (a plan of widths, no search): the last lines give
    the target as given (``--param-ratio``: its count and of what) and the count reached; a
    target above the model is one ``fxsym:`` line, nothing written."""
    import fxsym.prune.demo

    total = sum(p.numel() for p in fxsym.prune.demo.DemoNet().parameters())
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--param-ratio", "0.5", "--input-shape",
                 "1,3,16,16", "-o", str(tmp_path / "half")]) == 0
    said = capsys.readouterr().out
    plan = json.loads((tmp_path / "half" / "fxsym.json").read_text())["plan"]
    target, reached = int(total * 0.5), plan["params"]["after"]
    assert (f"target: {target:,} parameters (--param-ratio 0.5 of {total:,}); reached "
            f"{reached:,} parameters") in said
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--target-params", str(total + 1),
                 "--input-shape", "1,3,16,16", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"above the model's {total:,} parameters" in err and not (tmp_path / "x").exists()


def test_routing_groups_reach_analyze_and_the_plan_records_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--routing-groups keep`` is ``fxsym.analyze(routing_groups="keep")``: the experts'
    unit is one expert position of every routing group (2 of each of 4 routing groups), not
    a routing group (4 of 2 experts); ``fxsym prune`` records it and ``fxsym.load`` replays
    it."""
    from test_grouped_routing import GroupedRouterExperts, _inputs

    import fxsym

    spec, shape = "test_grouped_routing:GroupedRouterExperts", ["--input-shape", "2,5,8"]
    assert main(["analyze", spec, *shape, "--routing-groups", "keep", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (g,) = [g for g in data["groups"] if ["", "router:0"] in g["members"]]
    assert (g["size"], g["unit"], data["analysis"]) == (2, 1, {"routing_groups": "keep"})
    assert main(["analyze", spec, *shape, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (g,) = [g for g in data["groups"] if ["", "router:0"] in g["members"]]
    assert (g["size"], g["unit"], data["analysis"]) == (4, 2, {})
    out = tmp_path / "pruned"
    assert main(["prune", spec, *shape, "--routing-groups", "keep", "--ratio", "0.25",
                 "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["extra"]["analysis"] == {
        "routing_groups": "keep"}
    fresh = fxsym.load(GroupedRouterExperts(), out, example_inputs=_inputs())
    assert (fresh.num_experts, fresh.num_group) == (8, 4)
