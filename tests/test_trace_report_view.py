"""What the trace report shows (issue 20 §6): the same lines in Python, on the command line and
in the HTML report, and no line about a size that never was an elastic candidate (a number read
from a module attribute that sizes no tensor, such as a pooling's ``kernel_size``) unless
asked for (``verbose``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.report_html import report_data


class _Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.MaxPool2d(3, 2)
        self.conv2 = nn.Conv2d(8, 6, 3)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv2(self.pool(self.conv(x))).mean((2, 3)))


def _stem() -> fxsym.SymMap:
    return fxsym.analyze(_Stem().eval(), example_inputs=(torch.randn(1, 3, 16, 16),))


def test_a_size_that_never_was_a_candidate_is_a_detail_line() -> None:
    sm = _stem()
    report = sm.trace_report
    assert [g.name for g in sm.groups()] == ["conv.out_channels", "conv2.out_channels"]
    shown = [str(e) for e in report]
    assert shown == ["[boundary] node output: reaches the model output"]
    assert str(report) == "trace report:\n  " + "\n  ".join(shown)
    assert len(report) == 1 and report.of_kind("boundary") == list(report)
    (detail,) = report.details
    assert detail.where.startswith("pool") and "pooling window" in detail.message
    assert detail in report.entries
    assert str(detail) in report.format(verbose=True)
    assert report.format() == str(report)


def test_the_html_report_lists_only_sizes_that_could_have_changed() -> None:
    sm = _stem()
    data = report_data(sm)
    assert [c["name"] for c in data["constant"]] == ["fc.out_features"]
    assert data["report"] == [str(e) for e in sm.trace_report]
    full = report_data(sm, verbose=True)
    assert {"pool.attr:kernel_size", "pool.attr:stride"} <= {c["name"] for c in full["constant"]}
    assert full["report"] == [str(e) for e in sm.trace_report.entries]


def test_python_and_cli_show_the_same_trace_report(capsys: pytest.CaptureFixture[str]) -> None:
    torchvision = pytest.importorskip("torchvision")
    sm = fxsym.analyze(torchvision.models.resnet18().eval(),
                       example_inputs=(torch.randn(1, 3, 32, 32),))
    assert not any("kernel_size" in str(e) or "maxpool" in str(e) for e in sm.trace_report)
    spec = ["analyze", "torchvision:resnet18", "--input-shape", "1,3,32,32"]
    assert main([*spec, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["trace_report"]
    assert cli == [{"kind": e.kind, "where": e.where, "message": e.message}
                   for e in sm.trace_report]
    assert main(spec) == 0
    text = capsys.readouterr().out
    assert all(f"  {e}" in text.splitlines() for e in sm.trace_report)
    assert "maxpool" not in text
    assert main([*spec, "--verbose"]) == 0
    assert "maxpool" in capsys.readouterr().out


def test_trace_report_is_never_none() -> None:
    sm = fxsym.SymMap(nn.Linear(2, 2))
    assert isinstance(sm.trace_report, fxsym.TraceReport) and not sm.trace_report.entries
