"""The front door of each distribution: what its wheel carries and what its README promises.

Each of the three distributions is built as a wheel the way ``pip install ./FOLDER`` builds it
(``pip wheel --no-deps``; without build isolation, so with the pinned setuptools and no
network), from a copy of its folder so that the checkout gains no ``build/`` or
``*.egg-info``. Its ``METADATA`` must say what a user reads before installing: the license
(``License-Expression``, the ``LICENSE`` file inside the wheel), a long description that is the
distribution's own README (not a pointer to another file), project URLs and classifiers.

What a README says about dependencies is what the metadata declares: the requirements listed
under its ``## Dependencies`` section (``### Installed with it``, ``### With the `X` extra``)
are the wheel's ``Requires-Dist``, name, version range and extra alike; and every package the
distribution's code imports (at module level or inside a function) is one of them, or listed
under ``### Used when present`` (imported only when installed, never installed by it).
The README's python blocks run in tests/test_docs.py.
"""

from __future__ import annotations

import ast
import email.parser
import functools
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: folder -> distribution name
DISTRIBUTIONS = {"fxsym_core": "fxsym", "fxsym_plugins_nn": "fxsym-plugins-nn",
                 "fxsym_plugins_hf": "fxsym-plugins-hf"}
FOLDERS = list(DISTRIBUTIONS)

#: (name, version range, extra or None): one requirement, comparable across spellings
Req = tuple[str, SpecifierSet, str | None]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each folder's wheel, built once for the module."""
    base = tmp_path_factory.mktemp("wheels")
    out: dict[str, Path] = {}
    for folder in FOLDERS:
        src = base / folder
        shutil.copytree(ROOT / folder, src, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__"))
        res = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "--disable-pip-version-check", "-w", str(base / "out"), str(src)],
            capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{folder} does not build:\n{res.stdout}\n{res.stderr}"
        name = DISTRIBUTIONS[folder].replace("-", "_")
        (out[folder],) = (base / "out").glob(f"{name}-*.whl")
    return out


def _dist_info(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (info,) = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(
            ".dist-info")}
    return info


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"{_dist_info(wheel)}/METADATA").decode("utf-8")
    return email.parser.Parser().parsestr(text)


