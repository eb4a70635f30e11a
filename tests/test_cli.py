"""The command line: analyze (demo, torchvision, JSON), plugins, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fxsym.prune.cli import main


def test_analyze_demo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze"]) == 0
    out = capsys.readouterr().out
    assert "built-in demo" in out and "5 searchable groups" in out
    for name in ("stem.0.out_channels", "block.0.out_channels", "left.out_channels",
                 "right.out_channels", "head.0.out_features"):
        assert name in out


def test_analyze_json_torchvision(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    assert main(["analyze", "torchvision:resnet18", "--input-shape", "1,3,64,64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "torchvision:resnet18"
    names = {g["name"]: g for g in data["groups"]}
    assert len(names) == 12 and names["conv1.out_channels"]["size"] == 64
    assert ["bn1", "num_features"] in names["conv1.out_channels"]["members"]


def test_analyze_factory_spec_and_bad_specs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "fxsym.prune.demo:DemoNet", "--input-shape", "1,3,16,16"]) == 0
    assert "5 searchable groups" in capsys.readouterr().out
    assert main(["analyze", "resnet18"]) == 2
    assert "MODEL must look like" in capsys.readouterr().err
    # wrong input shape: a clear error, exit code 2
    assert main(["analyze", "fxsym.prune.demo:DemoNet", "--input-shape", "1,4,16,16"]) == 2
    assert "ModelError" in capsys.readouterr().err


def test_console_script_runs() -> None:
    exe = shutil.which("fxsym")
    assert exe is not None, "the fxsym console script is not installed"
    res = subprocess.run([exe, "plugins"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "fxsym-plugins-nn" in res.stdout


def test_fxsym_plugins_lists_what_each_plugin_declares(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``fxsym plugins`` lists under each plugin what it declares (its analysis options with
    their values, its size options), as the flags they are, whole: the nn plugin's
    ``--norm-groups``/``--routing-groups``, the hf plugin's size flags where it is installed,
    and a plugin registered in code's own (before: only the hook names, six at most)."""
    import fxsym
    from fxsym.declarations import AnalysisOption, SizeOption
    from fxsym_plugins_nn.declarations import OPTIONS

    class Levels:
        @fxsym.hookimpl
        def fxsym_size_options(self) -> tuple[SizeOption, ...]:
            return (SizeOption("levels", "channels of every level"),
                    SizeOption("skip_levels", "channels of every skip"))

        @fxsym.hookimpl
        def fxsym_analysis_options(self) -> tuple[AnalysisOption, ...]:
            return (AnalysisOption("skips", ("add", "concat"), "how a skip joins"),)

    try:
        from fxsym_plugins_hf import declarations as hf
    except ImportError:
        allow, sizes = ["nn"], {}
    else:
        allow, sizes = ["nn", "hf"], {"hf": [o.flag for o in hf.fxsym_size_options()]}
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=allow)
    pm.register(Levels(), name="levels")
    with fxsym.use_plugins(pm):
        assert main(["plugins"]) == 0
    blocks: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith("    "):
            block = blocks[line.split()[0]] = []
        block.append(line.strip())
    assert blocks["levels"][0] == "levels  (<local>)"
    assert blocks["levels"][-2:] == ["analysis options: --skips add|concat",
                                     "size options: --levels, --skip-levels"]
    assert blocks["nn"][-1] == "analysis options: " + ", ".join(
        f"{o.flag} {'|'.join(o.values)}" for o in OPTIONS)
    assert blocks["nn"][-1] == ("analysis options: --norm-groups follow|keep, "
                                "--routing-groups follow|keep")
    for plugin, flags in sizes.items():
        assert blocks[plugin][-1] == "size options: " + ", ".join(flags)
        assert not any(line.startswith("analysis options") for line in blocks[plugin])


