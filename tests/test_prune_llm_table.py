"""``benchmarks/prune_llm.py``'s table: its rows, and a verdict only beyond the spread.

The benchmark itself trains a model for minutes; what is checked here is the part that turns
its raw figures into claims (no model is trained): a fxsym row is *better* or *worse* than the
best Torch-Pruning row only when their ranges over the seeds do not overlap, and the depth cut
lands at the layer count nearest half the parameters.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any


def _bench() -> ModuleType:
    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "prune_llm.py"
    spec = importlib.util.spec_from_file_location("prune_llm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("prune_llm", module)
    spec.loader.exec_module(module)
    return module


def _result(recovered: dict[str, list[float]]) -> dict[str, Any]:
    shape = {"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
             "num_attention_heads": 2, "num_key_value_heads": 1}
    rows = {name: [{"seed": i, "params": 500, "ppl_pruned": 40.0 + i, "ppl_recovered": v,
                    "shape": shape} for i, v in enumerate(values)]
            for name, values in recovered.items()}
    return {"base": {"params": 1000, "val_ppl": 5.0}, "seeds": 3, "rows": rows}


def test_verdicts_only_beyond_the_spread() -> None:
    bench = _bench()
    result = _result({
        "fxsym width": [9.0, 9.5, 10.0],        # below every seed of the best TP row
        "fxsym depth": [11.0, 14.0, 12.0],      # overlaps it: a tie, whatever the means
        "fxsym both": [15.1, 16.0, 17.0],       # above every seed of it
        "Torch-Pruning magnitude": [10.5, 12.0, 15.0],
        "Torch-Pruning Taylor": [20.0, 21.0, 22.0],
    })
    assert bench.verdicts(result) == {
        "fxsym width": "fxsym better", "fxsym depth": "tie", "fxsym both": "fxsym worse",
        "Torch-Pruning magnitude": "(best Torch-Pruning)", "Torch-Pruning Taylor": ""}
    table = bench.render(result)
    lines = [line for line in table.splitlines() if "fxsym " in line or "Torch-Pruning " in line
             or "base (unpruned)" in line]
    assert len(lines) == 6
    assert "10.75 ± 4.25" not in table  # the spread is half the range, of the recovered column
    assert "12.50 ± 2.25" in table       # Torch-Pruning magnitude: mean 12.5, range 10.5..15


def test_depth_cut_nearest_half() -> None:
    bench = _bench()
    setup = bench.Setup()
    # the benchmark's own sizes: embedding and head weigh two layers, so 3 of 8 layers is half
    layer, rest = 101_568, 196_704
    params = rest + setup.layers * layer
    keep = bench.depth_only(setup, params, layer)
    assert keep == 3
    assert abs((rest + keep * layer) / params - 0.5) < 0.02