def _readme(folder: str) -> str:
    return (ROOT / folder / "README.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a README (up to the next ``## ``)."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found is not None, f"no '## {heading}' section"
    return found.group(1)


def _listed(folder: str) -> dict[str, list[Requirement]]:
    """The requirements each ``###`` part of the README's dependency section lists: one per
    bullet, the requirement in the bullet's first code span."""
    parts: dict[str, list[Requirement]] = {}
    part = None
    for line in _section(_readme(folder), "Dependencies").splitlines():
        if line.startswith("### "):
            part = line[4:].strip()
            parts[part] = []
        elif line.startswith("- "):
            assert part is not None, f"{folder}: a dependency before any ### part: {line}"
            spans = re.findall(r"`([^`]+)`", line)
            assert spans and line.startswith(f"- `{spans[0]}`"), f"{folder}: {line}"
            parts[part].append(Requirement(spans[0]))
    return parts


def _key(req: Requirement, extra: str | None) -> Req:
    return canonicalize_name(req.name), req.specifier, extra


def _readme_requirements(folder: str) -> set[Req]:
    found: set[Req] = set()
    for part, reqs in _listed(folder).items():
        if part == "Installed with it":
            found |= {_key(r, None) for r in reqs}
        elif (extra := re.fullmatch(r"With the `([^`]+)` extra", part)) is not None:
            found |= {_key(r, extra.group(1)) for r in reqs}
        else:
            assert part == "Used when present", f"{folder}: unknown dependency part {part!r}"
    return found


def _declared(meta: Message) -> set[Req]:
    out: set[Req] = set()
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        extra = re.fullmatch(r'extra == "([^"]+)"', str(req.marker)) if req.marker else None
        assert req.marker is None or extra is not None, f"a marker other than an extra: {line}"
        out.add(_key(req, extra.group(1) if extra else None))
    return out


def _imported(folder: str) -> set[str]:
    """The top-level modules the distribution's code imports from outside itself and the
    standard library (every ``import``, at module level or not)."""
    names: set[str] = set()
    for path in (ROOT / folder / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    own = {p.name for p in (ROOT / folder / "src").iterdir() if p.is_dir()}
    return names - own - set(sys.stdlib_module_names) - {"__future__"}


@functools.cache
def _owners() -> dict[str, set[str]]:
    """Which installed distributions give each top-level module: their ``top_level.txt``, else
    the top of each file their ``RECORD`` lists (what ``packages_distributions`` does from
    Python 3.11; 3.10's reads ``top_level.txt`` only, which torch's wheel lacks)."""
    owners: dict[str, set[str]] = {}
    for dist in md.distributions():
        declared = (dist.read_text("top_level.txt") or "").split()
        tops = set(declared) or {f.parts[0].removesuffix(".py") for f in dist.files or []
                                 if len(f.parts) > 1 or f.suffix == ".py"}
        name = dist.metadata["Name"]
        for top in tops:
            if not top.endswith((".dist-info", ".data")) and top not in ("..", "__pycache__"):
                owners.setdefault(top, set()).add(name)
    return owners


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_wheel_carries_the_license(wheels: dict[str, Path], folder: str) -> None:
    """The Apache-2.0 text is in the wheel (PEP 639's ``.dist-info/licenses/``) and named by
    ``License-Expression`` and ``License-File``; each folder's copy is the repository's."""
    text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    assert (ROOT / folder / "LICENSE").read_bytes() == text
    wheel = wheels[folder]
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(f"{_dist_info(wheel)}/licenses/LICENSE") == text
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_long_description_is_the_distributions_own_readme(
        wheels: dict[str, Path], folder: str) -> None:
    """The description is the README of the folder, in markdown, and that README stands on its
    own: what it is, how to install it, its dependencies, an example, the license; no link a
    package index could not follow."""
    meta = _metadata(wheels[folder])
    assert meta["Description-Content-Type"] == "text/markdown"
    body = meta.get_payload()
    assert isinstance(body, str)
    readme = _readme(folder)
    assert body.strip() == readme.strip()
    assert readme.startswith(f"# {DISTRIBUTIONS[folder]}\n")
    for heading in ("Install", "Dependencies", "Example", "License"):
        _section(readme, heading)
    assert "```python\n" in _section(readme, "Example")
    assert "See the repository's README" not in readme
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert all(link.startswith("https://") for link in links), links


@pytest.mark.parametrize("folder", FOLDERS)
def test_project_urls_and_classifiers(wheels: dict[str, Path], folder: str) -> None:
    """Every wheel gives project URLs (the same ones) and classifiers, typed (``py.typed`` is
    in the wheel) and for the Python versions ``Requires-Python`` allows, from its lowest."""
    meta = _metadata(wheels[folder])
    urls = meta.get_all("Project-URL") or []
    assert {u.split(",")[0] for u in urls} >= {"Homepage", "Documentation", "Source", "Issues"}
    assert urls == _metadata(wheels["fxsym_core"]).get_all("Project-URL")
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Development Status :: 3 - Alpha" in classifiers
    with zipfile.ZipFile(wheels[folder]) as zf:
        assert any(n.endswith("/py.typed") for n in zf.namelist())
    versions = [c.rsplit(" ", 1)[1] for c in classifiers
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions and meta["Requires-Python"] == f">={min(versions, key=lambda v: int(v[2:]))}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_readme_dependencies_are_the_metadatas(wheels: dict[str, Path], folder: str) -> None:
    """The README's ``Installed with it`` and ``With the `X` extra`` lists are the wheel's
    ``Requires-Dist``: the same names, version ranges and extras."""
    listed = _readme_requirements(folder)
    declared = _declared(_metadata(wheels[folder]))
    assert listed == declared, (f"README only: {sorted(map(str, listed - declared))}; "
                                f"metadata only: {sorted(map(str, declared - listed))}")


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_import_is_declared_or_listed_as_used_when_present(
        wheels: dict[str, Path], folder: str) -> None:
    """A package the code imports is a declared requirement (of the distribution or one of its
    extras) or listed as used when present, and what is listed so is imported and not
    declared: a user who installs the wheel alone has what its code needs. (A module no
    installed distribution gives, an optional one missing here, is taken to be given by the
    distribution of its name.)"""
    parts = _listed(folder)
    declared = {name for name, _, _ in _declared(_metadata(wheels[folder]))}
    optional = {canonicalize_name(r.name) for r in parts.get("Used when present", [])}
    owners = _owners()
    imported: dict[str, str] = {}
    for module in _imported(folder):
        imported |= {canonicalize_name(d): module for d in owners.get(module, [module])}
    undeclared = {d: m for d, m in imported.items() if d not in declared | optional}
    assert not undeclared, f"{folder} imports packages it does not declare: {undeclared}"
    assert optional <= set(imported), f"listed as used but not imported: {optional - set(imported)}"
    assert not optional & declared


def test_each_readme_installs_what_it_needs_from_the_repository() -> None:
    """The install command of each README installs at least the distribution's folder and the folder
    of each distribution of this repository it requires."""
    folder_of = {canonicalize_name(d): f for f, d in DISTRIBUTIONS.items()}
    for folder in FOLDERS:
        install = _section(_readme(folder), "Install")
        command = re.findall(r"```bash\n(pip install [^\n]*)\n```", install)
        assert command, f"{folder}: no pip install command"
        installed = set(re.findall(r"\./(fxsym_\w+)", command[0]))
        needed = {folder_of[n] for n, _, extra in _readme_requirements(folder)
                  if n in folder_of and extra is None}
        assert installed >= needed | {folder}, (folder, installed)
