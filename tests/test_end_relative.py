"""Positions counted from the end (issue 19, section 2).

Every op rule that reads an index, a bound or a shift along an elastic dim is tried with a
position counted from the start and one counted from the end. A conv's 8 channels ``h`` are
read whole by one conv and through the op by another; the test names which of ``h``'s
channels may still change. A part whose position a number fixes (counted from the start: the
entries before it; counted from the end: the entries after it) must be pinned, and the part
kept with it; what stays free must be exactly the entries a resize can drop without moving
what the op reads. Each case is then checked by value (:func:`fxsym.oracles.check_values`):
dropping a free channel must equal zeroing its columns in every consumer.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import ReadThrough

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values

Op = Callable[[torch.Tensor], torch.Tensor]


def _free_entries(sm: fxsym.SymMap, qualname: str, symbol: str) -> list[int]:
    """The entries of ``qualname.symbol``'s dim that lie in a searchable group."""
    analysis = sm.analysis
    assert analysis is not None
    roots = {g.id for g in sm.groups()}
    out: list[int] = []
    offset = 0
    for seg in analysis.symbol_dims[(qualname, symbol)]:
        if seg.group is not None and analysis.table.find(seg.group) in roots:
            out += range(offset, offset + seg.units * seg.block)
        offset += seg.units * seg.block
    return out


ALL = list(range(8))

#: op -> the channels of ``h`` that may change; a pair per op, from the start and from the end
CASES: dict[str, tuple[Op, list[int]]] = {
    "narrow from the start": (lambda h: torch.narrow(h, 1, 3, 2), [5, 6, 7]),
    "narrow from the end": (lambda h: torch.narrow(h, 1, -5, 2), [0, 1, 2]),
    "narrow to the end": (lambda h: torch.narrow(h, 1, -2, 2), [0, 1, 2, 3, 4, 5]),
    "narrow method from the end": (lambda h: h.narrow(-3, -5, 2), [0, 1, 2]),
    "slice from the start": (lambda h: h[:, 3:5], [5, 6, 7]),
    "slice from the end": (lambda h: h[:, -5:-3], [0, 1, 2]),
    "slice of the tail": (lambda h: h[:, -3:], [0, 1, 2, 3, 4]),
    "slice between both ends": (lambda h: h[:, 2:-3], [2, 3, 4]),
    "select from the start": (lambda h: h.select(1, 2)[:, None], []),
    "select from the end": (lambda h: torch.select(h, 1, -2)[:, None], []),
    "index from the start": (lambda h: h[:, 2, None], []),
    "index from the end": (lambda h: h[:, -2, None], []),
    "split": (lambda h: torch.split(h, [5, 3], 1)[1], []),
    "split along a dim from the end": (lambda h: h.split([5, 3], -3)[0], []),
    "tensor_split from the start": (lambda h: torch.tensor_split(h, [5], 1)[1], []),
    "tensor_split from the end": (lambda h: torch.tensor_split(h, [-3], 1)[0], []),
    "roll forward": (lambda h: torch.roll(h, 2, 1), []),
    "roll backward along a dim from the end": (lambda h: h.roll(-2, -3), []),
    "flip": (lambda h: torch.flip(h, [1]), []),
    "flip a dim from the end": (lambda h: h.flip(-3), []),
    "index_select of computed positions": (
        lambda h: torch.index_select(h, 1, torch.arange(h.shape[1] - 3, h.shape[1])), []),
    "index_select of positions from the end": (
        lambda h: torch.index_select(h, -3, torch.tensor([-1, -2]) % h.shape[1]), []),
    "list of positions from the end": (lambda h: h[:, [-1, -2]], []),
    "negative padding": (lambda h: F.pad(h.transpose(1, 3), (0, -2)).transpose(1, 3), []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_positions_from_either_end(case: str) -> None:
    op, free = CASES[case]
    torch.manual_seed(0)
    model = ReadThrough(op)
    x = (torch.randn(1, 3, 4, 4),)
    model(*x)
    sm = fxsym.analyze(model, example_inputs=x)
    assert _free_entries(sm, "c1", "out_channels") == free
    if free:
        assert check_permutation(model, sm, x).ok
        assert check_shrink(model, sm, x).ok
        values = check_values(model, sm, x)
        assert values.ok, str(values)
