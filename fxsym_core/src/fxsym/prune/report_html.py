"""A picture of an analysis: one self-contained HTML file, or a Graphviz DOT file.

Design. :func:`report_data` turns an analyzed :class:`~fxsym.SymMap` into plain data that
both outputs share, so the HTML page and the DOT file show the same picture:

- every node of the traced graph, with its shape, its inputs and the groups its symbols
  belong to (a ``call_module`` node through its module's symbols, a ``get_attr`` node through
  the parameter members it reads);
- a tree of *clusters* by module path, built by walking the nodes in graph order (a module's
  nodes are contiguous there, so each cluster is one box). Sibling clusters with a numeric
  name (``layers.0``, ``layers.1``, ...) whose nodes match an earlier sibling's, relative to
  their own path, are *repeated blocks*: they are collapsed and say which block they repeat.
  That keeps a 32-layer Llama or a ViT-B to one open block;
- the searchable groups (``sm.groups()``), then the *constant* groups: every group of the
  analysis' table that some symbol reaches but that is not searchable, with the reason the
  table gives (the first boundary it met) and the trace-report lines that recorded it (sizes
  that never were elastic candidates, a pooling's ``kernel_size``, only when ``verbose``, as
  the trace report's details); and the symbols whose size is fixed where it enters (a model
  input or a literal).

:func:`to_html` writes that data as JSON into one page with its own small CSS and
JavaScript (``report_assets/``): nothing is fetched when the page is viewed, and a
Content-Security-Policy forbids it. The browser lays the graph out: clusters are nested
``<details>`` boxes, nodes are rows in graph order, edges are arcs drawn in SVG beside them
(to the nearest visible row when a block is collapsed). A search box filters the group tables
and highlights the nodes of the groups it matches; clicking a group shows its members and,
for a constant group, why it is constant. :func:`to_dot` writes the same clusters for
Graphviz, a collapsed block as one node.

Each searchable group also shows the parameters and MACs it sizes: what the model would
hold and compute less with that group at zero units (:func:`fxsym.prune.planning.count_macs`,
:meth:`fxsym.paramlayout.ParamLayout.param_count`); ``None`` where the layout probe cannot tell.

Imports from fxsym: errors, importance, naming, planning, symbols.
"""

from __future__ import annotations

import colorsys
import html
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import fx

from ..errors import PlanError
from ..naming import qualname
from ..symbols import ATTRIBUTE_PREFIX, SymMap
from .importance import layout
from .planning import count_macs

__all__ = ["report_data", "to_dot", "to_html", "write_dot", "write_html"]

#: the colour of constant groups (the page draws them hatched)
CONSTANT_COLOR = "#b8b8b8"
#: fallback reason of a constant group the table recorded no boundary for
NO_PRODUCER = "no searchable producer feeds its group"


def _color(i: int) -> str:
    """A distinct colour for the ``i``-th searchable group (golden-angle hues)."""
    r, g, b = colorsys.hls_to_rgb((i * 0.381966) % 1.0, 0.62, 0.62)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "\u00d7".join(str(int(s)) for s in value.shape) or "scalar"
    if isinstance(value, (tuple, list)):
        parts = [_shape(v) for v in value[:4]]
        return "(" + ", ".join(parts) + (", ..." if len(value) > 4 else "") + ")"
    if value is None or isinstance(value, (int, float, bool)):
        return repr(value)
    return ""


def _label(node: fx.Node, module_types: dict[str, str]) -> str:
    if node.op == "call_module":
        target = str(node.target)
        kind = module_types.get(target)
        return f"{target.rsplit('.', 1)[-1]} ({kind})" if kind else target.rsplit(".", 1)[-1]
    if node.op == "call_function":
        name = getattr(node.target, "__name__", None)
        return name if isinstance(name, str) else qualname(node.target, module=False)
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "get_attr":
        return str(node.target).rsplit(".", 1)[-1]
    if node.op == "placeholder":
        return f"input {node.name}"
    return "output"


def _path(node: fx.Node) -> str:
    """The module path a node belongs to (a leaf module's node: its parent's path)."""
    stack = node.meta.get("nn_module_stack")
    path = ""
    if stack:
        key, value = list(stack.items())[-1]
        path = str(value[0]) if isinstance(value, tuple) and value else str(key)
    if node.op in ("call_module", "get_attr"):
        target = str(node.target)
        if not path or path == target:
            path = target.rpartition(".")[0]
    return path


