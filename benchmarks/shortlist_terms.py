"""Whether the search's shortlist holds the full search's winner (issue 31 §4): each
candidate's damage (:func:`fxsym.prune.shortlist.damage`) split into its terms beside its
loss, and the winner's rank under the estimate, the estimate before it and the variants tried.

A run is a share of the non-embedding parameters removed (``--fractions``) and a calibration
sample of ``prune_real_llm.py`` (``--seeds``, one per fraction, or one for all). Its candidates
come from one ``fxsym.prune_checkpoint(..., shortlist=None)`` run on ``--checkpoint`` (every
candidate scored by its loss, the rows of ``plan.extra["search"]``), or from ``--rows`` files
such a run wrote earlier (``{"rows": [...]}`` or the rows themselves, one file per run, in
order). The calibration pass is then made once per sample, in this process, on the same tokens,
and every candidate is planned again as the search plans it (the row's damage must equal its
estimate, or the previous estimate for rows written before it: the script refuses otherwise).
Terms of a candidate keeping blocks ``K``, ``b`` the blocks' influence, ``f`` the share of the
squared importance a cut keeps (in a block: of its groups; ``f_h`` of the groups outside the
blocks, the hidden size):

* ``depth``: the influence of the blocks dropped, ``sum b``;
* ``width``: ``sum over K of b (1 - sqrt(f_block))**2``;
* ``reads``: ``sum over K of b (1 - f_h)``, each kept block reading the stream without the
  channels cut;
* ``output``: ``1 - sqrt(f_h)``, the stream's own turn, once.

``estimate`` is their sum (:func:`fxsym.prune.shortlist.damage`). ``previous``, the estimate
before (efb309f): ``depth + width + (|K| + 1) (1 - sqrt(f_h))``. The variants the last session
tried on the searches that showed the miss: ``b-reads`` (``depth + width + (1 + sum over K of
b) (1 - sqrt(f_h))``), ``linear`` (``previous`` with a width term ``b (1 - f)``) and ``abs``
(``b-reads`` on shares of ``|score|``, not its square).

The summary gives, per run, the winner's rank under ``previous`` and ``estimate``, the loss of
the best of the ``--shortlist`` candidates each ranks first minus the winner's (0: the shortlist
holds the winner) and how far above the lowest estimate the winner's lies.

    python benchmarks/shortlist_terms.py --checkpoint DIR --fractions 0.3 0.4 --seeds 2
    python benchmarks/shortlist_terms.py --checkpoint DIR --fractions 0.55 --seeds 3 --rows r.json
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
NAMES = ("estimate", "previous", "b-reads", "linear", "abs")


def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r["layers"], r.get("hidden"), json.dumps(r.get("classes") or {}, sort_keys=True))


def share(scores: torch.Tensor, keep: Sequence[int], power: int) -> float:
    e = scores.double().abs() ** power
    total = float(e.sum())
    return float(e[list(keep)].sum()) / total if total > 0 else 1.0


def terms(sm: Any, plan: Any, scores: Mapping[str, torch.Tensor], power: int
          ) -> tuple[dict[int, float], float, set[int]]:
    """The share kept in each block kept, the share kept of the groups outside the blocks,
    the blocks kept (one depth group: a decoder's)."""
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
    return in_block, stream, kept


def width(f: float) -> float:
    return (1 - math.sqrt(f)) ** 2


def damages(sm: Any, plan: Any, scores: Mapping[str, torch.Tensor],
            influence: Sequence[float]) -> dict[str, float]:
    """The terms, the estimate (their sum), the previous estimate and the variants, of one
    candidate."""
    in_block, stream, kept = terms(sm, plan, scores, 2)
    b_kept = sum(influence[i] for i in kept)
    out = {"depth": sum(b for i, b in enumerate(influence) if i not in kept),
           "width": sum(influence[i] * width(in_block.get(i, 1.0)) for i in kept),
           "reads": b_kept * (1 - stream),
           "output": 1 - math.sqrt(stream)}
    out["estimate"] = out["depth"] + out["width"] + out["reads"] + out["output"]
    out["previous"] = out["depth"] + out["width"] + (len(kept) + 1) * (1 - math.sqrt(stream))
    out["b-reads"] = out["depth"] + out["width"] + (1 + b_kept) * (1 - math.sqrt(stream))
    out["linear"] = out["previous"] - out["width"] + sum(
        influence[i] * (1 - in_block.get(i, 1.0)) for i in kept)
    in_block, stream, kept = terms(sm, plan, scores, 1)
    out["abs"] = out["depth"] + sum(influence[i] * width(in_block.get(i, 1.0)) for i in kept) + (
        1 + b_kept) * (1 - math.sqrt(stream))
    return out


def label(r: Mapping[str, Any]) -> str:
    classes = " ".join(f"{k}{v}" for k, v in sorted((r.get("classes") or {}).items()))
    return f"L{r['layers']} h{r.get('hidden')} {classes}".strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.625])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="prune_real_llm.py's calibration sample of each fraction (one: all)")
    parser.add_argument("--rows", type=Path, nargs="*", default=[])
    parser.add_argument("--shortlist", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quiet", action="store_true", help="the summary only")
    args = parser.parse_args()
    seeds = args.seeds * len(args.fractions) if len(args.seeds) == 1 else args.seeds
    if len(seeds) != len(args.fractions):
        parser.error("give one seed, or one per fraction")
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from prune_real_llm import calibration_texts, embedding_params

    import fxsym
    import fxsym.prune.checkpoint as ckpt
    import fxsym.prune.checkpoint.tensors as ckpt_tensors
    from fxsym.prune.search import search

    reader = ckpt.open_checkpoint(args.checkpoint)
    meta = reader.build()
    total = sum(p.numel() for p in meta.parameters())
    embedding = embedding_params(meta)
    runs = [(f, s, total - round(f * (total - embedding))) for f, s in zip(args.fractions, seeds)]
    rows: list[list[dict[str, Any]]] = []
    for i, (_, seed, target) in enumerate(runs):
        if i < len(args.rows):
            data = json.loads(args.rows[i].read_text())
            rows.append(data["rows"] if isinstance(data, dict) else data)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            plan = fxsym.prune_checkpoint(args.checkpoint, Path(tmp, "out"),
                                          calibration=calibration_texts(seed),
                                          calibration_tokens=args.tokens, seq_len=args.seq_len,
                                          target_params=target, shortlist=None)
        rows.append(plan.extra["search"])
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    sm = fxsym.analyze(meta)
    calibrated: dict[int, tuple[dict[str, torch.Tensor], list[float]]] = {}
    summary = []
    for (fraction, seed, target), scored in zip(runs, rows):
        if seed not in calibrated:
            batches = reader.calibration(calibration_texts(seed), tokens=args.tokens,
                                         seq_len=args.seq_len)
            streamed = ckpt.stream_activations(meta, sm, tensors, batches)
            calibrated[seed] = (streamed.scores, [float(b) for b in streamed.block_importance])
        scores, influence = calibrated[seed]

        def given(m: Any, s: Any, scores: dict[str, torch.Tensor] = scores
                  ) -> dict[str, torch.Tensor]:
            return scores

        given.__name__ = "activation"
        blocks = {g.name: torch.tensor(influence, dtype=torch.float64) for g in sm.depth_groups()}
        found = search(meta, sm, target_params=target, importance=given, block_scores=blocks,
                       evaluate_all=lambda plans: [0.0] * len(plans), round_to=1,
                       shortlist=None, describable=True)
        loss = {key(r): r for r in scored}
        table = []
        for c, r in zip(found.candidates, found.rows()):
            row = loss.get(key(r))
            d = damages(sm, c.plan, scores, influence)
            assert math.isclose(d["estimate"], c.damage, rel_tol=1e-9, abs_tol=1e-12), (d, c)
            if row is None or not any(math.isclose(row["damage"], d[n], rel_tol=1e-6)
                                      for n in ("estimate", "previous")):
                raise SystemExit(f"{fraction} seed {seed}: candidate {key(r)} is not the scored "
                                 "run's (another checkpoint, sample or code?)")
            table.append((r, row["loss"], d))
        best = min(range(len(table)), key=lambda i: table[i][1])
        ranks, gaps = {}, {}
        for name in NAMES:
            order = sorted(range(len(table)), key=lambda i: (table[i][2][name], i))
            ranks[name] = order.index(best) + 1
            gaps[name] = min(table[i][1] for i in order[:args.shortlist]) - table[best][1]
        lowest = min(t[2]["estimate"] for t in table)
        summary.append((fraction, seed, len(table), label(table[best][0]), table[best][1],
                        ranks, gaps, table[best][2]["estimate"] - lowest))
        if args.quiet:
            continue
        print(f"\n{fraction:g} of the non-embedding parameters removed (target {target:,}), "
              f"seed {seed}, {len(table)} candidates; the winner's rank by each: "
              + ", ".join(f"{n} {ranks[n]}" for n in NAMES))
        for r, value, d in sorted(table, key=lambda t: t[2]["estimate"]):
            print(f"  {label(r)}: loss {value:.3f} "
                  + " ".join(f"{k} {d[k]:.3f}" for k in ("depth", "width", "reads", "output",
                                                          *NAMES)))
    k = args.shortlist
    print(f"\n| removed | seed | candidates | winner (loss) | rank previous / estimate | "
          f"loss gap, shortlist of {k}: previous / estimate | winner above the lowest estimate "
          f"| {' / '.join(NAMES[2:])} |")
    print("|---|---|---|---|---|---|---|---|")
    for fraction, seed, n, won, value, ranks, gaps, above in summary:
        print(f"| {fraction:.1%} | {seed} | {n} | {won} ({value:.2f}) | {ranks['previous']} / "
              f"**{ranks['estimate']}** | {gaps['previous']:.2f} / {gaps['estimate']:.2f} | "
              f"{above:.3f} | {' / '.join(str(ranks[n]) for n in NAMES[2:])} |")


if __name__ == "__main__":
    main()
