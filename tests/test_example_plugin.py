"""The example third-party distribution in examples/, installed the way a user would."""

from __future__ import annotations

import contextlib
import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.prune.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fxsym-example-plugin"
PACKAGE = "fxsym_example_plugin"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """``pip install ./examples/fxsym-example-plugin`` into a temp folder, then rescan.

    The source is copied first so the build leaves nothing behind in the repository.
    """
    tmp = tmp_path_factory.mktemp("example-plugin")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                  "__pycache__"))
    site = tmp / "site"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
         str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        pm = fxsym.load_plugins(rescan=True)
        assert pm.has_plugin("example"), [f.error for f in pm.failed]
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(site))
        pm = fxsym.load_plugins(rescan=True)
        if pm.has_plugin("example"):
            pm.unregister(name="example")
        for mod in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[mod]


def test_installed_as_a_distribution(example: ModuleType) -> None:
    src = fxsym.load_plugins().source("example")
    assert (src.distribution, src.version) == ("fxsym-example-plugin", "0.1.0")
    assert Path(example.__file__).parent.joinpath("py.typed").is_file()
    assert "site" in Path(example.__file__).parts[-3]  # the installed copy, not the source


def test_module_family(example: ModuleType) -> None:
    model = nn.Sequential(nn.Linear(4, 6), example.ScaledLinear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    x = torch.randn(3, 4)
    sm = assert_oracles(model, (x,))
    groups = {g.name: g.members for g in sm.groups()}
    assert groups == {  # the attributes ScaledLinear declares are members too
        "0.out_features": (("0", "out_features"), ("1", "in_features"),
                           ("1", "attr:in_features")),
        "1.out_features": (("1", "out_features"), ("1", "attr:out_features"),
                           ("3", "in_features")),
    }
    # resize by size: the importance function picks the rows to keep
    fxsym.resize(model, sm, {"0.out_features": [5, 0, 2], "1.out_features": 2})
    layer = model[1]
    assert (layer.in_features, layer.out_features) == (3, 2)
    assert layer.weight.shape == (2, 3) and layer.scale.shape == (2,)
    assert model(x).shape == (3, 2)


class GateOpaque(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class Gate(nn.Module):  # same computation, name not ending in "Opaque"
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def _called_modules(model: nn.Module) -> set[str]:
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 4),))
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}


@contextlib.contextmanager
def _without_example() -> Iterator[None]:
    """The example plugin unregistered for a while (to show what it changes)."""
    pm = fxsym.load_plugins()
    plugin = pm.get_plugin("example")
    pm.unregister(name="example")
    try:
        yield
    finally:
        pm.register(plugin, name="example")


def test_wrapper_changes_the_answer_of_another_plugin(example: ModuleType) -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    sm = fxsym.analyze(model)  # the nn plugin's float32 guess, cast by the example's wrapper
    assert [g.name for g in sm.groups()] == ["0.out_features"]
    assert sm.graph_module is not None
    (x,) = sm.graph_module.example_inputs  # type: ignore[attr-defined]
    assert x.dtype == torch.float64
    model(x)  # inputs the model runs on
    with _without_example():
        gm = fxsym.trace(model)
        (guess,) = gm.example_inputs  # type: ignore[attr-defined]
        assert guess.dtype == torch.float32  # the nn plugin's answer, unwrapped
        with pytest.raises(RuntimeError, match=r"(?i)dtype|double|float"):
            model(guess)


def test_leaf_decision(example: ModuleType) -> None:
    model = nn.Sequential(nn.Linear(4, 4), GateOpaque(), Gate(), nn.Linear(4, 2))
    called = _called_modules(model)
    assert "1" in called  # kept as a leaf by the example's policy
    assert "2" not in called  # traced into, as without the plugin
    with _without_example():
        assert "1" not in _called_modules(model)
    assert "1" in _called_modules(model)


class DoubleNeg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.neg(torch.neg(self.lin(x)))) + 1


def _negs(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.neg)


@pytest.mark.parametrize("with_inputs", [True, False])
def test_pattern(example: ModuleType, with_inputs: bool) -> None:
    model = DoubleNeg().eval()
    x = torch.randn(5, 4)
    assert _negs(fxsym.trace(model, example_inputs=(x,))) == 2
    # without example inputs only exact patterns may change the graph: this one is exact
    gm = fxsym.optimize(model, example_inputs=(x,) if with_inputs else None)
    assert _negs(gm) == 0
    assert gm.meta["fxsym_verified"] is True
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
    with _without_example():
        assert _negs(fxsym.optimize(model, example_inputs=(x,))) == 2


def test_cli_names_the_plugin(example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("example  (fxsym-example-plugin 0.1.0)"):]
    assert "sym_infos: fxsym_example_plugin.modules.ScaledLinear" in block
    assert "hooks: fxsym_example_inputs (wrapper), fxsym_leaf_module" in block
    assert "patterns: double_neg" in block
