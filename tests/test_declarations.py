"""What plugins declare as data (:mod:`fxsym.declarations`), read on its two paths: the
torch-free ``fxsym.declarations`` entry points (``fxsym prune --help``, before any plugin is
loaded) and the loaded plugins' hooks.

Each test installs a third party's distribution on the fly (a ``*.dist-info`` directory with
its ``entry_points.txt`` on ``PYTHONPATH``) and runs a fresh interpreter, so the entry points
are read as an installed distribution's are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _distribution(where: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """A distribution ``name`` installed under ``where``: its metadata, its entry points and
    its modules."""
    info = where / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, text in modules.items():
        (where / f"{module}.py").write_text(text)


def _run(code: str, where: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(where), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=300, env=env)


_BOTH_PATHS = """
import json, sys
import fxsym
from fxsym.declarations import declared, installed

said = {}
try:
    installed()
except fxsym.AnalysisError as exc:
    said["entry points"] = str(exc)
said["torch imported"] = "torch" in sys.modules
fxsym.load_plugins()
try:
    declared()
except fxsym.AnalysisError as exc:
    said["hooks"] = str(exc)
print(json.dumps(said))
"""

_HELP = """
import sys
from fxsym.prune.cli import main
try:
    print("exit", main(["prune", "--help"]))
except SystemExit as exc:
    print("exit", exc.code)
"""


@pytest.mark.parametrize(("hook", "answer", "says"), [
    ("fxsym_size_options", "['levels']",
     "answers fxsym_size_options with a sequence holding a str ('levels'), not a sequence of "
     "SizeOption"),
    ("fxsym_analysis_options", "{'name': 'levels'}",
     "answers fxsym_analysis_options with a dict ({'name': 'levels'}), not a sequence of "
     "AnalysisOption"),
])
def test_a_declaration_of_the_wrong_type_is_refused_alike_on_both_paths(
        tmp_path: Path, hook: str, answer: str, says: str) -> None:
    """A third party's distribution whose declaration answers something else than a sequence
    of its hook's type: the torch-free entry point (``installed()``, torch not imported) and
    the loaded plugin's hook (``declared()`` once the plugins are loaded) refuse it with the
    same :class:`~fxsym.errors.AnalysisError`, naming the plugin and its distribution;
    ``fxsym prune --help`` says it as one line (before: the entry point's answer was dropped
    without a word, the hook's refused)."""
    _distribution(tmp_path, "wrong-decl",
                  "[fxsym]\nwrongdecl = wrong_decl_hooks\n"
                  "[fxsym.declarations]\nwrongdecl = wrong_decl\n",
                  {"wrong_decl": f"def {hook}():\n    return {answer}\n",
                   "wrong_decl_hooks": "import fxsym\nimport wrong_decl\n\n@fxsym.hookimpl\n"
                                       f"def {hook}():\n    return wrong_decl.{hook}()\n"})
    done = _run(_BOTH_PATHS, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    expected = (f"fxsym plugin 'wrongdecl' (distribution 'wrong-decl') {says}: make it answer "
                f"fxsym.declarations.{'SizeOption' if 'size' in hook else 'AnalysisOption'} "
                "values, or leave the plugin out (FXSYM_PLUGINS)")
    assert said == {"entry points": expected, "torch imported": False, "hooks": expected}
    done = _run(_HELP, tmp_path)
    assert done.stdout.strip() == "exit 2"
    assert done.stderr.strip() == f"fxsym: AnalysisError: {expected}"


_READ_AGAIN = """
import json, sys
from pathlib import Path
from fxsym.declarations import installed, rescan

where = Path(sys.argv[1])
module = "def fxsym_size_options():\\n    from fxsym.declarations import SizeOption\\n" \\
         "    return (SizeOption({name!r}, 'channels of every level'),)\\n"

def install(name):
    info = where / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: {name}\\nVersion: 0.1\\n")
    (info / "entry_points.txt").write_text(f"[fxsym.declarations]\\n{name} = {name}_decl\\n")
    (where / f"{name}_decl.py").write_text(module.format(name=name))

def sizes():
    return [o.name for o in installed().sizes if o.name in ("levels", "depths")]

seen = [sizes()]
install("levels")
seen.append(sizes())  # the scan of this process is kept
rescan()
seen.append(sizes())
install("depths")
seen.append(sizes())
import fxsym
fxsym.load_plugins(rescan=True)
seen.append(sizes())
print(json.dumps(seen))
"""


def test_the_entry_points_are_read_once_per_process_until_a_rescan(tmp_path: Path) -> None:
    """``installed()`` scans and loads the ``fxsym.declarations`` entry points once per
    process (each call rescanned them before, ~8 ms each, several per ``fxsym prune
    --help``): a distribution installed meanwhile is seen after ``rescan()`` or
    ``fxsym.load_plugins(rescan=True)``, as the plugin loader's own scan is (before: at the
    next call, so the second list already held ``levels``)."""
    done = _run(_READ_AGAIN, tmp_path, str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [[], [], ["levels"], ["levels"], ["depths", "levels"]]


_HOOKS = """import fxsym
from fxsym.declarations import SizeOption


@fxsym.hookimpl
def fxsym_size_options():
    return tuple(SizeOption(name, "channels of every " + name) for name in {names!r})
"""


def test_fxsym_plugins_says_where_the_command_line_lacks_a_plugins_flags(
        tmp_path: Path) -> None:
    """The command line builds its flags from the ``fxsym.declarations`` entry points, before
    any plugin is loaded: ``fxsym plugins`` says under a plugin whose distribution has no such
    entry point (``levels``), or one declaring otherwise (``depths``: ``--depths`` there,
    ``--depths, --widths`` in its hooks), what the command line offers; and ``fxsym prune
    --help`` indeed lacks those flags. The nn and hf plugins, whose entry points declare what
    their hooks do, get no such line."""
    _distribution(tmp_path, "levels-plugin", "[fxsym]\nlevels = levels_hooks\n",
                  {"levels_hooks": _HOOKS.format(names=("levels",))})
    _distribution(tmp_path, "depths-plugin",
                  "[fxsym]\ndepths = depths_hooks\n[fxsym.declarations]\ndepths = depths_decl\n",
                  {"depths_hooks": _HOOKS.format(names=("depths", "widths")),
                   "depths_decl": "from fxsym.declarations import SizeOption\n\n\n"
                                  "def fxsym_size_options():\n"
                                  "    return (SizeOption('depths', 'blocks of every stage'),)\n"})
    done = _run("from fxsym.prune.cli import main; raise SystemExit(main(['plugins']))",
                tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    blocks: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("    "):
            block = blocks[line.split()[0]] = []
        block.append(line.strip())
    assert blocks["levels"][0] == "levels  (levels-plugin 0.1)"
    assert blocks["levels"][-2:] == [
        "size options: --levels",
        "without torch: nothing: no fxsym.declarations entry point 'levels', so fxsym prune "
        "--help and the command line lack these flags"]
    assert blocks["depths"][-2:] == [
        "size options: --depths, --widths",
        "without torch: size options: --depths (its fxsym.declarations entry point, what fxsym "
        "prune --help and the command line offer)"]
    assert not any(line.startswith("without torch") for name in ("nn", "hf")
                   for line in blocks.get(name, []))
    done = _run(_HELP, tmp_path)
    assert done.stdout.strip().endswith("exit 0") and "--depths" in done.stdout
    assert "--levels" not in done.stdout and "--widths" not in done.stdout
