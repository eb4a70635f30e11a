"""``fxsym prune``: the request checked, its output too, and what MODEL names
(:func:`check_prune_options`), then a checkpoint directory pruned streamed
(:mod:`.prune_streamed`) or a model in memory analyzed, planned, resized and saved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..request import Checked
from .analysis_flags import analysis_options
from .models import _example_inputs, _load, check_spec
from .prune_flags import flags, prune_request
from .prune_model import _criterion, _plan_architecture, saved_note
from .prune_streamed import _prune_checkpoint
from .prune_text import _reached_text, _target_text


def check_prune_options(args: argparse.Namespace) -> Checked:
    """``fxsym prune``'s flags parsed and checked (:meth:`PruneRequest.check`, the API's
    rules in the flags' words: ``-o`` and ``--force`` too), and what MODEL names, before
    torch is imported."""
    checked = prune_request(args).check(flags())
    if not checked.request.checkpoint and not Path(args.model).is_dir():
        check_spec(args.model)
    return checked


def cmd_prune(args: argparse.Namespace) -> int:
    checked = check_prune_options(args)
    if checked.request.checkpoint:
        return _prune_checkpoint(args, checked)
    from ... import analyze, load_plugins
    from ..checkpoint import apply_with_notes
    from ..console import status
    from ..persist import save
    from ..planning import solve as make_plan

    load_plugins()
    model, inputs, manifest = _load(args.model)
    source, history = args.model, []
    if manifest is not None:
        source = manifest["source"]
        history = [*manifest["history"], manifest["plan"]]
    inputs = _example_inputs(args.input_shape, inputs, source)
    with status(f"analyzing {args.model}"):
        sm = analyze(model, example_inputs=inputs, **analysis_options(args, manifest))
    if inputs is None:
        inputs = sm.example_inputs
    checked = checked.on_model(stack=bool(sm.depth_groups()))
    req = checked.request
    req = req.counted(sum(p.numel() for p in model.parameters()))
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
