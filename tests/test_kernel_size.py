"""The kernel's size and the words it uses (issue 32: a kernel that names no model family and
no transformer role outside its docstrings), measured by ``benchmarks/kernel_size.py``.

Its counts are checked on a small module whose lines are known, its kernel is the layering
test's, and no family or role word is found outside its docstrings. The workflow
(``fxsym/prune/``) is held to today's words by room (:data:`WORKFLOW_KNOWN`: a new one fails),
a list meant to empty (``test_the_workflow_names_no_family_or_role``, an expected failure).
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

#: the family and role words the workflow names outside docstrings today, by room: the usage
#: records' keys (expert_load), the deprecated ExpertRecorder alias, the search's expert shares,
#: the deprecated next_token_loss alias and 'a router picks' message. The CLI's size flags and
#: analysis options' flags are the plugins' declarations (fxsym_size_options,
#: fxsym_analysis_options) and prune_checkpoint's and the request's analysis options one
#: mapping. By room, so that a split of a room's modules moves words without failing here
WORKFLOW_KNOWN: dict[str, set[str]] = {
    "checkpoint": {"expert"},
    "importance": {"expert", "experts", "routing"},
    "search": {"expert", "experts", "next_token", "router"},
}


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
    identifier counts (``routing_groups``), a longer word does not (``headless``)."""
    f = tmp_path / "m.py"
    f.write_text('"""About llama experts."""\n#: the hidden_size\nrouting_groups = 1\n'
                 's = "a decoder"  # the FFN\nheadless = tokens = 0\n')
    assert [(line, w) for line, w, _ in ks.role_words(f)] == [
        (3, "routing"), (4, "decoder"), (4, "ffn")]


def test_the_kernel_names_no_family_or_role() -> None:
    """Issue 32's acceptance: ``grep`` for families and roles in the kernel finds only
    docstrings. What knows a family or a role belongs in a plugin, behind a typed hook (the
    analysis options: ``fxsym_analysis_options``)."""
    assert _found() == {}, f"the kernel names families or roles outside docstrings: {_found()}"


def test_no_new_family_or_role_word_in_the_workflow() -> None:
    """A family or role word outside the workflow's docstrings beyond :data:`WORKFLOW_KNOWN`
    fails: what knows a family or a role belongs in a plugin, behind a typed hook."""
    found = _found(ks.workflow_rooms())
    new = {r: sorted(w - WORKFLOW_KNOWN.get(r, set())) for r, w in found.items()
           if w - WORKFLOW_KNOWN.get(r, set())}
    assert not new, f"the workflow names families or roles outside docstrings: {new}"


@pytest.mark.xfail(strict=True, reason="issue 32 §1: the usage records' keys, the search's expert "
                   "shares, deprecated aliases (see WORKFLOW_KNOWN)")
def test_the_workflow_names_no_family_or_role() -> None:
    """Issue 32: the kernel and the workflow name no family and no role."""
    assert _found(ks.workflow_rooms()) == {}
