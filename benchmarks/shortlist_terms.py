"""Why the search's shortlist keeps or misses the full search's winner (issue 31 §4): each
candidate's damage (:func:`fxsym.prune.shortlist.damage`) split into its three terms, beside
its loss, and the winner's rank under the estimate and under the variants tried.

For each ``--fractions`` share of the non-embedding parameters removed, the candidates come
from one ``fxsym.prune_checkpoint(..., shortlist=None)`` run on ``--checkpoint`` (every
candidate scored by its loss, the rows of ``plan.extra["search"]``), or from ``--rows`` files
such a run wrote earlier (``{"rows": [...]}`` or the rows themselves, one file per fraction,
in order). The calibration pass is then made once, in this process, on the same tokens, and
every candidate is planned again as the search plans it (its damage must equal the row's: the
script refuses otherwise). Terms of a candidate keeping blocks ``K``, ``b`` the blocks'
influence, ``f`` the share of the squared importance a cut keeps:

* ``depth``: the influence of the blocks dropped, ``sum b``;
* ``width``: ``sum over K of b (1 - sqrt(f_block))**2``;
* ``hidden``: ``(|K| + 1) (1 - sqrt(f_hidden))``, the stream read by every block kept and the
  output.

The variants: ``b-reads`` (each read of the stream weighted by its block's influence:
``(1 + sum over K of b) (1 - sqrt(f_hidden))``), ``linear`` (a width term ``b (1 - f)``) and
``abs`` (``b-reads`` on shares of ``|score|``, not its square).

    python benchmarks/shortlist_terms.py --checkpoint DIR --fractions 0.5 0.625
    python benchmarks/shortlist_terms.py --checkpoint DIR --fractions 0.625 --rows r625.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r["layers"], r.get("hidden"), json.dumps(r.get("classes") or {}, sort_keys=True))


def share(scores: torch.Tensor, keep: Sequence[int], power: int) -> float:
    e = scores.double().abs() ** power
    total = float(e.sum())
    return float(e[list(keep)].sum()) / total if total > 0 else 1.0


def terms(sm: Any, plan: Any, scores: Mapping[str, torch.Tensor], influence: Sequence[float],
          power: int) -> tuple[float, dict[int, float], float, set[int]]:
    """The influence of the blocks dropped, the share kept in each block kept, the share kept
    of the groups outside the blocks, the blocks kept (one depth group: a decoder's)."""
    depth = sm.depth_groups()[0]
    homes = {b: i for i, b in enumerate(depth.blocks)}
    kept = set(range(depth.size))
    for d in plan.depth:
        kept = set(d.keep)
    groups = {g.name: g for g in sm.groups()}
    in_block: dict[int, float] = {}
    stream = 1.0
    for choice in plan.groups:
        g = groups.get(choice.name)
        if choice.keep is None or g is None or g.name not in scores:
            continue
        f = share(scores[g.name], choice.keep, power)
        blocks = {next((homes[p] for p in homes if q == p or q.startswith(p + ".")), None)
                  for q, _ in g.members}
        if len(blocks) == 1 and None not in blocks:
            i = blocks.pop()
            assert i is not None
            in_block[i] = in_block.get(i, 1.0) * f
        else:
            stream *= f
    dropped = sum(b for i, b in enumerate(influence) if i not in kept)
    return dropped, in_block, stream, kept


def width(f: float) -> float:
    return (1 - math.sqrt(f)) ** 2


def damages(sm: Any, plan: Any, scores: Mapping[str, torch.Tensor],
            influence: Sequence[float]) -> dict[str, float]:
    """The three terms, the estimate (their sum) and the variants, of one candidate."""
    dropped, in_block, stream, kept = terms(sm, plan, scores, influence, 2)
    out = {"depth": dropped,
           "width": sum(influence[i] * width(in_block.get(i, 1.0)) for i in kept),
           "hidden": (len(kept) + 1) * (1 - math.sqrt(stream))}
    out["estimate"] = out["depth"] + out["width"] + out["hidden"]
    out["b-reads"] = out["depth"] + out["width"] + (1 + sum(influence[i] for i in kept)) * (
        1 - math.sqrt(stream))
    out["linear"] = out["depth"] + out["hidden"] + sum(
        influence[i] * (1 - in_block.get(i, 1.0)) for i in kept)
    dropped, in_block, stream, kept = terms(sm, plan, scores, influence, 1)
    out["abs"] = dropped + sum(influence[i] * width(in_block.get(i, 1.0)) for i in kept) + (
        1 + sum(influence[i] for i in kept)) * (1 - math.sqrt(stream))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.625])
    parser.add_argument("--rows", type=Path, nargs="*", default=[])
    parser.add_argument("--seed", type=int, default=0,
                        help="prune_real_llm.py's calibration sample")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from prune_real_llm import calibration_texts, embedding_params

    import fxsym
    import fxsym.prune.checkpoint as ckpt
    import fxsym.prune.checkpoint.tensors as ckpt_tensors
    from fxsym.prune.search import search

    texts = calibration_texts(args.seed)
    reader = ckpt.open_checkpoint(args.checkpoint)
    meta = reader.build()
    total = sum(p.numel() for p in meta.parameters())
    embedding = embedding_params(meta)
    targets = [total - round(f * (total - embedding)) for f in args.fractions]
    rows: list[list[dict[str, Any]]] = []
    for i, target in enumerate(targets):
        if i < len(args.rows):
            data = json.loads(args.rows[i].read_text())
            rows.append(data["rows"] if isinstance(data, dict) else data)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            plan = fxsym.prune_checkpoint(args.checkpoint, Path(tmp, "out"), calibration=texts,
                                          calibration_tokens=args.tokens, seq_len=args.seq_len,
                                          target_params=target, shortlist=None)
        rows.append(plan.extra["search"])
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    batches = reader.calibration(texts, tokens=args.tokens, seq_len=args.seq_len)
    sm = fxsym.analyze(meta)
    streamed = ckpt.stream_activations(meta, sm, tensors, batches)
    scores = streamed.scores
    influence = [float(b) for b in streamed.block_importance]

    def given(m: Any, s: Any) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = "activation"
    blocks = {g.name: torch.tensor(influence, dtype=torch.float64) for g in sm.depth_groups()}
    names = ("estimate", "b-reads", "linear", "abs")
    for fraction, target, scored in zip(args.fractions, targets, rows):
        found = search(meta, sm, target_params=target, importance=given, block_scores=blocks,
                       evaluate_all=lambda plans: [0.0] * len(plans), round_to=1,
                       shortlist=None, describable=True)
        loss = {key(r): r for r in scored}
        table = []
        for c, r in zip(found.candidates, found.rows()):
            row = loss.get(key(r))
            if row is None or not math.isclose(row["damage"], c.damage, rel_tol=1e-6):
                raise SystemExit(f"{fraction}: candidate {key(r)} is not the scored run's "
                                 "(another checkpoint, sample or code?)")
            d = damages(sm, c.plan, scores, influence)
            assert math.isclose(d["estimate"], c.damage, rel_tol=1e-9, abs_tol=1e-12), (d, c)
            table.append((r, row["loss"], d))
        best = min(range(len(table)), key=lambda i: table[i][1])
        print(f"\n{fraction:g} of the non-embedding parameters removed (target {target:,}), "
              f"{len(table)} candidates; the winner's rank by each:")
        for name in names:
            order = sorted(range(len(table)), key=lambda i: (table[i][2][name], i))
            print(f"  {name}: {order.index(best) + 1}")
        for r, value, d in sorted(table, key=lambda t: t[2]["estimate"]):
            print(f"  L{r['layers']} {r.get('hidden')} {r.get('classes')}: loss {value:.3f} "
                  + " ".join(f"{k} {d[k]:.3f}" for k in ("depth", "width", "hidden",
                                                          *names)))


if __name__ == "__main__":
    main()
