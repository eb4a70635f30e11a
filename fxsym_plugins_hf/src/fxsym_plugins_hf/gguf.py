"""A GGUF file (llama.cpp's format) made a normal transformers checkpoint directory, which plain
``from_pretrained`` loads and :func:`fxsym.prune_checkpoint` / ``fxsym prune`` read:
:func:`to_checkpoint`, and ``python -m fxsym_plugins_hf.gguf FILE.gguf -o DIR``.

transformers reads the file (the ``gguf`` package parses it; ``accelerate`` is asked for by
its loader): the config from the file's metadata, the weights dequantized into the
``dtype`` asked for (``GgufConfig(dequantize=True)``: never left in packed GGUF blocks),
llama.cpp's tensor names and layouts mapped back to the model's (its row permutation of a
llama's query and key projections undone), and the tokenizer from the vocabulary and merges
the metadata holds. Nothing here knows a tensor name or an architecture: what transformers
cannot read is refused with its reason.

``save_pretrained`` refuses a model loaded that way (its config carries the GGUF
``quantization_config``), so the model is built again, by ``from_pretrained`` of the same
class, from the config without it and the loaded model's state dict (the same tensors, not
copies); that model, its generation config and the tokenizer are saved into ``output``.

Memory: the model is held in memory once, in ``dtype``, plus what transformers' reader holds
while it dequantizes (the conversion is not streamed: transformers' GGUF reader dequantizes
every tensor of the file into one state dict before the model is filled, and the names and
layouts are its own, per architecture; SmolLM2-135M, a 98 MB Q4_1 file, peaked at 1.6 GB
resident for a 538 MB float32 checkpoint). The checkpoint written is what ``fxsym prune``
then streams block by block.

``output`` is written atomically (:func:`fxsym.prune.persist.replace_directory`): it must be
missing or an empty directory, and holds nothing or the complete checkpoint whenever the
process stops. Every refusal is a :class:`fxsym.CheckpointError` saying what to do: the
``gguf`` or ``accelerate`` package missing, a file that is not GGUF, an architecture (or a
tokenizer) transformers cannot read, an output that exists and is not empty.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from fxsym.errors import CheckpointError, FxsymError
from fxsym.prune.paths import check_new_output, kind
from fxsym.prune.persist import replace_directory

__all__ = ["main", "to_checkpoint"]

#: the packages transformers' GGUF loading imports, and why
_NEEDS = {"gguf": "to parse GGUF files", "accelerate": "transformers asks for it to load a GGUF"}


def to_checkpoint(gguf_file: str | os.PathLike[str], output: str | os.PathLike[str], *,
                  dtype: torch.dtype = torch.float32) -> Path:
    """Write the model of ``gguf_file`` as a transformers checkpoint directory ``output``
    (``config.json`` without a quantization config, ``model.safetensors``,
    ``generation_config.json``, the tokenizer's files), its weights dequantized to ``dtype``;
    return ``output``'s absolute path. See the module's description for what is refused."""
    source = Path(os.path.abspath(gguf_file))
    out = Path(os.path.abspath(output))
    what = kind(source)
    if what is not None or not source.is_file():
        raise CheckpointError(f"{gguf_file} is {what or 'a directory'}; give a .gguf file")
    check_new_output(out)
    for package, why in _NEEDS.items():
        if importlib.util.find_spec(package) is None:
            raise CheckpointError(f"converting {source.name} needs the {package!r} package "
                                  f"({why}): pip install {package}")
    architecture = _architecture(source)
    model = _plain(_dequantized(source, architecture, dtype))
    tokenizer = _transformers_call("read the tokenizer of", source, architecture,
                                   lambda: _tokenizer(source))
    with replace_directory(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _usual_modes(tmp)
    return out


def _architecture(source: Path) -> str:
    """The file's ``general.architecture``, read by the ``gguf`` package (the tensors are
    mapped, not read)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(source).get_field("general.architecture")
    except Exception as exc:
        raise CheckpointError(f"{source} is not a GGUF file the gguf package reads "
                              f"({type(exc).__name__}: {exc})") from exc
    if field is None:
        raise CheckpointError(f"{source} has no general.architecture: not a model's GGUF file")
    return str(field.contents())


def _dequantized(source: Path, architecture: str, dtype: torch.dtype) -> Any:
    """The model transformers loads from ``source``, every weight dequantized to ``dtype``:
    the config's architecture class when transformers has it, else its causal-LM class."""
    import transformers

    def load() -> Any:
        config = transformers.AutoConfig.from_pretrained(source.parent, gguf_file=source.name,
                                                         local_files_only=True)
        named = [getattr(transformers, a, None) for a in config.architectures or ()]
        cls = named[0] if named and named[0] is not None else transformers.AutoModelForCausalLM
        return cls.from_pretrained(source.parent, gguf_file=source.name, dtype=dtype,
                                   quantization_config=transformers.GgufConfig(dequantize=True),
                                   local_files_only=True)

    return _transformers_call("load", source, architecture, load)


def _plain(model: Any) -> Any:
    """``model`` built again without the GGUF quantization config, holding the same tensors
    (``save_pretrained`` refuses a model whose config has one)."""
    settings = model.config.to_dict()
    settings.pop("quantization_config", None)
    config = type(model.config).from_dict(settings)
    plain = type(model).from_pretrained(None, config=config, state_dict=model.state_dict(),
                                        dtype=model.dtype)
    plain.generation_config = model.generation_config
    return plain.eval()


def _transformers_call(doing: str, source: Path, architecture: str, call: Callable[[], Any]
                       ) -> Any:
    try:
        return call()
    except FxsymError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"transformers could not {doing} {source.name} (architecture {architecture!r}): "
            f"{type(exc).__name__}: {str(exc).rstrip('.')}. Only the architectures "
            "transformers reads from GGUF can be converted (a newer transformers may read more)"
        ) from exc


def _tokenizer(source: Path) -> Any:
    from transformers import AutoTokenizer

    # a local file is never downloaded; local_files_only would be saved in tokenizer_config.json
    return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)


def _usual_modes(directory: Path) -> None:
    """Give every file written the mode a new file gets (some writers make theirs private)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o666 & ~mask)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxsym_plugins_hf.gguf FILE.gguf -o DIR [--dtype bfloat16]``: exit 0, or 2
    with one ``fxsym: …`` line on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m fxsym_plugins_hf.gguf",
        description="Write a GGUF file's model as a transformers checkpoint directory "
                    "(dequantized), which from_pretrained loads and fxsym prune reads.")
    parser.add_argument("gguf_file", help="the .gguf file")
    parser.add_argument("-o", "--output", required=True,
                        help="the checkpoint directory to write (new or empty)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the weights' type in the checkpoint (default: float32)")
    args = parser.parse_args(argv)
    try:
        out = to_checkpoint(args.gguf_file, args.output, dtype=getattr(torch, args.dtype))
    except FxsymError as exc:
        print(f"fxsym: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
