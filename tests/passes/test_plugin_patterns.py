"""A pattern and a pass contributed by a third-party distribution, pip-installed from a temp
folder, are listed with their distribution and applied by ``optimize``."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import torch
from passes_helpers import count
from torch import nn

from fxsym.passes import format_passes, optimize

PLUGIN = textwrap.dedent(
    '''
    """A third-party fxsym plugin adding one pattern and one pass."""
    import torch
    from torch import fx

    import fxsym
    from fxsym.passes import Pass, SubgraphPattern

    HARDTANH = SubgraphPattern(
        "clamp_to_hardtanh",
        lambda x: torch.clamp(x, -1.0, 1.0),
        lambda x: torch.nn.functional.hardtanh(x),
    )


    def count_hardtanh(gm: fx.GraphModule) -> int:
        gm.meta["hardtanh_seen"] = sum(
            1 for n in gm.graph.nodes if n.target is torch.nn.functional.hardtanh
        )
        return 0


    @fxsym.hookimpl
    def fxsym_register_patterns(register):
        register(HARDTANH)
        register(Pass("count_hardtanh", count_hardtanh, after=("patterns",), before=("dce",)))
    '''
)


def test_pattern_from_pip_installed_distribution_is_applied(
    install_plugin: Callable[..., Path],
) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.clamp(self.fc(x), -1.0, 1.0) * 2

    model = Net()
    x = torch.randn(3, 4) * 4
    before = optimize(model, example_inputs=(x,))
    assert count(before, torch.nn.functional.hardtanh) == 0

    install_plugin(
        "fxsym-thirdparty-passes",
        {"fxsym_thirdparty_passes.py": PLUGIN},
        {"thirdparty_passes": "fxsym_thirdparty_passes"},
    )
    text = format_passes()
    pattern_line = next(ln for ln in text.splitlines() if ln.startswith("clamp_to_hardtanh "))
    assert "thirdparty_passes" in pattern_line and "fxsym-thirdparty-passes" in pattern_line
    pass_line = next(ln for ln in text.splitlines() if " count_hardtanh " in ln)
    assert "fxsym-thirdparty-passes" in pass_line

    gm = optimize(model, example_inputs=(x,))
    assert count(gm, torch.nn.functional.hardtanh) == 1 and count(gm, torch.clamp) == 0
    assert gm.meta["hardtanh_seen"] == 1
    report = gm.meta["fxsym_passes"]
    assert "fxsym-thirdparty-passes" in report["count_hardtanh"].source
    for shape in [(3, 4), (1, 4), (6, 4)]:
        inp = torch.randn(*shape) * 4
        torch.testing.assert_close(gm(inp), model(inp))
