"""What the cached-path trial (:mod:`fxsym_plugins_hf.cachepath`) could not check is said.

The trial tells a size the forward refuses on every path (no finding about the cache) from one
the cache disagrees with by running the forward without a cache on the resized meta copy. Where
that forward could not run on meta tensors (an ``.item()``, a branch on data; for every
transformers decoder without an attention mask, the mask builders' packed-sequence check),
every size looked refused: the trial found no size to try, returned nothing, and the analysis
said nothing while ``generate`` of the model resized failed. Where the forward refused each
trial size of one group, that group was left out of the trial without a word.

Now the forward without a cache runs the mask builders as the trace does (meta tensors count
as traced), so a decoder's cached path is checked; where that forward still cannot run, a
``<model>`` ``untraced-path`` line gives its error, a group is pinned only where each of its
trial sizes fails the cached path, and a size that fails where another runs, or sizes failing
only together, are said, not pinned. Groups failing only together where the forward without a
cache fails too are said, not pinned (no finding about the cache). The models: RWKV, whose
recurrent state is sized by the hidden size (its hidden size and attention widths break
``generate``), and Llama, each with forward pre-hooks (part of the program: the trace runs
them) that check the input's values without a cache or a width with one; PhiMoE, whose
rotary embedding reads the config at every forward (the trial inside ``analyze`` must see the
fields the forward reads, as the resize after it does).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
import transformers
from test_moe import build_moe

import fxsym

IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]])
NEW_TOKENS = 4


def _rwkv(seed: int = 0) -> Any:
    """A 2-layer RWKV (hidden 64, attention 64, FFN 128), random weights, float64."""
    config = transformers.AutoConfig.for_model(
        "rwkv", hidden_size=64, num_hidden_layers=2, vocab_size=100, attention_hidden_size=64,
        intermediate_size=128, context_length=32)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def _llama() -> Any:
    """A 2-layer Llama (hidden 64, 4 heads in 2 key/value heads, FFN 128), float64."""
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
        max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def _checks_tokens(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Without a cache, refuse a token id out of the vocabulary (``.item()``: no meta tensor
    can answer)."""
    if not kwargs.get("use_cache", True):
        if int(kwargs["input_ids"].max().item()) >= module.config.vocab_size:
            raise ValueError("a token id out of the vocabulary")


