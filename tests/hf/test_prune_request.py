"""One prune request for the command line and the API, checked once (issue 32 §2).

``fxsym prune`` parses its flags into a :class:`fxsym.PruneRequest` and
:func:`fxsym.prune_checkpoint` builds one from its keyword arguments; both run its one check.
Each bad combination below is given to ``fxsym prune CKPT_DIR``, to ``fxsym prune MODEL`` (a
model in memory) where it applies, and to the API: each path refuses with the request's own
error (same type; the message the request's check gives, in the flags' words on the command
line and the keyword arguments' in Python), before anything is written (two that
``prune_checkpoint``'s keyword arguments used to accept, an unused scope or calibration size,
are left out there with a DeprecationWarning giving that message). Good combinations
make the same plan by the flags, the keyword arguments and a request. :func:`fxsym.plan` builds
the request of ``fxsym prune MODEL --no-search`` (a plan of widths, not searched) and refuses
alike, in the keyword arguments' words (a scope given where it changes nothing, which it
accepted before, is left out with a DeprecationWarning giving the refusal), and makes the plan
those flags make. The output and ``--force``/``force`` are the request's too: refused alike on
every path before anything is written. Tiny llama models from ``AutoConfig.for_model`` with
random weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import checkpoint, tiny_llama

import fxsym
from fxsym.errors import FxsymError
from fxsym.prune.cli import FLAGS, main

transformers = pytest.importorskip("transformers")

MODEL = "ckpt_helpers:tiny_llama"
CALIB = "CALIB"  # replaced by the calibration file
SMALL = dict(calibration_tokens=64, seq_len=16, round_to=8)




def _argv(options: dict[str, Any]) -> list[str]:
    """The flags saying what the keyword arguments ``options`` say."""
    out: list[str] = []
    for key, value in options.items():
        if key == "sizes":
            for role, size in value.items():
                out += [f"--{role.replace('_', '-')}", str(size)]
        elif key == "search":
            out.append("--search" if value else "--no-search")
        elif key == "layers":
            out += ["--layers", ",".join(map(str, value)) if isinstance(value, tuple)
                    else str(value)]
        else:
            flag = {"calibration": "--calib", "calibration_tokens": "--calib-tokens"}.get(
                key, f"--{key.replace('_', '-')}")
            out += [flag, str(value)]
    return out


def _refusal(request: fxsym.PruneRequest, names: Any = None, *, stack: bool = True
             ) -> FxsymError:
    """What the request's check raises (for a model in memory, with a stack of blocks)."""
    with pytest.raises(FxsymError) as caught:
        checked = request.check() if names is None else request.check(names)
        checked.on_model(stack=stack)
    return caught.value


def _cli_line(capsys: pytest.CaptureFixture[str], argv: list[str], out: Path) -> str:
    assert main(["prune", *argv, "-o", str(out)]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


#: (keyword arguments, where: "checkpoint" (fxsym prune CKPT_DIR and prune_checkpoint),
#: "model" (fxsym prune MODEL), "plan" (fxsym.plan and fxsym prune MODEL --no-search);
#: "deprecated": what ``prune_checkpoint``'s keyword arguments accepted before, now left out
#: with a DeprecationWarning saying the refusal; "plan-deprecated": the same for fxsym.plan)
BAD: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({}, ("checkpoint", "model", "plan")),
    (dict(ratio=0.3, param_ratio=0.3), ("checkpoint", "model", "plan")),
    (dict(target_params=9000, target_non_embedding_params=9000),
     ("checkpoint", "model", "plan")),
    (dict(param_ratio=1.5), ("checkpoint", "model", "plan")),
    (dict(ratio=0.3, sizes={"hidden": 32}), ("checkpoint", "model", "plan")),
    (dict(search=True, ratio=0.3, calibration=CALIB), ("checkpoint",)),
    (dict(search=True, ratio=0.3), ("model",)),
    (dict(search=False, target_active_params=9000, calibration=CALIB), ("checkpoint",)),
    (dict(search=False, target_active_params=9000), ("model",)),
    (dict(search=True, target_params=9000, layers=(0, 2), calibration=CALIB),
     ("checkpoint", "model")),
    (dict(search=True, target_non_embedding_params=9000), ("checkpoint",)),
    (dict(ratio=0.3, importance="l2", calibration_tokens=64), ("checkpoint", "deprecated")),
    (dict(ratio=0.3, importance="l2", calibration=CALIB), ("checkpoint",)),
    (dict(target_params=90000, calibration=CALIB, scope="global"), ("checkpoint",)),
    (dict(target_params=90000, scope="global"), ("model",)),
    (dict(sizes={"hidden": 32}, importance="l2", scope="uniform"),
     ("checkpoint", "model", "deprecated", "plan", "plan-deprecated")),
    (dict(layers=2), ("checkpoint",)),
    (dict(importance="taylor", ratio=0.3), ("checkpoint",)),
    (dict(ratio=0.3, batches=2), ("model",)),
    (dict(ratio=0.3, seq_len=16), ("model",)),
    (dict(ratio=0.3, importance="l2", shortlist=2), ("checkpoint", "model")),
    (dict(target_params=90000, calibration=CALIB, shortlist=0), ("checkpoint",)),
    (dict(target_params=90000, shortlist=0), ("model",)),
    (dict(ratio=1.0), ("checkpoint", "model", "plan")),
    (dict(ratio=0.3, round_to=0), ("checkpoint", "model", "plan")),
    (dict(layers=(0, 2), importance="l2", scope="uniform"),
     ("checkpoint", "deprecated", "model", "plan", "plan-deprecated")),
    (dict(ratio=0.3, scope="local"), ("plan",)),  # the command line's --scope: its choices
]


