"""What pruning an ultralytics YOLO with fxsym buys on a CPU: parameters, MACs and latency.

    python benchmarks/prune_yolo.py [--models yolov8n,yolo11n] [--param-ratio 0.5]
                                    [--imgsz 640] [--runs 20] [--threads 2]

For each model (built from its yaml, random weights, nothing downloaded) the script analyzes
it at a small input (64x64: the groups do not depend on the input size) with the decoded
predictions as its output contract (``outputs=[0]``: what ultralytics' predictor reads; the
feature maps ``Detect`` also returns may change size), plans with
:func:`fxsym.plan` to ``--param-ratio`` of its parameters (global scope, L2 importance,
channels rounded to multiples of 8), applies the plan, and measures the unpruned model and the
pruned one in the same run, each in eval mode with its convolutions and batch norms fused as
ultralytics' predictor fuses them (``model.fuse()``, on a copy):

* ``params``: parameters of the model as pruned (before fusing);
* ``GMACs``: multiply-accumulates of convolutions and matrix products at ``--imgsz``,
  counted by ``torch.utils.flop_counter`` (half its flop count), decode head included;
* ``latency ms``: median wall time of ``--runs`` forward passes at batch 1 and ``--imgsz``
  (after 3 warm-up runs) under ``torch.inference_mode`` with ``torch.set_num_threads``
  ``--threads``, the two models taking turns run by run; ``speedup`` is the unpruned
  model's median over the pruned one's;
* ``CPU ms``: the same runs' median CPU time of the process (all threads), which other
  processes on a busy machine disturb less than wall time; ``CPU speedup`` likewise.

The pruned model is also checked to give outputs of the unpruned model's shapes. The weights
are random, so the table says nothing about accuracy; it says what the pruned architecture
costs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import table

import fxsym

DEFAULT = ["yolov8n", "yolo11n"]


def gmacs(model: nn.Module, x: torch.Tensor) -> float:
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model(x)
    return counter.get_total_flops() / 2 / 1e9


def fused(model: nn.Module) -> Any:
    """A copy of ``model`` in eval mode, fused as ultralytics' predictor fuses it."""
    clone: Any = copy.deepcopy(model).eval()
    return clone.fuse(verbose=False)


def latencies(models: list[Any], x: torch.Tensor, runs: int) -> list[tuple[float, float]]:
    """Median wall and CPU time (ms) of a forward of each model; the models take turns, run
    by run, so that what else the machine does weighs on each alike."""
    wall: list[list[float]] = [[] for _ in models]
    cpu: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for model in models:
            for _ in range(3):
                model(x)
        for _ in range(runs):
            for i, model in enumerate(models):
                start, start_cpu = time.perf_counter(), time.process_time()
                model(x)
                wall[i].append(time.perf_counter() - start)
                cpu[i].append(time.process_time() - start_cpu)
    return [(statistics.median(w) * 1e3, statistics.median(c) * 1e3) for w, c in zip(wall, cpu)]


def prune(name: str, ratio: float) -> tuple[nn.Module, nn.Module, int]:
    """The unpruned model, a copy pruned to ``ratio`` of its parameters, and the number of
    groups the analysis found."""
    from ultralytics import YOLO  # type: ignore[attr-defined]

    torch.manual_seed(0)
    model: Any = YOLO(f"{name}.yaml").model
    model.eval()
    pruned = copy.deepcopy(model)
    sm = fxsym.analyze(pruned, example_inputs=(torch.randn(1, 3, 64, 64),), outputs=[0])
    params = sum(p.numel() for p in pruned.parameters())
    plan = fxsym.plan(pruned, sm, target_params=int(ratio * params), round_to=8)
    plan.apply(pruned, sm)
    return model, pruned, len(sm.groups())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", help=f"comma-separated (default: {','.join(DEFAULT)})")
    parser.add_argument("--param-ratio", type=float, default=0.5,
                        help="parameters to keep, a fraction of the unpruned model's")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # the libraries' deprecation notes
    fxsym.load_plugins()
    x = torch.randn(1, 3, args.imgsz, args.imgsz)
    rows: list[list[Any]] = []
    for name in args.models.split(",") if args.models else DEFAULT:
        model, pruned, groups = prune(name, args.param_ratio)
        with torch.inference_mode():
            shapes = [tuple(t.shape) for t in (model(x)[0], pruned(x)[0])]
        assert shapes[0] == shapes[1], shapes
        models = [fused(model), fused(pruned)]
        timed = latencies(models, x, args.runs)
        for label, m, src, (ms, cpu) in zip(("unpruned", "pruned"), models, (model, pruned),
                                             timed):
            params = sum(p.numel() for p in src.parameters())
            rows.append([name, label, f"{params:,}", f"{gmacs(m, x):.2f}", f"{ms:.1f}",
                         f"{timed[0][0] / ms:.2f}x", f"{cpu:.1f}", f"{timed[0][1] / cpu:.2f}x",
                         groups if label == "pruned" else ""])
    print(f"imgsz {args.imgsz}, batch 1, {args.threads} threads, median of {args.runs} runs, "
          f"kept {args.param_ratio:.0%} of the parameters (fxsym.plan target_params)")
    print(table(rows, ["model", "", "params", "GMACs", "latency ms", "speedup", "CPU ms",
                       "CPU speedup", "groups"]))


if __name__ == "__main__":
    main()
