"""A GGUF file → a checkpoint directory → pruned → plain ``from_pretrained`` → ``generate``
(issue 31): the test writes a tiny llama GGUF itself with the ``gguf`` package (F32 tensors
under llama.cpp's names, the query and key rows permuted as llama.cpp's converter does, a
byte-level BPE tokenizer's tokens and merges in the metadata), converts it with
:func:`fxsym_plugins_hf.gguf.to_checkpoint` and prunes the result with
:func:`fxsym.prune_checkpoint`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import TEXT, n_params, tiny_config, tokenizer

import fxsym
from fxsym.errors import CheckpointError

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from fxsym_plugins_hf.gguf import to_checkpoint  # noqa: E402

_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permuted(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The rows of a llama query or key projection as llama.cpp's converter stores them (each
    head's rotary halves interleaved)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: Path, *, tied: bool, seed: int = 0) -> tuple[Any, Any]:
    """Write a tiny llama (3 layers, hidden 64, 4 heads / 2 key-value heads) with random
    weights and a :func:`ckpt_helpers.tokenizer` as a GGUF file; return the transformers model
    and the tokenizer it holds."""
    written = tokenizer(100)
    tok = json.loads(written.backend_tokenizer.to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    config = tiny_config("llama", vocab_size=len(vocab), tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny llama")
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(len(vocab))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t.startswith("<") else 1 for t, _ in vocab])  # 3: control
    w.add_token_merges(merges)
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)
    state = model.state_dict()
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"],
               "output_norm.weight": state["model.norm.weight"]}
    if not tied:
        tensors["output.weight"] = state["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        for name, short in _LAYER.items():
            t = state[f"model.layers.{i}.{name}.weight"]
            if short == "attn_q":
                t = _permuted(t, config.num_attention_heads)
            elif short == "attn_k":
                t = _permuted(t, config.num_key_value_heads)
            tensors[f"blk.{i}.{short}.weight"] = t
    for name, t in tensors.items():
        w.add_tensor(name, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model, written


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_gguf_file_converted_pruned_and_generating(tmp_path: Path, tied: bool) -> None:
    """The converted directory loads with plain ``from_pretrained`` into the model of the
    GGUF (logits equal to transformers' own GGUF loading, atol 0, and to the model written);
    ``fxsym.prune_checkpoint`` prunes it by width and by depth, and each pruned directory
    loads with plain ``from_pretrained`` and generates."""
    src = tmp_path / "tiny.gguf"
    original, written = write_gguf(src, tied=tied)
    ckpt = tmp_path / "ckpt"
    assert to_checkpoint(src, ckpt) == ckpt
    config = json.loads((ckpt / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is tied
    assert {"config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json"} <= set(os.listdir(ckpt))
    assert not any(f.startswith(".") for f in os.listdir(tmp_path))  # no temporary left

    converted = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert type(converted) is transformers.LlamaForCausalLM
    assert n_params(converted) == n_params(original)
    read = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=src.name).eval()
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = tok(TEXT[:200], return_tensors="pt").input_ids
    gguf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=src.name)
    assert torch.equal(ids, gguf_tok(TEXT[:200], return_tensors="pt").input_ids)
    # the tokenizer of the metadata is the one written: its merges, its ids
    assert torch.equal(ids, written(TEXT[:200], return_tensors="pt").input_ids)
    torch.testing.assert_close(_logits(converted, ids), _logits(read, ids), atol=0, rtol=0)
    # the q/k rows are back in transformers' order: the model written is the model read
    torch.testing.assert_close(_logits(converted, ids), _logits(original, ids),
                               atol=1e-5, rtol=1e-5)

    width = tmp_path / "width"
    plan = fxsym.prune_checkpoint(ckpt, width, calibration=[TEXT], calibration_tokens=256,
                                  seq_len=32, sizes={"ffn": 96, "kv_heads": 1}, search=False)
    depth = tmp_path / "depth"
    fxsym.prune_checkpoint(ckpt, depth, calibration=[TEXT], calibration_tokens=256, seq_len=32,
                           layers=2)
    for out, check in ((width, lambda c: c.intermediate_size == 96 and
                        c.num_key_value_heads == 1),
                       (depth, lambda c: c.num_hidden_layers == 2)):
        pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(pruned) is transformers.LlamaForCausalLM and check(pruned.config)
        assert n_params(pruned) < n_params(converted)
        prompt = transformers.AutoTokenizer.from_pretrained(out)("The quick brown",
                                                                 return_tensors="pt")
        new = pruned.generate(**prompt, max_new_tokens=5, do_sample=False)
        assert new.shape == (1, prompt.input_ids.shape[1] + 5)
    assert plan.params_after == n_params(transformers.AutoModelForCausalLM.from_pretrained(width))


def test_refusals_name_what_failed_and_write_nothing(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a GGUF file, an architecture transformers does not read from GGUF, a missing file,
    the gguf package missing and an output that is not empty: each a CheckpointError, the
    output untouched."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file" * 10)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        to_checkpoint(bad, tmp_path / "a")
    assert not (tmp_path / "a").exists()

    unknown = tmp_path / "unknown.gguf"
    w = gguf.GGUFWriter(unknown, "no-such-arch")
    w.add_tensor("x.weight", torch.zeros(4, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="architecture 'no-such-arch'"):
        to_checkpoint(unknown, tmp_path / "b")
    assert not (tmp_path / "b").exists()

    with pytest.raises(CheckpointError, match="missing"):
        to_checkpoint(tmp_path / "nothing.gguf", tmp_path / "c")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "gguf", None)  # what Python does for a package not installed
        with pytest.raises(CheckpointError, match=r"needs the 'gguf' package.*pip install gguf"):
            to_checkpoint(bad, tmp_path / "c")
    assert not (tmp_path / "c").exists()

    src = tmp_path / "tiny.gguf"
    write_gguf(src, tied=True)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        to_checkpoint(src, full)
    assert os.listdir(full) == ["keep.txt"]


def test_the_module_command_converts_and_refuses_in_one_line(tmp_path: Path) -> None:
    """``python -m fxsym_plugins_hf.gguf FILE -o DIR``: the directory written and its path
    printed; a bad file is one ``fxsym: …`` line on stderr and exit code 2."""
    src = tmp_path / "tiny.gguf"
    write_gguf(src, tied=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-m", "fxsym_plugins_hf.gguf", str(src), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    done = subprocess.run([sys.executable, "-m", "fxsym_plugins_hf.gguf", str(bad), "-o",
                           str(tmp_path / "x")], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("fxsym: ") and "not a GGUF file" in line
