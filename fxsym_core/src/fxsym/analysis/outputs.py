"""The output contract: which of a model's outputs must keep their sizes.

Every group that reaches a *contract* output is constant: a resize must not change what the
model's user reads. By default every output is in the contract. A user narrows it with
``analyze(model, outputs=...)``; a plugin may narrow it for the models it knows through the
``fxsym_default_outputs`` hook (a Hugging Face task model's contract is its ``logits`` and
``loss``, not auxiliary hidden states). Outputs outside the contract may change size after a
resize; the trace report lists them.

A contract is a tuple of keys: a name picks an entry of a mapping output (a model output
object or a dict), an int picks by position (in a tuple, a list, or a mapping's values in
order, ``None`` values left out as model output objects do). A single-tensor output is
position 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import AnalysisError

OutputKey = str | int
Contract = tuple[OutputKey, ...]


def normalize_contract(outputs: Any) -> Contract | None:
    """``None`` (every output) or a tuple of names and positions."""
    if outputs is None:
        return None
    if isinstance(outputs, (str, int)) and not isinstance(outputs, bool):
        return (outputs,)
    if isinstance(outputs, Sequence) and all(
            isinstance(k, (str, int)) and not isinstance(k, bool) for k in outputs):
        if not outputs:
            raise AnalysisError("outputs=() leaves no output in the contract; pass None for all")
        return tuple(outputs)
    raise AnalysisError(f"outputs must be names or positions of the model's outputs, "
                        f"got {outputs!r}")


def output_keys(output: Any) -> list[OutputKey]:
    """The keys a contract may use for ``output``."""
    if isinstance(output, Mapping):
        return [k for k, v in output.items() if v is not None]
    if isinstance(output, (tuple, list)):
        return list(range(len(output)))
    return [0]


def select_outputs(output: Any, contract: Contract | None, *,
                   strict: bool = True) -> list[Any]:
    """The parts of ``output`` (a model's return value, or the traced graph's output
    structure) that the contract names. ``strict=False`` skips keys that are missing (a
    plugin's default contract names ``loss``, present only when labels are passed)."""
    if contract is None:
        return [output]
    if isinstance(output, Mapping):
        present = {k: v for k, v in output.items() if v is not None}
        values = list(present.values())
    elif isinstance(output, (tuple, list)):
        present, values = {}, list(output)
    else:
        present, values = {}, [output]
    picked: list[Any] = []
    for key in contract:
        if isinstance(key, str) and key in present:
            picked.append(present[key])
        elif isinstance(key, int) and -len(values) <= key < len(values):
            picked.append(values[key])
        elif strict:
            raise AnalysisError(f"output {key!r} is not among the model's outputs "
                                f"{output_keys(output)}")
    return picked


__all__ = ["Contract", "normalize_contract", "output_keys", "select_outputs"]