@pytest.mark.parametrize("options, where", BAD, ids=[
    "nothing", "two-amounts", "two-targets", "param-ratio-range", "sizes-and-amount",
    "search-without-target", "search-without-target-in-memory", "active-without-search",
    "active-without-search-in-memory", "search-positions", "search-without-calibration",
    "calib-tokens-without-text", "calibration-unused", "search-scope",
    "search-scope-in-memory", "sizes-scope", "layer-count-without-text",
    "taylor-on-a-checkpoint", "batches", "seq-len-in-memory", "shortlist-without-search",
    "shortlist-zero", "shortlist-zero-in-memory", "ratio-range", "round-to",
    "layers-scope", "scope-value"])
def test_every_path_refuses_a_bad_combination_alike(
        tmp_path: Path, calib: Path, capsys: pytest.CaptureFixture[str],
        options: dict[str, Any], where: tuple[str, ...]) -> None:
    options = {k: str(calib) if v == CALIB else v for k, v in options.items()}
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=3)
    if "checkpoint" in where:
        request = fxsym.PruneRequest(checkpoint=True, **options)
        asked = _refusal(request)
        with pytest.raises(FxsymError) as by_api:
            fxsym.prune_checkpoint(src, tmp_path / "api", request=request)
        assert type(by_api.value) is type(asked) and str(by_api.value) == str(asked)
        if "deprecated" in where:
            with pytest.warns(DeprecationWarning, match=re.escape(str(asked))):
                fxsym.prune_checkpoint(src, tmp_path / "kw", **options)
        else:
            with pytest.raises(FxsymError) as by_api:
                fxsym.prune_checkpoint(src, tmp_path / "api", **options)
            assert type(by_api.value) is type(asked) and str(by_api.value) == str(asked)
        in_flags = _refusal(request, FLAGS)
        assert type(in_flags) is type(asked)
        line = _cli_line(capsys, [str(src), *_argv(options)], tmp_path / "cli")
        assert line == f"fxsym: {type(asked).__name__}: {in_flags}"
        assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()
    if "model" in where:
        request = fxsym.PruneRequest(**options)
        asked, in_flags = _refusal(request), _refusal(request, FLAGS)
        assert type(in_flags) is type(asked)
        line = _cli_line(capsys, [MODEL, *_argv(options)], tmp_path / "cli")
        assert line == f"fxsym: {type(asked).__name__}: {in_flags}"
        assert not (tmp_path / "cli").exists()
    if "plan" in where:
        _plan_refuses_alike(tmp_path, capsys, options, "plan-deprecated" in where)


_ANALYZED: list[tuple[Any, Any]] = []


def _plan_refuses_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        options: dict[str, Any], deprecated: bool) -> None:
    """``fxsym.plan`` (the tiny llama analyzed once, sizes by role made sizes by group) and
    ``fxsym prune MODEL --no-search`` give the refusal of the request not searched."""
    from fxsym.prune.search import sizes_for

    if not _ANALYZED:
        model = tiny_llama()
        _ANALYZED.append((model, fxsym.analyze(model)))
    model, sm = _ANALYZED[0]
    request = fxsym.PruneRequest(search=False, **options)
    asked = _refusal(request)
    given = dict(options)
    if "sizes" in given:
        given["sizes"] = sizes_for(sm, **given["sizes"])
    if deprecated:  # left out, the plan made as without it
        with pytest.warns(DeprecationWarning, match=re.escape(str(asked))):
            made = fxsym.plan(model, sm, **given)
        without = fxsym.plan(model, sm, **{k: v for k, v in given.items() if k != "scope"})
        assert made.choices() == without.choices()
    else:
        with pytest.raises(FxsymError) as by_plan:
            fxsym.plan(model, sm, **given)
        assert type(by_plan.value) is type(asked) and str(by_plan.value) == str(asked)
    if "scope" in options and options["scope"] not in ("global", "uniform"):
        return  # the command line's --scope takes its choices only
    in_flags = _refusal(request, FLAGS)
    line = _cli_line(capsys, [MODEL, "--no-search", *_argv(options)], tmp_path / "cli")
    assert line == f"fxsym: {type(asked).__name__}: {in_flags}"


