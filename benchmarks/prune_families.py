"""Every decoder family x every way of pruning a checkpoint: ok, refused (and why) or failed.

For each family (tiny random-weight checkpoints written by ``save_pretrained`` with a
tokenizer trained here: the layer-differing families of ``tests/hf/ckpt_helpers.LAYERED`` and
the plain ones of :data:`PLAIN`, 4 layers of hidden 64), ``fxsym.prune_checkpoint`` is asked
each of :data:`OPERATIONS`; the output is then loaded the way its ``config.json`` says (plain
``from_pretrained``, or ``trust_remote_code`` for fxsym's own non-uniform type) and asked to
``generate`` three tokens. A cell is

* ``ok`` (a plain checkpoint) or ``ok (fxsym_pruned: why)`` (the config could not describe
  the pruned model; the plan's note says why), when it loads and generates finite logits;
* ``refused: <message>``, a typed fxsym error raised on purpose before OUT was touched;
* ``FAILED: <error>``, anything else (a crash, a checkpoint that does not load or generate).

    python benchmarks/prune_families.py [--families llama,gemma2] [--ops depth-count,ffn]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hf"))

from ckpt_helpers import LAYERED, TEXT, checkpoint

#: plain families (no layer differs), with the overrides a tiny config needs
PLAIN: dict[str, dict[str, Any]] = {
    "llama": {}, "qwen2": {}, "qwen3": dict(head_dim=16), "phi3": dict(pad_token_id=0),
    "gemma": dict(head_dim=16), "cohere": {}, "olmo2": {}, "granite": {},
    "glm": dict(pad_token_id=0), "glm4": dict(pad_token_id=0), "stablelm": {}, "starcoder2": {},
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt2": dict(n_embd=64, n_layer=4, n_head=4, n_positions=128),
}

#: name -> prune_checkpoint's arguments
OPERATIONS: dict[str, dict[str, Any]] = {
    "depth-count": dict(calibration=[TEXT], layers=2),
    "depth-positions": dict(layers=[0, 2], importance="l2"),
    "search": dict(calibration=[TEXT], param_ratio=0.3, search=True),
    "ffn": dict(sizes={"ffn": 96}, importance="l2"),
    "expert-ffn": dict(sizes={"expert_ffn": 16}, importance="l2"),
    "hidden": dict(sizes={"hidden": 32}, importance="l2"),
    "heads": dict(sizes={"heads": 2}, importance="l2"),
    "experts": dict(sizes={"experts": 2}, importance="l2"),
    "global": dict(ratio=0.3, scope="global", importance="l2"),
}


def _short(text: str, n: int = 150) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def _generate(out: Path) -> str:
    """Load ``out`` as its config says and generate 3 tokens; how it loaded."""
    import torch
    import transformers

    kind = json.loads((out / "config.json").read_text()).get("model_type")
    remote = kind == "fxsym_pruned"
    model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all(), "non-finite logits"
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    return "fxsym_pruned" if remote else "plain"


def cell(src: Path, out: Path, op: dict[str, Any]) -> str:
    import fxsym
    from fxsym.errors import FxsymError

    try:
        calibrated = dict(calibration_tokens=64, seq_len=24) if "calibration" in op else {}
        plan = fxsym.prune_checkpoint(src, out, **calibrated, **op)
    except FxsymError as exc:
        return f"refused: {_short(str(exc))}"
    except Exception as exc:
        return f"FAILED (prune): {type(exc).__name__}: {_short(str(exc))}"
    try:
        how = _generate(out)
    except Exception as exc:
        return f"FAILED (load/generate): {type(exc).__name__}: {_short(str(exc))}"
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if how == "plain":
        return "ok"
    notes = "; ".join(plan.extra.get("notes", ())) if plan.extra else ""
    return f"ok ({how}{': ' + _short(notes, 100) if notes else ''})"


def main() -> None:
    import torch

    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    families = {**PLAIN, **LAYERED}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(sorted(families)))
    parser.add_argument("--ops", default=",".join(OPERATIONS))
    args = parser.parse_args()
    ops = args.ops.split(",")
    print("| family | " + " | ".join(ops) + " |", flush=True)
    print("|---" * (len(ops) + 1) + "|", flush=True)
    for family in args.families.split(","):
        work = Path(tempfile.mkdtemp(prefix="fxsym-families-"))
        start = time.perf_counter()
        try:
            src = work / "in"
            try:
                checkpoint(src, family, num_hidden_layers=4, **families[family])
            except Exception as exc:
                print(f"| {family} | does not build: {_short(str(exc))} |", flush=True)
                continue
            cells = [cell(src, work / "out", OPERATIONS[op]) for op in ops]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"| {family} | " + " | ".join(cells) + " |", flush=True)
        print(f"{family}: {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
