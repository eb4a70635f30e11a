"""Pattern-engine speed against ``torch.fx.subgraph_rewriter.replace_pattern``.

Graphs of 1k, 10k and 100k nodes are built directly with ``torch.fx.Graph``: a chain of
units ``g(f(x)) + 1`` where ``(f, g)`` is a pair of unary ops. Twenty pairs are registered as
patterns ``g(f(x)) -> erf(x)``; half the units use one of them (they match), the other half
use pairs that are not patterns (their anchors are candidates that fail). Every tenth unit
adds a residual connection, so values have several users.

For each size the script times

* fxsym: :class:`fxsym.passes.PatternEngine` applying all 20 patterns in one run, then one
  ``recompile()`` (patterns are traced once per process, as registered patterns are, so
  their one-off tracing is done before timing; the replacement is traced on first use,
  inside the first timed run);
* torch.fx: ``replace_pattern`` once per pattern (it recompiles after each call),

checks that both made the same rewrites (same op sequence afterwards), and prints the
median of several repeats, the time per node and the speed-up.

    python benchmarks/rewrite_speed.py [--sizes 1000 10000 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.fx.subgraph_rewriter import replace_pattern

from fxsym.passes import PatternEngine, SubgraphPattern

UNARY: list[Callable[..., Any]] = [
    torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.neg,
    torch.abs,
]
PAIRS = list(itertools.permutations(UNARY, 2))  # 56 ordered pairs
rng = random.Random(0)
rng.shuffle(PAIRS)
PATTERN_PAIRS, OTHER_PAIRS = PAIRS[:20], PAIRS[20:]


def _pattern_fn(f: Callable[..., Any], g: Callable[..., Any]) -> Callable[[Any], Any]:
    def pattern(x: Any) -> Any:
        return g(f(x))

    return pattern


def _replacement(x: Any) -> Any:
    return torch.erf(x)


PATTERN_FNS = [_pattern_fn(f, g) for f, g in PATTERN_PAIRS]


def build_graph(n_nodes: int, seed: int = 0) -> fx.GraphModule:
    """A chain of ``g(f(x)) + 1`` units (3 nodes each) with residual adds, ~``n_nodes`` nodes."""
    r = random.Random(seed)
    graph = fx.Graph()
    x = graph.placeholder("x")
    current, skip = x, x
    units = 0
    while len(graph.nodes) < n_nodes - 1:
        f, g = r.choice(PATTERN_PAIRS) if r.random() < 0.5 else r.choice(OTHER_PAIRS)
        current = graph.call_function(g, (graph.call_function(f, (current,)),))
        current = graph.call_function(torch.add, (current, 1.0))
        units += 1
        if units % 10 == 0:
            current = graph.call_function(torch.add, (current, skip))
            skip = current
    graph.output(current)
    return fx.GraphModule(torch.nn.Module(), graph)


def op_sequence(gm: fx.GraphModule) -> list[str]:
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes]


def make_patterns() -> list[SubgraphPattern]:
    """The 20 patterns, compiled: registered patterns are traced once per process."""
    patterns = [SubgraphPattern(f"p{i}", fn, _replacement) for i, fn in enumerate(PATTERN_FNS)]
    for p in patterns:
        _ = p.variants
    return patterns


def run_fxsym(gm: fx.GraphModule, patterns: list[SubgraphPattern]) -> tuple[float, float, int]:
    start = time.perf_counter()
    engine = PatternEngine(patterns)
    changes = engine.run(gm)
    rewrite = time.perf_counter() - start
    gm.recompile()
    return rewrite, time.perf_counter() - start, changes


def run_torch(gm: fx.GraphModule) -> tuple[float, int]:
    start = time.perf_counter()
    changes = 0
    for fn in PATTERN_FNS:
        changes += len(replace_pattern(gm, fn, _replacement))
    return time.perf_counter() - start, changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--torch-repeats-100k", type=int, default=1,
        help="repeats of replace_pattern on graphs of >= 100k nodes (it takes minutes)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)

    header = (
        f"{'nodes':>7} {'rewrites':>8} {'fxsym rewrite':>14} {'us/node':>8} "
        f"{'+recompile':>11} {'us/node':>8} {'replace_pattern':>16} {'us/node':>8} "
        f"{'speed-up':>9}"
    )
    print(f"20 patterns; medians of {args.repeats} repeats (replace_pattern: see --help)")
    print(header)
    print("-" * len(header))
    patterns = make_patterns()
    for size in args.sizes:
        n_nodes = len(build_graph(size).graph.nodes)
        ours_rw, ours_total = [], []
        ours_gm = None
        ours_changes = 0
        for _ in range(args.repeats):
            gm = build_graph(size)
            rw, total, ours_changes = run_fxsym(gm, patterns)
            ours_rw.append(rw)
            ours_total.append(total)
            ours_gm = gm
        t_repeats = args.repeats if size < 100_000 else args.torch_repeats_100k
        theirs = []
        theirs_gm = None
        theirs_changes = 0
        for _ in range(max(1, t_repeats)):
            gm = build_graph(size)
            t, theirs_changes = run_torch(gm)
            theirs.append(t)
            theirs_gm = gm
        assert ours_gm is not None and theirs_gm is not None
        if ours_changes != theirs_changes or op_sequence(ours_gm) != op_sequence(theirs_gm):
            raise SystemExit(
                f"the two rewriters disagree at {size} nodes: {ours_changes} vs {theirs_changes}"
            )
        rw, total, th = (statistics.median(v) for v in (ours_rw, ours_total, theirs))
        print(
            f"{n_nodes:>7} {ours_changes:>8} {rw * 1e3:>12.1f}ms {rw / n_nodes * 1e6:>8.2f} "
            f"{total * 1e3:>9.1f}ms {total / n_nodes * 1e6:>8.2f} {th * 1e3:>14.1f}ms "
            f"{th / n_nodes * 1e6:>8.2f} {th / total:>8.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
