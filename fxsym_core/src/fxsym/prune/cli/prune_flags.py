"""``fxsym prune``'s flags parsed into a :class:`fxsym.request.PruneRequest`
(:func:`prune_request`; what cannot be read as a value is a usage error here, every rule of
the values is the request's), and :func:`flags` (``FLAGS``), how the request's rules name
them.
"""

from __future__ import annotations

import argparse
import re

from ...declarations import declared
from ..options import Spelling
from ..request import PruneRequest
from .analysis_flags import given_options
from .failure import CliError
from .models import _input_shape, is_checkpoint_dir

#: ``fxsym prune``'s defaults of the options only some ways of pruning use (left ``None`` by
#: the parser, so an option given where it is not used is refused, never dropped)
MAX_SHARD = "5GB"


def flags() -> Spelling:
    """``fxsym prune``'s flags, as the request's rules name them (:mod:`fxsym.request`): the
    size flags and analysis options' flags those the plugins declare
    (:func:`fxsym.declarations.declared`)."""
    sizes = ", ".join(o.flag for o in declared().sizes) or "no size flag: no plugin declares one"
    return Spelling(calibration="--calib FILE", importance="--importance", layers="--layers",
                    scope="--scope", search="--search", no_search="--no-search",
                    target_active_params="--target-active-params",
                    calibration_tokens="--calib-tokens", seq_len="--seq-len",
                    param_ratio="--param-ratio", target_params="--target-params",
                    ratio="--ratio", target_macs="--target-macs", round_to="--round-to",
                    min_keep="--min-keep",
                    target_non_embedding_params="--target-non-embedding-params",
                    sizes=sizes, batches="--batches", input_shape="--input-shape",
                    max_shard_size="--max-shard-size", shortlist="--shortlist",
                    output="-o", force="--force", declared="{flag}")


def __getattr__(name: str) -> Spelling:
    if name == "FLAGS":  # the flags of the plugins declared now (:func:`flags`)
        return flags()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def prune_request(args: argparse.Namespace) -> PruneRequest:
    """``fxsym prune``'s flags parsed into the request (what cannot be read as a value is a
    usage error here; every rule of the values is :meth:`PruneRequest.check`'s)."""
    layers = _layers(args.layers)
    sizes = {o.name: v for o in declared().sizes if (v := getattr(args, o.name, None)) is not None}
    return PruneRequest(
        checkpoint=is_checkpoint_dir(args.model), ratio=args.ratio,
        param_ratio=args.param_ratio, target_params=args.target_params,
        target_non_embedding_params=args.target_non_embedding_params,
        target_active_params=args.target_active_params, target_macs=args.target_macs,
        sizes=sizes or None, layers=tuple(layers) if isinstance(layers, list) else layers,
        search=args.search, scope=args.scope, importance=args.importance,
        calibration=args.calib, calibration_tokens=args.calib_tokens, seq_len=args.seq_len,
        batches=args.batches,
        input_shape=None if args.input_shape is None else _input_shape(args.input_shape),
        round_to=args.round_to, min_keep=args.min_keep, exclude=tuple(args.exclude or ()),
        describable=args.describable, analysis_options=given_options(args) or None,
        max_shard_size=None if args.max_shard_size is None else _bytes(args.max_shard_size),
        shortlist=_shortlist(args.shortlist), source=args.model, output=args.output,
        force=args.force)


def _shortlist(text: str | None) -> int | str | None:
    """``--shortlist``: a number of candidates, or ``all``."""
    if text is None or text == "all":
        return text
    try:
        return int(text)
    except ValueError as exc:
        raise CliError(f"--shortlist is a number of candidates or 'all', got {text!r}") from exc


def _bytes(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with KB, MB or GB (powers of 1000)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text, flags=re.IGNORECASE)
    if m is None:
        raise CliError(f"--max-shard-size must be bytes or a size such as 500MB, got {text!r}")
    unit = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9}[m.group(2).upper().rstrip("B")
                                                                 or ""]
    return max(1, int(float(m.group(1)) * unit))


def _layers(text: str | None) -> int | list[int] | None:
    """``--layers``: a count, or the blocks to keep separated by commas."""
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError as exc:
        raise CliError(f"--layers is a count or positions separated by commas, got "
                       f"{text!r}") from exc
    return values[0] if len(values) == 1 and "," not in text else values
