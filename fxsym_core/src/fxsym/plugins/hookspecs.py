"""Hook specifications: everything a plugin can contribute to fxsym.

Two kinds of hooks (how each is called: :mod:`fxsym.plugins.calls`):

* *registration* hooks (``fxsym_register_*``), ``fxsym_trace_context``,
  ``fxsym_after_resize``, ``fxsym_after_depth``, ``fxsym_depth_kinds``,
  ``fxsym_depth_refusal`` and ``fxsym_save_files`` call every plugin.
  Each plugin gets its own
  ``register`` callable, so conflicts and ``fxsym plugins`` name the distribution behind each
  contribution;
* *decision* hooks (``firstresult=True``: ``fxsym_leaf_module``, ``fxsym_hook_computes``,
  ``fxsym_derived_tensors``, ``fxsym_example_inputs``,
  ``fxsym_default_outputs``, ``fxsym_checkpoint_reader``) answer one question per call: the
  first implementation in pluggy's order that returns something other than ``None``
  decides, and hook wrappers see (and may replace) that answer.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "fxsym"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def fxsym_register_sym_infos(register: Any) -> None:
    """Describe module families.

    ``register(nn_cls, factory, *, leaf=True, resize=None, importance=None, value=None)``:

    * ``factory(module) -> SymInfo`` gives the module's symbols;
    * ``leaf``: trace such modules as one ``call_module`` node;
    * ``resize(module, symbol_name, index)`` keeps the entries ``index`` (a 1-D LongTensor) of
      the symbol's dimension in every parameter, buffer and attribute it sizes;
    * ``importance(module, symbol_name) -> Tensor`` scores each entry of an OUTGOING symbol's
      dimension (higher is kept first when a resize asks for a size instead of indices);
    * ``value(module, args, kwargs)`` gives the leaf's output for meta-device inputs without
      running it (a speed-up of tracing), or ``None``: run it. It must give exactly what
      running the module on the meta device gives (shape, dtype, strides) and ``None``
      wherever it cannot prove that, including wherever running would raise, so that the
      error the user sees stays the module's own. It reads the module (never writes it) and
      is not asked while hooks run around the module's forward.
    """


@hookspec(firstresult=True)
def fxsym_leaf_module(module: Any, qualname: str) -> bool | None:
    """Whether the tracer keeps ``module`` (at ``qualname``) as one ``call_module`` node
    (``True``), traces into it (``False``), or leaves the question to others (``None``).

    Asked for every module the tracer meets, before the ``leaf`` of its SymInfo registration;
    when no plugin answers, that registration decides, else torch.fx's default (``torch.nn``
    modules are leaves).
    """


@hookspec(firstresult=True)
def fxsym_hook_computes(module: Any, hook: Any) -> bool | None:
    """Whether forward (or pre-forward) hook ``hook`` registered on ``module`` is part of
    how the model computes (``True``: it runs while the model is traced), an observer of the
    user's (``False``: hidden while traced), or leaves the question to others (``None``).

    When no plugin answers (here or in ``fxsym_derived_tensors``), the hook is hidden and
    its effect not seen: the groups of the module call's inputs and outputs and of the
    module's own sizes are pinned, and a ``hidden-hook`` trace-report line names the hook
    (:mod:`fxsym.plugins.hookroles`). A library that carries values between modules through
    hooks (transformers 5 collects hidden states that way) declares its hooks ``True`` here:
    hidden, they would make the traced program another one than the model runs; a hook that
    changes no value (a logger, a timer) is declared ``False``. A process-wide hook
    (``register_module_forward_hook``) is asked with ``module=None``: it does not run in
    the graph of a leaf, so unless it is declared ``False`` every module call is pinned.
    """


@hookspec(firstresult=True)
def fxsym_derived_tensors(module: Any, hook: Any) -> Any:
    """A :class:`fxsym.plugins.hookroles.DerivedTensors` if forward pre-hook ``hook`` on
    ``module`` recomputes tensors of the module from others before every forward (``weight``
    from ``weight_g``/``weight_v``: ``torch.nn.utils.weight_norm``), else ``None``.

    Such a hook is part of the computation: it stays on the module while traced, the
    module's family describes the tensor it computes, and a resize keeps entries of that
    tensor through the answer's ``keep`` (its sources resized consistently); an answer
    without ``keep`` pins the module's groups, its ``reason`` in the trace report.
    """


@hookspec
def fxsym_register_op_rules(register: Any) -> None:
    """``register(target, rule)``: how a function or method moves elastic dimensions.

    ``target`` is the callable of a ``call_function`` node or the method name of a
    ``call_method`` node; ``rule(ctx: fxsym.analysis.OpContext)`` returns the layout of the
    node's value (see :mod:`fxsym.analysis.layout`).
    """


@hookspec
def fxsym_register_proxies(register: Any) -> None:
    """``register(value_type, proxy_cls)``: trace values of that type with that Proxy class.

    ``proxy_cls`` must subclass :class:`fxsym.tracer.ShapeProxy`.
    """


@hookspec
def fxsym_register_patterns(register: Any) -> None:
    """Contribute graph-rewrite patterns and named passes to :func:`fxsym.optimize`."""


@hookspec
def fxsym_trace_context(model: Any, example_inputs: Any) -> Any:
    """Return a context manager active while ``model`` is traced, or ``None``.

    ``model`` is the module tree the trace runs: a shadow of the user's model (same classes,
    parameters, buffers and qualified names; see :mod:`fxsym.tracer.shadow`), so what the
    context changes in it never reaches the user's modules. A record kept by module should
    be keyed by :func:`fxsym.tracer.original_module` of it.
    """


@hookspec(firstresult=True)
def fxsym_example_inputs(model: Any) -> Any:
    """Return default example inputs (tuple of args or dict of kwargs) for ``model``, or None."""


@hookspec(firstresult=True)
def fxsym_default_outputs(model: Any) -> Any:
    """Return the default output contract of ``model``, or ``None`` (every output).

    The contract is a sequence of output names or positions (see
    :mod:`fxsym.analysis.outputs`): groups reaching them stay constant, other outputs may
    change size after a resize. A name missing from an actual output is skipped.
    """


@hookspec
def fxsym_after_resize(model: Any, symmap: Any, kept: Any, sizes: Any) -> None:
    """Bring what describes ``model`` up to date after :func:`fxsym.resize` changed it (a
    Hugging Face model's ``config``).

    Called once per successful resize, after every resize rule, inside the resize's
    transaction: if an implementation raises, the plugin is disabled, the model is restored
    and ``fxsym.resize`` raises :class:`~fxsym.errors.ResizeError`. Like a resize rule, an
    implementation must bind new objects (``module.config = new_config``), never change the
    old ones in place, or the restore cannot undo it.

    * ``symmap``: the :class:`~fxsym.SymMap` the resize used (it describes the model as it was
      before; it is marked stale once the resize returns);
    * ``kept``: ``{group name: indices kept}`` (1-D ``torch.long`` tensors), the choices made;
    * ``sizes``: ``{(module_qualname, symbol_name): (length before, length after)}`` for every
      symbol and parameter member (``(owner, "name:dim")``) whose dimension the resize
      changed. Symbols a leaf's resize rule resizes inside it (:attr:`fxsym.Symbol.covers`)
      are not listed: read the resized modules.
    """


@hookspec
def fxsym_undescribed_groups(model: Any, symmap: Any) -> Any:
    """The searchable groups of ``symmap`` that ``model``'s own description (a config its
    library rebuilds it from) could not follow if a resize changed them:
    ``{group name: reason}``, or that it follows only in steps: ``{group name: (entries,
    reason)}`` (a kept size a multiple of ``entries`` entries, or the whole group); or
    ``None``.

    :func:`fxsym.plan` with ``describable=True`` keeps the first whole (and records the
    reasons in ``Plan.extra["undescribed"]``) and rounds the second to their step (recorded in
    ``Plan.extra["steps"]``), so the pruned model saves with its library's own
    ``save_pretrained``. Called before anything is resized; it must not change the model.
    """


@hookspec
def fxsym_group_steps(model: Any, symmap: Any) -> Any:
    """The searchable groups of ``symmap`` whose sizes ``model``'s own kernels take only in
    steps: ``{group name: (entries, reason)}`` (a kept size must be a multiple of ``entries``
    entries of the group's dim, or the whole group), or ``None``.

    Called once by :func:`fxsym.analyze`, after the groups are found; it must not change the
    model. The step becomes :attr:`fxsym.SymGroup.step` (in units; several plugins' steps
    combine to their least common multiple), which every plan rounds to.
    """


@hookspec
def fxsym_group_sources(model: Any, symmap: Any) -> Any:
    """Where the sizes of the searchable groups of ``symmap`` are read from: ``{group name:
    source}`` (a string naming what sizes the group: the hf plugin gives the config fields
    whose change changes the group's parameter dims, ``"intermediate_size"``), or ``None``.

    Groups read from different sources are different things even where their sizes are
    equal: :func:`fxsym.search.roles` makes them different width classes, which the search
    sizes each from its own range, and a group read from where a residual stream is read, as
    long as it, is that hidden size again (no FFN width). Called once per analysis when roles
    are first asked for; it must not change the model. Several plugins: the first to name a
    group decides.
    """


@hookspec
def fxsym_after_depth(model: Any, group: Any, kept: Any) -> Any:
    """Bring what describes ``model`` up to date after :func:`fxsym.resize` dropped blocks of
    the depth group ``group`` (a :class:`~fxsym.symbols.DepthGroup`); ``kept`` is the list of
    the old positions kept, in order (block ``kept[j]`` is now block ``j``).

    Called inside the resize's transaction, after the blocks were dropped and renumbered,
    with the same rules as ``fxsym_after_resize`` (bind new objects; a raise disables the
    plugin and restores the model). Return the names of what selects a value per block
    that the plugin made follow the kept blocks (a Hugging Face config's ``layer_types``),
    or ``None``: a group with ``varying_inputs`` is dropped only if some plugin names one.
    """


@hookspec
def fxsym_depth_kinds(model: Any, group: Any) -> Any:
    """The kinds of blocks of the depth group ``group`` (a
    :class:`~fxsym.symbols.DepthGroup`) of which ``model`` must keep at least one block once
    blocks are dropped: ``{kind: (positions, why)}`` (what tells the kind's blocks from the
    others, their positions in the stack, why one must stay: a hybrid's attention layers,
    without which transformers' cache cannot be used), or ``None``.

    Asked before any block is dropped (:func:`fxsym.depth.choose_blocks`): a count of blocks
    keeps the best-ranked block of a missing kind in place of the worst one kept, a choice of
    positions losing a kind is refused. It must not change the model.
    """


@hookspec
def fxsym_depth_refusal(model: Any, group: Any, kept: Any) -> Any:
    """Why the plugin's ``fxsym_after_depth`` would refuse keeping the blocks ``kept`` (old
    positions, increasing) of the depth group ``group``, as a message, or ``None``.

    Asked before any block is dropped, so that a caller choosing among several sets of
    blocks (the architecture search's depths) skips those refused; it must not change the
    model.
    """


@hookspec
def fxsym_save_files(model: Any, plan: Any) -> Any:
    """The files :func:`fxsym.save` writes beside the weights and ``fxsym.json`` for
    ``model`` (pruned by ``plan``), so that the directory is also what the model's own
    library reads (the hf plugin: ``config.json``, as ``save_pretrained`` writes it):
    ``{file name: bytes}``, or ``None``.

    Called once per save, before anything is written. A name is a plain file name (no
    directory part), not ``fxsym.json`` or ``model.safetensors``, and given by one plugin
    only. If an implementation raises, the plugin is disabled and the save raises
    :class:`~fxsym.errors.PlanError` with nothing written.
    """


@hookspec(firstresult=True)
def fxsym_checkpoint_reader(directory: Any) -> Any:
    """A reader of the checkpoint directory ``directory`` (a :class:`pathlib.Path`) for
    :func:`fxsym.prune_checkpoint`, or ``None`` when the plugin does not know its kind (the
    hf plugin: a directory with a ``config.json``). Answer quickly and read little: the reader
    (:class:`fxsym.checkpoint.CheckpointReader`) does the work in its methods, which raise
    :class:`~fxsym.errors.CheckpointError` on bad input (an error raised here disables the
    plugin)."""
