"""Import time of fxsym and its plugins on top of ``import torch``.

    python benchmarks/import_time.py [--repeat 7] [--top 15]

Every measurement runs in a fresh interpreter (``python -c``) that times its own imports with
``time.perf_counter``; each figure is the median of ``--repeat`` runs (the runs of the
different scenarios are interleaved, after one unrecorded warm-up round):

* (a) ``import torch``
* (b) ``import torch; import fxsym``
* (c) ``import torch; import fxsym; fxsym.load_plugins()`` with whatever distributions are
  installed (fxsym_core, fxsym_plugins_nn, fxsym_plugins_hf)
* (d) ``import transformers`` alone and on top of ``import torch``, and whether (c) left
  ``transformers`` in ``sys.modules``
* (e) (c) with ``transformers`` made unimportable: the hf plugin fails at its
  ``import transformers`` and is disabled, so this is roughly what (c) would cost if nothing
  imported ``transformers`` before it is needed (minus the hf plugin's own modules)

fxsym's cost on top of torch is (c) - (a). The runs of (c) also time their own steps after
``import torch``; that paired figure is judged too, since on a busy machine the spread of
``import torch`` alone is larger than the target. Target: (c) - (a) under 50 ms (the pass
pipeline and the Hugging Face plugin import ``transformers`` only when needed).

With ``--top N`` (default 15) one more run of (c) under ``python -X importtime`` lists the N
slowest top-level imports made after ``import torch`` and the N packages whose modules (all
depths) spent the most time importing after ``import torch`` (``-X importtime`` inflates
times).

Bytecode: an installed package has its ``.pyc`` files, but a checkout run with
``PYTHONDONTWRITEBYTECODE=1`` compiles every fxsym module from source at each import (about
50 ms of the total). So by default the subprocesses write and read their bytecode under a
temporary ``PYTHONPYCACHEPREFIX`` (filled by the warm-up round; the tree is not touched).
``--as-is`` keeps the caller's environment instead.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import table

TARGET_MS = 50.0

_PRELUDE = "import json, sys, time\nt0 = time.perf_counter()\n"
_EPILOGUE = "print(json.dumps(out))\n"

# Each snippet fills ``out`` with the seconds of its steps (and a few facts).
SCENARIOS: dict[str, str] = {
    "torch": """
import torch
out = {"total": time.perf_counter() - t0}
""",
    "torch+fxsym": """
import torch
t1 = time.perf_counter()
import fxsym
t2 = time.perf_counter()
out = {"total": t2 - t0, "after_torch": t2 - t1}
""",
    "torch+fxsym+plugins": """
import torch
t1 = time.perf_counter()
import fxsym
t2 = time.perf_counter()
pm = fxsym.load_plugins()
t3 = time.perf_counter()
out = {"total": t3 - t0, "after_torch": t3 - t1, "fxsym": t2 - t1, "load_plugins": t3 - t2,
       "transformers_loaded": "transformers" in sys.modules,
       "plugins": sorted(n for n, p in pm.list_name_plugin() if p is not None),
       "failed": [str(getattr(f, "name", f)) for f in getattr(pm, "failed", ())]}
""",
    "no-transformers": """
import warnings
warnings.simplefilter("ignore")  # the hf plugin's failure
sys.modules["transformers"] = None  # ``import transformers`` raises ImportError
import torch
t1 = time.perf_counter()
import fxsym
pm = fxsym.load_plugins()
t2 = time.perf_counter()
out = {"total": t2 - t0, "after_torch": t2 - t1,
       "plugins": sorted(n for n, p in pm.list_name_plugin() if p is not None)}
""",
    "transformers": """
import transformers
out = {"total": time.perf_counter() - t0, "torch_loaded": "torch" in sys.modules}
""",
    "torch+transformers": """
