"""What a streamed run shows of a parameter whose tensor is not in memory (issue 29 §1): its
device, dtype and shape as the loaded model shows them, and an error naming it for any other
use, never a value made up (a meta tensor let torch's embedding return uninitialised memory
for transformers' Llama 4, which moves the token ids to its embedding's device first)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fxsym.errors import CheckpointError
from fxsym.prune.checkpoint.streaming import Loader, Watch, stream


class Source:
    """A model's tensors by name, as a checkpoint reader gives them."""

    directory = Path("in-memory")

    def __init__(self, model: nn.Module) -> None:
        self.tensors = {n: p.detach().clone() for n, p in model.named_parameters()}

    def has(self, name: str) -> bool:
        return name in self.tensors

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        return {n: self.tensors[n].clone() for n in names}


class Outputs(Watch):
    def __init__(self) -> None:
        self.got: list[Any] = []

    def output(self, batch: Any, out: Any) -> None:
        self.got.append(out)


def streamed(model: nn.Module, batches: list[torch.Tensor]) -> list[Any]:
    """``model``'s outputs on ``batches``, run streamed from a copy of its tensors with its
    parameters on the meta device."""
    source = Source(model)
    meta = copy.deepcopy(model).to("meta")
    watch = Outputs()
    stream(meta, Loader(meta, source), batches, watch)
    assert all(p.is_meta for p in meta.parameters())
    return watch.got


class DeviceFirst(nn.Module):
    """Reads its embedding's device and dtype before calling it, as Llama 4 does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids.to(self.embed.weight.device))
        for layer in self.layers:
            x = layer(x).to(self.layers[0].weight.dtype)
        return x


def test_a_parameter_s_device_read_before_its_call_is_the_loaded_one() -> None:
    model = DeviceFirst().eval()
    batches = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])]
    with torch.no_grad():
        want = [model(b) for b in batches]
    for got, w in zip(streamed(model, batches), want):
        assert torch.equal(got, w)


def test_a_weight_used_outside_its_module_s_call_is_refused_by_name() -> None:
    class Borrowing(DeviceFirst):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return nn.functional.linear(x, self.embed.weight)  # a head tied by hand

    with pytest.raises(CheckpointError, match=r"embed\.weight was used \(linear\)"):
        streamed(Borrowing().eval(), [torch.tensor([[1, 2]])])
