"""The search's shortlist (issue 31 §4): candidates ranked by the damage the calibration pass
estimates (:func:`fxsym.prune.shortlist.damage`), only the best few scored by their loss.

The models are tiny checkpoints trained here for a few hundred steps on the calibration text
(random weights give the estimate nothing to read: every unit and block matters alike), a
llama and a Qwen2-MoE (a dense layer, then MoE layers with a shared expert). On each, the
shortlisted search keeps the candidate the full search (every candidate scored) keeps, and the
losses of the candidates it scores are those each gets scored alone
(:func:`fxsym.prune.checkpoint.stream_loss`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import LAYERED, TEXT, tiny_config, tokenizer

import fxsym
import fxsym.prune.checkpoint as ckpt
import fxsym.prune.checkpoint.tensors as ckpt_tensors
from fxsym.prune.persist import MANIFEST
from fxsym.prune.search import search
from fxsym.prune.shortlist import damage, shortlist


def _trained(directory: Path, model_type: str, steps: int = 100, **overrides: Any) -> Any:
    """A tiny causal LM of ``model_type`` trained ``steps`` steps on :data:`TEXT` (next-token
    loss, Adam; one thread: a tiny model's steps are many times slower on two threads of a
    loaded machine), saved with its tokenizer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(directory, model_type, steps, overrides)
    finally:
        torch.set_num_threads(threads)


