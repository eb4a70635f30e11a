"""The rooms of the ``fxsym`` package import downward only (issue 10), in two layers (issue 32).

A *room* is a top-level module or subpackage of ``fxsym`` (``fxsym.analysis.context`` is in
room ``analysis``) or of ``fxsym.prune`` (``fxsym.prune.planning.data`` is in ``planning``).
The **kernel** is every room directly under ``fxsym/`` but ``prune``, the **workflow** every room
under ``fxsym/prune/``: read from the folders, each layer's rooms must be placed in its list
(:data:`KERNEL`, :data:`WORKFLOW`), and no kernel module imports the workflow.
:data:`ORDER` lists the rooms lowest first and :data:`ALLOWED` says which
rooms each one imports; a lower room never imports a higher one. Checked, with :mod:`ast`:
every import a module runs when it is imported — module level, class bodies, ``try`` and
``if`` blocks — except those under ``if TYPE_CHECKING:`` (annotations only). Imports inside
functions run later and may go anywhere (``cli`` imports most rooms that way, ``fxsym``'s
``__getattr__`` imports every room but errors on first use); two go upward today: a new
``SymMap`` holds an empty ``TraceReport`` (the tracer's), and the deprecated
``fxsym.paramlayout.probe_layout`` calls the layout oracle it moved to
(``fxsym.oracles.probe_layout``).

Adding an import to another room: add it to :data:`ALLOWED` if the room is lower; an upward
one means the shared piece belongs in a lower module (or in a function-level import, with a
reason, listed in :data:`EXCEPTIONS`).

Rooms also keep to themselves: no module reads or writes a private field (``x._name``) that
another module defines; see :func:`private_violations`.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import fxsym

PACKAGE = Path(fxsym.__file__).parent

#: the kernel's rooms (every module and subpackage directly under ``fxsym/`` but ``prune``),
#: lowest first
KERNEL = [
    "errors",      # the exception and warning classes
    "declarations",  # what plugins declare as data (options, sizes), read without torch
    "_moved",      # the old import paths of the rooms moved into fxsym.prune, deprecated
    "naming",      # how a class or callable is named
    "memo",        # answers remembered for one run (the plugins' repeated probes)
    "modstate",    # a module tree's state, captured and put back (trace, resize, passes)
    "plugins",     # hook specifications, the plugin manager, guarded hook calls
    "registry",    # user registrations + plugin contributions
    "symbols",     # Symbol, SymInfo, SymMap, SymGroup
    "tracer",      # the hook-driven tracer and its report
    "analysis",    # layouts, groups, op-rule context, analyze
    "resizing",    # the resize engine and its helpers
    "paramlayout",  # where each group's units lie in the parameters
    "oracles",     # permutation, shrink, value and layout oracles
    "passes",      # optimize: passes, patterns, verification
]

#: the workflow's rooms (every module and subpackage under ``fxsym/prune/``), lowest first;
#: ``prune`` is the package's ``__init__``
WORKFLOW = [
    "prune",       # the workflow's package: its docstring, no code
    "paths",       # what a path is, outputs overlapping inputs, the lock of an output
    "options",     # the rules of single pruning options, their spellings (no torch)
    "request",     # one prune request, its options checked together once (no torch)
    "console",     # tables and progress: rich at a terminal, plain text otherwise
    "phases",      # where a long call's time goes: its steps timed when asked
    "collector",   # the garbage collector skips the objects alive before a long run
    "spans",       # a safetensors tensor as a byte range, copied by the kernel
    "lockstep",    # batches run through a model together, held at the entry of its blocks
    "embeddings",  # which parameters are embedding tables (read by integer inputs)
    "importance",  # importance criteria
    "depth",       # block importance and the blocks a plan keeps
    "planning",    # fxsym.plan: the units to keep, parameter and MAC counts, Plan as data
    "shortlist",   # the search's damage estimate from the calibration pass; its shortlist
    "roles",       # what the groups are, as the plugins' fxsym_roles declare them
    "search",      # architecture sizes by role; the search for a parameter target
    "persist",     # fxsym.save / fxsym.load: safetensors weights + the plan
    "checkpoint",  # fxsym.prune_checkpoint: a checkpoint directory pruned, streamed
    "report_html",  # the HTML and DOT pictures of an analysis
    "demo",        # the demo model of ``fxsym analyze``
    "cli",         # the command line
]

#: lowest first: the kernel, the workflow on top, ``fxsym`` (the package's ``__init__``, the
#: public facade) last
ORDER = [*KERNEL, *WORKFLOW, "fxsym"]

#: the rooms each room imports when it is imported (what the code needs today)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "declarations": {"errors"},  # the plugins' hooks inside declared(), once loaded
    "_moved": set(),
    "naming": set(),
    "prune": set(),
    "paths": {"errors"},
    "options": {"errors"},
    "request": {"declarations", "errors", "options", "paths"},
    "console": set(),
    "phases": set(),
    "collector": set(),
    "memo": set(),
    "spans": {"errors"},
    "modstate": set(),
    "lockstep": {"errors"},
    "plugins": {"declarations", "errors"},
    "registry": {"errors", "naming", "plugins"},
    # the registry only inside functions; the registry and TraceReport for annotations
    "symbols": set(),
    "tracer": {"errors", "modstate", "plugins", "registry"},
    "analysis": {"errors", "modstate", "naming", "plugins", "registry", "symbols", "tracer"},
    "resizing": {"errors", "modstate", "plugins", "registry", "symbols"},
    "paramlayout": {"errors", "modstate", "resizing", "symbols"},
    "importance": {"errors", "paramlayout", "plugins", "symbols"},
    "depth": {"errors", "importance", "plugins", "symbols"},  # console inside a function
    "embeddings": {"symbols"},
    "planning": {"console", "depth", "embeddings", "errors", "importance", "options", "request",
                 "paramlayout", "plugins", "resizing", "symbols"},
    "shortlist": {"errors", "importance", "planning", "request", "symbols"},
    "roles": {"plugins", "symbols"},
    "search": {"console", "depth", "embeddings", "errors", "importance", "memo",
               "paramlayout", "planning", "plugins", "roles", "shortlist", "symbols"},
    "persist": {"analysis", "depth", "errors", "modstate", "paths", "planning", "plugins",
                "symbols"},
    "checkpoint": {"analysis", "collector", "depth", "errors", "importance", "memo", "paths",
                   "persist", "phases", "planning", "plugins", "request", "search", "spans"},
    "oracles": {"analysis", "errors", "modstate", "paramlayout", "resizing", "symbols"},
    # the tracer only inside optimize()
    "passes": {"errors", "modstate", "naming", "plugins", "registry"},
    "report_html": {"errors", "importance", "naming", "planning", "symbols"},
    "demo": set(),
    # everything else inside its commands, so ``fxsym --help`` is fast
    "cli": {"declarations", "errors", "options", "request"},
    "fxsym": {"errors", "_moved"},  # every other name on first use, so ``import fxsym`` skips torch
}

#: justified upward imports: (room, imported room) -> reason. None today.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room(module: str) -> str:
    """The room of a module: ``fxsym.analysis.context`` is in ``analysis``,
    ``fxsym.prune.planning.data`` in ``planning``, ``fxsym.prune`` in ``prune``."""
    parts = module.split(".")
    if parts[1:2] == ["prune"] and len(parts) > 2:
        return parts[2]
    return parts[1] if len(parts) > 1 else parts[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_imports(module: str, modules: dict[str, Path] | None = None
                        ) -> list[tuple[int, str]]:
    """``(line, imported module)`` for each import ``module`` runs when it is imported
    (``modules``: the files by module name, :data:`MODULES` by default)."""
    modules = MODULES if modules is None else modules
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # ``from . import hookspecs`` imports a submodule
                    sub = f"{target}.{alias.name}"
                    found.append((node.lineno, sub if sub in modules else target))
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)
            # function bodies run later: not import-time imports

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def test_the_table_goes_downward() -> None:
    assert set(ORDER) == set(ALLOWED)
    rank = {r: i for i, r in enumerate(ORDER)}
    upward = [(r, d) for r, deps in ALLOWED.items() for d in deps
              if rank[d] >= rank[r] and (r, d) not in EXCEPTIONS]
    assert not upward, f"ALLOWED lets a room import itself or a higher room: {upward}"


def test_every_module_is_in_a_room() -> None:
    assert {room(m) for m in MODULES} <= set(ORDER)


def violations(modules: dict[str, Path] = MODULES) -> list[str]:
    """An import of a room that is not in its :data:`ALLOWED` (nor in :data:`EXCEPTIONS`)."""
    bad = []
    for module in modules:
        here = room(module)
        for line, imported in import_time_imports(module):
            if imported != "fxsym" and not imported.startswith("fxsym."):
                continue  # torch, the standard library, ...
            there = room(imported)  # ``from .. import analyze`` is the facade, room "fxsym"
            if there != here and there not in ALLOWED[here] and (here, there) not in EXCEPTIONS:
                bad.append(f"{modules[module].relative_to(PACKAGE.parent)}:{line} imports "
                           f"{imported} (room {here!r} may import "
                           f"{sorted(ALLOWED[here]) or 'no room'})")
    return bad


def rooms_on_disk(folder: Path) -> set[str]:
    """The rooms a folder holds: its modules and its packages (``__init__.py`` not a room)."""
    return ({p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
            | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()})


def test_the_layers_are_the_folders() -> None:
    """The kernel is every room directly under ``fxsym/`` but ``prune``, the workflow every
    room under ``fxsym/prune/``: a room on disk that its layer's list does not place (or a
    listed room no longer on disk) fails, so a new room must say where it goes."""
    kernel, workflow = rooms_on_disk(PACKAGE) - {"prune"}, rooms_on_disk(PACKAGE / "prune")
    assert kernel == set(KERNEL), (f"kernel rooms on disk but not in KERNEL: "
                                   f"{sorted(kernel - set(KERNEL))}; listed, not on disk: "
                                   f"{sorted(set(KERNEL) - kernel)}")
    assert workflow | {"prune"} == set(WORKFLOW), (
        f"workflow rooms on disk but not in WORKFLOW: {sorted(workflow - set(WORKFLOW))}; "
        f"listed, not on disk: {sorted(set(WORKFLOW) - workflow - {'prune'})}")


def test_the_kernel_imports_nothing_of_the_workflow() -> None:
    """No kernel module imports ``fxsym.prune`` (or the facade, which names it) when it is
    imported; its table allows no workflow room either."""
    assert all(ALLOWED[r] <= set(KERNEL) for r in KERNEL), {
        r: sorted(ALLOWED[r] - set(KERNEL)) for r in KERNEL if ALLOWED[r] - set(KERNEL)}
    bad = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {imported}"
           for m in MODULES if room(m) in KERNEL
           for line, imported in import_time_imports(m)
           if imported in ("fxsym", "fxsym.prune") or imported.startswith("fxsym.prune.")]
    assert not bad, "the kernel imports the workflow:\n" + "\n".join(bad)


def test_no_room_imports_a_room_it_may_not() -> None:
    bad = violations()
    assert not bad, "upward or unlisted imports:\n" + "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    fake = tmp_path / "fxsym" / "tracer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..passes import Pass\n"  # annotations only: fine
        "def f():\n    from ..cli import main\n"  # inside a function: not at import time
        "from .. import analyze\n"  # the facade: upward
        "from ..analysis import Analyzer\n"  # upward
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "fxsym")
    modules = {"fxsym.tracer": fake / "__init__.py"}
    monkeypatch.setitem(MODULES, "fxsym.tracer", fake / "__init__.py")
    assert [m for _, m in import_time_imports("fxsym.tracer")] == [
        "typing", "fxsym", "fxsym.analysis"]
    bad = violations(modules)
    assert len(bad) == 2 and "imports fxsym.analysis (room 'tracer'" in bad[1], bad


def test_every_module_imports_in_room_order() -> None:
    rank = {r: i for i, r in enumerate(ORDER)}
    for module in sorted(MODULES, key=lambda m: (rank[room(m)], m)):
        importlib.import_module(module)


#: rooms split into modules of one step each (issue 32 §4), and the order, lowest first, in
#: which their modules import one another (the ``__init__`` re-exports them all)
INSIDE: dict[str, list[str]] = {
    "fxsym.prune.checkpoint": ["reader", "calibration", "memory", "tensors", "cuts",
                               "streaming", "scores", "losses", "writing", "output", "run"],
    "fxsym.prune.search": ["sizes", "active", "results", "space", "losses", "run"],
    "fxsym_plugins_hf.configs": ["fields", "builds", "prober", "measuring", "inferred",
                                 "reasons", "update"],
}


def test_the_modules_inside_a_split_room_import_downward() -> None:
    """Inside a room listed in :data:`INSIDE`, every module on disk is listed and imports (when
    it is imported) only the modules listed before it."""
    for package, order in INSIDE.items():
        folder = Path(importlib.import_module(package).__file__ or "").parent
        files = {f"{package}.{p.stem}": p for p in folder.glob("*.py") if p.name != "__init__.py"}
        assert set(files) == {f"{package}.{m}" for m in order}, sorted(files)
        rank = {f"{package}.{m}": i for i, m in enumerate(order)}
        bad = [f"{m} imports {imported}" for m, i in rank.items()
               for _, imported in import_time_imports(m, {package: folder / "__init__.py",
                                                          **files})
               if imported in rank and rank[imported] >= i]
        assert not bad, f"upward imports inside {package}:\n" + "\n".join(bad)


# -- private fields stay in their module ----------------------------------------------------
# A module reads and writes only its own private fields: ``x._name`` (one leading underscore)
# where ``x`` is not ``self``/``cls`` must name something the same file defines (an attribute
# it assigns as ``self._name``/``cls._name``, a function or class, or a name assigned at module
# level or in a class body). ``getattr``/``setattr``/``hasattr``/``delattr`` with a literal
# private name count too. What another module needs gets a public name there.

#: private-looking names of other libraries' objects fxsym uses knowingly, allowed anywhere:
#: name -> why
FOREIGN_PRIVATE: dict[str, str] = {
    "_fields": "a NamedTuple's field names (public API despite the underscore)",
    "_replace": "a NamedTuple's copy with fields replaced (public API despite the underscore)",
    "_version": "torch.Tensor's version counter: the only way to see a write in place "
                "(the resize transaction)",
    "_base": "torch.Tensor's base of a view: the only way to see that an op's value is a view "
             "(of an input, or of a tensor made inside a module) before reusing it (tracer)",
}

#: ``(file, private name)`` used where the file does not define it -> reason
PRIVATE_EXCEPTIONS: dict[tuple[str, str], str] = {
    # torch's private fields, not another room's: a shallow copy of a module that shares its
    # tensors (passes) or holds meta copies of them (tracer) has no public torch API
    ("fxsym/passes/copying.py", "_parameters"): "nn.Module storage, shallow clone",
    ("fxsym/passes/copying.py", "_buffers"): "nn.Module storage, shallow clone",
    ("fxsym/passes/copying.py", "_modules"): "nn.Module storage, shallow clone",
    ("fxsym/passes/copying.py", "_non_persistent_buffers_set"): "nn.Module storage",
    ("fxsym/prune/cli/parser.py", "_actions"): "argparse's arguments: the only way to list a "
                                         "parser's options (the close match of an unknown one)",
    ("fxsym/resizing/helpers.py", "_forward_pre_hooks"): "nn.Module's pre-hooks: which "
        "of them computes a tensor a rule keeps entries of (no public reader)",
    ("fxsym/resizing/helpers.py", "_parameters"): "nn.Module storage: a tensor that is "
        "neither a parameter nor a buffer may be computed by a pre-hook",
    ("fxsym/resizing/helpers.py", "_buffers"): "nn.Module storage (as _parameters)",
    ("fxsym/tracer/meta.py", "_parameters"): "nn.Module storage, meta copy",
    ("fxsym/tracer/meta.py", "_buffers"): "nn.Module storage, meta copy",
    ("fxsym/tracer/meta.py", "_modules"): "nn.Module storage, meta copy",
    ("fxsym/tracer/memo.py", "_parameters"): "nn.Module storage: a torch.nn leaf's key",
    ("fxsym/tracer/memo.py", "_buffers"): "nn.Module storage: a torch.nn leaf's key",
    ("fxsym/tracer/memo.py", "_modules"): "nn.Module storage: a torch.nn leaf's key",
    ("fxsym/tracer/tracer.py", "_parameters"): "nn.Module storage: is it parametrized",
    ("fxsym/tracer/tracer.py", "_buffers"): "nn.Module storage: is it parametrized",
    ("fxsym/tracer/tracer.py", "_modules"): "nn.Module storage: is it parametrized",
    ("fxsym/tracer/assembly.py", "_parameters"): "nn.Module storage: the GraphModule built",
    ("fxsym/tracer/assembly.py", "_buffers"): "nn.Module storage: the GraphModule built",
    ("fxsym/tracer/assembly.py", "_modules"): "nn.Module storage: the GraphModule built",
    ("fxsym/tracer/assembly.py", "_non_persistent_buffers_set"): "nn.Module storage: a "
        "buffer the GraphModule holds stays as persistent as where it came from",
    ("fxsym/tracer/assembly.py", "_tracer_cls"): "torch.fx.Graph's tracer class, which a "
        "GraphModule keeps to be copied and pickled (no public reader)",
    ("fxsym/tracer/assembly.py", "_tracer_extras"): "torch.fx.Graph's tracer arguments, kept "
        "with _tracer_cls",
    ("fxsym/tracer/shadow.py", "_parameters"): "nn.Module storage, shadow sharing tensors",
    ("fxsym/tracer/shadow.py", "_buffers"): "nn.Module storage, shadow sharing tensors",
    ("fxsym/tracer/shadow.py", "_modules"): "nn.Module storage, shadow of the tree",
    ("fxsym/tracer/tracer.py", "_root"): "torch.fx.Graph's node list sentinel (rollback)",
    ("fxsym/tracer/attribute_sizes.py", "_root"): "torch.fx.Graph's node list sentinel (the "
        "newest node when a forward begins)",
    ("fxsym/tracer/finish.py", "_assert"): "torch._assert, the assert torch.fx records",
    ("fxsym/analysis/shared.py", "_parameters"): "nn.Module storage: a childless leaf's tensors",
    ("fxsym/analysis/shared.py", "_buffers"): "nn.Module storage: a childless leaf's tensors",
    ("fxsym/analysis/shared.py", "_modules"): "nn.Module storage: whether a leaf has children",
}

_ATTR_FUNCTIONS = {"getattr", "setattr", "hasattr", "delattr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module file defines (see the comment above)."""
    names: set[str] = set()

    def targets(node: ast.AST) -> list[ast.expr]:
        if isinstance(node, ast.Assign):
            return node.targets
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            return [node.target]
        return []

    def bound(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                bound(elt)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        for stmt in scope.body:
            for target in targets(stmt):
                bound(target)
    return {n for n in names if _is_private(n)}


def _private_uses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """``(line, name, source)`` of each private attribute used on an object other than
    ``self``/``cls``."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _ATTR_FUNCTIONS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            owner, name = node.args[0], node.args[1].value
        else:
            continue
        if not _is_private(name):
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append((node.lineno, name, ast.unparse(node)))
    return found


def private_violations(modules: dict[str, Path] = MODULES) -> list[str]:
    """Each use of a private name its file does not define (nor allowed above)."""
    bad = []
    for path in modules.values():
        where = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = _own_names(tree)
        for line, name, source in sorted(_private_uses(tree)):
            if name in own or name in FOREIGN_PRIVATE or (where, name) in PRIVATE_EXCEPTIONS:
                continue
            bad.append(f"{where}:{line} uses {source}, a private name {where} does not define")
    return bad


def test_no_module_uses_another_modules_private_fields() -> None:
    bad = private_violations()
    assert not bad, ("private fields used outside their module (give them a public name "
                     "there):\n" + "\n".join(bad))


def test_the_checker_sees_a_foreign_private_field(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fxsym" / "resizing"
    fake.mkdir(parents=True)
    (fake / "engine.py").write_text(
        "_LIMIT = 3\n"
        "class Plan:\n"
        "    _cache: dict = {}\n"
        "    def __init__(self):\n        self._steps = []\n"
        "    def _merge(self, other):\n"
        "        return other._steps, other._merge, Plan._cache, _LIMIT\n"  # all defined here
        "def run(symmap, t):\n"
        "    symmap.__class__, t._version\n"  # a dunder; an allowed foreign private
        "    symmap._table.find(0)\n"  # another module's private field
        "    setattr(symmap, '_stale', True)\n"  # the same, spelled as a string
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "fxsym")
    bad = private_violations({"fxsym.resizing.engine": fake / "engine.py"})
    assert [b.split(" uses ")[0] for b in bad] == ["fxsym/resizing/engine.py:10",
                                                   "fxsym/resizing/engine.py:11"], bad
    assert "symmap._table" in bad[0] and "'_stale'" in bad[1]


def _room_docstring(room: str) -> str:
    if room == "fxsym":
        path = PACKAGE / "__init__.py"
    else:
        base = PACKAGE / "prune" if room in WORKFLOW and room != "prune" else PACKAGE
        path = base / room / "__init__.py"
        if not path.exists():
            path = base / f"{room}.py"
    return ast.get_docstring(ast.parse(path.read_text())) or ""


@pytest.mark.parametrize("room", ORDER)
def test_each_room_says_what_it_imports(room: str) -> None:
    """The docstring's ``Imports from fxsym: a, b (...)`` names exactly :data:`ALLOWED`."""
    text = " ".join(_room_docstring(room).split())
    marker = "Imports from fxsym:"
    assert marker in text, f"the docstring of {room} does not say what it imports"
    said = text[text.index(marker) + len(marker):].split("(")[0].split(".")[0]
    names = {n.strip() for n in said.split(",")} - {"nothing", ""}
    assert names == ALLOWED[room], f"{room} says it imports {sorted(names)}"
