"""``fxsym.plan``: which units of which groups to keep, as plain data.

A :class:`Plan` lists every searchable group of the model it was made for, with its size and,
for each group it shrinks, the units to keep (in increasing order); ``print(plan)`` shows its
:meth:`Plan.summary`. It is plain data
(:meth:`Plan.to_json` / :meth:`Plan.from_json`): applied to a freshly built model of the same
architecture it gives the same model, and :meth:`Plan.check` says precisely where a model does
not fit it (:class:`~fxsym.errors.PlanMismatchError`). :meth:`Plan.apply` resizes through
:func:`fxsym.resize`, so a plan is validated and applied all or nothing.

**Counts.** Parameters come from the :class:`~fxsym.paramlayout.ParamLayout` (each parameter's
shape once groups keep so many units, without resizing anything). MACs come from the traced
graph (``node.meta["val"]``): a call of a module holding parameters of two or more dims costs
each of their elements once per output position (the output's entries over its feature
dim), so a conv, a linear and the projections inside an attention leaf are counted and shrink
with the plan; an embedding (integer input) costs nothing; a ``matmul``/``bmm`` between
activations costs ``output entries x inner dim`` at its traced size, which a plan does not
reduce (the attention scores inside a leaf are not counted).

**Solving.** Each group's units are ranked by an importance criterion
(:mod:`fxsym.importance`). ``scope="uniform"`` removes the same fraction of every group;
``scope="global"`` removes the lowest units over all groups, each group's scores divided by
their mean so groups compare. A ``ratio`` is that fraction of units; ``target_params`` or
``target_macs`` is met by bisection on it: the plan is the smallest cut that reaches the target,
so it misses it by less than one rounding step. Kept sizes are rounded up to a multiple of
``round_to`` (never past the group's size), at least ``min_keep`` and at least the group's
own ``min_size`` (a router's ``topk`` over the experts needs ``k`` of them), then up to a
multiple of the group's own ``step`` (what the model's kernels take: transformers'
``grouped_mm`` experts need 16-byte strides; the groups a plan so shrinks are listed with
the reason in ``plan.extra["steps"]``), or the whole group; groups listed in
``exclude`` (names or ``fnmatch`` patterns), groups the criterion cannot score and groups of
one unit stay whole; groups tied by ``same_size`` keep as many units as each other.

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
* :mod:`.solve` — :func:`plan`: the units each group keeps, solved for the amount.

Every public name is re-exported here: ``from fxsym.planning import Plan, plan``.

Imports from fxsym: console, depth, embeddings, errors, importance, options, paramlayout,
plugins, resizing, symbols.
"""

from __future__ import annotations

from .counts import MATMULS, count_macs, param_shapes
from .data import FORMAT, DepthChoice, GroupChoice, Plan, analysis_options, with_extra
from .describable import described
from .exclude import excluded_groups
from .inputs import MAX_INPUT_ELEMENTS, input_spec, inputs_from_spec
from .solve import plan
from .strict import MAX_JSON_DEPTH, strict_loads

__all__ = ["FORMAT", "MATMULS", "MAX_INPUT_ELEMENTS", "MAX_JSON_DEPTH", "DepthChoice",
           "GroupChoice", "Plan", "analysis_options", "count_macs", "described",
           "excluded_groups", "input_spec", "inputs_from_spec", "param_shapes", "plan",
           "strict_loads", "with_extra"]
