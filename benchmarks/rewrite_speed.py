"""Pattern-engine speed against ``torch.fx.subgraph_rewriter.replace_pattern``.

Graphs of 1k, 10k and 100k nodes are built directly with ``torch.fx.Graph``: a chain of
units ``g(f(x)) + 1`` where ``(f, g)`` is a pair of unary ops. Twenty pairs are registered as
patterns ``g(f(x)) -> erf(x)``; half the units use one of them (they match), the other half
use pairs that are not patterns (their anchors are candidates that fail). Every tenth unit
adds a residual connection, so values have several users.

For each size the script times

* fxsym: :class:`fxsym.passes.PatternEngine` applying all 20 patterns in one run ("rewrite"),
  then the one recompile a user needs for a runnable module, done as ``apply_patterns`` and
  ``optimize`` do it (:func:`fxsym.passes.engine.recompile`: ``gm.recompile()`` with the
  cyclic garbage collector paused). "total" is the sum; patterns are traced once per
  process, as registered patterns are, so their one-off tracing is done before timing (the
  replacement is traced on first use, inside the first timed run);
* torch.fx: ``replace_pattern`` once per pattern (it recompiles after each call),

checks that both made the same rewrites (same op sequence afterwards), and prints the
median of several repeats, the time per node and the speed-up (``replace_pattern`` over the
fxsym total). A second table splits the recompile into torch.fx's two steps — generating the
Python source (``Graph.python_code``) and compiling it (``compile``) — timed once more on
the rewritten graph. Last comes a PASS/FAIL verdict per target:

* at 10k nodes, the fxsym total is at least 30x faster than ``replace_pattern``;
* 100k nodes are rewritten (and recompiled) in at most 2 s;
* the time per node stays flat from 1k to 100k (largest / smallest us/node <= 1.5).

    python benchmarks/rewrite_speed.py [--sizes 1000 10000 100000] [--repeats 5]
        [--torch-repeats-100k 1] [--skip-torch-above NODES]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.subgraph_rewriter import replace_pattern

from fxsym.passes import PatternEngine, SubgraphPattern
from fxsym.passes.engine import recompile

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
    """Rewrite ``gm`` and recompile it; return (rewrite seconds, total seconds, rewrites)."""
    start = time.perf_counter()
    engine = PatternEngine(patterns)
    changes = engine.run(gm)
    rewrite = time.perf_counter() - start
    recompile(gm)
    return rewrite, time.perf_counter() - start, changes


def codegen_split(gm: fx.GraphModule) -> tuple[float, float]:
    """Seconds torch.fx spends generating ``gm``'s source and compiling it (GC paused, as in
    :func:`fxsym.passes.engine.recompile`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        src = gm.graph.python_code(root_module="self").src
        generated = time.perf_counter()
        compile(src, "<rewrite_speed>", "exec", dont_inherit=True)
        return generated - start, time.perf_counter() - generated
    finally:
        if enabled:
            gc.enable()


def run_torch(gm: fx.GraphModule) -> tuple[float, int]:
    start = time.perf_counter()
    changes = 0
    for fn in PATTERN_FNS:
        changes += len(replace_pattern(gm, fn, _replacement))
    return time.perf_counter() - start, changes


@dataclass
class Row:
    nodes: int
    rewrites: int
    rewrite: float
    total: float
    torch: float | None  # None: replace_pattern skipped at this size
    codegen: float
    compiled: float

    @property
    def recompile(self) -> float:
        return self.total - self.rewrite


def measure(size: int, patterns: list[SubgraphPattern], args: argparse.Namespace) -> Row:
    n_nodes = len(build_graph(size).graph.nodes)
    ours_rw, ours_total = [], []
    ours_gm: fx.GraphModule | None = None
    ours_changes = 0
    for _ in range(args.repeats):
        gm = build_graph(size)
        rw, total, ours_changes = run_fxsym(gm, patterns)
        ours_rw.append(rw)
        ours_total.append(total)
        ours_gm = gm
    assert ours_gm is not None
    codegen, compiled = codegen_split(ours_gm)
    theirs_time: float | None = None
    if args.skip_torch_above is None or n_nodes <= args.skip_torch_above:
        t_repeats = args.repeats if size < 100_000 else args.torch_repeats_100k
        theirs = []
        theirs_gm = None
        theirs_changes = 0
        for _ in range(max(1, t_repeats)):
            gm = build_graph(size)
            t, theirs_changes = run_torch(gm)
            theirs.append(t)
            theirs_gm = gm
        assert theirs_gm is not None
        if ours_changes != theirs_changes or op_sequence(ours_gm) != op_sequence(theirs_gm):
            raise SystemExit(
                f"the two rewriters disagree at {size} nodes: {ours_changes} vs {theirs_changes}"
            )
        theirs_time = statistics.median(theirs)
    return Row(
        n_nodes,
        ours_changes,
        statistics.median(ours_rw),
        statistics.median(ours_total),
        theirs_time,
        codegen,
        compiled,
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}ms"