@dataclass
class _Cluster:
    id: str
    path: str
    children: list[Any] = field(default_factory=list)  # node ids and clusters
    collapsed: bool = False
    same_as: str | None = None

    def node_ids(self) -> list[int]:
        out: list[int] = []
        for c in self.children:
            out.extend(c.node_ids() if isinstance(c, _Cluster) else [c])
        return out

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "collapsed": self.collapsed,
                "same_as": self.same_as, "count": len(self.node_ids()),
                "children": [c.to_json() if isinstance(c, _Cluster) else c
                             for c in self.children]}


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _build_tree(paths: list[str]) -> _Cluster:
    root = _Cluster("c0", "")
    stack, made = [root], 0
    for i, path in enumerate(paths):
        wanted = _ancestors(path)
        while len(stack) > 1 and stack[-1].path not in wanted:
            stack.pop()
        for p in wanted[len(stack) - 1:]:
            made += 1
            cluster = _Cluster(f"c{made}", p)
            stack[-1].children.append(cluster)
            stack.append(cluster)
        stack[-1].children.append(i)
    return root


def _iter_clusters(cluster: _Cluster) -> Any:
    yield cluster
    for c in cluster.children:
        if isinstance(c, _Cluster):
            yield from _iter_clusters(c)


_NUMBERED = re.compile(r"(.*?)\d+")


def _collapse_repeats(root: _Cluster, nodes: list[dict[str, Any]]) -> None:
    """Collapse numbered sibling blocks whose nodes repeat an earlier sibling's."""

    def signature(cluster: _Cluster) -> tuple[Any, ...]:
        prefix = cluster.path + "."

        def rel(p: str) -> str:
            return "" if p == cluster.path else p.removeprefix(prefix)

        return tuple((nodes[i]["op"], rel(nodes[i]["target"]), rel(nodes[i]["path"]),
                      nodes[i]["label"], nodes[i]["shape"]) for i in cluster.node_ids())

    for cluster in _iter_clusters(root):
        first: dict[tuple[Any, ...], str] = {}
        for child in cluster.children:
            # numbered siblings: ``layers.3``, ``layer_3``
            if not isinstance(child, _Cluster):
                continue
            stem = _NUMBERED.fullmatch(child.path.rpartition(".")[2])
            if stem is None:
                continue
            sig = (stem.group(1), *signature(child))
            if sig in first:
                child.collapsed, child.same_as = True, first[sig]
            else:
                first[sig] = child.path


def _sized(sm: SymMap) -> dict[str, tuple[int, int]]:
    """Per searchable group: the parameters and MACs the model loses with it at zero units."""
    try:
        lay = layout(sm.model, sm)
        params = lay.param_count({})
        macs = count_macs(sm.model, sm)
        return {g.name: (params - lay.param_count({g.name: 0}),
                         macs - count_macs(sm.model, sm, {g.name: 0})) for g in sm.groups()}
    except PlanError:
        return {}


