"""The kernel's size and the words it uses (issue 32: a kernel that names no model family and
no transformer role outside its docstrings), measured by ``benchmarks/kernel_size.py``.

Its counts are checked on a small module whose lines are known, its kernel is the layering
test's, and no family or role word is found outside the docstrings of the kernel nor of the
workflow (``fxsym/prune/``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from test_layering import KERNEL


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_size.py"
    spec = importlib.util.spec_from_file_location("kernel_size", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kernel_size", module)
    spec.loader.exec_module(module)
    return module


ks = _load()

def _found(rooms: dict[str, list[Path]] | None = None) -> dict[str, set[str]]:
    """``{room: the words found}`` of the rooms (the kernel's by default) naming any."""
    out: dict[str, set[str]] = {}
    for room, files in (ks.kernel_rooms() if rooms is None else rooms).items():
        words = {w for f in files for _, w, _ in ks.role_words(f)}
        if words:
            out[room] = words
    return out


def test_lines_are_counted_by_kind(tmp_path: Path) -> None:
    """Each line once: code (a line with a code token, a trailing comment too), docstring
    (every string statement, attribute strings too), comment, blank."""
    f = tmp_path / "m.py"
    f.write_text('"""Module.\n\nMore."""\n\n# a comment\nx = 1  # trailing\n'
                 'def f():\n    """One line."""\n    return """not a\n    docstring"""\n'
                 'y = 2\n"""y\'s string."""\n')
    assert ks.count(f) == {"docstring": 5, "blank": 1, "comment": 1, "code": 5}
    assert sum(ks.count(f).values()) == len(f.read_text().splitlines())


def test_the_kernel_is_the_layering_tests() -> None:
    """The rooms measured are the kernel ``tests/test_layering.py`` reads from the folders."""
    assert set(ks.kernel_rooms()) == set(KERNEL)


def test_family_and_role_words_outside_docstrings(tmp_path: Path) -> None:
    """Names, strings and comments count, docstrings and ``#:`` comments not; a word inside an
    identifier counts (``routing_groups``), a longer word does not (``headless``); a
    module-level table of deprecated names (``DEPRECATED...``) does not count, elsewhere the
    name does not hide a word."""
    f = tmp_path / "m.py"
    f.write_text('"""About llama experts."""\n#: the hidden_size\nrouting_groups = 1\n'
                 's = "a decoder"  # the FFN\nheadless = tokens = 0\n'
                 'DEPRECATED = {\n    "expert_shares": 1,\n}\n'
                 'def f():\n    DEPRECATED = "moe"\n')
    assert [(line, w) for line, w, _ in ks.role_words(f)] == [
        (3, "routing"), (4, "decoder"), (4, "ffn"), (10, "moe")]


def test_the_kernel_names_no_family_or_role() -> None:
    """Issue 32's acceptance: ``grep`` for families and roles in the kernel finds only
    docstrings. What knows a family or a role belongs in a plugin, behind a typed hook (the
    analysis options: ``fxsym_analysis_options``)."""
    assert _found() == {}, f"the kernel names families or roles outside docstrings: {_found()}"


def test_the_workflow_names_no_family_or_role() -> None:
    """Issue 32: the kernel and the workflow name no family and no role: the command line's
    size flags and analysis options' flags are the plugins' declarations
    (``fxsym_size_options``, ``fxsym_analysis_options``), the analysis options one mapping,
    transformer knowledge behind typed hooks; old names live only in ``DEPRECATED`` tables."""
    assert _found(ks.workflow_rooms()) == {}, (
        f"the workflow names families or roles outside docstrings: "
        f"{_found(ks.workflow_rooms())}")


def test_the_deprecated_tables_still_answer() -> None:
    """Each name of the workflow's ``DEPRECATED`` tables (which the word scan skips) still
    gives its value, with a DeprecationWarning naming what to use: the search's
    ``expert_shares`` is ``picked_shares``, ``next_token_loss`` is ``batch_loss`` (issue 32:
    deprecate, do not break)."""
    import fxsym.prune.importance as importance
    import fxsym.prune.search as search
    from fxsym.prune.checkpoint.scores import DEPRECATED_FIELDS, StreamedScores

    for module in (search, importance):
        for name in module.DEPRECATED:
            with pytest.warns(DeprecationWarning):
                assert getattr(module, name) is not None
    with pytest.warns(DeprecationWarning, match="use fxsym.prune.search.picked_shares"):
        assert search.expert_shares is search.picked_shares
    with pytest.warns(DeprecationWarning, match="use fxsym.prune.search.batch_loss"):
        assert search.next_token_loss is search.batch_loss
    scores = StreamedScores({}, usage={DEPRECATED_FIELDS[0]: {"g": [1.0]}})
    with pytest.warns(DeprecationWarning, match=r"usage\['expert_load'\]"):
        assert getattr(scores, DEPRECATED_FIELDS[0]) == {"g": [1.0]}