def _us(seconds: float, nodes: int) -> str:
    return f"{seconds / nodes * 1e6:.2f}"


def print_verdict(rows: list[Row]) -> None:
    """One PASS/FAIL line per target (``not measured`` when the sizes run do not cover it)."""

    def near(size: int) -> Row | None:
        return next((r for r in rows if abs(r.nodes - size) <= size // 100), None)

    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    print("\ntargets (fxsym total = rewrite + recompile):")
    r10k = near(10_000)
    if r10k is None or r10k.torch is None:
        print("  >= 30x faster than replace_pattern at 10k nodes: not measured")
    else:
        speed, speed_rw = r10k.torch / r10k.total, r10k.torch / r10k.rewrite
        print(
            f"  >= 30x faster than replace_pattern at 10k nodes: {speed:.1f}x  {mark(speed >= 30)}"
            f"  (rewrite alone {speed_rw:.1f}x; torch.fx's recompile is "
            f"{r10k.recompile / r10k.total:.0%} of the fxsym total)"
        )
    r100k = near(100_000)
    if r100k is None:
        print("  100k nodes in <= 2 s: not measured")
    else:
        print(
            f"  100k nodes in <= 2 s: {r100k.total:.2f} s  {mark(r100k.total <= 2.0)}"
            f"  (rewrite {r100k.rewrite:.2f} s {mark(r100k.rewrite <= 2.0)}, "
            f"recompile {r100k.recompile:.2f} s)"
        )
    small, large = near(1_000), r100k
    if small is None or large is None:
        print("  flat time per node from 1k to 100k: not measured")
        return
    for label, seconds in (
        ("total", [r.total for r in rows]),
        ("rewrite", [r.rewrite for r in rows]),
    ):
        per_node = [t / r.nodes * 1e6 for t, r in zip(seconds, rows)]
        ratio = max(per_node) / min(per_node)
        listed = " / ".join(f"{v:.2f}" for v in per_node)
        print(
            f"  flat time per node from 1k to 100k ({label}): {listed} us/node, "
            f"max/min {ratio:.2f}  {mark(ratio <= 1.5)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--torch-repeats-100k", type=int, default=1,
        help="repeats of replace_pattern on graphs of >= 100k nodes (it takes minutes)",
    )
    parser.add_argument(
        "--skip-torch-above", type=int, default=None, metavar="NODES",
        help="do not run replace_pattern on graphs of more than NODES nodes (the table says "
        "'skipped'; at 100k nodes it takes about ten minutes)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)

    header = (
        f"{'nodes':>7} {'rewrites':>8} {'fxsym rewrite':>14} {'us/node':>8} "
        f"{'recompile':>10} {'us/node':>8} {'fxsym total':>12} {'us/node':>8} "
        f"{'replace_pattern':>16} {'us/node':>8} {'speed-up':>9}"
    )
    torch_note = (
        f"; replace_pattern skipped above {args.skip_torch_above} nodes"
        if args.skip_torch_above is not None
        else ""
    )
    print(
        f"20 patterns; medians of {args.repeats} repeats (replace_pattern at >= 100k nodes: "
        f"{args.torch_repeats_100k}){torch_note}"
    )
    print(header)
    print("-" * len(header))
    patterns = make_patterns()
    rows = []
    for size in args.sizes:
        r = measure(size, patterns, args)
        rows.append(r)
        theirs = (
            f"{_ms(r.torch):>16} {_us(r.torch, r.nodes):>8} {r.torch / r.total:>8.1f}x"
            if r.torch is not None
            else f"{'skipped':>16} {'-':>8} {'-':>9}"
        )
        print(
            f"{r.nodes:>7} {r.rewrites:>8} {_ms(r.rewrite):>14} {_us(r.rewrite, r.nodes):>8} "
            f"{_ms(r.recompile):>10} {_us(r.recompile, r.nodes):>8} {_ms(r.total):>12} "
            f"{_us(r.total, r.nodes):>8} {theirs}",
            flush=True,
        )
    print("\nwhere the fxsym total goes (recompile split timed once more on the rewritten graph):")
    split_header = (
        f"{'nodes':>7} {'fxsym rewrite':>14} {'torch.fx codegen':>17} {'python compile':>15} "
        f"{'rewrite share':>14}"
    )
    print(split_header)
    print("-" * len(split_header))
    for r in rows:
        print(
            f"{r.nodes:>7} {_ms(r.rewrite):>14} {_ms(r.codegen):>17} {_ms(r.compiled):>15} "
            f"{r.rewrite / r.total:>13.0%}"
        )
    print_verdict(rows)


if __name__ == "__main__":
    main()
