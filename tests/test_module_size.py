"""Rooms of one idea each (issue 32 §4): no module of the three distributions is longer than
:data:`LIMIT` lines unless its docstring states why, in a paragraph beginning ``Length:``.

A long module is split by concern into a package whose ``__init__`` re-exports its public
names (``fxsym.prune.checkpoint``, ``fxsym.prune.search``, ``fxsym_plugins_hf.configs``); where a
split would not help, the reason is written where the next reader looks first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the source trees of the three distributions
SOURCES = [ROOT / "fxsym_core" / "src", ROOT / "fxsym_plugins_nn" / "src",
           ROOT / "fxsym_plugins_hf" / "src"]
#: the most lines a module holds without a stated reason
LIMIT = 600
#: how the paragraph stating a long module's reason begins
REASON = "Length:"


def too_long(path: Path, limit: int = LIMIT) -> str | None:
    """Why ``path`` breaks the rule (its length, no reason stated), or ``None``."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    if lines <= limit:
        return None
    doc = ast.get_docstring(ast.parse(text)) or ""
    if any(p.strip().startswith(REASON) for p in doc.split("\n\n")):
        return None
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {lines} lines"


def test_no_module_is_over_the_limit_without_its_reason() -> None:
    """Every module of the three source trees: at most :data:`LIMIT` lines, or a docstring
    paragraph beginning ``Length:`` saying why a split would not help."""
    modules = sorted(p for src in SOURCES for p in src.rglob("*.py"))
    assert len(modules) > 100
    long = [why for p in modules if (why := too_long(p)) is not None]
    assert not long, (f"modules over {LIMIT} lines without a 'Length:' paragraph in their "
                      "docstring (split them by concern, or say why not):\n" + "\n".join(long))


def test_a_stated_reason_lets_a_long_module_pass(tmp_path: Path) -> None:
    """The check reads the docstring's paragraphs: a long module passes with a ``Length:``
    paragraph, not with the word elsewhere, nor with a comment."""
    body = "x = 1\n" * 10
    bare = tmp_path / "bare.py"
    bare.write_text('"""A module."""\n' + body)
    stated = tmp_path / "stated.py"
    stated.write_text('"""A module.\n\nLength: one table, read whole.\n"""\n' + body)
    mention = tmp_path / "mention.py"
    mention.write_text('"""A module. Length: none."""\n# Length: a comment\n' + body)
    short = tmp_path / "short.py"
    short.write_text('"""A module."""\n' + body)
    assert too_long(bare, limit=5) == f"{bare}: 11 lines"
    assert too_long(stated, limit=5) is None
    assert too_long(mention, limit=5) is not None
    assert too_long(short, limit=20) is None