def _checks_width(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Without a cache, refuse the first block's feed-forward at any width but 128."""
    if not kwargs.get("use_cache", True):
        if module.rwkv.blocks[0].feed_forward.key.out_features != 128:
            raise ValueError("the first feed-forward is 128 wide")


def _caches_narrow_widths_only(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """With a cache, refuse the second block's feed-forward between 41 and 127 units."""
    if kwargs.get("use_cache"):
        if 40 < module.rwkv.blocks[1].feed_forward.key.out_features < 128:
            raise ValueError("the cache holds the second feed-forward whole or narrow")


def _caches_the_first_mlp_whole(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """With a cache, refuse the first layer's MLP at any width but 128."""
    if kwargs.get("use_cache"):
        if module.model.layers[0].mlp.gate_proj.out_features != 128:
            raise ValueError("the cache holds the first MLP 128 wide")


def _lines(sm: Any) -> dict[str, str]:
    return {e.where: e.message for e in sm.trace_report.entries if e.kind == "untraced-path"}


def _generate(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(IDS, attention_mask=torch.ones_like(IDS),
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
    return out  # type: ignore[no-any-return]


def _greedy(model: Any) -> torch.Tensor:
    ids = IDS
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids


def _each_group_halved_generates_as_greedy_decoding(model: Any, sm: Any) -> None:
    for group in sm.groups():
        resized, resized_map = copy.deepcopy((model, sm))
        fxsym.resize(resized, resized_map, {group.name: group.size // 2})
        assert torch.equal(_generate(resized), _greedy(resized)), group.name


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_forward_that_cannot_run_on_meta_is_said_and_the_cache_still_tried() -> None:
    """The uncached forward calls ``.item()`` (no meta tensor can run it): a ``<model>`` line
    gives its error; the groups are those of the same model without the hook (the hidden size
    and attention widths pinned, each failing the cached path at every trial size, their
    reasons saying the size may break every path); each group left halved generates as greedy
    decoding. Analyzed again, the remembered answer is the same; the hook removed, the trials
    run again and the line is gone.

    Before: no line, and the hidden size and attention widths stayed groups (halved hidden
    size: ``generate`` fails with 'Attempting to broadcast')."""
    plain = fxsym.analyze(_rwkv(), example_inputs={"input_ids": IDS})
    model = _rwkv()
    hook = model.register_forward_pre_hook(_checks_tokens, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    lines = _lines(sm)
    assert "<model>" in lines, lines
    assert "Tensor.item() cannot be called on meta tensors" in lines["<model>"]
    assert "does not run on meta tensors" in lines["<model>"]
    assert ({(g.name, g.size) for g in sm.groups()}
            == {(g.name, g.size) for g in plain.groups()})
    pinned = {w for w in lines if w != "<model>"}
    assert pinned == {w for w in _lines(plain) if w != "<model>"} and pinned
    assert "rwkv.embeddings.embedding_dim" in pinned
    assert all("to each of" in lines[w] and "may break every path" in lines[w]
               and "cached forward" in lines[w] for w in pinned)
    assert not {g.name for g in sm.groups()} & pinned
    _each_group_halved_generates_as_greedy_decoding(model, sm)
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == lines
    hook.remove()
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == _lines(plain)


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_size_that_fails_where_another_runs_is_said_not_pinned() -> None:
    """The uncached forward cannot run on meta tensors (``.item()``) and the cached path
    refuses the second feed-forward between 41 and 127 units: its first trial size fails and
    a narrower one runs. The trial cannot tell whether that size breaks every path, so the
    group stays (not pinned) and the ``<model>`` line names it, the size that failed and the
    one that ran; resized to that one, the model generates as greedy decoding.

    Before: no line, nothing said of that group."""
    model = _rwkv()
    model.register_forward_pre_hook(_checks_tokens, with_kwargs=True)
    model.register_forward_pre_hook(_caches_narrow_widths_only, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    line = _lines(sm).get("<model>", "")
    second = "rwkv.blocks.1.feed_forward.key.out_features"
    said = re.search(rf"{re.escape(second)} resized from 128 to (\d+) units fails .*"
                     r"the cache holds the second feed-forward.*, not at (\d+): not pinned",
                     line)
    assert said, line
    failed, ran = int(said[1]), int(said[2])
    assert 40 < failed < 128 and ran <= 40
    assert {g.name: g.size for g in sm.groups()}[second] == 128
    resized, resized_map = copy.deepcopy((model, sm))
    fxsym.resize(resized, resized_map, {second: ran})
    assert torch.equal(_generate(resized), _greedy(resized))


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_group_whose_every_trial_size_the_forward_refuses_is_named() -> None:
    """The uncached forward refuses the first feed-forward at any width but 128, so the trial
    cannot try that group: a ``<model>`` line names it as not tried, and it stays a group of
    its size (nothing shows its cache breaks); the hidden size and attention widths are pinned
    as without the hook; the second feed-forward halved generates as greedy decoding.

    Before: no ``<model>`` line, nothing said of the first feed-forward."""
    plain = fxsym.analyze(_rwkv(), example_inputs={"input_ids": IDS})
    model = _rwkv()
    model.register_forward_pre_hook(_checks_width, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    lines = _lines(sm)
    first = "rwkv.blocks.0.feed_forward.key.out_features"
    assert "<model>" in lines, lines
    assert f"was not tried for {first}:" in lines["<model>"]
    assert "blocks.1" not in lines["<model>"]
    assert {w for w in lines if w != "<model>"} == {w for w in _lines(plain) if w != "<model>"}
    groups = {g.name: g.size for g in sm.groups()}
    assert groups == {g.name: g.size for g in plain.groups()} and groups[first] == 128
    second = "rwkv.blocks.1.feed_forward.key.out_features"
    resized, resized_map = copy.deepcopy((model, sm))
    fxsym.resize(resized, resized_map, {second: 64})
    assert torch.equal(_generate(resized), _greedy(resized))


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_decoders_cache_is_checked_though_it_builds_its_mask_from_positions() -> None:
    """Llama without an attention mask builds its mask through transformers' mask builders,
    whose packed-sequence check asks a value (``.all()``) no meta tensor holds: the forward
    without a cache now runs them as the trace does, so the trial runs. A cached path refusing
    the first MLP resized pins that group, its reason the refusal, with no ``<model>`` line;
    every other group halved generates as greedy decoding; the hook removed, nothing is
    pinned.

    Before: the forward without a cache failed on the meta copy at every size, the trial
    returned nothing, the first MLP stayed a group and ``generate`` of it resized failed."""
    model = _llama()
    hook = model.register_forward_pre_hook(_caches_the_first_mlp_whole, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    lines = _lines(sm)
    first = "model.layers.0.mlp.gate_proj.out_features"
    assert set(lines) == {first}, lines
    assert "the cache holds the first MLP 128 wide" in lines[first]
    assert first not in {g.name for g in sm.groups()}
    assert "model.layers.1.mlp.gate_proj.out_features" in {g.name for g in sm.groups()}
    _each_group_halved_generates_as_greedy_decoding(model, sm)
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == lines
    hook.remove()
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == {}


def _refuses_both_narrow(module: Any, args: Any) -> None:
    """On every path, refuse the first layer with both its MLP and its queries narrowed."""
    if module.mlp.gate_proj.out_features < 128 and module.self_attn.q_proj.out_features < 64:
        raise ValueError("the first MLP and the first queries cannot both shrink")


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_groups_failing_together_on_both_paths_are_said_not_pinned() -> None:
    """A Llama whose first layer refuses, with a cache or without, its MLP and its queries
    narrowed together (each alone runs both paths): no finding about the cache, so nothing is
    pinned and the ``<model>`` line says so, with both errors; the groups that fail together
    stay groups and each group halved generates as greedy decoding. ccd4259's trial pinned
    every group of such a model."""
    model = _llama()
    model.model.layers[0].register_forward_pre_hook(_refuses_both_narrow)
    sm = fxsym.analyze(model)
    lines = _lines(sm)
    assert set(lines) == {"<model>"}, lines
    line = lines["<model>"]
    assert "and so does the forward without a cache on the meta copy" in line
    assert "cannot both shrink" in line and "nothing is pinned" in line
    names = {g.name for g in sm.groups()}
    assert {"model.layers.0.mlp.gate_proj.out_features", "model.layers.0.self_attn.heads",
            "model.layers.0.self_attn.queries_per_kv"} <= names, names
    _each_group_halved_generates_as_greedy_decoding(model, sm)


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_the_trial_sees_the_config_fields_the_forward_reads() -> None:
    """PhiMoE's rotary embedding recomputes its frequencies from ``config.hidden_size //
    config.num_attention_heads`` at every forward, so the resize leaves those fields as they
    are; the trial's resize inside ``analyze`` must know it too (the analysis' graph is on the
    SymMap the hooks get). Before, it wrote them on the meta copy, the head dim it gave the
    rotary embedding no longer matched the queries', and a ``<model>`` line reported a joint
    failure the resized model does not have. The real model resized as the trial does (every
    group to about half) generates as greedy decoding."""
    model = build_moe("phimoe")  # float32: the grouped-mm experts kernel takes no float64
    ids = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]] * 2)
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    assert _lines(sm) == {}
    groups = {g.name: g.size for g in sm.groups()}
    assert len(groups) >= 8
    resized, resized_map = copy.deepcopy((model, sm))
    fxsym.resize(resized, resized_map, {name: max(1, n // 2) for name, n in groups.items()})
    assert torch.equal(_generate(resized), _greedy(resized))
