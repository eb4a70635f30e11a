"""A pass: a named function over a GraphModule that returns how many changes it made.

A pass edits ``gm.graph`` and may add or replace submodules and attributes of ``gm``. Three
rules keep the pipeline's promises (roll back, never touch the user's model):

* never write into an existing tensor or module — build new ones and attach them to ``gm``
  (``gm.add_submodule``, ``setattr`` on a container of ``gm``);
* do not call ``gm.recompile()``: the pipeline recompiles once, after the last pass; a pass
  that needs to run the graph uses :class:`torch.fx.Interpreter`;
* return the number of changes (``0`` when the graph is untouched).

Ordering is declared, not implied: ``before``/``after`` name other passes (``"*"`` means every
other pass). Names unknown to the current pipeline are ignored.

Numerics are declared too: ``exact=True`` promises that the pass never changes the model's
outputs, not even by rounding (it removes identities, dead code, in-place writes). A pass that
may change them (folding a BatchNorm, fusing a formula into one kernel, any pass of unknown
effect — the default) runs only where it can be verified: see :mod:`fxsym.passes.pipeline`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import fx

PassFn = Callable[[fx.GraphModule], int]


@dataclass
class Pass:
    """A named graph pass with ordering constraints.

    ``fn(gm) -> int`` edits ``gm`` in place and returns the number of changes. ``default``
    puts the pass in the pipeline :func:`fxsym.optimize` runs when ``passes`` is ``None``.
    ``exact`` says the pass never changes the values the model computes (module docstring).
    """

    name: str
    fn: PassFn
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    default: bool = True
    description: str = ""
    exact: bool = False

    def __post_init__(self) -> None:
        self.before = _names(self.before)
        self.after = _names(self.after)
        if not self.description:
            doc = (getattr(self.fn, "__doc__", None) or "").strip()
            self.description = doc.splitlines()[0] if doc else ""

    def __call__(self, gm: fx.GraphModule) -> int:
        changes = self.fn(gm)
        if not isinstance(changes, int) or isinstance(changes, bool):
            raise TypeError(
                f"pass {self.name!r} returned {changes!r}; a pass returns its number of changes"
            )
        return changes


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def graph_pass(
    name: str | None = None,
    *,
    before: str | Iterable[str] = (),
    after: str | Iterable[str] = (),
    default: bool = True,
    exact: bool = False,
) -> Callable[[PassFn], Pass]:
    """Decorator: turn ``fn(gm) -> int`` into a :class:`Pass` (named after ``fn``)."""

    def wrap(fn: PassFn) -> Pass:
        return Pass(
            name or fn.__name__,
            fn,
            before=_names(before),
            after=_names(after),
            default=default,
            exact=exact,
        )

    return wrap


@dataclass
class PassRecord:
    """What one pass did in one pipeline run."""

    name: str
    source: str
    changes: int = 0
    seconds: float = 0.0
    status: str = "ok"  # ok | rolled back | refused | skipped
    message: str = ""
    verified: bool = False  # its changes are exact, or matched the original outputs


@dataclass
class PipelineReport:
    """Per-pass records of one :func:`fxsym.optimize` run (``gm.meta["fxsym_passes"]``)."""

    records: list[PassRecord] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Every change kept is exact or was checked against the original model's outputs."""
        return all(r.verified for r in self.records if r.status == "ok" and r.changes)

    @property
    def changes(self) -> int:
        return sum(r.changes for r in self.records if r.status == "ok")

    def __getitem__(self, name: str) -> PassRecord:
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(name)

    def order(self) -> list[str]:
        return [r.name for r in self.records]

    def __str__(self) -> str:
        lines = [f"{'pass':<28} {'changes':>7} {'status':<12} source"]
        for r in self.records:
            lines.append(f"{r.name:<28} {r.changes:>7} {r.status:<12} {r.source}")
        return "\n".join(lines)

