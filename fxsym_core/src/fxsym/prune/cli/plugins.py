"""``fxsym plugins``: the plugins installed and what each contributed (a rich table at a
terminal, plain text otherwise), the inactive ones with why; ``--trace``, every hook call while
the built-in demo model is analyzed.

What a plugin declares (:mod:`fxsym.declarations`: its analysis options and size options, the
flags it adds to ``fxsym analyze`` and ``fxsym prune``) is listed whole, as flags, under it:
the other contributions are shortened to their first six. The command line builds those flags
before any plugin is loaded, from the distributions' ``fxsym.declarations`` entry points: a
plugin of a distribution whose entry point of that name declares otherwise (or is missing) is
said to (a ``without torch`` line), since its flags are then not the command line's.
"""

from __future__ import annotations

import argparse
from typing import Any

from ...declarations import GROUP, Declarations, installed_by_plugin


def cmd_plugins(args: argparse.Namespace) -> int:
    from ...plugins import load_plugins
    from ...plugins.analysis_options import declared_by_plugin
    from ...registry import get_registry
    from ..console import is_terminal

    pm = load_plugins()
    by_plugin = get_registry().contributions.by_plugin()
    by_hooks, torch_free = declared_by_plugin(pm), installed_by_plugin()
    declared = {name: _declared(name, by_hooks.get(name), torch_free.get(name),
                                name in pm.sources) for name in pm.plugin_names()}
    names = pm.plugin_names()
    if not names and not pm.failed:
        print("no fxsym plugins installed (try: pip install fxsym-plugins-nn)")
    if is_terminal():
        _plugins_table(pm, by_plugin, declared)
        names = []  # drawn above
    for name in names:
        src = pm.source(name)
        print(f"{name}  ({' '.join(filter(None, (src.distribution, src.version)))})")
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
        for kind, flags in declared[name].items():
            print(f"    {kind}: {flags}")
    for failure in pm.failed:
        where = "" if failure.during == "import" else f" (failed in {failure.during})"
        print(f"{failure.name}  ({failure.distribution})  INACTIVE{where}: {failure.error}")
    if args.trace:
        _trace_demo(pm)
    return 0


def _flags(declarations: Declarations | None) -> dict[str, str]:
    """``{kind: flags}`` of what a plugin declares: its analysis options as
    ``--flag value|value`` (the default first), its size options as ``--flag``."""
    if declarations is None:
        return {}
    flags = {"analysis options": ", ".join(f"{o.flag} {'|'.join(o.values)}"
                                           for o in declarations.analysis),
             "size options": ", ".join(o.flag for o in declarations.sizes)}
    return {kind: text for kind, text in flags.items() if text}


def _declared(name: str, hooks: Declarations | None, torch_free: Declarations | None,
              installed: bool) -> dict[str, str]:
    """``{kind: text}`` of what plugin ``name`` declares (:func:`_flags` of its ``hooks``), and
    where it is ``installed`` from a distribution whose :data:`GROUP` entry point ``name``
    (``torch_free``) declares otherwise, a ``without torch`` line saying so."""
    flags, read = _flags(hooks), _flags(torch_free)
    if not installed or flags == read:
        return flags
    if torch_free is None:
        said = (f"nothing: no {GROUP} entry point {name!r}, so fxsym prune --help and the "
                "command line lack these flags")
    else:
        said = (f"{'; '.join(f'{k}: {v}' for k, v in read.items()) or 'nothing'} (its {GROUP} "
                "entry point, what fxsym prune --help and the command line offer)")
    return {**flags, "without torch": said}


def _plugins_table(pm: Any, by_plugin: dict[str, dict[str, list[str]]],
                   declared: dict[str, dict[str, str]]) -> None:
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
        text = "\n".join([
            *(f"[bold]{kind}[/bold] ({len(items)}): " + escape(", ".join(items[:6]))
              + (", ..." if len(items) > 6 else "") for kind, items in contributed.items()),
            *(f"[bold]{kind}[/bold]: {escape(flags)}"
              for kind, flags in declared[name].items())])
        table.add_row(escape(name), escape(src.distribution), escape(str(src.version)),
                      text or "nothing")
    Console().print(table)


def _trace_demo(pm: Any) -> None:
    """Analyze the built-in demo model with every hook call traced (pluggy's tracer), the
    registrations collected again, and print the trace."""
    from ... import analyze
    from ...registry import get_registry
    from ..demo import demo_model

    lines: list[str] = []
    model, _ = demo_model()
    get_registry().invalidate()
    undo = pm.trace_hooks(lines.append)
    try:
        analyze(model)  # no inputs: the plugins' fxsym_example_inputs is asked too
    finally:
        undo()
    print("\nhook calls while analyzing the built-in demo model (fxsym.prune.demo.DemoNet):")
    print("".join(lines), end="")