def report_data(sm: SymMap, *, title: str | None = None, verbose: bool = False
                ) -> dict[str, Any]:
    """What the HTML and DOT reports show, as plain JSON-ready data.

    Keys: ``title``, ``nodes`` (``id``, ``name``, ``op``, ``target``, ``label``, ``path``,
    ``shape``, ``groups``: group ids, ``inputs``: node ids), ``tree`` (nested clusters:
    ``path``, ``collapsed``, ``same_as``, ``count``, ``children``: node ids and clusters),
    ``groups`` (searchable, in ``sm.groups()`` order), ``constant`` (the constant groups,
    with ``reason`` and ``trace``: the trace-report lines behind it), ``fixed`` (symbols of
    a fixed size) and ``report`` (the trace-report lines). Sizes that never were elastic
    candidates (groups of module attributes only, a pooling's ``kernel_size``) and their
    trace-report lines are left out unless ``verbose``. A group is ``id``, ``name``,
    ``size``, ``unit``, ``sortable``, ``members`` (``"module.symbol"`` strings), ``params``
    and ``macs`` (what it sizes, searchable groups only; ``None`` if unknown) and ``color``.
    Raises ``ValueError`` when ``sm`` holds no analysis (call :func:`fxsym.analyze`).
    """
    analysis, gm = sm.analysis, sm.graph_module
    if analysis is None or gm is None:
        raise ValueError("the SymMap holds no analysis: build it with fxsym.analyze(model)")
    find = analysis.table.find
    entries = sm.trace_report.entries if verbose else list(sm.trace_report)

    # every group a symbol reaches, and the modules (or parameters) whose nodes show it
    members: dict[int, list[str]] = {}
    fixed: list[str] = []
    node_groups: dict[str, list[int]] = {}
    for (module, symbol), segs in analysis.symbol_dims.items():
        roots = list(dict.fromkeys(find(s.group) for s in segs if s.group is not None))
        if not roots:
            fixed.append(f"{module}.{symbol}")
        for r in roots:
            members.setdefault(r, []).append(f"{module}.{symbol}")
        target = module
        if (module, symbol) in analysis.param_members:
            target = f"{module}.{symbol.partition(':')[0]}" if module else symbol.partition(":")[0]
        shown = node_groups.setdefault(target, [])
        shown.extend(r for r in roots if r not in shown)

    sized = _sized(sm)
    groups: list[dict[str, Any]] = []
    for i, g in enumerate(sm.groups()):
        params, macs = sized.get(g.name, (None, None))
        groups.append({"id": g.id, "name": g.name, "size": g.size, "unit": g.unit,
                       "sortable": g.is_sortable, "routed": g.routed,
                       "min_size": g.min_size, "constant": False, "color": _color(i),
                       "members": [f"{m}.{s}" if m else s for m, s in g.members],
                       "params": params, "macs": macs, "reason": None, "trace": []})
    live = {g["id"] for g in groups}
    names = {g["name"] for g in groups}
    constant: list[dict[str, Any]] = []
    # a group of module attributes only, pinned by a detail line: never a tensor size
    details = {e.message for e in sm.trace_report.details} - {e.message for e in sm.trace_report}
    for root, keys in members.items():
        reason = analysis.table.reason(root) or NO_PRODUCER
        if root in live or (not verbose and reason in details and all(
                k.rpartition(".")[2].startswith(ATTRIBUTE_PREFIX) for k in keys)):
            continue
        name = keys[0]
        k = 2
        while name in names:
            name, k = f"{keys[0]} #{k}", k + 1
        names.add(name)
        constant.append({
            "id": root, "name": name, "size": analysis.table.units[root], "unit": 1,
            "sortable": False, "constant": True, "color": CONSTANT_COLOR, "members": keys,
            "reason": reason, "trace": [str(e) for e in entries if e.message == reason]})

    listed = {g["id"] for g in [*groups, *constant]}
    module_types = {name: type(m).__name__ for name, m in gm.named_modules()}
    graph_nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(graph_nodes)}
    nodes = []
    for i, n in enumerate(graph_nodes):
        target = str(n.target) if n.op in ("call_module", "get_attr", "call_method") else ""
        nodes.append({
            "id": i, "name": n.name, "op": n.op, "target": target, "label": _label(n, module_types),
            "path": _path(n), "shape": _shape(n.meta.get("val", "")),
            "groups": [r for r in node_groups.get(target, []) if r in listed] if target else [],
            "inputs": [index[a] for a in n.all_input_nodes if a in index]})
    tree = _build_tree([n["path"] for n in nodes])
    _collapse_repeats(tree, nodes)
    return {
        "title": title or type(sm.model).__name__,
        "nodes": nodes, "tree": tree.to_json(), "groups": groups, "constant": constant,
        "fixed": fixed, "report": [str(e) for e in entries],
    }


def _asset(name: str) -> str:
    return resources.files(__package__ or "fxsym.prune").joinpath(
        "report_assets", name).read_text(encoding="utf-8")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fxsym: {title}</title>
