"""The command line's parser and :func:`main`: the subcommands and their flags (``fxsym
prune``'s in :func:`add_prune_parser`), usage errors as one line (``_Parser``), an unknown
option answered with the closest one the command has (``_unknown``), every failure and warning
shown as one line on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ...declarations import declared
from ...errors import FxsymError
from ..request import CALIBRATION_TOKENS, RANDOM_BATCHES, SEQ_LEN, SHORTLIST
from .analysis_flags import add_analysis_flags
from .analyze import cmd_analyze
from .failure import CliError, _one_line
from .passes import cmd_passes
from .plugins import cmd_plugins
from .prune import cmd_prune
from .prune_flags import MAX_SHARD


def add_prune_parser(sub: Any) -> _Parser:
    p: _Parser = sub.add_parser("prune", help="prune a model and save it (safetensors + plan)")
    p.add_argument("model", help="torchvision:NAME, timm:NAME, package.module:factory, a "
                   "directory written by fxsym prune, or a checkpoint directory (what "
                   "save_pretrained writes: pruned streamed, layer by layer)")
    how = p.add_argument_group("how much (one of)")
    how.add_argument("--ratio", type=float, help="fraction of units (channels, heads) to "
                     "remove, e.g. 0.5; of units, not of parameters: a layer between two "
                     "halved groups keeps a quarter of its weights")
    how.add_argument("--param-ratio", type=float, help="fraction of parameters to remove, "
                     "e.g. 0.5 (the same as --target-params at that fraction of the model)")
    how.add_argument("--target-params", type=int, help="parameters to reach or go under")
    how.add_argument("--target-non-embedding-params", type=int, metavar="N",
                     help="parameters but the embedding tables (tied or not: the count model "
                     "cards quote) to reach or go under; searched as --target-params is")
    how.add_argument("--target-macs", type=int, help="MACs to reach or go under")
    how.add_argument("--target-active-params", type=int, metavar="N",
                     help="parameters a token uses (all but lookup tables) to reach or go "
                     "under; with a depth group, both targets search uniform architectures")
    sizes = p.add_argument_group("sizes (a model with a stack of residual blocks)")
    sizes.add_argument("--layers", metavar="K|I,J,...", help="blocks to keep: a count (the "
                       "most influential, 1 - cos of each block's input and output) or "
                       "positions")
    for size in declared().sizes:
        sizes.add_argument(size.flag, dest=size.name, type=int, metavar=size.metavar,
                           help=size.help)
    p.add_argument("--importance", choices=["l1", "l2", "bn_scale", "taylor", "activation"],
                   help="how units are ranked (default l2; taylor and activation: on random "
                   "inputs; for a checkpoint, activation on --calib text by default)")
    p.add_argument("--batches", type=int, help="random batches of an in-memory model for "
                   "taylor and activation, ranking --layers K and the architecture search "
                   f"(default {RANDOM_BATCHES})")
    p.add_argument("--search", action=argparse.BooleanOptionalAction, help="search uniform "
                   "candidate architectures for a parameter target, each scored by its loss "
                   "(default: on for --target-params, --param-ratio and --target-active-params "
                   "without sizes, at the depth of --layers K if given; a checkpoint "
                   "directory's needs --calib); --no-search: one plan of widths to the target")
    p.add_argument("--shortlist", metavar="K|all", help="candidates of the search scored by "
                   "their loss, the K the calibration pass estimates least damaged (default "
                   f"{SHORTLIST}); all: every candidate (slower, the estimate not trusted)")
    p.add_argument("--scope", choices=["global", "uniform"], help="default: global; uniform "
                   "for a checkpoint (every layer keeps the same shape, so its config says it) "
                   "and with --layers; the architecture search is uniform only")
    add_analysis_flags(p)
    p.add_argument("--describable", action=argparse.BooleanOptionalAction, help="keep the "
                   "sizes the model's own config can describe (fxsym.plan's describable: "
                   "a diffusers config's groups it cannot follow stay whole, a config whose "
                   "checks take only some sizes rounds to them), so a uniform plan saves "
                   "with the library's save_pretrained; default: off, on for a checkpoint "
                   "directory's uniform plan")
    calib = p.add_argument_group("calibration (a checkpoint directory)")
    calib.add_argument("--calib", metavar="FILE", help="calibration text: plain text, or JSON "
                       "lines with a \"text\" field; tokenised as the checkpoint's reader does")
    calib.add_argument("--calib-tokens", type=int, metavar="N",
                       help=f"calibration tokens to use (default {CALIBRATION_TOKENS})")
    calib.add_argument("--seq-len", type=int, metavar="L",
                       help=f"tokens per calibration sequence (default {SEQ_LEN})")
    calib.add_argument("--max-shard-size", metavar="SIZE",
                       help=f"largest output weight file (default {MAX_SHARD})")
    p.add_argument("--round-to", type=int, default=1, help="kept sizes a multiple of this")
    p.add_argument("--min-keep", type=int, default=1, help="units every group keeps at least")
    p.add_argument("--exclude", action="append", metavar="GROUP",
                   help="a group (or fnmatch pattern) to leave whole; repeatable")
    p.add_argument("--input-shape", help="shape of one random input tensor, e.g. 1,3,224,224")
    p.add_argument("-o", "--output", required=True,
                   help="directory to write: new or empty (replaced atomically)")
    p.add_argument("--force", action="store_true",
                   help="replace the output directory even if it holds files")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--times", action="store_true", help="a checkpoint directory: print on "
                   "stderr the seconds each step took (building, analysing, the calibration "
                   "pass, writing ...)")
    p.set_defaults(func=cmd_prune)
    return p


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (raised, reported by :func:`main`)
    instead of the usage text and an exit."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)")


def _unknown(parser: _Parser, extra: list[str]) -> CliError:
    """The error for what ``parser`` (a command's) did not take: the first unknown option
    with the closest option it has, else the first unexpected argument."""
    options = [s for action in parser._actions for s in action.option_strings]
    flags = [x for x in extra if x.startswith("-") and x != "-"]
    if not flags:
        return CliError(f"unexpected argument {extra[0]!r} (see {parser.prog} --help)")
    flag = flags[0].partition("=")[0]
    close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return CliError(f"unknown option {flag}{hint} (see {parser.prog} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    shown_as = warnings.formatwarning
    warnings.formatwarning = _warning_line  # the plugins' declarations may warn in the parser
    try:
        args, func = _parsed(argv)
        return int(func(args))
    except KeyboardInterrupt:
        print("fxsym: interrupted", file=sys.stderr)
        return 130
    except CliError as exc:
        print(f"fxsym: {' '.join(str(exc).split())}", file=sys.stderr)
    except FxsymError as exc:
        print(f"fxsym: {_one_line(exc)}", file=sys.stderr)
    except Exception as exc:
        print(f"fxsym: unexpected error: {_one_line(exc)}", file=sys.stderr)
    finally:
        warnings.formatwarning = shown_as
    return 2


def _parsed(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Any]:
    """The command line parsed: its arguments and the command's function."""
    from ... import __version__

    parser = _Parser(
        prog="fxsym",
        description="Which sizes inside a PyTorch model can change, and which change together.")
    parser.add_argument("--version", action="version", version=f"fxsym {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, _Parser] = {}
    p = commands["analyze"] = sub.add_parser("analyze", help="list a model's searchable groups")
    p.add_argument("model", nargs="?", help="torchvision:NAME, timm:NAME or package.module:factory"
                   " (default: a built-in demo model)")
    p.add_argument("--input-shape", help="shape of one random input tensor, e.g. 1,3,224,224")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--outputs", help="the outputs whose sizes must stay, by name or position "
                   "(e.g. out or 0,1; * for every output); default: the plugins' choice "
                   "for the model's family, else every output")
    p.add_argument("--max-report", type=int, default=20, help="trace report entries to show")
    add_analysis_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="also show sizes that never "
                   "could change (numbers read from module attributes that size no tensor, "
                   "such as a pooling's kernel_size) in the trace report and --html")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report: "
                   "the graph with each group's nodes coloured, the groups, why the constant "
                   "ones are constant, a search box")
    p.add_argument("--dot", metavar="FILE", help="also write the graph for Graphviz (dot -Tsvg)")
    p.set_defaults(func=cmd_analyze)
    p = commands["plugins"] = sub.add_parser("plugins",
                                             help="list plugins and what each contributed")
    p.add_argument("--trace", action="store_true", help="also analyze the built-in demo model "
                   "and show each hook call and the plugin that answered (as FXSYM_DEBUG=1 "
                   "does on stderr)")
    p.set_defaults(func=cmd_plugins)
    p = commands["passes"] = sub.add_parser("passes", help="list optimize passes and patterns")
    p.set_defaults(func=cmd_passes)
    commands["prune"] = add_prune_parser(sub)
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise _unknown(commands[args.command], extra)
    return args, args.func


def _warning_line(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, line: str | None = None) -> str:
    """A warning the command shows: one line, ``fxsym: <Category>: <message>`` (not the
    source line that issued it)."""
    return f"fxsym: {category.__name__}: {' '.join(str(message).split())}\n"