import torch
t1 = time.perf_counter()
import transformers
t2 = time.perf_counter()
out = {"total": t2 - t0, "after_torch": t2 - t1}
""",
}

LABELS = {
    "torch": "(a) import torch",
    "torch+fxsym": "(b) import torch; import fxsym",
    "torch+fxsym+plugins": "(c) (b); fxsym.load_plugins()",
    "no-transformers": "(e) (c) with transformers unimportable",
    "transformers": "(d) import transformers",
    "torch+transformers": "(d) import torch; import transformers",
}


ENV: dict[str, str] | None = None  # None: the caller's environment


def run(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True,
                          text=True, check=False, env=ENV)
    if proc.returncode != 0:
        raise SystemExit(f"subprocess failed:\n{code}\n{proc.stderr}")
    return proc


def measure_once(name: str) -> dict[str, Any]:
    proc = run(_PRELUDE + SCENARIOS[name] + _EPILOGUE)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def top_imports(n: int) -> tuple[list[list[str]], list[list[str]]]:
    """After ``import torch``, from ``-X importtime``: the ``n`` slowest top-level imports,
    and the ``n`` packages whose modules took the most time of their own."""
    code = "import torch\nimport fxsym\nfxsym.load_plugins()\n"
    lines = run(code, "-X", "importtime").stderr.splitlines()
    entries = []
    for line in lines:
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumul_us, name = line[len("import time:"):].split("|")
        entries.append((int(self_us), int(cumul_us), name))
    # everything after the line that closes the top-level ``torch`` import
    start = next(i for i, e in enumerate(entries) if e[2].strip() == "torch"
                 and e[2].startswith(" ") and not e[2].startswith("  "))
    after = entries[start + 1:]
    top = [e for e in after if e[2].startswith(" ") and not e[2].startswith("  ")]
    top.sort(key=lambda e: e[1], reverse=True)
    packages: dict[str, list[int]] = collections.defaultdict(list)
    for self_us, _, name in after:
        packages[name.strip().split(".")[0]].append(self_us)
    by_package = sorted(packages.items(), key=lambda kv: sum(kv[1]), reverse=True)
    return ([[e[2].strip(), f"{e[1] / 1000:.1f}", f"{e[0] / 1000:.1f}"] for e in top[:n]],
            [[p, f"{sum(v) / 1000:.1f}", len(v)] for p, v in by_package[:n]])


def print_table(title: str, rows: list[list[Any]], header: list[str]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"\n{title}\n{table(rows, header)}")
        return
    console = Console(width=max(100, Console().width))
    console.print(f"\n{title}")
    t = Table()
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(str(c) for c in row))
    console.print(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--top", type=int, default=15,
                        help="list the N slowest imports after torch (0: skip)")
    parser.add_argument("--as-is", action="store_true",
                        help="keep the environment's bytecode settings (see above)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fxsym-pyc-") as pyc:
        if not args.as_is:
            global ENV
            ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            ENV["PYTHONPYCACHEPREFIX"] = pyc
        if args.as_is:
            print("bytecode: the caller's environment (PYTHONDONTWRITEBYTECODE="
                  f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r})")
        else:
            print("bytecode: cached under a temporary PYTHONPYCACHEPREFIX (as for an install)")
        measure(args)


def measure(args: argparse.Namespace) -> None:
    names = list(SCENARIOS)
    for name in names:  # warm-up: bytecode caches and the page cache
        measure_once(name)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(args.repeat):
        print(f"[{i + 1}/{args.repeat}]", file=sys.stderr, flush=True)
        for name in names:
            results[name].append(measure_once(name))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name]) * 1000

    def spread(name: str, key: str) -> str:
        vals = [r[key] * 1000 for r in results[name]]
        return f"{min(vals):.0f}-{max(vals):.0f}"

    rows = []
    for name in names:
        after = f"{med(name, 'after_torch'):.1f}" if "after_torch" in results[name][0] else "-"
        rows.append([LABELS[name], f"{med(name, 'total'):.1f}", spread(name, "total"), after])
    print_table(f"Import time, median of {args.repeat} fresh interpreters (ms)", rows,
                ["scenario", "total", "min-max", "after import torch"])

    c = results["torch+fxsym+plugins"]
    cost = med("torch+fxsym+plugins", "total") - med("torch", "total")
    paired = med("torch+fxsym+plugins", "after_torch")
    loaded = sum(r["transformers_loaded"] for r in c)
    print(f"\nplugins loaded: {', '.join(c[0]['plugins']) or '-'}"
          + (f"  (failed: {', '.join(c[0]['failed'])})" if c[0]["failed"] else ""))
    print(f"in (c): import fxsym {med('torch+fxsym+plugins', 'fxsym'):.1f} ms, "
          f"load_plugins() {med('torch+fxsym+plugins', 'load_plugins'):.1f} ms; "
          f"transformers in sys.modules afterwards: {'yes' if loaded else 'no'}"
          f" ({loaded}/{len(c)} runs)")
    print(f"(e) plugins loaded: {', '.join(results['no-transformers'][0]['plugins']) or '-'}; "
          f"after import torch: {med('no-transformers', 'after_torch'):.1f} ms")
    print(f"import transformers alone: {med('transformers', 'total'):.1f} ms "
          f"(imports torch: {'yes' if results['transformers'][0]['torch_loaded'] else 'no'}), "
          f"on top of torch: {med('torch+transformers', 'after_torch'):.1f} ms")
    def verdict(ms: float) -> str:
        return "PASS" if ms < TARGET_MS else "FAIL"

    print(f"fxsym on top of torch, (c) - (a): {cost:.1f} ms {verdict(cost)}; paired, timed "
          f"inside (c): {paired:.1f} ms {verdict(paired)} (target < {TARGET_MS:.0f} ms; the "
          "paired figure is the steadier one when import torch alone varies a lot)")

    if args.top:
        top, packages = top_imports(args.top)
        print_table("Slowest top-level imports after torch in (c), -X importtime (ms)",
                    top, ["module", "cumulative", "self"])
        print_table("Packages imported after torch in (c), own time, -X importtime (ms)",
                    packages, ["package", "self", "modules"])


if __name__ == "__main__":
    main()
