"""Concurrency: analyses in several threads give the sequential results, and a thread that is
not tracing never sees the tracer's patches (issue 9, items 6 and 10)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from torch import nn

import fxsym

torchvision = pytest.importorskip("torchvision")


class TinyCNN(nn.Module):
    """A small residual CNN: one free group, one residual group."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.body = nn.Sequential(nn.Conv2d(8, 12, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(12, 8, 3, padding=1))
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.stem(x)))
        h = h + self.body(h)
        return self.head(h.mean((2, 3)))


def _models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    x = (torch.randn(1, 3, 32, 32),)
    return {
        "tiny": (TinyCNN().eval(), x),
        "resnet18": (torchvision.models.resnet18(weights=None).eval(), x),
        "squeezenet1_1": (torchvision.models.squeezenet1_1(weights=None).eval(), x),
        "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small(weights=None).eval(), x),
    }


def _summary(sm: fxsym.SymMap) -> list[tuple[Any, ...]]:
    return [(g.name, g.size, g.is_sortable, tuple(g.members)) for g in sm.groups()]


def test_concurrent_analyses_give_the_sequential_results() -> None:
    models = _models()
    expected = {name: _summary(fxsym.analyze(m, example_inputs=x))
                for name, (m, x) in models.items()}
    assert all(expected.values())
    jobs = [name for name in models for _ in range(2)]  # eight threads, two per model

    def run(name: str) -> list[tuple[Any, ...]]:
        model, x = models[name]
        return _summary(fxsym.analyze(model, example_inputs=x))

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for _round in range(20):
            results = list(pool.map(run, jobs))
            for name, got in zip(jobs, results):
                assert got == expected[name], (name, _round)


class _Waits(nn.Module):
    """A model whose forward, while traced, lets another thread run and waits for it."""

    def __init__(self, go: threading.Event, done: threading.Event) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.out = nn.Linear(6, 2)
        self.go, self.done = go, done

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n = x.shape[0], x.shape[1]
        h = self.lin(x) + torch.zeros(b, 6) + torch.ones(b, n).sum(1, keepdim=True)
        self.go.set()
        assert self.done.wait(30), "the other thread did not finish"
        return self.out(h)


def test_a_thread_not_tracing_sees_no_patch() -> None:
    go, done = threading.Event(), threading.Event()
    model = _Waits(go, done).eval()
    seen: dict[str, Any] = {}

    def bystander() -> None:
        assert go.wait(30)
        try:
            seen["zeros"] = torch.zeros(2, 3)
            seen["ones"] = torch.ones(2)
            seen["module"] = model.lin(torch.randn(2, 4))  # the very module being traced
            seen["weight"] = model.lin.weight
        finally:
            done.set()

    thread = threading.Thread(target=bystander)
    thread.start()
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 4),))
    thread.join()
    assert type(seen["zeros"]) is torch.Tensor and seen["zeros"].shape == (2, 3)
    assert type(seen["ones"]) is torch.Tensor and seen["ones"].shape == (2,)
    assert type(seen["module"]) is torch.Tensor and seen["module"].shape == (2, 6)
    assert seen["weight"] is model.lin._parameters["weight"]
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["lin", "out"]
    zeros = [n for n in gm.graph.nodes if n.target is torch.zeros]
    assert zeros, "torch.zeros with a traced size is a node of the traced thread's graph"
