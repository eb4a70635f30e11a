"""The suite runs with the versions it was pinned with: the README's test command and
``.ci/run`` install with ``constraints.txt``, which pins every requirement, and a package whose
installed version differs from its pin fails here (upgrade on purpose: ``.ci/pin.py``)."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[canonicalize_name(name)] = version
    return out


def _readme_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^pip install .*&& python -m pytest -q -n auto$", text, re.M)[0]


def test_the_readme_command_is_what_ci_runs_and_uses_the_constraints() -> None:
    command = _readme_command()
    assert "-c constraints.txt" in command and "-r requirements-test.txt" in command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command.replace("pip install ", "pip install -q ") in ci
    assert command in (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")


def test_every_requirement_is_pinned() -> None:
    pins = _pins()
    for name in ("requirements-test.txt", "requirements-docs.txt", "requirements-checks.txt"):
        for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                assert canonicalize_name(Requirement(line).name) in pins, (name, line)
    for key in ("torch", "transformers", "ultralytics", "diffusers", "playwright", "mkdocs"):
        assert key in pins, key


def test_installed_versions_are_the_pinned_ones() -> None:
    differ = []
    for name, version in _pins().items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            continue  # a platform's own dependency (CUDA libraries) not installed here
        if installed.split("+")[0] != version:
            differ.append(f"{name} {installed} (pinned {version})")
    assert not differ, ("installed versions differ from constraints.txt: "
                        f"{', '.join(differ)}; run the README's test command, or upgrade on "
                        "purpose (python .ci/pin.py > constraints.txt)")