@pytest.mark.parametrize(("spec", "says"), [
    ("json:dumps", "json:dumps is not a model factory: calling it without arguments failed"),
    ("os:sep", "os:sep is a str, not a model or a model factory"),
    ("fxsym.prune.demo:demo_model",
     "fxsym.prune.demo:demo_model() returned a tuple, not a torch.nn.Module"),
    ("fxsym.prune.demo:NoSuchNet", "cannot load fxsym.prune.demo:NoSuchNet: AttributeError"),
    ("no_such_package_xyz:Net", "cannot load no_such_package_xyz:Net: ModuleNotFoundError"),
    (":Net", "MODEL must look like"),
])
def test_bad_model_specs_are_one_line_errors(
    spec: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", spec, "--input-shape", "1,3,8,8"]) == 2
    assert _error_line(capsys.readouterr().err).startswith(f"fxsym: {says}")


def test_bad_input_shape_and_model_errors_are_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["analyze", "fxsym.prune.demo:DemoNet", "--input-shape", "1,three,8,8"]) == 2
    assert "--input-shape must be integers" in _error_line(capsys.readouterr().err)


def test_console_script_never_prints_a_traceback() -> None:
    exe = shutil.which("fxsym")
    assert exe is not None
    res = subprocess.run([exe, "analyze", "json:dumps"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2
    assert "not a model factory" in _error_line(res.stderr)


def _error_line(stderr: str) -> str:
    """The one error line after the progress lines ('loading ...', 'analyzing ...')."""
    lines = [ln for ln in stderr.splitlines() if not ln.endswith(" ...")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_analyze_outputs_option_narrows_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    spec = ["analyze", "torchvision:squeezenet1_1", "--input-shape", "1,3,64,64", "--json"]
    assert main(spec) == 0
    assert json.loads(capsys.readouterr().out)["output_contract"] is None
    assert main([*spec, "--outputs", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["output_contract"] == [0]
    assert main([*spec, "--outputs", "logits"]) == 2
    err = capsys.readouterr().err
    assert "'logits' is not among the model's outputs" in err and "Traceback" not in err


# -- issue 20 §6: a run that explains itself -----------------------------------------------
_NO_TORCH = """
import sys
from fxsym.prune.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    code = exc.code
print("exit", code, "torch imported:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("argv", [["--help"], ["prune", "--help"], ["analyze", "--help"],
                                  ["--version"]])
def test_help_and_version_do_not_import_torch(argv: list[str]) -> None:
    res = subprocess.run([sys.executable, "-c", _NO_TORCH.format(argv=argv)],
                         capture_output=True, text=True, timeout=300)
    assert res.stdout.splitlines()[-1] == "exit 0 torch imported: False", res.stderr
    assert "usage: fxsym" in res.stdout or "fxsym " in res.stdout


_FLAGS_NO_TORCH = """
import sys
from fxsym.declarations import installed
from fxsym.prune.cli import main
try:
    main(["prune", "--help"])
except SystemExit:
    pass
declared = installed()
print("flags", *[o.flag for o in (*declared.sizes, *declared.analysis)])
print("torch imported:", "torch" in sys.modules)
"""


def test_the_plugins_flags_are_listed_without_torch() -> None:
    """``fxsym prune --help`` lists the size flags and analysis options' flags the installed
    plugins declare (``fxsym_size_options``, ``fxsym_analysis_options``, read from their
    ``fxsym.declarations`` entry points, the hf plugin's ``--ffn`` among them where it is
    installed) without importing torch; with no plugin loaded (``FXSYM_DISABLE_PLUGIN_AUTOLOAD``)
    ``--ffn`` is an unknown option."""
    res = subprocess.run([sys.executable, "-c", _FLAGS_NO_TORCH], capture_output=True,
                         text=True, timeout=300)
    *_, flags_line, torch_line = res.stdout.splitlines()
    flags = flags_line.split()[1:]
    assert torch_line == "torch imported: False", res.stderr
    assert "--norm-groups" in flags and all(f in res.stdout for f in flags)
    try:
        import fxsym_plugins_hf  # noqa: F401
    except ImportError:
        pass
    else:
        assert {"--hidden", "--ffn", "--kv-heads", "--experts", "--routing-groups"} <= set(flags)
    res = subprocess.run([sys.executable, "-m", "fxsym.prune.cli", "prune", "ckpt", "--ffn", "8",
                          "-o", "out"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FXSYM_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert res.returncode == 2
    assert res.stderr.strip() == "fxsym: unknown option --ffn (see fxsym prune --help)"


def test_a_declaration_that_fails_to_load_is_said(tmp_path: Path) -> None:
    """A distribution whose ``fxsym.declarations`` entry point fails to import: ``fxsym prune
    --help`` still answers (the other plugins' flags listed), with one warning line naming
    the entry point and its distribution."""
    info = tmp_path / "broken_decl-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-decl\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fxsym.declarations]\nbroken = no_such_module_of_declarations\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    res = subprocess.run([sys.executable, "-m", "fxsym.prune.cli", "prune", "--help"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and "--norm-groups" in res.stdout, res.stderr
    assert res.stderr.strip() == (
        "fxsym: PluginWarning: the fxsym.declarations entry point 'broken' of broken-decl "
        "(no_such_module_of_declarations) failed to load, its options are left out: "
        "ModuleNotFoundError: No module named 'no_such_module_of_declarations'")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import fxsym

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fxsym {fxsym.__version__}"


@pytest.mark.parametrize("argv, says", [
    (["bogus"], "invalid choice: 'bogus'"),
    (["prune", "fxsym.prune.demo:DemoNet", "--ratio", "0.5"], "-o/--output"),
    (["prune", "fxsym.prune.demo:DemoNet", "--ratio", "half", "-o", "x"], "--ratio"),
    (["analyze", "--max-report"], "--max-report"),
    ([], "command"),
])
def test_usage_errors_are_one_line(argv: list[str], says: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = _error_line(err)
    assert line.startswith("fxsym: ") and says in line, err


_USAGE_NO_TORCH = """
import sys
from fxsym.prune.cli import main
code = main({argv!r})
print("exit", code, "torch imported:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("argv, says", [
    (["torchvision:resnet18"], "give exactly one of --ratio"),
    (["torchvision:resnet18", "--ratio", "0.5", "--hidden", "8"], "or an amount, not both"),
    (["torchvision:resnet18", "--param-ratio", "1.5"], "--param-ratio is the fraction"),
    (["torchvision:resnet18", "--ratio", "0.5", "--calib", "c.txt"], "--calib FILE is for a"),
    (["torchvision:resnet18", "--target-active-params", "9", "--layers", "0,1"],
     "not positions"),
    (["torchvision:resnet18", "--ratio", "0.5", "--layers", "two"], "--layers is a count"),
    (["torchvision:resnet18", "--ratio", "0.5", "--batches", "2"], "--batches"),
    (["torchvision:resnet18", "--ratio", "1.5"], "--ratio is the fraction of units"),
    (["torchvision:resnet18", "--ratio", "nan"], "--ratio must be a finite number"),
    (["torchvision:resnet18", "--ratio", "0.5", "--round-to", "0"], "--round-to must be"),
    (["ckpt", "--ratio", "0.5", "--min-keep", "-1"], "--min-keep must be"),
    (["torchvision:resnet18", "--layers", "0,1", "--scope", "global"], "--scope global"),
    (["resnet18", "--ratio", "0.5"], "MODEL must look like"),
    (["ckpt", "--ratio", "0.5", "--importance", "taylor"], "--importance 'taylor'"),
    (["ckpt", "--layers", "2"], "give --calib FILE"),
    (["ckpt", "--ratio", "0.5", "--importance", "activation"], "give --calib FILE"),
    (["ckpt", "--target-params", "9", "--calib", "c.txt", "--scope", "global"],
     "--scope global"),
    (["ckpt", "--target-active-params", "9"], "give --calib FILE"),
    (["ckpt", "--ratio", "0.5", "--calib", "c.txt", "--importance", "l2"], "--calib FILE with"),
    (["ckpt", "--target-macs", "9"], "--target-macs is not available"),
    (["ckpt", "--ratio", "0.5", "--max-shard-size", "5XB"], "--max-shard-size must be"),
    (["ckpt", "--ratio", "0.5", "--calib", "c.txt", "--seq-len", "0"], "must be positive"),
], ids=["no-amount", "amount-and-sizes", "param-ratio", "calib-in-memory", "search-positions",
        "layers-text", "batches-unused", "ratio-range", "ratio-nan", "round-to", "min-keep",
        "depth-scope", "no-source", "ckpt-importance",
        "ckpt-layer-count", "ckpt-activation", "ckpt-search-scope", "ckpt-active",
        "ckpt-calib-unused", "ckpt-macs", "ckpt-shard", "ckpt-seq-len"])
def test_usage_errors_are_answered_before_torch_is_imported(
        tmp_path: Path, argv: list[str], says: str) -> None:
    """Before, ``fxsym prune torchvision:resnet18 -o x`` imported torch, the plugins and the
    model (45 s) to say that no amount was given: every rule of the options alone is checked
    first (``ckpt`` is a checkpoint directory: a ``config.json``)."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "c.txt").write_text("some text")
    argv = ["prune", *argv, "-o", "out"]
    res = subprocess.run([sys.executable, "-c", _USAGE_NO_TORCH.format(argv=argv)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.stdout.splitlines()[-1] == "exit 2 torch imported: False", res.stderr
    line = _error_line(res.stderr)
    assert line.startswith("fxsym: ") and says in line, res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, says", [
    (["analyze", "resnet18"], "MODEL must look like"),
    (["analyze", "torchvision:resnet18", "--input-shape", "1,three"], "--input-shape must be"),
    (["prune", "torchvision:resnet18", "--ratio", "0.5", "--input-shape", "1,x", "-o", "o"],
     "--input-shape must be"),
], ids=["analyze-spec", "analyze-shape", "prune-shape"])
def test_analyze_and_input_shape_errors_come_before_torch(tmp_path: Path, argv: list[str],
                                                          says: str) -> None:
    """Before, ``fxsym analyze resnet18`` imported torch and the plugins to say the spec is
    malformed."""
    res = subprocess.run([sys.executable, "-c", _USAGE_NO_TORCH.format(argv=argv)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.stdout.splitlines()[-1] == "exit 2 torch imported: False", res.stderr
    assert _error_line(res.stderr).startswith(f"fxsym: {says}"), res.stderr


@pytest.mark.parametrize("argv, says", [
    (["prune", "m:f", "--ratoi", "0.5", "-o", "x"],
     "unknown option --ratoi; did you mean --ratio? (see fxsym prune --help)"),
    (["prune", "m:f", "--ratio", "0.5", "--param-ration=0.5", "-o", "x"],
     "unknown option --param-ration; did you mean --param-ratio? (see fxsym prune --help)"),
    (["analyze", "--jsno"], "unknown option --jsno; did you mean --json? (see fxsym analyze "
     "--help)"),
    (["prune", "m:f", "--ratio", "0.5", "--zzzz", "-o", "x"],
     "unknown option --zzzz (see fxsym prune --help)"),
    (["prune", "m:f", "stray", "--ratio", "0.5", "-o", "x"],
     "unexpected argument 'stray' (see fxsym prune --help)"),
], ids=["ratio", "param-ratio", "analyze", "no-close-match", "stray"])
def test_an_unknown_option_offers_the_closest_one(argv: list[str], says: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``fxsym: unrecognized arguments: --ratoi 0.5 (see fxsym --help)``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"fxsym: {says}", err


def test_an_unimportable_factory_hints_at_pythonpath(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "no_such_package_xyz.models:Net", "--input-shape", "1,3,8,8"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "ModuleNotFoundError" in line and "PYTHONPATH" in line
