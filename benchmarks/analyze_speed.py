"""fxsym.analyze time over plain torch.fx.symbolic_trace time, per torchvision model.

    python benchmarks/analyze_speed.py [--models resnet50,densenet121] [--repeat 5]

Both are measured in the same run, on the same model and a 224x224 input (299 for
Inception), as medians of ``--repeat`` runs after one warm-up, the two runs alternating (a
trace, an analysis, a trace, ...) so that a burst of load on a shared machine falls on both.
The ratio is of wall-clock medians (the headline figure); the CPU-time ratio (medians of
``time.process_time``, which another process's load barely moves) is printed beside it.
Target: median ratio <= 1.7 over the zoo, no model above 3.5. Torch-Pruning's dependency
graph and ModelOpt's ``analyze_symbols`` are timed too when installed (medians of 3 runs after
one warm-up); both run the model, so their times grow with the input size, while fxsym
computes shapes on the meta device.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import input_size, median_time, table, track, zoo_names

import fxsym


def _torch_pruning(model: torch.nn.Module, x: torch.Tensor) -> str:
    if importlib.util.find_spec("torch_pruning") is None:
        return "-"
    import torch_pruning as tp

    return _timed(lambda: tp.DependencyGraph().build_dependency(model, example_inputs=x))


def _modelopt(model: torch.nn.Module, x: torch.Tensor) -> str:
    if importlib.util.find_spec("modelopt") is None:
        return "-"
    from modelopt.torch.trace import analyze_symbols  # type: ignore[import-not-found]

    return _timed(lambda: analyze_symbols(model, (x,)))


def _timed(fn: Any) -> str:
    """Another tool's median time over 3 runs after a warm-up, in ms, or why it failed."""
    try:
        fn()
        return f"{median_time(fn, 3) * 1000:.0f}"
    except Exception as exc:
        return f"failed ({type(exc).__name__})"


def alternating(first: Any, second: Any, repeat: int) -> tuple[float, float, float, float]:
    """Medians of ``repeat`` runs of each of two functions run in turn: wall-clock seconds of
    ``first`` and ``second``, then CPU seconds of each."""
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for i, fn in enumerate((first, second)):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    m = statistics.median
    return m(wall[0]), m(wall[1]), m(cpu[0]), m(cpu[1])


def measure(name: str, repeat: int) -> tuple[list[str], float, float]:
    import torchvision

    model = torchvision.models.get_model(name, weights=None).eval()
    size = max(input_size(name), 224)  # the size models are used at: the other tools run them
    x = torch.randn(1, 3, size, size)
    fxsym.analyze(model, example_inputs=(x,))  # warm-up
    t_fx, t_ours, c_fx, c_ours = alternating(
        lambda: torch.fx.symbolic_trace(model),
        lambda: fxsym.analyze(model, example_inputs=(x,)), repeat)
    tp_time, mo_time = _torch_pruning(model, x), _modelopt(model, x)
    row = [name, f"{t_fx * 1000:.1f}", f"{t_ours * 1000:.1f}", f"{t_ours / t_fx:.2f}",
           f"{c_ours / c_fx:.2f}", tp_time, mo_time]
    return row, t_ours / t_fx, c_ours / c_fx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated torchvision names (default: all)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    fxsym.load_plugins()
    names = args.models.split(",") if args.models else zoo_names()
    rows, ratios, cpu_ratios = [], [], []
    for name in track(names, description="analyze speed"):
        row, ratio, cpu_ratio = measure(name, args.repeat)
        rows.append(row)
        ratios.append(ratio)
        cpu_ratios.append(cpu_ratio)
    print(table(rows, ["model", "symbolic_trace ms", "analyze ms", "ratio", "cpu ratio",
                       "torch-pruning ms", "modelopt ms"]))
    print(f"\nmodels: {len(ratios)}  median ratio: {statistics.median(ratios):.2f}  "
          f"max ratio: {max(ratios):.2f} ({names[ratios.index(max(ratios))]})  "
          f"cpu: median {statistics.median(cpu_ratios):.2f}, max {max(cpu_ratios):.2f}")


if __name__ == "__main__":
    main()