def test_a_request_and_keyword_arguments_are_not_mixed(tmp_path: Path) -> None:
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    request = fxsym.PruneRequest(checkpoint=True, ratio=0.3, importance="l2")
    with pytest.raises(fxsym.PlanError, match=r"give the request or its options \(ratio\)"):
        fxsym.prune_checkpoint(src, tmp_path / "out", request=request, ratio=0.5)
    with pytest.raises(fxsym.PlanError, match="checkpoint=True"):
        fxsym.prune_checkpoint(src, tmp_path / "out", request=fxsym.PruneRequest(ratio=0.3))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options", [
    dict(ratio=0.3, importance="l2"),
    dict(target_non_embedding_params=60000, calibration=CALIB, **SMALL),
    dict(target_non_embedding_params=60000, calibration=CALIB, shortlist=1, **SMALL),
    dict(target_non_embedding_params=60000, calibration=CALIB, shortlist="all", **SMALL),
], ids=["l2-ratio", "non-embedding-search", "shortlist-1", "shortlist-all"])
def test_the_flags_the_keywords_and_a_request_make_the_same_plan(
        tmp_path: Path, calib: Path, capsys: pytest.CaptureFixture[str],
        options: dict[str, Any]) -> None:
    options = {k: str(calib) if v == CALIB else v for k, v in options.items()}
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=3)
    assert main(["prune", str(src), *_argv(options), "-o", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    by_cli = fxsym.prune.persist.read_manifest(tmp_path / "cli")["plan"]
    by_keywords = fxsym.prune_checkpoint(src, tmp_path / "kw", **options)
    by_request = fxsym.prune_checkpoint(
        src, tmp_path / "req", request=fxsym.PruneRequest(checkpoint=True, **options))
    assert by_cli.choices() == by_keywords.choices() == by_request.choices()
    assert by_cli.extra.get("search") == by_keywords.extra.get("search") == \
        by_request.extra.get("search")
    assert by_cli.extra.get("target") == by_keywords.extra.get("target") == \
        by_request.extra.get("target")
    if "shortlist" in options:  # the candidates scored by their loss: as many as asked
        rows = by_cli.extra["search"]
        asked = len(rows) if options["shortlist"] == "all" else options["shortlist"]
        assert len(rows) > 1 and sum(r["scored"] for r in rows) == asked


def test_an_in_memory_prune_makes_the_plan_the_api_makes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fxsym prune MODEL --target-non-embedding-params N`` (a model in memory with a stack
    of blocks: the search, on copies of its example inputs, integer ids kept) keeps what
    :func:`fxsym.search.search` keeps for the same request in Python."""
    from fxsym.prune.search import search

    model = tiny_llama()
    sm = fxsym.analyze(model)
    target = sum(p.numel() for p in model.parameters()) // 2
    checked = fxsym.PruneRequest(target_non_embedding_params=target, round_to=8).check()
    checked = checked.on_model(stack=bool(sm.depth_groups()))
    assert checked.searching and checked.target == (target, "non_embedding")
    by_api = search(model, sm, target_params=target, non_embedding=True, round_to=8,
                    batches=[sm.example_inputs] * checked.batches,
                    importance=checked.importance).plan
    out = tmp_path / "out"
    assert main(["prune", MODEL, "--target-non-embedding-params", str(target), "--round-to",
                 "8", "-o", str(out)]) == 0
    capsys.readouterr()
    by_cli = fxsym.prune.persist.read_manifest(out)["plan"]
    assert by_cli.choices() == by_api.choices()
    assert by_cli.extra["target"] == by_api.extra["target"]


def _tree(root: Path) -> list[tuple[str, bytes | str | None]]:
    """Every path under ``root``, with a file's bytes and a link's target."""
    out: list[tuple[str, bytes | str | None]] = []
    for p in sorted(root.rglob("*")):
        what = (str(p.readlink()) if p.is_symlink() else p.read_bytes() if p.is_file()
                else None)
        out.append((str(p.relative_to(root)), what))
    return out


@pytest.mark.parametrize("case", ["input", "inside", "file", "link", "not-empty"])
def test_every_path_refuses_an_output_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            case: str) -> None:
    """``-o``/``output`` and ``--force``/``force`` are the request's: the input itself, a
    folder inside it (both even with force), a file, a link, and a directory holding files
    without force are refused by the request's check, by ``fxsym prune`` (a checkpoint and a
    model in memory) and by ``prune_checkpoint`` (a request, keyword arguments) alike, before
    anything is written; ``prune_checkpoint``'s keywords, which replaced a directory holding
    files without being told to, still do, with a DeprecationWarning giving the refusal."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    out = {"input": src, "inside": src / "pruned"}.get(case, tmp_path / "out")
    if case == "file":
        out.write_bytes(b"mine")
    elif case == "link":
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    elif case == "not-empty":
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    force = True if case != "not-empty" else None
    options: dict[str, Any] = dict(ratio=0.3, importance="l2")
    before = _tree(tmp_path)
    request = fxsym.PruneRequest(checkpoint=True, source=src, output=out, force=force,
                                 **options)
    asked, in_flags = _refusal(request), _refusal(request, FLAGS)
    assert type(asked) is fxsym.CheckpointError is type(in_flags)
    with pytest.raises(FxsymError) as by_request:
        fxsym.prune_checkpoint(src, out, request=fxsym.PruneRequest(
            checkpoint=True, force=force, **options))
    assert type(by_request.value) is type(asked) and str(by_request.value) == str(asked)
    force_flag = ["--force"] if force else []
    line = _cli_line(capsys, [str(src), *_argv(options), *force_flag], out)
    assert line == f"fxsym: {type(asked).__name__}: {in_flags}"
    if case not in ("input", "inside"):  # a model in memory has no input directory
        in_memory = fxsym.PruneRequest(source=MODEL, output=out, force=force, **options)
        asked_model = _refusal(in_memory)
        assert str(asked_model) == str(asked)  # the same rule, the same words
        line = _cli_line(capsys, [MODEL, *_argv(options), *force_flag], out)
        assert line == f"fxsym: {type(asked).__name__}: {_refusal(in_memory, FLAGS)}"
    assert _tree(tmp_path) == before
    if case != "not-empty":
        with pytest.raises(FxsymError) as by_keywords:
            fxsym.prune_checkpoint(src, out, force=True, **options)
        assert type(by_keywords.value) is type(asked)
        assert str(by_keywords.value) == str(asked)
        assert _tree(tmp_path) == before
        return
    with pytest.warns(DeprecationWarning, match=re.escape(str(asked))):
        by_keywords = fxsym.prune_checkpoint(src, out, **options)
    assert not (out / "mine.txt").exists()  # replaced whole, as before
    assert by_keywords.choices() == fxsym.prune.persist.read_manifest(out)["plan"].choices()


def test_force_replaces_an_output_alike_by_the_flags_and_the_keywords(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--force`` and ``force=True`` replace a directory holding files whole, with the same
    plan, and no warning."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    plans = []
    for how in ("cli", "keywords"):
        out = tmp_path / how
        out.mkdir()
        (out / "mine.txt").write_text("mine")
        if how == "cli":
            assert main(["prune", str(src), "--ratio", "0.3", "--importance", "l2", "-o",
                         str(out), "--force"]) == 0
            capsys.readouterr()
            plans.append(fxsym.prune.persist.read_manifest(out)["plan"])
        else:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                plans.append(fxsym.prune_checkpoint(src, out, ratio=0.3, importance="l2",
                                                    force=True))
        assert not (out / "mine.txt").exists()
    assert plans[0].choices() == plans[1].choices()


@pytest.mark.parametrize("options", [
    dict(param_ratio=0.3, round_to=8, scope="global"),
    dict(target_non_embedding_params=60000, scope="uniform"),
    dict(layers=(0, 2), ratio=0.25, scope="global"),
    dict(sizes={"ffn": 96}),
], ids=["param-ratio", "non-embedding-uniform", "layers-and-ratio", "sizes"])
def test_fxsym_plan_makes_the_plan_of_the_no_search_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any]) -> None:
    """``fxsym.plan`` and ``fxsym prune MODEL --no-search`` with the same options (l2, a tiny
    llama with a stack of blocks, built alike) keep the same units and blocks, and count
    ``param_ratio`` alike (a target of the rest of the model's parameters). The scope is
    given: left out, ``fxsym.plan``'s is global and the command line's uniform for a target
    on a model with a stack of blocks (docs/cli.md)."""
    from fxsym.prune.search import sizes_for

    model = tiny_llama()
    sm = fxsym.analyze(model)
    given = dict(options)
    if "sizes" in given:
        given["sizes"] = sizes_for(sm, **given["sizes"])
    by_api = fxsym.plan(model, sm, importance="l2", **given)
    out = tmp_path / "out"
    assert main(["prune", MODEL, "--no-search", "--importance", "l2", *_argv(options), "-o",
                 str(out)]) == 0
    capsys.readouterr()
    by_cli = fxsym.prune.persist.read_manifest(out)["plan"]
    assert by_cli.choices() == by_api.choices()
    assert by_cli.params_after == by_api.params_after
    if "param_ratio" in options:
        before = sum(p.numel() for p in model.parameters())
        assert by_api.params_after <= int(before * 0.7)
