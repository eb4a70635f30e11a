"""The documentation site: every python block of the docs and of the READMEs (the
repository's and each distribution's) runs, the site builds with ``mkdocs build --strict`` (a
broken link fails it), and the CLI reference names every option.

Each page runs as one script (its blocks in order) in a fresh interpreter, in a temporary
directory, with the example plugin's sources importable (as after
``pip install ./examples/fxsym-example-plugin``). A block that only shows the shape of some
code (names it does not define, ``...`` placeholders) says so with a ``<!-- fragment -->`` line
just above its fence: it is compiled, not run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOWTO = sorted((DOCS / "howto").glob("*.md"))
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("fxsym_*/README.md")), *sorted(DOCS.rglob("*.md"))]
EXAMPLE_SRC = ROOT / "examples" / "fxsym-example-plugin" / "src"
FRAGMENT = "<!-- fragment -->"


def blocks(page: Path) -> list[tuple[str, bool]]:
    """Each python block of ``page`` and whether it is marked a fragment."""
    found = re.findall(r"^([^\n]*)\n```python\n(.*?)^```", page.read_text(encoding="utf-8"),
                       re.S | re.M)
    return [(code, before.strip() == FRAGMENT) for before, code in found]


def python_blocks(page: Path) -> list[str]:
    """The blocks of ``page`` that run, in order."""
    return [code for code, fragment in blocks(page) if not fragment]


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]


def test_there_are_howto_pages() -> None:
    names = {p.stem for p in HOWTO}
    assert {"prune-torchvision", "prune-huggingface", "write-a-plugin",
            "add-a-rewrite-pattern"} <= names
    assert all(python_blocks(p) for p in HOWTO)


def test_every_block_is_run_or_a_fragment_that_compiles() -> None:
    every = [(p, code, fragment) for p in PAGES for code, fragment in blocks(p)]
    assert sum(not f for _, _, f in every) >= 20
    for page, code, fragment in every:
        if fragment:
            compile(code, f"{page.name} (fragment)", "exec")
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    assert text.count(FRAGMENT) == sum(f for _, _, f in every), "a marker not above a block"


@pytest.mark.parametrize("page", PAGES_WITH_CODE,
                         ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_CODE])
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n\n".join(python_blocks(page)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLE_SRC), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{page.name} failed:\n{res.stderr[-3000:]}"


def _mkdocs() -> str:
    exe = shutil.which("mkdocs", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert exe is not None, "the mkdocs command is missing (pip install -r requirements-test.txt)"
    return exe


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_mkdocs(), "build", "--strict", "-f", str(config), "-d",
                           str(site)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_site_builds_strict(tmp_path: Path) -> None:
    res = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stdout + res.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("fxsym.analysis.api.analyze", "fxsym.symbols.SymGroup",
                 "fxsym.prune.report_html.write_html"):
        assert f'id="{name}"' in api, name


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for src in ("fxsym_core/src", "fxsym_plugins_nn/src", "fxsym_plugins_hf/src"):
        config = config.replace(src, str(ROOT / src))
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    with (tmp_path / "docs" / "concepts.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [nowhere](no-such-page.md).\n")
    res = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0 and "no-such-page.md" in res.stdout + res.stderr


def test_cli_reference_names_every_option() -> None:
    from fxsym.prune import cli

    captured: dict[str, argparse.ArgumentParser] = {}
    original = argparse.ArgumentParser.parse_known_args  # parse_args calls it too

    def grab(self: argparse.ArgumentParser, *a: object, **k: object) -> argparse.Namespace:
        captured.setdefault("parser", self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_known_args = grab  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(SystemExit):
            cli.main(["analyze"])
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parser = captured["parser"]
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, sub in subparsers[0].choices.items():
        if f"fxsym {name}" not in text:
            missing.append(f"fxsym {name}")
        for action in sub._actions:
            missing += [o for o in action.option_strings
                        if o.startswith("--") and o != "--help" and f"`{o}" not in text]
    assert not missing, f"docs/cli.md does not mention: {missing}"
