"""Sizes a config class computes (read-only properties) that a resize would leave stale.

A config class may compute a size from its fields instead of holding it (xLSTM's ``v_dim`` and
``qk_dim``: ``hidden_size`` times a factor, rounded up to a multiple of 64) while each module
holds its own value, set when it was built. Code reading the config's value (xLSTM sizes its
recurrent-state cache by ``config.v_dim // num_heads``) then disagrees with the modules once a
resize changes the fields the value follows, and the cached forward fails (``matC_old has
wrong shape``). The config cannot be given the modules' value (a property has no setter), nor
can a config of fxsym's own model type, which computes it the same way; so the resize is
refused (:class:`fxsym.errors.ResizeError` from :func:`stale_values`' phrases), naming the
value, the fields it follows and the modules that hold another one. A resize the rounding
absorbs (hidden 128 to 96: ``v_dim`` stays 128) is not refused, nor is a value the config
already computed differently before the resize (the modules never held it: not the
resize's doing).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import nn


def read_only(cls: type) -> set[str]:
    """The names of ``cls``'s read-only properties (a property with a setter is a field's
    other name: it can be given a value)."""
    return {name for klass in cls.__mro__ for name, value in vars(klass).items()
            if isinstance(value, property) and value.fset is None and not name.startswith("_")}


def stale_values(model: nn.Module, before: Any, new: Any, changed: Sequence[str]) -> list[str]:
    """One phrase per value the class of ``new`` (the resized model's config) computes that
    ``model``'s modules hold as an int attribute of the same name, equal to ``before``'s
    value (the config before the resize) and no longer to ``new``'s."""
    names = read_only(type(new))
    held: dict[str, dict[str, int]] = {}
    for qualname, mod in model.named_modules():
        for attr in names & vars(mod).keys():
            value = vars(mod)[attr]
            if type(value) is int:
                held.setdefault(attr, {})[qualname] = value
    out: list[str] = []
    for attr, where in sorted(held.items()):
        try:
            old, now = getattr(before, attr), getattr(new, attr)
        except Exception:  # a property that cannot be computed: nothing to compare
            continue
        stale = {q: v for q, v in where.items() if v == old != now}
        if not stale:
            continue
        follows = [f for f in changed if _follows(new, before, attr, f, old)]
        first, value = next(iter(stale.items()))
        more = f" and {len(stale) - 1} more" if len(stale) > 1 else ""
        out.append(
            f"{type(new).__name__}.{attr} is computed from {', '.join(follows) or 'its fields'} "
            f"(a read-only property): the resized config gives {now}, but {first or 'the model'}"
            f"{more} hold {value}, and code reading config.{attr} (a cache it sizes) would "
            f"break; keep {', '.join(follows) or 'the fields it follows'} (exclude the group "
            "sizing it: fxsym.plan(exclude=...), fxsym prune --exclude GROUP)")
    return out


def _follows(new: Any, before: Any, attr: str, field: str, old: Any) -> bool:
    """Whether ``new``'s ``attr`` is ``old`` again with ``field`` put back as in ``before``."""
    trial = copy.deepcopy(new)
    try:
        setattr(trial, field, getattr(before, field))
        return bool(getattr(trial, attr) == old)
    except Exception:
        return False
