"""How long ``fxsym.plan`` takes, against Torch-Pruning's prune step measured in the same run.

Rows 1-3: torchvision resnet50, vit_b_16 and mobilenet_v3_large (random weights, 224x224,
``torch.set_num_threads(2)``). fxsym: ``fxsym.plan(model, sm, ratio=0.3)`` (global, L2), on a
SymMap analyzed beforehand and not yet planned (the layout is computed per SymMap, so its cost
is in the time). Torch-Pruning 1.6.1: ``MetaPruner(model, example, importance=
MagnitudeImportance(p=2), pruning_ratio=0.3, ignored_layers=[classifier]).step()`` on a fresh
copy of the model, the pruner (its dependency graph) built beforehand. Median of ``--repeat``
runs each, wall-clock and CPU time of the process (``time.process_time``: on a shared machine
the wall-clock includes waiting for the cores).

Rows 4-5: Llama-3-shaped models built on the meta device (no weight allocated), planned with
scores given: ``fxsym.plan(model, sm, ratio=0.5, scope="uniform", importance=scores)``. 8B
shape with 2 layers, and the 70B shape (hidden 8192, intermediate 28672, 80 layers, 64 heads,
8 key/value heads, vocabulary 128256). Each runs in a process of its own, which reports the
plan's time and its peak resident memory (``VmHWM``: building and analyzing included).

    python benchmarks/plan_speed.py [--repeat 3] [--skip-70b]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import torch

LLAMA = {
    "8b-2": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                 num_attention_heads=32, num_key_value_heads=8),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8),
}


def peak_rss_gb() -> float:
    """The process' peak resident memory: ``VmHWM`` where ``/proc`` has it (``ru_maxrss`` is
    inherited across ``exec`` on Linux: a child would report its parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def llm_row(shape: str) -> dict[str, Any]:
    """Build, analyze and plan one Llama shape on the meta device (in this process)."""
    import transformers

    import fxsym

    fxsym.load_plugins()
    cfg = transformers.AutoConfig.for_model(
        "llama", vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=False, **LLAMA[shape])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    start = time.perf_counter()
    sm = fxsym.analyze(model)
    analyzed = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    scores = {g.name: torch.rand(g.size, generator=gen) for g in sm.groups()}
    planned = _clocks()
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", importance=scores)
    wall, cpu = _since(planned)
    return {"analyze": analyzed - start, "plan": wall, "plan_cpu": cpu, "peak_gb": peak_rss_gb(),
            "params": f"{plan.params_before / 1e9:.2f}B -> {plan.params_after / 1e9:.2f}B"}


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clocks()
    return wall - start[0], cpu - start[1]


def _median(times: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def cnn_rows(names: list[str], repeat: int) -> list[list[str]]:
    import torch_pruning as tp
    import torchvision

    import fxsym

    fxsym.load_plugins()
    rows = []
    for name in names:
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None).eval()
        example = torch.randn(1, 3, 224, 224)
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for _ in range(repeat):
            sm = fxsym.analyze(model, example_inputs=(example,))
            start = _clocks()
            plan = fxsym.plan(model, sm, ratio=0.3)
            ours.append(_since(start))
            other = copy.deepcopy(model)
            classifier = [m for m in other.modules() if isinstance(m, torch.nn.Linear)][-1]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pruner = tp.pruner.MetaPruner(
                    other, example, importance=tp.importance.MagnitudeImportance(p=2),
                    pruning_ratio=0.3, ignored_layers=[classifier])
                start = _clocks()
                pruner.step()
                theirs.append(_since(start))
        after = sum(p.numel() for p in other.parameters())
        (a, a_cpu), (b, b_cpu) = _median(ours), _median(theirs)
        rows.append([name, f"{a:.3f} / {a_cpu:.3f}", f"{b:.3f} / {b_cpu:.3f}",
                     f"{a / b:.2f} / {a_cpu / b_cpu:.2f}",
                     f"{plan.params_after / plan.params_before:.2f} / "
                     f"{after / plan.params_before:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--llm", choices=sorted(LLAMA), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.llm:  # one LLM row, in its own process (its peak memory is its own)
        print(json.dumps(llm_row(args.llm)))
        return

    sys.path.insert(0, "benchmarks")
    from _common import table

    rows = cnn_rows(["resnet50", "vit_b_16", "mobilenet_v3_large"], args.repeat)
    print(table(rows, ["model", "fxsym plan s (wall / cpu)", "TP step s (wall / cpu)",
                       "fxsym / TP (wall / cpu)", "params left (fxsym / TP)"]))
    llm = []
    for shape in [s for s in LLAMA if not (args.skip_70b and s == "70b")]:
        out = subprocess.run([sys.executable, __file__, "--llm", shape], capture_output=True,
                             text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        llm.append([f"llama {shape} (meta)", f"{r['analyze']:.1f}",
                    f"{r['plan']:.1f} / {r['plan_cpu']:.1f}", f"{r['peak_gb']:.2f}", r["params"]])
    print()
    print(table(llm, ["model", "analyze (s)", "plan s (wall / cpu)", "peak RSS (GB)",
                      "parameters"]))


if __name__ == "__main__":
    main()