def _train(directory: Path, model_type: str, steps: int, overrides: dict[str, Any]) -> Any:
    import transformers

    torch.manual_seed(0)
    config = tiny_config(model_type, **overrides)
    tok = tokenizer(config.vocab_size)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.tensor(tok(TEXT)["input_ids"])
    windows = ids[: len(ids) // 32 * 32].view(-1, 32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (8,))]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(directory, max_shard_size="200KB")
    tok.save_pretrained(directory)
    return model


def _searched(src: Path, ratio: float) -> dict[str, Any]:
    """The pieces of ``prune_checkpoint``'s search on ``src``: the meta model, its analysis,
    tensors, layout, batches, scores and block importance."""
    reader = ckpt.open_checkpoint(src)
    meta = reader.build()
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    batches = reader.calibration([TEXT], tokens=128, seq_len=32)
    sm = fxsym.analyze(meta)
    lay = fxsym.importance.layout(meta, sm)
    streamed = ckpt.stream_activations(meta, sm, tensors, batches)
    scores = streamed.scores

    def given(m: Any, s: Any) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = "activation"
    blocks = {g.name: torch.tensor(streamed.block_importance, dtype=torch.float64)
              for g in sm.depth_groups()}
    target = int(sum(p.numel() for p in meta.parameters()) * (1 - ratio))
    common = dict(target_params=target, round_to=8, importance=given, block_scores=blocks)
    return dict(meta=meta, sm=sm, tensors=tensors, lay=lay, batches=batches, common=common)


FAMILIES = {"llama": dict(num_hidden_layers=4),
            "qwen2_moe": dict(LAYERED["qwen2_moe"], num_hidden_layers=4)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(request.param) / "in"
    _trained(directory, request.param, **FAMILIES[request.param])
    return directory


@pytest.mark.parametrize("ratio", [0.35, 0.5])
def test_the_shortlist_keeps_the_full_searchs_winner(trained: Path, ratio: float) -> None:
    """The search scoring 4 candidates keeps the candidate the search scoring all of them
    keeps; its scored candidates have the losses each gets scored alone, the others none."""
    got = _searched(trained, ratio)
    meta, sm, tensors, lay, batches = (got[k] for k in ("meta", "sm", "tensors", "lay",
                                                        "batches"))

    def together(plans: Any) -> list[float]:
        return ckpt.stream_losses(meta, sm, tensors, lay, plans, batches)

    full = search(meta, sm, evaluate_all=together, shortlist=None, **got["common"])
    short = search(meta, sm, evaluate_all=together, shortlist=4, **got["common"])
    assert len(full.candidates) > 4
    assert [c.damage for c in short.candidates] == [c.damage for c in full.candidates]
    assert sum(c.scored for c in short.candidates) == 4
    assert all(c.scored for c in full.candidates)
    assert (short.best.layers, short.best.hidden, short.best.classes) == (
        full.best.layers, full.best.hidden, full.best.classes)
    assert short.plan.choices() == full.plan.choices()
    for c in short.candidates:
        if not c.scored:
            assert c.loss != c.loss  # nan: never scored
            continue
        assert c.plan is not None
        alone = ckpt.stream_loss(meta, sm, tensors, lay, c.plan, batches)
        assert c.loss == pytest.approx(alone, rel=1e-6)


def test_the_shortlist_is_the_lowest_damages() -> None:
    """``shortlist`` keeps the positions of the lowest damages, in the order given (ties by
    position); ``None`` or a size of at least the count keeps all."""
    assert shortlist([0.3, 0.1, 0.2, 0.1], 2) == [1, 3]
    assert shortlist([0.3, 0.1, 0.2], 1) == [1]
    assert shortlist([0.3, 0.1], None) == [0, 1] == shortlist([0.3, 0.1], 5)


def test_the_damage_of_dropped_blocks_and_cut_widths(tmp_path: Path) -> None:
    """``damage``, each term by hand (block importance 0.5, 0.2, 0.1): a dropped block costs
    its importance ``b``; an FFN width cut in a kept block ``b (1 - sqrt(f))**2``, ``f`` the
    kept share of its squared scores; the hidden size ``1 - f`` of each kept block's
    importance (every block reads the stream without the channels cut) plus, once, the
    stream's own turn ``1 - sqrt(f)``; the three together add, the two changes of one block
    by their squares."""
    model = _trained(tmp_path / "in", "llama", steps=1, num_hidden_layers=3)
    sm = fxsym.analyze(model)
    (depth,) = sm.depth_groups()
    ffn = [g for g in sm.groups() if g.name.endswith("mlp.gate_proj.out_features")]
    hidden = depth.stream_group
    assert hidden is not None
    scores = {g.name: torch.arange(1.0, g.size + 1) for g in sm.groups()}
    blocks = {depth.name: torch.tensor([0.5, 0.2, 0.1], dtype=torch.float64)}

    def kept(name: str, keep: list[int]) -> float:
        s = scores[name].double().square()
        return float(s[keep].sum() / s.sum())

    drop = fxsym.plan(model, sm, importance=scores, layers=[0, 2])
    assert damage(sm, drop, scores, blocks) == pytest.approx(0.2, rel=1e-12)
    first = ffn[0]
    half = first.size // 2
    f_ffn = kept(first.name, list(range(first.size - half, first.size)))
    cut = fxsym.plan(model, sm, importance=scores, sizes={first.name: half})
    assert damage(sm, cut, scores, blocks) == pytest.approx(0.5 * (1 - f_ffn ** 0.5) ** 2,
                                                            rel=1e-12)
    size = next(g.size for g in sm.groups() if g.name == hidden)
    f_h = kept(hidden, list(range(8, size)))
    narrow = fxsym.plan(model, sm, importance=scores, sizes={hidden: size - 8})
    assert damage(sm, narrow, scores, blocks) == pytest.approx(
        (0.5 + 0.2 + 0.1) * (1 - f_h) + 1 - f_h ** 0.5, rel=1e-12)
    together = fxsym.plan(model, sm, importance=scores, layers=[0, 2],
                          sizes={first.name: half, hidden: size - 8})
    assert damage(sm, together, scores, blocks) == pytest.approx(
        0.2 + 0.5 * ((1 - f_ffn ** 0.5) ** 2 + 1 - f_h) + 0.1 * (1 - f_h) + 1 - f_h ** 0.5,
        rel=1e-12)


def test_prune_checkpoint_says_which_candidates_were_scored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prune_checkpoint``'s search scores its shortlist: the rows say ``scored``, the table
    says "not scored" for the others, and ``extra["read"]`` counts the bytes read against the
    checkpoint's (calibration, shortlist and writing: at most three reads)."""
    from ckpt_helpers import checkpoint, on_reads

    from fxsym.prune.search import table

    model = checkpoint(tmp_path / "in", "llama", num_hidden_layers=4)
    target = sum(p.numel() for p in model.parameters()) // 2
    given: list[int] = []
    on_reads(monkeypatch, lambda name: None,
             lambda name, t: given.append(t.numel() * t.element_size()))
    plan = fxsym.prune_checkpoint(tmp_path / "in", tmp_path / "out", calibration=[TEXT],
                                  target_params=target, calibration_tokens=64, seq_len=24,
                                  round_to=8, shortlist=2)
    rows = plan.extra["search"]
    assert len(rows) > 2 and sum(r["scored"] for r in rows) == 2
    assert all(r["loss"] is None for r in rows if not r["scored"])
    kept = next(r for r in rows if r["kept"])
    assert kept["scored"]
    text = table(rows)
    assert text.count("not scored") == len(rows) - 2 and "damage" in text
    stored = sum(p.numel() * 4 for p in model.parameters())
    read = plan.extra["read"]
    assert read["checkpoint"] == stored
    # the tensors written whole are copied from the files by the kernel (fxsym.prune.spans), not
    # given by safetensors: counted as read all the same (the kept candidate may cut the hidden
    # size, which every tensor reads: then none is written whole)
    whole = [n for n, p in model.named_parameters()
             if tuple(plan.shapes.get(n, ())) == tuple(p.shape)]
    assert (sum(given) < read["bytes"] if whole else sum(given) <= read["bytes"])
    assert read["bytes"] <= sum(given) + stored
    assert 2 * stored < read["bytes"] <= 3 * stored
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["plan"]["extra"]["read"] == read


def test_the_calibration_pass_reads_each_tensor_once(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed calibration of several batches reads every tensor once: the embedding and
    the head, which every batch calls in turn, are kept until the next block opens (before:
    read once per batch)."""
    from collections import Counter

    from ckpt_helpers import checkpoint, on_reads

    checkpoint(tmp_path / "in", "llama", num_hidden_layers=3)
    reader = ckpt.open_checkpoint(tmp_path / "in")
    meta = reader.build()
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    batches = reader.calibration([TEXT], tokens=96, seq_len=24)
    assert len(batches) > 1
    sm = fxsym.analyze(meta)
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    ckpt.stream_activations(meta, sm, tensors, batches)
    assert set(reads) == set(tensors.files)
    assert max(reads.values()) == 1, reads.most_common(3)


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_a_shortlist_that_is_not_a_count_is_refused(tmp_path: Path, size: Any) -> None:
    """``shortlist`` is a number of candidates (1 or more) or ``None``: anything else is a
    PlanError before the checkpoint is read."""
    from ckpt_helpers import checkpoint

    checkpoint(tmp_path / "in", "llama", num_hidden_layers=2)
    with pytest.raises(fxsym.PlanError, match="shortlist"):
        fxsym.prune_checkpoint(tmp_path / "in", tmp_path / "out", calibration=[TEXT],
                               param_ratio=0.5, calibration_tokens=64, seq_len=24,
                               shortlist=size)
    assert not (tmp_path / "out").exists()