<style>{css}</style></head>
<body>
<header><h1>fxsym: {title}</h1><span id="summary"></span></header>
<main>
<section id="side">
<input id="search" type="search" placeholder="search groups (name or member)" autocomplete="off">
<div id="detail" hidden></div>
<h2>Searchable groups</h2>
<table id="groups"><thead><tr><th></th><th>name</th><th>size</th><th>unit</th>
<th>sortable</th><th>members</th><th>params</th><th>MACs</th></tr></thead><tbody></tbody></table>
<h2>Constant groups</h2>
<table id="constant"><thead><tr><th></th><th>name</th><th>size</th><th>why constant</th>
</tr></thead><tbody></tbody></table>
<h2>Fixed sizes</h2><p class="note">set where they enter: a model input or a literal</p>
<ul id="fixed"></ul>
<h2>Trace report</h2><pre id="report"></pre>
</section>
<section id="graph"><div id="canvas"><svg id="edges"></svg><div id="tree"></div></div></section>
</main>
<script type="application/json" id="data">{data}</script>
<script>{js}</script>
</body></html>
"""


def to_html(sm: SymMap, *, title: str | None = None, verbose: bool = False) -> str:
    """The report of an analyzed SymMap as one self-contained HTML page (see the module)."""
    data = report_data(sm, title=title, verbose=verbose)
    # every "<" as \u003c: no name in the data can start "</script", "<script" or "<!--",
    # which would end the data block or switch the HTML parser into an escaped state
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return _PAGE.format(title=html.escape(data["title"]), css=_asset("report.css"),
                        js=_asset("report.js"), data=payload)


def write_html(sm: SymMap, path: str | Path, *, title: str | None = None,
               verbose: bool = False) -> Path:
    """Write :func:`to_html` to ``path`` (UTF-8); returns the path."""
    out = Path(path)
    out.write_text(to_html(sm, title=title, verbose=verbose), encoding="utf-8")
    return out


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(sm: SymMap, *, title: str | None = None, verbose: bool = False) -> str:
    """The same picture for Graphviz: clusters by module path, nodes filled with their
    groups' colours, each collapsed repeated block as one node."""
    data = report_data(sm, title=title, verbose=verbose)
    color = {g["id"]: g["color"] for g in [*data["groups"], *data["constant"]]}
    shown: dict[int, str] = {}  # node id -> the DOT node that shows it
    lines = ["digraph fxsym {", f"  label={_dot_str(data['title'])};", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", '
             "fontname=Helvetica, fontsize=10];"]

    def emit(cluster: dict[str, Any], indent: str) -> None:
        for child in cluster["children"]:
            if isinstance(child, int):
                n = data["nodes"][child]
                shown[child] = f"n{child}"
                fills = [color[g] for g in n["groups"] if g in color][:4]
                style = ""
                if len(fills) > 1:
                    style = f', style="filled,striped", fillcolor="{":".join(fills)}"'
                elif fills:
                    style = f', fillcolor="{fills[0]}"'
                label = n["label"] + (f"\n{n['shape']}" if n["shape"] else "")
                lines.append(f"{indent}n{child} [label={_dot_str(label)}{style}];")
            elif child["collapsed"]:
                name = child["id"]
                for i in _dot_ids(child):
                    shown[i] = name
                label = f"{child['path']}\nsame as {child['same_as']} ({child['count']} nodes)"
                lines.append(f'{indent}{name} [label={_dot_str(label)}, shape=box3d, '
                             'style=filled, fillcolor="#eeeeee"];')
            else:
                lines.append(f"{indent}subgraph cluster_{child['id']} {{")
                lines.append(f"{indent}  label={_dot_str(child['path'])};")
                emit(child, indent + "  ")
                lines.append(f"{indent}}}")

    emit(data["tree"], "  ")
    edges: dict[tuple[str, str], None] = {}
    for n in data["nodes"]:
        for i in n["inputs"]:
            a, b = shown[i], shown[n["id"]]
            if a != b:
                edges[(a, b)] = None
    lines.extend(f"  {a} -> {b};" for a, b in edges)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_ids(cluster: dict[str, Any]) -> list[int]:
    out: list[int] = []
    for c in cluster["children"]:
        out.extend([c] if isinstance(c, int) else _dot_ids(c))
    return out


def write_dot(sm: SymMap, path: str | Path, *, title: str | None = None,
              verbose: bool = False) -> Path:
    """Write :func:`to_dot` to ``path``; returns the path."""
    out = Path(path)
    out.write_text(to_dot(sm, title=title, verbose=verbose), encoding="utf-8")
    return out
