"""Real-shrink coverage of the models people prune today (issue 21): MoE LLMs, diffusion
UNets, YOLO, modern timm models.

    python benchmarks/shrink_coverage.py [--models mixtral,yolov8n,timm:eva02_tiny_patch14_224]
                                         [--norm-groups keep]

For each model (random weights, built from a config or yaml, nothing downloaded) the script
analyzes it, takes a perturbed copy (:class:`fxsym.oracles.PerturbedCopy`, whose tensors are
freed when it is done with), halves every searchable group there (the sizes
:func:`fxsym.oracles.check_shrink` chooses: half the units of each group, at least one, so
the groups of a same-size class keep equal sizes) and compares the weight shapes of every
projection before and after. A projection is an ``nn.Conv*d`` (transposed too), an
``nn.Linear`` (subclasses too), a transformers ``Conv1D`` and every 3-D parameter with more
than one entry along dim 0 that is not a conv weight (the fused experts of transformers 5,
``[experts, out, in]``, ``[experts, in, out]`` where the module says ``is_transposed``).

Columns:

* ``shrunk``: the share of projections whose output dim (``weight.shape[0]``, ``shape[1]``
  of a ``Conv1D`` or a transposed conv, the per-expert output dim of a fused expert tensor)
  is smaller after the resize. This is measured on the weights, not read from the groups: a
  module whose symbol is a group member but whose weight keeps its shape does not count.
  The task head (whose output is the model's output) always counts against it.
* ``experts``: fused expert tensors whose expert dim (dim 0) shrank, of all of them.
* ``runs``: the shrunk copy runs and gives outputs of the original shapes.
* ``permutation``: :func:`fxsym.oracles.check_permutation` (float64 where the model runs in
  it).

timm models are built with a 10-class head: some configs default to none (eva02's masked
image modelling config has ``num_classes=0``), and then the pooled embedding is the output,
whose size the output contract keeps, pinning the residual stream; a pruning user keeps a
classifier.

``ok``/``fail``/``not checked`` (no group to check); a model that fails to build or analyze
is a row saying why. ``--norm-groups keep`` analyzes with ``fxsym.analyze(...,
norm_groups="keep")`` (group norms keep ``num_groups``; :mod:`fxsym_plugins_nn.options`).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import table, track

import fxsym
from fxsym.oracles import OracleResult, PerturbedCopy, check_permutation, perturbed, run_model

_DECODER: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
    num_experts_per_tok=2)

#: model_type -> the tiny config's fields (4 experts, 2 per token)
HF: dict[str, dict[str, Any]] = {
    "mixtral": dict(_DECODER, num_local_experts=4),
    "qwen2_moe": dict(_DECODER, num_experts=4, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "qwen3_moe": dict(_DECODER, num_experts=4, moe_intermediate_size=32, head_dim=16),
    "olmoe": dict(_DECODER, num_experts=4),
    "granitemoe": dict(_DECODER, num_local_experts=4),
    "phimoe": dict(_DECODER, num_local_experts=4),
    "deepseek_v3": dict(_DECODER, num_key_value_heads=4, n_routed_experts=4, n_group=2,
                        topk_group=1, n_shared_experts=1, moe_intermediate_size=32,
                        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
    "deepseek_v2": dict(_DECODER, num_key_value_heads=4, n_routed_experts=4, n_group=2,
                        topk_group=1, topk_method="group_limited_greedy", n_shared_experts=1,
                        moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16),
    "jamba": dict(_DECODER, num_experts=4, attn_layer_period=2, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1,
                  mamba_d_state=8),
}

#: timm name -> the smallest input size the model takes
TIMM: dict[str, int] = {
    "eva02_tiny_patch14_224": 112, "mixer_b16_224": 112, "ghostnetv2_100": 64,
    "res2net50_14w_8s": 64, "sequencer2d_s": 112}

#: the models of issue 21's table, in its order
DEFAULT = [*HF, "unet2d", "unet2d_cond", "yolov8n", "yolo11n", *(f"timm:{n}" for n in TIMM)]

Built = tuple[nn.Module, Any]


def _hf(model_type: str) -> Built:
    import transformers

    from fxsym.tracer import resolve_example_inputs

    cfg = transformers.AutoConfig.for_model(model_type, **HF[model_type])
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model, resolve_example_inputs(model, None)


def _unet2d() -> Built:
    from diffusers import UNet2DModel

    model = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(32, 64), norm_num_groups=8,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    return model.eval(), (torch.randn(1, 3, 32, 32), torch.tensor([10]))


def _unet2d_cond() -> Built:
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4,
                                 layers_per_block=1, block_out_channels=(32, 64),
                                 norm_num_groups=8, cross_attention_dim=32, attention_head_dim=8,
                                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    return model.eval(), (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 7, 32))


def _yolo(name: str) -> Built:
    from ultralytics import YOLO

    model = YOLO(f"{name}.yaml").model
    assert isinstance(model, nn.Module)
    return model.eval(), (torch.randn(1, 3, 64, 64),)


def _timm(name: str) -> Built:
    import timm

    size = TIMM.get(name, 224)
    kwargs: dict[str, Any] = {"num_classes": 10}
    if size != 224 and not name.startswith(("ghost", "res")):  # the CNNs take any size as is
        kwargs["img_size"] = size
    model = timm.create_model(name, pretrained=False, **kwargs)
    return model.eval(), (torch.randn(1, 3, size, size),)


def build(spec: str) -> Built:
    """The model ``spec`` names, in eval mode, and its example inputs."""
    torch.manual_seed(0)
    builders: dict[str, Callable[[], Built]] = {"unet2d": _unet2d, "unet2d_cond": _unet2d_cond}
    if spec in HF:
        return _hf(spec)
    if spec in builders:
        return builders[spec]()
    if spec.startswith("yolo"):
        return _yolo(spec)
    if spec.startswith("timm:"):
        return _timm(spec.removeprefix("timm:"))
    raise ValueError(f"unknown model {spec!r} (a transformers model type of {list(HF)}, "
                     "unet2d, unet2d_cond, yolov8n, yolo11n or timm:<name>)")


def _is_conv1d_transformers(mod: nn.Module) -> bool:
    return any(c.__name__ == "Conv1D" and c.__module__.startswith("transformers.")
               for c in type(mod).__mro__)


def projections(model: nn.Module) -> dict[str, tuple[int, int | None]]:
    """Every projection's output size and, for a fused expert tensor, its number of experts,
    by qualified name (``module.param`` for a fused expert tensor)."""
    out: dict[str, tuple[int, int | None]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.conv._ConvTransposeNd):
            out[name] = (mod.weight.shape[1] * mod.groups, None)
        elif isinstance(mod, (nn.modules.conv._ConvNd, nn.Linear)):
            out[name] = (mod.weight.shape[0], None)
        elif _is_conv1d_transformers(mod):
            out[name] = (int(mod.weight.shape[1]), None)
        else:
            dim = 2 if getattr(mod, "is_transposed", False) is True else 1
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() == 3 and p.shape[0] > 1:
                    out[f"{name}.{pname}"] = (p.shape[dim], p.shape[0])
    return out


def _word(result: OracleResult) -> str:
    return {"ok": "ok", "failed": "fail"}.get(result.status, "not checked")


def report(spec: str, seeds: tuple[int, ...], norm_groups: str = "follow") -> list[Any]:
    """One row: model, groups, shrunk, experts, runs, permutation, analyze s, note."""
    try:
        model, inputs = build(spec)
    except Exception as exc:
        return [spec, "", "", "", "", "", "", f"build failed: {type(exc).__name__}: {exc}"]
    start = time.perf_counter()
    try:
        sm = fxsym.analyze(model, example_inputs=inputs, norm_groups=norm_groups)
    except Exception as exc:
        return [spec, "", "", "", "", "", "", f"analyze failed: {type(exc).__name__}: {exc}"]
    elapsed = f"{time.perf_counter() - start:.1f}"
    groups = sm.groups()
    notes: list[str] = []
    # the reference runs on a copy of its own: a run can derive state from the weights that
    # resize refuses to leave stale, and the copy to shrink is resized as freshly built (with
    # its SymMap: a reference cycle, so its tensors are freed when it is done with)
    reference = [t.shape for t in run_model(perturbed(model, seeds[0]), inputs,
                                            sm.output_contract)]
    chosen = {g.name: max(1, g.size // 2) for g in groups}  # as check_shrink chooses
    shrunk, experts, runs = "", "", "not checked"
    with PerturbedCopy(model, seeds[0], sm, None) as clone:
        before = projections(clone.model)
        try:
            clone.resize(chosen)
        except Exception as exc:
            runs = "fail"
            notes.append(f"resize failed: {type(exc).__name__}: {exc}")
        else:
            after = projections(clone.model)
            fused = [k for k, (_, e) in before.items() if e is not None]
            count = sum(after[k][0] < before[k][0] for k in before)
            shrunk = f"{count / len(before):.2f} ({count}/{len(before)})" if before else "-"
            if fused:
                fewer = sum(after[k][1] < before[k][1] for k in fused)  # type: ignore[operator]
                experts = f"{fewer}/{len(fused)}"
            if groups:
                try:
                    out = run_model(clone.model, inputs, sm.output_contract)
                    same = [t.shape for t in out] == reference
                    runs = "ok" if same else "fail"
                    if not same:
                        notes.append("output shapes changed")
                except Exception as exc:
                    runs = "fail"
                    notes.append(f"shrunk model fails: {type(exc).__name__}: {exc}")
    try:
        perm = check_permutation(model, sm, inputs, seeds=seeds)
    except Exception as exc:
        notes.append(f"permutation oracle raised {type(exc).__name__}: {exc}")
        permutation = "fail"
    else:
        permutation = _word(perm)
        if perm.status == "failed":
            notes.append(f"permutation: {perm}")
    return [spec, len(groups), shrunk, experts, runs, permutation, elapsed, "; ".join(notes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", help=f"comma-separated (default: {','.join(DEFAULT)})")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds of the permutation oracle (default 1)")
    parser.add_argument("--norm-groups", choices=("follow", "keep"), default="follow",
                        help="how group norms change (fxsym.analyze's norm_groups)")
    parser.add_argument("--note-width", type=int, default=100,
                        help="characters of the note column shown")
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")  # the libraries' deprecation and config notes
    fxsym.load_plugins()
    names = args.models.split(",") if args.models else DEFAULT
    rows = []
    for spec in track(names, description="shrink coverage"):
        try:
            row = report(spec, tuple(range(args.seeds)), args.norm_groups)
        except Exception as exc:  # a model that breaks the report is a row, not the end of it
            row = [spec, "", "", "", "", "", "", f"error: {type(exc).__name__}: {exc}"]
        row[-1] = str(row[-1])[:args.note_width]
        rows.append(row)
    print(table(rows, ["model", "groups", "shrunk", "experts", "runs", "permutation",
                       "analyze s", "note"]))


if __name__ == "__main__":
    main()
