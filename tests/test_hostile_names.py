"""Names are data, never code (issue 20 §4): a submodule name that torch.fx would paste into
its generated Python as it is is refused before any code exists, in Python and on the command
line; other odd names still work. (HTML-like names in Chromium: test_html_report.py.)"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import fxsym
from fxsym.errors import TraceError
from fxsym.prune.cli import main
from fxsym.prune.report_html import to_dot

INJECTION = 'x", print("PWNED") or "x'


class _Keyed(nn.Module):
    """One Linear under a ModuleDict key of the caller's choice, and a buffer beside it."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.blocks = nn.ModuleDict({key: nn.Linear(4, 6), "out": nn.Linear(6, 3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks["out"](torch.relu(self.blocks[self.key](x)))


class _Inner(nn.Module):
    """A non-leaf under a hostile key: its parameter is read through a get_attr target."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.t()


@pytest.mark.parametrize("key", [INJECTION, 'a"b', "a\nb", "a\\nb", "a\rb", "a\x00b"],
                         ids=["injection", "quote", "newline", "backslash", "cr", "nul"])
def test_a_name_torch_fx_would_paste_into_code_is_refused(
        key: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = _Keyed(key)
    with pytest.raises(TraceError, match="rename that submodule"):
        fxsym.analyze(model, example_inputs=(torch.randn(2, 4),))
    with pytest.raises(TraceError, match="rename that submodule"):
        fxsym.trace(model, example_inputs=(torch.randn(2, 4),))
    assert "PWNED" not in capsys.readouterr().out


def test_a_hostile_get_attr_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    class Root(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleDict({INJECTION: _Inner()})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inner = self.blocks[INJECTION]
            return x @ inner.w.t()  # read directly: a get_attr node

    with pytest.raises(TraceError, match="rename that submodule"):
        fxsym.analyze(Root(), example_inputs=(torch.randn(2, 4),))
    assert "PWNED" not in capsys.readouterr().out


def test_odd_but_harmless_names_still_work() -> None:
    for key in ("layer-1", "a b", "0", "ünï", "<!--<script>", "a'b"):
        sm = fxsym.analyze(_Keyed(key), example_inputs=(torch.randn(2, 4),))
        assert f"blocks.{key}.out_features" in {g.name for g in sm.groups()}
        gm = sm.graph_module
        assert gm is not None
        x = torch.randn(2, 4)
        torch.testing.assert_close(gm(x), sm.model(x))


def test_cli_refuses_a_hostile_name_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hostile_names_model.py").write_text(textwrap.dedent("""
        from torch import nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleDict({'a"b': nn.Linear(4, 6)})

            def forward(self, x):
                return self.blocks['a"b'](x)

        def build():
            return M()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    html, dot = tmp_path / "r.html", tmp_path / "r.dot"
    assert main(["analyze", "hostile_names_model:build", "--input-shape", "2,4",
                 "--html", str(html), "--dot", str(dot)]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("fxsym: TraceError") and "rename that submodule" in last
    assert not html.exists() and not dot.exists()
    sys.modules.pop("hostile_names_model", None)


def test_html_like_names_are_escaped_in_dot() -> None:
    names = ["<!--<script>", "</script><b>x"]
    sm = fxsym.analyze(_Keyed(names[0]), example_inputs=(torch.randn(2, 4),))
    dot = to_dot(sm, title=names[1])
    assert f'label="{names[1]}"' in dot and f'label="{names[0]} (Linear)' in dot
    assert "label=<" not in dot  # quoted DOT strings only, never HTML-like labels
