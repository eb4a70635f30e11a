"""A fingerprint of the analysis over the zoos, and what changed between two fingerprints.

    python benchmarks/fingerprint.py --out fp.json [--only torchvision|hf] [--models a,b]
    python benchmarks/fingerprint.py --compare before.json after.json

Record one before a change (on main's commit) and one after it, then compare: per model, the
groups added or removed, the members a group gained or lost, changes to a group's size, unit,
sortability or ``same_size``, the symbols whose segments changed (a group became constant, a
constant reason changed), the trace-report lines added or removed and the nodes whose value
metadata changed. A model that failed to analyze records its error, so a new failure shows
too. Run it under ``nice`` on a shared machine: the whole zoo takes a while.

The zoos are the torchvision classification models (:func:`_common.zoo_names`, inputs of
:func:`_common.input_size`) and the Hugging Face tiny configs of ``tests/hf/conftest.py``
(``CONFIGS``, built by its ``build``: random weights, nothing downloaded; analyzed without
example inputs, as the hf plugin supplies them). Models are keyed ``tv:<name>`` and
``hf:<model_type>``.

Per model the fingerprint holds:

* ``groups``: name -> size, unit, sortable, ``same_size`` and the sorted members;
* ``symbols``: every symbol the traced graph reached -> its dimension's segments, each
  ``"<units>"`` (fixed), ``"<group>*<units>x<block>"`` (a searchable group) or
  ``"const*<units>x<block>: <reason>"`` (a constant group and why it is constant);
* ``report``: every trace-report line (details included: ``TraceReport.entries``);
* ``nodes``: every graph node -> ``"<op> <target> -> <value>"``, the value being the node's
  ``meta["val"]`` (shape, dtype and strides of a tensor; an int; containers element by
  element).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import input_size, track, zoo_names

import fxsym

ROOT = Path(__file__).resolve().parent.parent


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
                f"/{list(value.stride())}")
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (bool, int, float, str, torch.dtype, torch.device)) or value is None:
        return repr(value)
    return type(value).__name__


def fingerprint(sm: fxsym.SymMap) -> dict[str, Any]:
    """The fingerprint of one analyzed model (see the module docstring)."""
    analysis = sm.analysis
    assert analysis is not None
    names = {g.id: g.name for g in analysis.groups}
    table = analysis.table

    def segment(seg: Any) -> str:
        if seg.group is None:
            return str(seg.units)
        root = table.find(seg.group)
        if root in names:
            return f"{names[root]}*{seg.units}x{seg.block}"
        return f"const*{seg.units}x{seg.block}: {table.reason(seg.group)}"

    groups = {g.name: {"size": g.size, "unit": g.unit, "sortable": g.is_sortable,
                       "same_size": sorted(g.same_size),
                       "members": sorted(f"{q}:{s}" for q, s in g.members)}
              for g in analysis.groups}
    symbols = {f"{q}:{s}": [segment(seg) for seg in segs]
               for (q, s), segs in sorted(analysis.symbol_dims.items())}
    nodes = {}
    if sm.graph_module is not None:
        for node in sm.graph_module.graph.nodes:
            target = node.target if isinstance(node.target, str) else getattr(
                node.target, "__name__", str(node.target))
            nodes[node.name] = f"{node.op} {target} -> {_describe(node.meta.get('val'))}"
    report = [str(e) for e in sm.trace_report.entries]
    return {"groups": groups, "symbols": symbols, "report": report, "nodes": nodes}


def _torchvision(names: list[str] | None) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    import torchvision

    for name in names if names is not None else zoo_names():
        def run(name: str = name) -> dict[str, Any]:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None).eval()
            size = input_size(name)
            torch.manual_seed(0)
            x = (torch.randn(1, 3, size, size),)
            return fingerprint(fxsym.analyze(model, example_inputs=x))
        yield f"tv:{name}", run


def _hf_configs() -> Any:
    spec = importlib.util.spec_from_file_location("_hf_conftest",
                                                  ROOT / "tests" / "hf" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    for folder in ("tests", "tests/hf"):  # what pytest puts on the path for it (ckpt_helpers)
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))
    spec.loader.exec_module(module)
    return module


def _hf(names: list[str] | None) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    conftest = _hf_configs()
    for name in names if names is not None else list(conftest.CONFIGS):
        def run(name: str = name) -> dict[str, Any]:
            return fingerprint(fxsym.analyze(conftest.build(name)))
        yield f"hf:{name}", run


def record(out: Path, only: str | None, models: list[str] | None) -> None:
    fxsym.load_plugins()
    torch.set_num_threads(2)
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if only in (None, "torchvision"):
        tv = None if models is None else [m for m in models if not m.startswith("hf:")]
        if tv is None or tv:
            jobs += _torchvision(None if tv is None else [m.removeprefix("tv:") for m in tv])
    if only in (None, "hf"):
        hf = None if models is None else [m.removeprefix("hf:") for m in models
                                          if m.startswith("hf:") or only == "hf"]
        if hf is None or hf:
            jobs += _hf(hf)
    result: dict[str, Any] = {}
    for key, run in track(jobs, description="fingerprint",
                           label=lambda job: job[0]):
        try:
            result[key] = run()
        except Exception as exc:  # a failure is part of the fingerprint
            result[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    out.write_text(json.dumps({"fxsym": fxsym.__file__, "models": result}, indent=1,
                              sort_keys=True))
    failed = sum("error" in v for v in result.values())
    print(f"{len(result)} models ({failed} failed) -> {out}")


def _diff_sets(label: str, a: set[str], b: set[str]) -> list[str]:
    return [f"  - {label} {x}" for x in sorted(a - b)] + [f"  + {label} {x}"
                                                           for x in sorted(b - a)]


def compare_model(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What changed from fingerprint ``a`` to ``b`` of one model, one line per change."""
    if "error" in a or "error" in b:
        if a.get("error") == b.get("error"):
            return []
        return [f"  - error {a.get('error')}", f"  + error {b.get('error')}"]
    lines = _diff_sets("group", set(a["groups"]), set(b["groups"]))
    for name in sorted(set(a["groups"]) & set(b["groups"])):
        ga, gb = a["groups"][name], b["groups"][name]
        for field in ("size", "unit", "sortable", "same_size"):
            if ga[field] != gb[field]:
                lines.append(f"  ~ group {name} {field}: {ga[field]} -> {gb[field]}")
        lines += _diff_sets(f"member of {name}:", set(ga["members"]), set(gb["members"]))
    for key in sorted(set(a["symbols"]) | set(b["symbols"])):
        sa, sb = a["symbols"].get(key), b["symbols"].get(key)
        if sa != sb:
            lines.append(f"  ~ symbol {key}: {sa} -> {sb}")
    lines += _diff_sets("report", set(a["report"]), set(b["report"]))
    for key in sorted(set(a["nodes"]) | set(b["nodes"])):
        na, nb = a["nodes"].get(key), b["nodes"].get(key)
        if na != nb:
            lines.append(f"  ~ node {key}: {na} -> {nb}")
    return lines


def compare(path_a: Path, path_b: Path) -> int:
    a = json.loads(path_a.read_text())["models"]
    b = json.loads(path_b.read_text())["models"]
    changed = 0
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            print(f"{key}: only in {path_a if key in a else path_b}")
            continue
        lines = compare_model(a[key], b[key])
        if lines:
            changed += 1
            print(f"{key}: {len(lines)} changes")
            print("\n".join(lines))
    print(f"{changed} of {len(set(a) & set(b))} models changed")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="where to write the fingerprint (JSON)")
    parser.add_argument("--only", choices=["torchvision", "hf"], help="one zoo only")
    parser.add_argument("--models", help="comma-separated: torchvision names, hf:<model_type>"
                        " (or plain model types with --only hf)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                        help="print what changed from fingerprint A to fingerprint B")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if args.out is None:
        parser.error("--out or --compare is required")
    record(args.out, args.only, args.models.split(",") if args.models else None)


if __name__ == "__main__":
    main()
