"""The workflow's rooms moved into ``fxsym.prune`` (issue 32 §1); their old paths still import.

``import fxsym.checkpoint`` (or ``fxsym.cli.parser``, ...) gives the module at the new path,
the same object, with a DeprecationWarning naming the new path; ``python -m fxsym.cli`` runs the
command; the facade's names (``fxsym.plan``, ``fxsym.importance``, ...) do not warn. The imports
run in one fresh interpreter (:func:`fresh`), so no earlier import hides a first one's warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fxsym
from fxsym._moved import MOVED
from fxsym.prune.cli import main

ROOT = Path(__file__).resolve().parents[1]

OLD = [f"fxsym.{r}" for r in MOVED] + ["fxsym.cli.parser", "fxsym.planning.data"]

_SCRIPT = f"""
import importlib, json, sys, warnings
out = {{}}
with warnings.catch_warnings(record=True) as seen:  # the facade first: nothing to warn
    warnings.simplefilter('always')
    import fxsym, fxsym.prune.importance, fxsym.prune.planning, fxsym.prune.checkpoint
    import fxsym.prune.persist, fxsym.prune.depth, fxsym.prune.search
    from fxsym import importance, depth, search
    p = fxsym.prune
    out['facade'] = [importance is p.importance, depth is p.depth, search is p.search,
                     fxsym.plan is p.planning.plan, fxsym.Plan is p.planning.Plan,
                     fxsym.prune_checkpoint is p.checkpoint.prune_checkpoint,
                     fxsym.save is p.persist.save, fxsym.load is p.persist.load]
out['facade warnings'] = [str(w.message) for w in seen]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter('always')
    read = fxsym.persist.read_manifest  # before any old path is imported
out['attribute'] = [read is p.persist.read_manifest, [str(w.message) for w in seen]]
for name in {OLD!r}:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        module = importlib.import_module(name)
    new = name.replace('fxsym.', 'fxsym.prune.', 1)
    out[name] = [module is sys.modules[new], module.__name__,
                 [(w.category.__name__, str(w.message)) for w in seen]]
sys.modules.pop('fxsym.checkpoint')  # imported again: warns again, the same module
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter('always')
    from fxsym.checkpoint import CheckpointReader
out['class'] = [CheckpointReader is p.checkpoint.CheckpointReader,
                CheckpointReader.__module__,
                [(w.filename, w.lineno, str(w.message)) for w in seen]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh() -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=300, check=True)
    found: dict[str, Any] = json.loads(res.stdout)
    return found


def test_every_old_path_is_the_new_module_with_a_deprecation_warning(
        fresh: dict[str, Any]) -> None:
    """Each moved room (and a submodule of each moved package) imports by its old name as
    the very module at ``fxsym.prune.<room>``; one DeprecationWarning per old name, naming the
    new path."""
    for name in OLD:
        same, module_name, warned = fresh[name]
        new = name.replace("fxsym.", "fxsym.prune.", 1)
        assert same and module_name == new, (name, module_name)
        assert [c for c, _ in warned] == ["DeprecationWarning"], (name, warned)
        assert warned[0][1].startswith(f"{name} moved to {new}; import it from there"), warned


def test_classes_are_one_object_by_either_path(fresh: dict[str, Any]) -> None:
    """A class imported by its old path is the class of the new path (isinstance, pickling
    by ``__module__`` agree); the warning points at the importing line."""
    same, module_name, warned = fresh["class"]
    assert same and module_name == "fxsym.prune.checkpoint.reader"
    line = _SCRIPT.splitlines().index("    from fxsym.checkpoint import CheckpointReader") + 1
    assert [(f, n) for f, n, _ in warned] == [("<string>", line)], warned
    assert warned[0][2].startswith("fxsym.checkpoint moved to fxsym.prune.checkpoint")


def test_a_moved_room_read_as_an_attribute_warns(fresh: dict[str, Any]) -> None:
    """``fxsym.persist.read_manifest`` (an attribute of ``fxsym`` once anything imported the
    old module) is still the new module's function, with the same warning."""
    same, warned = fresh["attribute"]
    assert same and len(warned) == 1
    assert warned[0].startswith("fxsym.persist moved to fxsym.prune.persist"), warned


def test_the_facade_names_do_not_warn(fresh: dict[str, Any]) -> None:
    """``fxsym.plan``, ``fxsym.importance``, ``fxsym.prune_checkpoint``, ``fxsym.save`` ... are
    the public API: the objects of ``fxsym.prune``, no warning."""
    assert fresh["facade"] == [True] * 8
    assert fresh["facade warnings"] == []


def test_the_command_runs_from_its_new_and_old_paths() -> None:
    """The console script names ``fxsym.prune.cli:main``; ``python -m fxsym.prune.cli`` and the
    deprecated ``python -m fxsym.cli`` run the command."""
    assert 'fxsym = "fxsym.prune.cli:main"' in (ROOT / "fxsym_core/pyproject.toml").read_text()
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    for module in ("fxsym.prune.cli", "fxsym.cli"):
        res = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0 and res.stdout == f"fxsym {fxsym.__version__}\n", res
