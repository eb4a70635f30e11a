"""How long the ``--target-params`` search of a checkpoint takes, as a ratio to one activation
prune of the same calibration tokens measured in the same run, and how many bytes it reads
from the checkpoint (issue 31 §4: goal at most 2x for ~25 candidates, and the checkpoint read once).

Each repeat runs, one after another and each in a subprocess of its own (time and
``ru_maxrss`` are the child's): ``uniform`` (``search=False``: one plan of widths for the
target, activation importance), ``shortlist`` (the search, only its ``--shortlist`` candidates
of lowest estimated damage scored by their loss: :mod:`fxsym.prune.shortlist`) and ``all`` (the
search scoring every candidate), all on the same ``--tokens`` calibration tokens in sequences
of ``--seq-len`` and the same ``--param-ratio``. The table gives medians over ``--repeats``;
the ratio column is the median of each repeat's ratio to that repeat's ``uniform`` (a shared
machine's load moves all three together). ``read/size`` is ``plan.extra["read"]``: the bytes
of tensor data read from the safetensors files over the bytes they hold. It is not 1: the
calibration pass reads every tensor (the activation scores and block importance need every
block before any candidate is planned), the scoring pass reads the blocks the shortlisted
candidates keep (each once for all of them), and the writer reads what the kept plan keeps,
so a search reads at most 3 times the checkpoint and one activation prune 2 times; only
holding blocks between passes (not flat memory) would save a read (``docs/pruning.md``, "What
a search reads"). SmolLM2 (``--param-ratio 0.4``, shortlist 4 of 12): 3.00 and 2.00 times,
3.21 and 2.21 before its tied embedding was kept for the head. ``winner in shortlist``
compares the ``shortlist`` run's kept candidate with the ``all`` run's, with the rank of the
``all`` run's winner by damage. ``cpu s`` is the child's processor time (user and system):
on a shared, loaded machine it moves less with the load than the wall time.

``--sources`` measures each checkout of this repository given (its three ``src`` folders first
on ``PYTHONPATH``), interleaved within each repeat, so a change is compared with the code
before it under the same load; ``--runs`` picks the runs (``uniform shortlist``: no search
scoring every candidate).

The checkpoint is ``--checkpoint DIR`` (for instance SmolLM2 converted by
``prune_real_llm.py``, real weights) or a synthetic one written as
``prune_ckpt_scale.py --family F`` writes it (``--size`` GB, random weights: the damage
ranking means nothing there, only the times and bytes do).

    python benchmarks/search_ratio.py --size 1 --family llama --repeats 3
    python benchmarks/search_ratio.py --checkpoint \\
        /tmp/fxsym-prune-real-llm/smollm2-135m-instruct --calib-text licenses --repeats 3
    python benchmarks/search_ratio.py --checkpoint DIR --runs uniform shortlist \\
        --sources /path/to/older/checkout .
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNS = ("uniform", "shortlist", "all")
SRC = ("fxsym_core/src", "fxsym_plugins_nn/src", "fxsym_plugins_hf/src")


def prune(src: str, out: str, calib: str, run: str, tokens: int, seq_len: int,
          param_ratio: float, shortlist: int, round_to: int) -> dict[str, Any]:
    """One prune of ``src`` as ``run`` says (:data:`RUNS`), in this (child) process."""
    import resource

    import torch

    import fxsym

    torch.set_num_threads(int(os.environ.get("SEARCH_RATIO_THREADS", "2")))
    texts = json.loads(Path(calib).read_text())
    how: dict[str, Any] = ({"search": False} if run == "uniform"
                           else {"search": True, "shortlist": shortlist if run == "shortlist"
                                 else None})
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = before.ru_utime + before.ru_stime
    start = time.perf_counter()
    plan = fxsym.prune_checkpoint(src, out, calibration=texts, calibration_tokens=tokens,
                                  seq_len=seq_len, param_ratio=param_ratio, round_to=round_to,
                                  **how)
    seconds = time.perf_counter() - start
    used = resource.getrusage(resource.RUSAGE_SELF)
    rows = plan.extra.get("search") or []
    return {"seconds": seconds, "peak_kb": used.ru_maxrss,
            "cpu": used.ru_utime + used.ru_stime - cpu_before,
            "read": plan.extra["read"], "candidates": len(rows),
            "scored": sum(bool(r.get("scored", True)) for r in rows),
            "rows": rows}


def child(*args: str, source: Path | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [*(str(source.resolve() / s) for s in SRC), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                          capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def calibration(kind: str) -> list[str]:
    """The calibration texts: ``stdlib`` (``argparse.py``, as ``prune_ckpt_scale.py``) or
    ``licenses`` (``prune_real_llm.py``'s seed-0 sample: licenses and ``Lib/*.py`` pieces)."""
    if kind == "licenses":
        sys.path.insert(0, str(HERE))
        from prune_real_llm import calibration_texts

        return calibration_texts(0)
    import sysconfig

    return [Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text(encoding="utf-8")]


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["layers"], row["hidden"], json.dumps(row.get("classes"), sort_keys=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--family", default="llama", help="prune_ckpt_scale.py's families")
    parser.add_argument("--size", type=float, default=1.0, help="GB of a synthetic checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--param-ratio", type=float, default=0.5)
    parser.add_argument("--round-to", type=int, default=64)
    parser.add_argument("--shortlist", type=int, default=4)
    parser.add_argument("--calib-text", choices=("stdlib", "licenses"), default="stdlib")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tmp", default="/tmp")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--sources", type=Path, nargs="+", default=None, help="checkouts of "
                        "this repository to measure, interleaved (default: the one this "
                        "script runs from)")
    args = parser.parse_args()
    if "uniform" not in args.runs:
        parser.error("--runs needs uniform (the ratios' denominator)")
    os.environ["SEARCH_RATIO_THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="fxsym-search-ratio-", dir=args.tmp))
    try:
        calib = work / "calib.json"
        calib.write_text(json.dumps(calibration(args.calib_text)))
        if args.checkpoint is None:
            sys.path.insert(0, str(HERE))
            from prune_ckpt_scale import layers_for

            src = work / "in"
            layers = layers_for(args.size, args.family)
            subprocess.run([sys.executable, str(HERE / "prune_ckpt_scale.py"), "--child",
                            "write", str(src), str(layers), args.family], check=True,
                           capture_output=True)
        else:
            src = args.checkpoint
        sources: list[Path | None] = list(args.sources) if args.sources else [None]
        figures: dict[str, dict[str, list[dict[str, Any]]]] = {
            str(s): {r: [] for r in args.runs} for s in sources}
        for repeat in range(args.repeats):
            for source in sources:
                for run in args.runs:
                    out = work / f"out-{run}"
                    got = child(str(src), str(out), str(calib), run, str(args.tokens),
                                str(args.seq_len), str(args.param_ratio), str(args.shortlist),
                                str(args.round_to), source=source)
                    shutil.rmtree(out, ignore_errors=True)
                    got["load"] = os.getloadavg()[0]
                    figures[str(source)][run].append(got)
                    print(f"repeat {repeat} {source or ''} {run}: {got['seconds']:.1f} s "
                          f"(cpu {got['cpu']:.1f} s), read "
                          f"{got['read']['bytes'] / got['read']['checkpoint']:.2f}x, "
                          f"{got['scored']}/{got['candidates']} scored, load "
                          f"{got['load']:.1f}", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for source, runs in figures.items():
        print(("" if source == "None" else f"\n{source}:\n") + render(runs, src, args))


def render(figures: dict[str, list[dict[str, Any]]], src: Path, args: Any) -> str:
    from fxsym.prune.console import render_table

    size = figures["uniform"][0]["read"]["checkpoint"]
    rows = []
    for run, got in figures.items():
        ratios = [g["seconds"] / u["seconds"] for g, u in zip(got, figures["uniform"])]
        cpu = [g["cpu"] / u["cpu"] for g, u in zip(got, figures["uniform"])]
        rows.append([run, f"{got[0]['scored']}/{got[0]['candidates']}" if got[0]["candidates"]
                     else "",
                     f"{statistics.median(g['seconds'] for g in got):.1f}",
                     f"{statistics.median(ratios):.2f}",
                     f"{statistics.median(g['cpu'] for g in got):.1f}",
                     f"{statistics.median(cpu):.2f}",
                     f"{statistics.median(g['read']['bytes'] for g in got) / 1e6:,.0f}",
                     f"{statistics.median(g['read']['bytes'] / size for g in got):.2f}",
                     f"{statistics.median(g['peak_kb'] for g in got) / 1024:.0f}"])
    table = render_table(rows, ["run", "scored", "median s", "x uniform", "cpu s",
                                "cpu x uniform", "read MB", "read/size", "peak MiB"])
    head = (f"{src} ({size / 1e6:,.0f} MB of tensors), {args.tokens} tokens, param_ratio "
            f"{args.param_ratio}, {args.repeats} repeat(s), medians\n{table}")
    if "all" not in figures or "shortlist" not in figures:
        return head
    full = figures["all"][0]["rows"]
    winner = next(r for r in full if r["kept"])
    ranked = sorted(full, key=lambda r: r["damage"])
    rank = [key(r) for r in ranked].index(key(winner)) + 1
    short = next(r for r in figures["shortlist"][0]["rows"] if r["kept"])
    return (f"{head}\nwinner of all: layers {winner['layers']} hidden {winner['hidden']} "
            f"{winner['classes']}, damage rank {rank} of {len(full)}; the shortlist kept "
            f"{'the same' if key(short) == key(winner) else 'another: ' + str(key(short))}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        a = sys.argv[2:]
        print(json.dumps(prune(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]), float(a[6]),
                               int(a[7]), int(a[8]))))
    else:
        main()
