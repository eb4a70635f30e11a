"""The ``fxsym`` command line: ``analyze``, ``prune``, ``plugins`` and ``passes``.

Every failure, a usage error included, is reported as one line on stderr,
``fxsym: <what failed>``, with exit code 2 (130 when interrupted); a traceback is never shown.
An unknown option is answered with the closest one the command has; a warning is shown as one
line too, ``fxsym: <Category>: <message>``. ``fxsym prune`` only parses its flags into a
:class:`fxsym.request.PruneRequest` (:func:`prune_request`): every rule of the options is the
request's check, the one :func:`fxsym.prune_checkpoint` runs on its keyword arguments, with
the same messages in the flags' words (a refusal is the request's typed error,
``fxsym: PlanError: ...``), before torch is imported: a usage error takes no time.

Imports from fxsym: errors, options, request (torch and the other rooms inside each command, so
``fxsym --help`` and ``fxsym --version`` never import torch: tested in a subprocess).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import FxsymError, ImportanceWarning
from .options import Spelling
from .request import CALIBRATION_TOKENS, RANDOM_BATCHES, SEQ_LEN, Checked, PruneRequest

if TYPE_CHECKING:
    import torch
    from torch import nn

#: when the command line's module was imported: ``fxsym prune --times`` counts from here
_STARTED = time.perf_counter()


class CliError(Exception):
    """A command-line failure, shown as one line."""


def load_model(spec: str) -> nn.Module:
    """``torchvision:resnet50``, ``timm:resnet18`` or ``package.module:factory`` (a module
    instance, or a callable returning one when called without arguments); a directory written
    by ``fxsym prune`` is :func:`load_saved`'s."""
    from torch import nn

    check_spec(spec)
    source, _, name = spec.partition(":")
    try:
        if source == "torchvision":
            import torchvision

            vision_model: nn.Module = torchvision.models.get_model(name, weights=None)
            return vision_model
        if source == "timm":
            import timm

            return timm.create_model(name, pretrained=False)
        obj: Any = importlib.import_module(source)
        for part in name.split("."):
            obj = getattr(obj, part)
    except ModuleNotFoundError as exc:
        hint = ("; is the directory holding it on PYTHONPATH? (the fxsym command does not "
                "look in the current directory: PYTHONPATH=. fxsym ...)") if exc.name and (
            source == exc.name or source.startswith(f"{exc.name}.")) else ""
        raise CliError(f"cannot load {spec}: {_one_line(exc)}{hint}") from exc
    except Exception as exc:
        raise CliError(f"cannot load {spec}: {_one_line(exc)}") from exc
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise CliError(f"{spec} is a {type(obj).__name__}, not a model or a model factory")
    try:
        model = obj()
    except Exception as exc:
        raise CliError(f"{spec} is not a model factory: calling it without arguments "
                       f"failed: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise CliError(f"{spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def check_spec(spec: str) -> None:
    """A model spec is ``SOURCE:NAME``, both given (checked before anything is imported)."""
    source, _, name = spec.partition(":")
    if not source or not name:
        raise CliError(f"MODEL must look like 'torchvision:resnet50' or "
                       f"'package.module:factory' (or name a directory), got {spec!r}")


def _one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's whitespace (newlines included) collapsed."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_analyze(args: argparse.Namespace) -> int:
    if args.model is not None and not Path(args.model).is_dir():  # before torch is imported
        check_spec(args.model)
    if args.input_shape:
        _input_shape(args.input_shape)
    from . import analyze, load_plugins
    from .console import print_table, status
    from .demo import demo_model

    load_plugins()
    manifest = None
    if args.model is None:
        model, inputs = demo_model()
        label = "built-in demo (fxsym.demo.DemoNet)"
    else:
        model, inputs, manifest = _load(args.model)
        label = args.model
    inputs = _example_inputs(args.input_shape, inputs, args.model)
    norm_groups = _norm_groups(args, manifest)
    routing = _routing_groups(args, manifest)
    start = time.perf_counter()
    outputs: Any = args.outputs or None
    if outputs and outputs != "*":
        outputs = [int(k) if k.lstrip("-").isdigit() else k for k in outputs.split(",")]
    with status(f"analyzing {label}"):
        sm = analyze(model, example_inputs=inputs, outputs=outputs, norm_groups=norm_groups,
                     routing_groups=routing)
    elapsed = time.perf_counter() - start
    _write_pictures(sm, label, args)
    groups = sm.groups()
    report = sm.trace_report.entries if args.verbose else list(sm.trace_report)
    if args.json:
        print(json.dumps({
            "model": label,
            "seconds": round(elapsed, 4),
            "output_contract": None if sm.output_contract is None else list(sm.output_contract),
            "analysis": sm.analysis_options,
            "groups": [{"name": g.name, "size": g.size, "unit": g.unit,
                        "sortable": g.is_sortable,
                        "routed": g.routed, "min_size": g.min_size,
                        "step": g.step, "step_reason": g.step_reason,
                        "members": [list(m) for m in g.members]} for g in groups],
            "trace_report": [{"kind": e.kind, "where": e.where, "message": e.message}
                             for e in report],
        }, indent=2))
        return 0
    print(f"{label}: {len(groups)} searchable groups ({elapsed:.2f} s)\n")
    stepped = [g for g in groups if g.step > 1]
    print_table([[g.name, g.size, g.unit, "yes" if g.is_sortable else "no",
                  f"yes, keeps >= {g.min_size}" if g.routed else "no",
                  *([g.step if g.step > 1 else ""] if stepped else []), len(g.members)]
                 for g in groups], ["group", "size", "unit", "sortable", "routed",
                                    *(["step"] if stepped else []), "members"])
    for g in stepped:
        print(f"  {g.name} keeps multiples of {g.step} units: {g.step_reason}")
    print()
    if report:
        print(f"trace report ({len(report)} entries: fallbacks, constant groups and why):")
        for e in report[: args.max_report]:
            print(f"  {e}")
        if len(report) > args.max_report:
            print(f"  ... {len(report) - args.max_report} more (--max-report N to see them)")
    else:
        print("trace report: nothing to report")
    return 0


def _write_pictures(sm: Any, label: str, args: argparse.Namespace) -> None:
    """``--html`` and ``--dot``: write the report files, and say so on stderr."""
    from .report_html import write_dot, write_html

    for path, write in ((args.html, write_html), (args.dot, write_dot)):
        if path:
            start = time.perf_counter()
            try:
                write(sm, path, title=label, verbose=args.verbose)
            except OSError as exc:
                raise CliError(f"cannot write {path}: {_one_line(exc)}") from exc
            print(f"wrote {path} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)


def _norm_groups(args: argparse.Namespace, manifest: dict[str, Any] | None) -> str:
    """``--norm-groups``; left out, the mode a saved directory's last plan was analyzed in
    (its groups are those of that mode), else ``"follow"``."""
    if args.norm_groups is not None:
        return str(args.norm_groups)
    from .planning import analysis_options

    recorded = {} if manifest is None else analysis_options(manifest["plan"])
    return recorded.get("norm_groups", "follow")


def _routing_groups(args: argparse.Namespace, manifest: dict[str, Any] | None) -> str:
    """``--routing-groups``; left out, the mode a saved directory's last plan was analyzed
    in, else ``"follow"``."""
    if args.routing_groups is not None:
        return str(args.routing_groups)
    from .planning import analysis_options

    recorded = {} if manifest is None else analysis_options(manifest["plan"])
    return recorded.get("routing_groups", "follow")


def _add_norm_groups(p: argparse.ArgumentParser) -> None:
    """``--norm-groups``: the values of :data:`fxsym.analysis.options.NORM_GROUPS` (written
    out: importing fxsym.analysis would import torch for ``--help``)."""
    p.add_argument("--norm-groups", choices=("follow", "keep"), help="how a group norm's channels "
                   "change: follow (default), a whole norm group at a time and num_groups "
                   "follows; keep, num_groups stays and every norm group loses as many "
                   "channels (what a config with one norm_num_groups describes)")
    p.add_argument("--routing-groups", choices=("follow", "keep"), help="how a router's "
                   "routing groups change (DeepSeek's n_group): follow (default), experts go "
                   "a whole routing group at a time and n_group follows; keep, n_group stays "
                   "and every routing group keeps the same expert positions")


def cmd_plugins(args: argparse.Namespace) -> int:
    from .console import is_terminal
    from .plugins import load_plugins
    from .registry import get_registry

    pm = load_plugins()
    by_plugin = get_registry().contributions.by_plugin()
    names = pm.plugin_names()
    if not names and not pm.failed:
        print("no fxsym plugins installed (try: pip install fxsym-plugins-nn)")
    if is_terminal():
        _plugins_table(pm, by_plugin)
        names = []  # drawn above
    for name in names:
        src = pm.source(name)
        print(f"{name}  ({src.distribution} {src.version})".rstrip())
        contributed = dict(by_plugin.get(name, {}))
        hooks = pm.answered_hooks(name)
        if hooks:
            contributed["hooks"] = hooks
        if not contributed:
            print("    contributes nothing")
        for kind, items in contributed.items():
            more = f", ... ({len(items)} in all)" if len(items) > 6 else ""
            shown = ", ".join(items[:6]) + more
            print(f"    {kind}: {shown}")
    for failure in pm.failed:
        where = "" if failure.during == "import" else f" (failed in {failure.during})"
        print(f"{failure.name}  ({failure.distribution})  INACTIVE{where}: {failure.error}")
    if args.trace:
        _trace_demo(pm)
    return 0


def _plugins_table(pm: Any, by_plugin: dict[str, dict[str, list[str]]]) -> None:
    """``fxsym plugins`` at a terminal: one rich table row per plugin."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="fxsym plugins", title_justify="left", header_style="bold")
    for column in ("plugin", "distribution", "version", "contributes"):
        table.add_column(column, overflow="fold")
    for name in pm.plugin_names():
        src = pm.source(name)
        contributed = dict(by_plugin.get(name, {}))
        hooks = pm.answered_hooks(name)
        if hooks:
            contributed["hooks"] = hooks
        text = "\n".join(
            f"[bold]{kind}[/bold] ({len(items)}): " + escape(", ".join(items[:6]))
            + (", ..." if len(items) > 6 else "") for kind, items in contributed.items())
        table.add_row(escape(name), escape(src.distribution), escape(str(src.version)),
                      text or "nothing")
    Console().print(table)


def _trace_demo(pm: Any) -> None:
    """Analyze the built-in demo model with every hook call traced (pluggy's tracer), the
    registrations collected again, and print the trace."""
    from . import analyze
    from .demo import demo_model
    from .registry import get_registry

    lines: list[str] = []
    model, _ = demo_model()
    get_registry().invalidate()
    undo = pm.trace_hooks(lines.append)
    try:
        analyze(model)  # no inputs: the plugins' fxsym_example_inputs is asked too
    finally:
        undo()
    print("\nhook calls while analyzing the built-in demo model (fxsym.demo.DemoNet):")
    print("".join(lines), end="")


def cmd_passes(args: argparse.Namespace) -> int:
    from .console import is_terminal, print_table
    from .passes import format_passes
    from .passes.listing import pass_listing
    from .plugins import load_plugins

    load_plugins()
    if not is_terminal():
        print(format_passes())
        return 0
    listing = pass_listing()
    for title, header, rows in listing.tables:
        print_table(rows, header, title=title)
        print()
    if listing.notes:
        print("Op knowledge used by the passes")
        print("\n".join(listing.notes))
    return 0


# -- prune, and loading a saved directory (issue 12) ---------------------------------------
#: model sources a saved directory may name: rebuilding one runs no code from the directory
SAFE_SOURCES = ("torchvision", "timm")
#: ``fxsym prune``'s defaults of the options only some ways of pruning use (left ``None`` by
#: the parser, so an option given where it is not used is refused, never dropped)
MAX_SHARD = "5GB"


def is_saved_dir(spec: str) -> bool:
    """Whether ``spec`` names a directory written by ``fxsym prune`` / ``fxsym.save``."""
    from .persist import is_saved

    return is_saved(spec)


def _load(spec: str) -> tuple[nn.Module, Any, dict[str, Any] | None]:
    """The model ``spec`` names, the example inputs it comes with and its manifest: a saved
    directory's (:func:`load_saved`), else ``None`` and ``None``."""
    from .console import status

    if is_saved_dir(spec):
        return load_saved(spec)
    with status(f"loading {spec}"):
        return load_model(spec).eval(), None, None


def _example_inputs(input_shape: str | None, inputs: Any, source: str | None) -> Any:
    """``--input-shape`` if given, else the inputs the model came with, else a 224x224 image
    for a ``torchvision:``/``timm:`` model, else ``None`` (the plugins' defaults)."""
    import torch

    if input_shape:
        return (torch.randn(*_input_shape(input_shape)),)
    if inputs is None and source and source.partition(":")[0] in SAFE_SOURCES:
        return (torch.randn(1, 3, 224, 224),)
    return inputs


def load_saved(path: str) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The model of a saved directory: built again from the ``torchvision:``/``timm:`` spec it
    records, its plans replayed, its weights loaded (JSON and safetensors: nothing is
    unpickled, no code named by the directory is imported); with the example inputs of its
    last plan and its manifest."""
    from .console import status
    from .persist import load, read_manifest
    from .planning import inputs_from_spec

    manifest = read_manifest(path)
    source = manifest["source"]
    if not isinstance(source, str) or not _registered(source):
        raise CliError(f"{path} records no torchvision:NAME or timm:NAME model to rebuild "
                       f"(source: {source!r}); build the model in Python and call "
                       f"fxsym.load(model, {path!r})")
    model = load_model(source).eval()
    with status(f"replaying the plan of {path}"):
        load(model, path)
    return model, inputs_from_spec(manifest["plan"].inputs), manifest


def _registered(source: str) -> bool:
    """Whether ``source`` is ``torchvision:NAME`` or ``timm:NAME`` with a NAME its library
    registers: building it fetches nothing and reads no file (a saved directory's
    ``timm:hf-hub:...`` would contact the Hub, ``timm:local-dir:/path`` read any path)."""
    lib, _, name = source.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        return False
    if lib == "torchvision":
        import torchvision

        return name in torchvision.models.list_models()
    if lib == "timm":
        import timm

        return bool(timm.is_model(name))
    return False


def _input_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: integers separated by commas."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise CliError(f"--input-shape must be integers separated by commas, like "
                       f"1,3,224,224; got {text!r}") from exc


def _random_batches(inputs: Any, count: int) -> list[Any]:
    """``count`` batches shaped like ``inputs``: random floats, integer inputs kept."""
    import torch

    def like(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return torch.randn_like(v)
        return v

    if isinstance(inputs, dict):
        return [{k: like(v) for k, v in inputs.items()} for _ in range(count)]
    return [tuple(like(v) for v in inputs) for _ in range(count)]


def _criterion(name: str, count: int, inputs: Any) -> Any:
    """The importance ``name``d; taylor and activation are calibrated on ``count`` random
    inputs of the example shape (a smoke run: with real data, use the library)."""
    import torch

    from . import importance
    from .importance import run_batch

    if name not in ("taylor", "activation"):
        return name
    batches = _random_batches(inputs, count)
    if name == "activation":
        return importance.activation(batches, progress=True)

    def self_labelled(model: nn.Module, batch: Any) -> torch.Tensor:
        out = run_batch(model, batch)
        logits = out if isinstance(out, torch.Tensor) else out[0]
        logits = logits.flatten(0, -2) if logits.dim() > 1 else logits[None]
        return torch.nn.functional.cross_entropy(logits, logits.detach().argmax(-1))

    return importance.taylor(self_labelled, batches, progress=True)


def is_checkpoint_dir(spec: str) -> bool:
    """Whether ``spec`` is a directory to prune as a checkpoint (:func:`fxsym.prune_checkpoint`):
    one holding a ``config.json``, or any directory not written by ``fxsym.save``."""
    path = Path(spec)  # fxsym.save's manifest named here: no torch imported before a usage error
    return path.is_dir() and ((path / "config.json").is_file()
                              or not (path / "fxsym.json").is_file())


#: the flags giving sizes by role
_SIZE_FLAGS = "--hidden, --ffn, --expert-ffn, --shared-ffn, --heads, --kv-heads, --experts"
#: the size flags' destinations, the roles of :func:`fxsym.search.sizes_for`
_SIZE_ROLES = ("hidden", "ffn", "expert_ffn", "shared_ffn", "heads", "kv_heads", "experts")

#: ``fxsym prune``'s flags, as the request's rules name them (:mod:`fxsym.request`)
FLAGS = Spelling(calibration="--calib FILE", importance="--importance", layers="--layers",
                 scope="--scope", search="--search", no_search="--no-search",
                 target_active_params="--target-active-params",
                 calibration_tokens="--calib-tokens", seq_len="--seq-len",
                 param_ratio="--param-ratio", target_params="--target-params",
                 ratio="--ratio", target_macs="--target-macs", round_to="--round-to",
                 min_keep="--min-keep",
                 target_non_embedding_params="--target-non-embedding-params",
                 sizes=_SIZE_FLAGS, batches="--batches", input_shape="--input-shape",
                 max_shard_size="--max-shard-size", norm_groups="--norm-groups")


def prune_request(args: argparse.Namespace) -> PruneRequest:
    """``fxsym prune``'s flags parsed into the request (what cannot be read as a value is a
    usage error here; every rule of the values is :meth:`PruneRequest.check`'s)."""
    layers = _layers(args.layers)
    sizes = {k: getattr(args, k) for k in _SIZE_ROLES if getattr(args, k) is not None}
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
        describable=args.describable, norm_groups=args.norm_groups,
        routing_groups=args.routing_groups,
        max_shard_size=None if args.max_shard_size is None else _bytes(args.max_shard_size))


def check_prune_options(args: argparse.Namespace) -> Checked:
    """``fxsym prune``'s flags parsed and checked (:meth:`PruneRequest.check`, the API's
    rules in the flags' words), and what MODEL and ``-o`` name on disk, before torch is
    imported."""
    checked = prune_request(args).check(FLAGS)
    _check_output(args.output, args.force, args.model)
    if not checked.request.checkpoint and not Path(args.model).is_dir():
        check_spec(args.model)
    return checked


def cmd_prune(args: argparse.Namespace) -> int:
    checked = check_prune_options(args)
    if checked.request.checkpoint:
        return _prune_checkpoint(args, checked)
    from . import analyze, load_plugins
    from . import plan as make_plan
    from .checkpoint import apply_with_notes
    from .console import status
    from .persist import save

    load_plugins()
    model, inputs, manifest = _load(args.model)
    source, history = args.model, []
    if manifest is not None:
        source = manifest["source"]
        history = [*manifest["history"], manifest["plan"]]
    inputs = _example_inputs(args.input_shape, inputs, source)
    with status(f"analyzing {args.model}"):
        sm = analyze(model, example_inputs=inputs, norm_groups=_norm_groups(args, manifest),
                     routing_groups=_routing_groups(args, manifest))
    if inputs is None:
        inputs = sm.example_inputs
    checked = checked.on_model(stack=bool(sm.depth_groups()))
    req = checked.request
    if req.param_ratio is not None:
        before = sum(p.numel() for p in model.parameters())
        req = replace(req, param_ratio=None, target_params=int(before * (1 - req.param_ratio)))
    criterion = _criterion(checked.importance, checked.batches, inputs)
    searched = None
    if checked.architecture:
        plan, searched = _plan_architecture(checked, req, model, sm, inputs, criterion)
    else:
        with status("planning (mapping every group onto the parameters, scoring, solving)"):
            plan = make_plan(model, sm, ratio=req.ratio, target_params=req.target_params,
                             target_non_embedding_params=req.target_non_embedding_params,
                             target_macs=req.target_macs, importance=criterion,
                             scope=checked.scope or "global", round_to=req.round_to,
                             min_keep=req.min_keep, exclude=req.exclude,
                             describable=bool(req.describable))
    with status("resizing"):
        plan = apply_with_notes(plan, model, sm)
    save(model, args.output, plan, source=source, history=history, keep_others=False)
    if args.json:
        print(plan.to_json())
        return 0
    if searched:
        print(f"candidates for {_target_text(checked, plan)}:\n{searched}\n")
    print(f"{plan.summary()}{_reached_text(checked, plan)}\n\nsaved to {args.output}\n"
          f"{saved_note(source, args.output)}")
    return 0


def saved_note(source: str | None, output: str) -> str:
    """How the directory ``fxsym prune`` wrote for an in-memory model loads back: as a
    checkpoint where a plugin reads it as one (a Hugging Face model's ``config.json``: the
    reader's :meth:`~fxsym.checkpoint.CheckpointReader.how_to_load`), else with
    :func:`fxsym.load` on a fresh model built as ``source`` says."""
    from .checkpoint import open_checkpoint

    try:
        return open_checkpoint(output).how_to_load(Path(output))
    except FxsymError:
        pass
    lib, _, name = (source or "").partition(":")
    build = {"torchvision": f"torchvision.models.get_model({name!r}, weights=None)",
             "timm": f"timm.create_model({name!r})"}.get(lib, f"model built as {source} "
                                                          "builds it")
    again = (f"; fxsym analyze {output} and fxsym prune {output} read it too"
             if lib in SAFE_SOURCES else "")
    return (f"load it with fxsym.load(model, {output!r}) on a fresh {build} (the plan is "
            f"replayed on it, then the weights are loaded){again}")


#: what each kind of parameter target counts, as the output says it
_COUNTED = {"params": "parameters", "non_embedding": "non-embedding parameters",
            "active": "active parameters"}


def _target_kind(record: dict[str, Any]) -> str:
    """What a plan's ``extra["target"]`` counts."""
    return ("active" if record.get("active") else "non_embedding"
            if record.get("non_embedding") else "params")


def _asked(checked: Checked, plan: Any) -> tuple[int | None, str]:
    """The parameter count asked and what it counts (a ``--param-ratio`` of the model's
    parameters before the plan)."""
    count, kind = checked.target
    ratio = checked.request.param_ratio
    if ratio is not None:
        count = int(plan.params_before * (1 - ratio))
    return count, kind


def _target_text(checked: Checked, plan: Any) -> str:
    """The parameter target as given: ``117,792 parameters (--param-ratio 0.5 of 235,584)``."""
    record = plan.extra.get("target") or {}
    count, kind = _asked(checked, plan)
    count = record.get("params", count)
    text = f"{count:,} {_COUNTED[_target_kind(record) if record else kind]}"
    if checked.request.param_ratio is not None:
        text += f" (--param-ratio {checked.request.param_ratio} of {plan.params_before:,})"
    return text


def _reached_text(checked: Checked, plan: Any) -> str:
    """What a plan for a parameter target reached, beside the target it was given (empty
    without a target); both counts, every parameter and all but the embedding tables."""
    record = plan.extra.get("target")
    counts = plan.extra.get("non_embedding")
    count, kind = _asked(checked, plan)
    if not record and count is not None:  # a plan of widths to the target
        reached = (counts["after"] if kind == "non_embedding" and counts
                   else plan.params_after)
        record = {"params": count, "reached": reached, kind: True}
    if not record:
        return ""
    removed = 100 * (plan.params_before - plan.params_after) / max(plan.params_before, 1)
    also = "" if not counts else (
        f"; {100 * (counts['before'] - counts['after']) / max(counts['before'], 1):.1f}% of its "
        "non-embedding parameters")
    return (f"\n\ntarget: {_target_text(checked, plan)}; reached {record['reached']:,} "
            f"{_COUNTED[_target_kind(record)]} ({removed:.1f}% of the model's parameters "
            f"removed{also})")


def _prune_checkpoint(args: argparse.Namespace, checked: Checked) -> int:
    """``fxsym prune CKPT_DIR``: :func:`fxsym.prune_checkpoint`, streamed, given the request
    checked (:func:`check_prune_options`); its steps timed (:mod:`fxsym.phases`), the times
    printed on stderr with ``--times``."""
    from .phases import format_record, phase, recording

    req = checked.request
    with recording() as seconds:
        with phase("importing torch and fxsym"):
            from .checkpoint import loading_note, prune_checkpoint
            from .console import status
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImportanceWarning)  # said below, in the flags' words
            plan = prune_checkpoint(args.model, args.output, request=req, progress=True,
                                    status=status)
        with phase("saying how the output loads"):
            note = loading_note(args.model, args.output)
    if args.times:
        total = time.perf_counter() - _STARTED
        print(f"time by step ({total:.2f} s since the command started):\n"
              f"{format_record(seconds, total)}", file=sys.stderr)
    if checked.warning:  # said once the prune is done: a refused prune says its refusal
        print(f"fxsym: ImportanceWarning: {checked.warning}", file=sys.stderr)
    if args.json:
        print(plan.to_json())
        return 0
    rows = plan.extra.get("search")
    if rows:
        from .search import table

        print(f"candidates for {_target_text(checked, plan)}:\n{table(rows)}\n")
    print(f"{plan.summary()}{_reached_text(checked, plan)}\n\nsaved to {args.output}\n"
          f"{_carried_text(plan)}{note}")
    return 0


def _carried_text(plan: Any) -> str:
    """The lines saying which of the input's other files the output carries and which it
    left out (``plan.extra`` of :func:`fxsym.prune_checkpoint`), each with why."""
    carried, left = plan.extra.get("carried") or [], plan.extra.get("left_out") or {}
    text = f"carried from the input: {', '.join(carried)}\n" if carried else ""
    if left:
        text += "left out: " + "; ".join(f"{n} ({why})" for n, why in left.items()) + "\n"
    return text


def _bytes(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with KB, MB or GB (powers of 1000)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text, flags=re.IGNORECASE)
    if m is None:
        raise CliError(f"--max-shard-size must be bytes or a size such as 500MB, got {text!r}")
    unit = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9}[m.group(2).upper().rstrip("B")
                                                                 or ""]
    return max(1, int(float(m.group(1)) * unit))


def _plan_architecture(checked: Checked, req: PruneRequest, model: nn.Module, sm: Any,
                       inputs: Any, criterion: Any) -> tuple[Any, str | None]:
    """A plan by depth and sizes (``--layers``, ``--hidden`` ...), or the architecture search
    for a parameter target (:mod:`fxsym.search`; ``--layers K`` fixes the candidates'
    depth): its plan and the table of candidates (``None`` without a search). Calibrated on
    random batches shaped like the example inputs. ``req`` is the request with a
    ``--param-ratio`` made a count of the model's."""
    from . import plan as make_plan
    from .console import status
    from .depth import block_importance
    from .search import search, sizes_for

    batches = _random_batches(inputs, checked.batches)
    count, kind = checked.target
    layers = list(req.layers) if isinstance(req.layers, tuple) else req.layers
    if checked.searching:
        target = req.target_params if count is None else count  # a --param-ratio's count
        assert target is not None
        with status("searching uniform architectures (each planned and scored)"):
            result = search(model, sm, target_params=target, batches=batches,
                            active=kind == "active", non_embedding=kind == "non_embedding",
                            round_to=max(req.round_to, 1), importance=criterion,
                            depths=(layers,) if isinstance(layers, int) else None,
                            describable=bool(req.describable), exclude=req.exclude,
                            min_keep=req.min_keep)
        return result.plan, result.table()
    with status("planning (depth and sizes)"):
        return make_plan(model, sm, ratio=req.ratio, target_params=req.target_params,
                         target_non_embedding_params=req.target_non_embedding_params,
                         target_macs=req.target_macs, importance=criterion,
                         scope=checked.scope or "uniform", round_to=req.round_to,
                         min_keep=req.min_keep, exclude=req.exclude, layers=layers,
                         describable=bool(req.describable),
                         depth_importance=None if layers is None else block_importance(
                             batches), sizes=sizes_for(sm, **req.sizes) if req.sizes
                         else None), None


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


def _check_output(path: str, force: bool, model: str) -> None:
    """``-o DIR`` must be new or empty unless ``--force``, and never the checkpoint directory
    pruned, inside it or holding it, even with ``--force`` (:func:`fxsym.paths.overlap`:
    real paths; the output is replaced whole). Checked before any work."""
    from .paths import overlap

    why = overlap(model, path) if is_checkpoint_dir(model) else None
    if why is not None:
        raise CliError(f"-o {why}: the output is replaced whole, so it would destroy the "
                       "checkpoint it is pruned from (also with --force); give a directory "
                       "outside it")
    out = Path(path)
    if force or not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink() or not out.is_dir() or os.listdir(out):
        raise CliError(f"-o {path}: exists and is not an empty directory; give a new one, or "
                       "--force to replace it whole (everything in it is removed)")


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
    sizes.add_argument("--hidden", type=int, help="hidden size (the residual stream's width)")
    sizes.add_argument("--ffn", type=int, help="dense FFN width of every block (an MLP "
                       "outside routed experts)")
    sizes.add_argument("--expert-ffn", type=int, help="FFN width of every routed expert "
                       "(a MoE's moe_intermediate_size)")
    sizes.add_argument("--shared-ffn", type=int, help="FFN width of every shared expert "
                       "(the MLP beside routed experts that every token uses)")
    sizes.add_argument("--heads", type=int, help="attention (query) heads of every block")
    sizes.add_argument("--kv-heads", type=int, help="key/value heads of every block")
    sizes.add_argument("--experts", type=int, help="MoE experts per layer (at least the "
                       "number a router picks)")
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
    p.add_argument("--scope", choices=["global", "uniform"], help="default: global; uniform "
                   "for a checkpoint (every layer keeps the same shape, so its config says it) "
                   "and with --layers; the architecture search is uniform only")
    _add_norm_groups(p)
    p.add_argument("--describable", action=argparse.BooleanOptionalAction, help="keep the "
                   "sizes the model's own config can describe (fxsym.plan's describable: "
                   "a diffusers config's groups it cannot follow stay whole, a transformers "
                   "config's sizes round to what its checks take), so a uniform plan saves "
                   "with the library's save_pretrained; default: off, on for a checkpoint "
                   "directory's uniform plan")
    calib = p.add_argument_group("calibration (a checkpoint directory)")
    calib.add_argument("--calib", metavar="FILE", help="calibration text: plain text, or JSON "
                       "lines with a \"text\" field; tokenised with the checkpoint's tokenizer")
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
    from . import __version__

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
                   "(e.g. logits or 0,1; * for every output); default: the plugins' choice "
                   "for the model's family, else every output")
    p.add_argument("--max-report", type=int, default=20, help="trace report entries to show")
    _add_norm_groups(p)
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
    shown_as = warnings.formatwarning
    warnings.formatwarning = _warning_line
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            raise _unknown(commands[args.command], extra)
        return int(args.func(args))
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


def _warning_line(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, line: str | None = None) -> str:
    """A warning the command shows: one line, ``fxsym: <Category>: <message>`` (not the
    source line that issued it)."""
    return f"fxsym: {category.__name__}: {' '.join(str(message).split())}\n"


if __name__ == "__main__":
    raise SystemExit(main())
