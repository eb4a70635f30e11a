"""The kernel's size, room by room, and the model families and transformer roles it names.

    python benchmarks/kernel_size.py [--words] [--workflow] [--at REV]

The kernel is every room directly under ``fxsym_core/src/fxsym/`` but ``prune`` (the workflow)
and the package's ``__init__`` (the facade above both layers): the same split as
``tests/test_layering.py``. Each line of a module is counted once, as one of:

* **code**: a line holding a token that is neither a comment nor part of a docstring;
* **docstring**: a line of a string statement (a module's, class's or function's docstring,
  or an attribute's string after it);
* **comment**: a line holding only a comment (``#:`` attribute comments too);
* **blank**.

Issue 32's acceptance: the kernel at most ~12k lines, and naming no model family or transformer
role outside docstrings: :func:`role_words` finds each of :data:`WORDS` in names, strings and
comments (a word inside an identifier counts: ``routing_groups``; ``#:`` comments document
attributes, as docstrings do), ``tests/test_kernel_size.py`` holds the kernel to it. A module's
table of its old public names kept as deprecated aliases (a module-level assignment to a name
beginning with ``DEPRECATED``, such as ``fxsym.prune.search.DEPRECATED``) is not counted
either: it keeps old spellings working, the code names them nowhere else. ``--workflow``
measures the pruning workflow (``fxsym/prune/``, its modules and subpackages as rooms) the same
way: the issue asks that it name no family and no role either. The words are the families and
the roles' own names (``num_heads``, ``hidden_size``, ``expert``, ...), not bare ``head``,
``hidden`` or ``token``, which the kernel uses in other senses (a union-find's head, a hook
torch hides, an expression's token).

The issue's own figure, "``fxsym_core`` is 20.9k lines", is every line of every file of the
package (``wc -l``) at 260fe2d, the one commit whose ``checkpoint.py`` has the 1,241 lines it
quotes: 20,669 lines of Python and 260 of the report's assets. The ``lines`` column counts the
same way. ``--at REV`` measures, in the tree of a git revision, the rooms of today's kernel
that exist there (``--at 260fe2d``: the kernel as it was when the issue was filed).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import tarfile
import tempfile
import tokenize
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fxsym_core" / "src" / "fxsym"

#: model families and transformer roles the kernel must not name outside its docstrings
WORDS = ("llama", "mistral", "mixtral", "qwen", "gemma", "gpt", "bert", "deepseek", "falcon",
         "mamba", "rwkv", "transformer", "transformers", "decoder", "encoder",
         "num_heads", "head_dim", "kv_heads", "ffn", "mlp", "intermediate_size", "expert",
         "experts", "moe", "router", "routing", "hidden_size", "hidden_dim", "next_token",
         "logits", "vocab", "tokenizer")

_WORD = re.compile(r"(?<![a-z0-9])(" + "|".join(sorted(WORDS, key=len, reverse=True))
                   + r")(?![a-z0-9])", re.IGNORECASE)


def kernel_rooms(package: Path = PACKAGE) -> dict[str, list[Path]]:
    """``{room: its module files}`` of the kernel."""
    rooms: dict[str, list[Path]] = {}
    for path in sorted(package.glob("*.py")):
        if path.name != "__init__.py":
            rooms[path.stem] = [path]
    for folder in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        if folder.name != "prune":
            rooms[folder.name] = sorted(folder.rglob("*.py"))
    return rooms


def rooms_at(rev: str, names: set[str], where: Path) -> dict[str, list[Path]]:
    """The rooms called ``names`` in the package's tree at git revision ``rev``, extracted
    under ``where``."""
    root = PACKAGE.parents[2]
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "fxsym_core/src/fxsym"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return {room: files for room, files in
            kernel_rooms(where / "fxsym_core" / "src" / "fxsym").items() if room in names}


def workflow_rooms(package: Path = PACKAGE) -> dict[str, list[Path]]:
    """``{room: its module files}`` of the workflow, ``fxsym/prune/`` (its ``__init__`` a
    room of its own)."""
    return kernel_rooms(package / "prune") | {"__init__": [package / "prune" / "__init__.py"]}


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _tokens(text: str) -> Iterator[tokenize.TokenInfo]:
    return tokenize.generate_tokens(io.StringIO(text).readline)


def count(path: Path) -> Counter[str]:
    """The lines of ``path`` by kind: code, docstring, comment, blank."""
    text = path.read_text(encoding="utf-8")
    docs = _docstring_lines(ast.parse(text))
    code: set[int] = set()
    comments: set[int] = set()
    for tok in _tokens(text):
        if tok.type == tokenize.COMMENT:
            comments.add(tok.start[0])
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER) and tok.start[0] not in docs:
            code.update(range(tok.start[0], tok.end[0] + 1))
    out: Counter[str] = Counter()
    for i, line in enumerate(text.splitlines(), 1):
        kind = ("code" if i in code else "docstring" if i in docs
                else "comment" if i in comments else "blank" if not line.strip() else "code")
        out[kind] += 1
    return out


def _deprecated_lines(tree: ast.Module) -> set[int]:
    """The lines of the module-level assignments to a name beginning with ``DEPRECATED``."""
    lines: set[int] = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id.startswith("DEPRECATED") for t in targets):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def role_words(path: Path) -> list[tuple[int, str, str]]:
    """``(line, word, token)`` for each of :data:`WORDS` in a name, a string or a comment of
    ``path`` that is not in a docstring (a ``#:`` comment documents an attribute: a
    docstring) nor in a table of deprecated names (:func:`_deprecated_lines`)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    docs = _docstring_lines(tree) | _deprecated_lines(tree)
    found = []
    for tok in _tokens(text):
        if tok.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) \
                and tok.start[0] not in docs and not tok.string.startswith("#:"):
            for m in _WORD.finditer(tok.string):
                found.append((tok.start[0], m.group(1).lower(), tok.string))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", action="store_true",
                        help="list every family or role word outside docstrings, by file")
    parser.add_argument("--workflow", action="store_true",
                        help="measure the pruning workflow (fxsym/prune) instead of the kernel")
    parser.add_argument("--at", metavar="REV",
                        help="measure today's kernel rooms in the tree of git revision REV")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        package = Path(where) / "fxsym_core" / "src" / "fxsym" if a.at else PACKAGE
        if a.at:
            rooms, name = rooms_at(a.at, set(kernel_rooms()), Path(where)), f"kernel@{a.at}"
        else:
            rooms, name = ((workflow_rooms(), "workflow") if a.workflow
                           else (kernel_rooms(), "kernel"))
        _table(rooms, name)
        if a.words:
            for files in rooms.values():
                for f in files:
                    for line, word, token in role_words(f):
                        print(f"{f.relative_to(package.parent)}:{line}: {word} "
                              f"({token[:60]})")


def _table(rooms: dict[str, list[Path]], name: str) -> None:
    total: Counter[str] = Counter()
    print(f"{'room':<14}{'code':>7}{'docstring':>11}{'comment':>9}{'blank':>7}{'code+doc':>10}"
          f"{'lines':>7}{'words':>7}")
    for room, files in rooms.items():
        c: Counter[str] = sum((count(f) for f in files), Counter())
        words = sum(len(role_words(f)) for f in files)
        total += c
        print(f"{room:<14}{c['code']:>7}{c['docstring']:>11}{c['comment']:>9}{c['blank']:>7}"
              f"{c['code'] + c['docstring']:>10}{c.total():>7}{words:>7}")
    print(f"{name:<14}{total['code']:>7}{total['docstring']:>11}{total['comment']:>9}"
          f"{total['blank']:>7}{total['code'] + total['docstring']:>10}{total.total():>7}")


if __name__ == "__main__":
    main()
