"""``fxsym.plan``: which units of which groups to keep, as plain data.

A :class:`Plan` is plain data, applied all or nothing (:mod:`.data`); its parameter and MAC
counts are :mod:`.counts`'s; how :func:`plan` solves an amount is :mod:`.solve`'s docstring.

One idea per module:

* :mod:`.data` — :class:`Plan`, :class:`GroupChoice`, :class:`DepthChoice`: a plan as data,
  checked against a model and applied; :func:`with_extra`, :func:`analysis_options`;
* :mod:`.strict` — :func:`strict_loads` and the strict reading of each JSON field;
* :mod:`.inputs` — example inputs as data (:func:`input_spec`, :func:`inputs_from_spec`);
* :mod:`.counts` — parameter and MAC counts (:func:`count_macs`, :func:`param_shapes`);
* :mod:`.amounts` — the amount checked: one of ratio, targets or sizes, in range;
* :mod:`.units` — the units' scores, checked, and their order over all groups;
* :mod:`.exclude` — :func:`excluded_groups`, the groups ``exclude`` keeps whole;
* :mod:`.describable` — :func:`described`, what the model's own description can follow;
* :mod:`.blocks` — the blocks ``layers`` keeps, and a plan dropping the others;
* :mod:`.solve` — :func:`plan`: the options checked as a request, then the units each group
  keeps, solved for the amount (:func:`solve`, for options a request already checked).

Every public name is re-exported here: ``from fxsym.prune.planning import Plan, plan``.

Imports from fxsym: console, depth, embeddings, errors, importance, options, paramlayout,
plugins, request, resizing, symbols.
"""

from __future__ import annotations

from .counts import MATMULS, count_macs, param_shapes
from .data import FORMAT, DepthChoice, GroupChoice, Plan, analysis_options, with_extra
from .describable import described
from .exclude import excluded_groups
from .inputs import MAX_INPUT_ELEMENTS, input_spec, inputs_from_spec
from .solve import plan, solve
from .strict import MAX_JSON_DEPTH, strict_loads

__all__ = ["FORMAT", "MATMULS", "MAX_INPUT_ELEMENTS", "MAX_JSON_DEPTH", "DepthChoice",
           "GroupChoice", "Plan", "analysis_options", "count_macs", "described",
           "excluded_groups", "input_spec", "inputs_from_spec", "param_shapes", "plan",
           "solve", "strict_loads", "with_extra"]
