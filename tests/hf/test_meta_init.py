"""The config probes' meta builds skip weight initialisation (issue 31 §4: an explicit-size
prune near its floor). A meta tensor holds no values, yet each initialiser ran torch's Python
decompositions on it: a third of a meta build, and a prune of SmolLM2 makes 15 of them.
:func:`fxsym_plugins_hf.metainit.no_meta_init` returns an initialiser's meta tensor at once,
in its own thread only."""

from __future__ import annotations

import threading
from typing import Any

import torch
from ckpt_helpers import tiny_config
from torch import nn
from torch.overrides import TorchFunctionMode

from fxsym_plugins_hf.configs import meta_build
from fxsym_plugins_hf.metainit import no_meta_init


class _Seen(TorchFunctionMode):
    """Records the names of the torch functions that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _described(model: nn.Module) -> dict[str, Any]:
    """Every parameter's and buffer's shape, dtype and device, and every module's int
    attributes: what a meta build is read for."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {"tensors": {n: (tuple(t.shape), t.dtype, t.device.type) for n, t in named},
            "ints": {q: {k: v for k, v in vars(m).items() if type(v) is int}
                     for q, m in model.named_modules()}}


def test_a_meta_build_runs_no_initialiser_and_builds_the_same_model() -> None:
    """``meta_build`` of a llama runs no weight initialiser (before: ``kaiming_uniform_`` of
    every linear, transformers' ``normal_``...) and gives the model a plain meta build gives:
    the same tensors (shape, dtype, device) and int attributes."""
    import transformers

    config = tiny_config("llama", num_hidden_layers=2)
    model = transformers.LlamaForCausalLM(config)
    with torch.device("meta"):
        plain = transformers.LlamaForCausalLM(config)
    with _Seen() as seen:
        built = meta_build(model, config)
    assert built is not None
    initialisers = [n for n in seen.names if n.endswith("_") and (
        n.startswith(("kaiming", "xavier", "normal", "uniform", "trunc_normal", "constant",
                      "ones", "zeros", "zero", "fill")))]
    assert not initialisers, sorted(set(initialisers))
    assert _described(built) == _described(plain)


def test_real_tensors_and_other_threads_are_initialised_as_always() -> None:
    """Inside ``no_meta_init`` a module built with real weights, in the same thread or in
    another one, is initialised exactly as without it (same seed, same values); a meta one
    keeps its shapes, and an initialiser that checks a shape still refuses a wrong one."""
    def linear(seed: int) -> nn.Linear:
        torch.manual_seed(seed)
        return nn.Linear(5, 7)

    expected = [linear(0).weight.detach().clone(), linear(1).weight.detach().clone()]
    got: list[torch.Tensor] = []
    with no_meta_init():
        same_thread = linear(0)
        other = threading.Thread(target=lambda: got.append(linear(1).weight.detach().clone()))
        other.start()
        other.join()
        with torch.device("meta"):
            meta = nn.Linear(5, 7)
        refused = False
        try:
            nn.init.eye_(torch.empty(2, 3, 4, device="meta"))
        except ValueError:
            refused = True
    assert torch.equal(same_thread.weight, expected[0])
    assert len(got) == 1 and torch.equal(got[0], expected[1])
    assert meta.weight.is_meta and tuple(meta.weight.shape) == (7, 5)
    assert refused
