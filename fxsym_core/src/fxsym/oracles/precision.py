"""The dtype the oracles compare in and the tolerance that goes with it.

Float64 wherever the model runs in it, compared at 1e-9 of the output's scale
(:data:`VALUE_TOLERANCE`), so rounding neither hides a wrong group nor fails a right one;
float32 at 1e-4, with a note, when the caller asks, when float64 copies do not fit in the
memory available (:data:`FLOAT64_COPIES`, :func:`available_memory`), when the model fails in
float64, or when it computes some values in a lower precision anyway (seen by watching every
op of the first run, ``_LowerPrecision``). ``_Precision`` makes those decisions for one
oracle run and records them in its result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..analysis.outputs import Contract
from .perturb import _floating_tensors
from .result import OracleResult
from .running import _cast_inputs, run_model

#: the tolerance of the value oracle, relative to each output's largest entry, by the dtype it
#: ran in (float64 wherever the model runs in it)
VALUE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


#: float64 copies of the model's floating tensors an oracle may hold at its peak, above the
#: model itself: one copy, the copy in the model's dtype a resized copy is converted from,
#: the activations and the value oracle's records (measured: 1.95 on vit_b_16, 1.7 on ViT-H)
FLOAT64_COPIES = 2.5


class _Precision:
    """The dtype the oracles run in and the tolerance that goes with it.

    Float64 unless ``dtype`` says otherwise, or its copies do not fit: :data:`FLOAT64_COPIES`
    times the model's floating parameters and buffers at 8 bytes each, against the
    ``memory_budget`` in bytes (default: the memory the system has available,
    :func:`available_memory`); then float32, with a note giving both figures. A float64 run
    that fails falls back to float32 too; the float32 tolerance is also used where a float64
    run computes some of its values in a lower precision (a norm that casts to float32 inside,
    a table kept in float32), seen by watching every op of the first run. Each fallback leaves
    a note in the result, and ``result.dtype`` is the dtype the copies ran in."""

    def __init__(self, result: OracleResult, tolerance: float | None = None, *,
                 model: nn.Module | None = None, dtype: torch.dtype | None = None,
                 memory_budget: int | None = None) -> None:
        if dtype not in (None, torch.float64, torch.float32):
            raise ValueError(f"the oracles compare in float64 or float32, not {dtype}")
        self.result = result
        self._tolerance = tolerance
        self._lowered = False
        self._watched = False
        self.dtype = torch.float64 if dtype is None else dtype
        if dtype == torch.float32:
            result.notes.append("float32: asked by the caller")
        elif dtype is None and model is not None:
            need = FLOAT64_COPIES * 8 * sum(t.numel() for t in _floating_tensors(model))
            available = available_memory() if memory_budget is None else memory_budget
            if available is not None and need > available:
                self.dtype = torch.float32
                result.notes.append(f"float32: float64 copies need {need / 1e9:.1f} GB, "
                                    f"{available / 1e9:.1f} GB available")
        result.dtype = self.dtype

    @property
    def tolerance(self) -> float:
        if self._tolerance is not None:
            return self._tolerance
        return VALUE_TOLERANCE[torch.float32 if self._lowered else self.dtype]

    def run(self, fn: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
        """``fn()`` (which runs a copy through :meth:`forward`), again in float32 if it fails
        in float64."""
        try:
            return fn()
        except Exception as exc:
            if self.dtype != torch.float64:
                raise
            self.dtype = self.result.dtype = torch.float32
            self.result.notes.append(f"the model does not run in float64 ({type(exc).__name__}"
                                     f": {exc}): compared in float32")
            return fn()

    def forward(self, model: nn.Module, inputs: Any,
                contract: Contract | None) -> list[torch.Tensor]:
        """:func:`run_model` on ``inputs`` cast to :attr:`dtype`; the first run in float64 is
        watched for values computed in a lower precision."""
        inputs = _cast_inputs(inputs, self.dtype)
        if self._watched or self.dtype != torch.float64:
            return run_model(model, inputs, contract)
        watch = _LowerPrecision()
        with watch:
            out = run_model(model, inputs, contract)
        self._watched = True
        if watch.seen is not None:
            self._lowered = True
            self.result.notes.append(f"the model computes some values in {watch.seen[1]} in "
                                     f"float64 ({watch.seen[0]}): compared at the float32 "
                                     "tolerance")
        return out


def available_memory() -> int | None:
    """The bytes the system can give without swapping (``MemAvailable`` of /proc/meminfo,
    else psutil's figure where it is installed); ``None`` when neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


class _LowerPrecision(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees the first op whose floating result is not float64: ``(op, dtype)``."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: tuple[str, str] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.seen is None:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and (
                        t.dtype != torch.float64):
                    self.seen = (str(func), str(t.dtype).removeprefix("torch."))
                    break
        return out
