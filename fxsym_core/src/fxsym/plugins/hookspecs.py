"""Hook specifications: everything a plugin can contribute to fxsym, each with its types.

Each hook is a :class:`typing.Protocol` of one method, the hook's specification: pluggy reads
it (:data:`HOOKS`, added to every :class:`~fxsym.plugins.PluginManager`) and mypy reads the
same signature, so what a hook takes and gives is stated once. The values with more than one
field are in :mod:`.contracts` (the ``register`` callables, :class:`~.contracts.GroupStep`,
:class:`~.contracts.Undescribed`, :class:`~.contracts.NeededBlocks`) and
:mod:`.hookroles` (:class:`~.hookroles.DerivedTensors`).

A plugin declares the hooks it implements, and mypy then checks each implementation against
its specification (``mypy --strict``: argument and return types); pluggy checks the argument
names when the plugin is registered:

* a plugin class subclasses the hooks' protocols::

      class MyPlugin(hookspecs.LeafModuleHook, hookspecs.GroupStepsHook):
          @fxsym.hookimpl
          def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None: ...

* a plugin module names them in a protocol and assigns itself to it, for mypy only::

      class Hooks(hookspecs.LeafModuleHook, hookspecs.ExampleInputsHook, Protocol): ...

      if TYPE_CHECKING:
          from . import plugin as _this
          _checked: Hooks = _this

:func:`declared_hooks` names the hooks a protocol class (a plugin class, or its ``Hooks``)
declares, so a test can check that every implementation is declared.

Two kinds of hooks (how each is called: :mod:`fxsym.plugins.calls`):

* *registration* hooks (``fxsym_register_*``), ``fxsym_trace_context``,
  ``fxsym_after_resize``, ``fxsym_after_depth``, ``fxsym_depth_kinds``,
  ``fxsym_depth_refusal``, ``fxsym_group_steps``, ``fxsym_untraced_paths``,
  ``fxsym_group_sources``, ``fxsym_roles``, ``fxsym_usage_recorder``,
  ``fxsym_analysis_options``, ``fxsym_size_options``,
  ``fxsym_undescribed_groups`` and ``fxsym_save_files`` call every plugin.
  Each registration hook's plugin gets its own ``register`` callable, so conflicts and
  ``fxsym plugins`` name the distribution behind each contribution;
* *decision* hooks (``firstresult=True``: ``fxsym_leaf_module``, ``fxsym_hook_computes``,
  ``fxsym_derived_tensors``, ``fxsym_example_inputs``, ``fxsym_default_outputs``,
  ``fxsym_batch_loss``, ``fxsym_checkpoint_reader``) answer one question per call: the
  first implementation in pluggy's order that returns something other than ``None``
  decides, and hook wrappers see (and may replace) that answer.

Types of higher rooms are named in annotations only (``TYPE_CHECKING``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pluggy
import torch
from torch import nn

if TYPE_CHECKING:
    from ..prune.checkpoint import CheckpointReader
    from ..prune.planning import Plan
    from ..symbols import DepthGroup, SymMap
    from .contracts import (
        AnalysisOption,
        ExampleInputs,
        ForwardHook,
        GroupStep,
        Kept,
        NeededBlocks,
        OpRuleRegistrar,
        PatternRegistrar,
        ProxyRegistrar,
        RoleMap,
        SizeChanges,
        SizeOption,
        SymInfoRegistrar,
        Undescribed,
        UsageRecorder,
    )
    from .hookroles import DerivedTensors

PROJECT = "fxsym"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class RegisterSymInfosHook(Protocol):
    @hookspec
    def fxsym_register_sym_infos(self, register: SymInfoRegistrar) -> None:
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


class LeafModuleHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
        """Whether the tracer keeps ``module`` (at ``qualname``) as one ``call_module`` node
        (``True``), traces into it (``False``), or leaves the question to others (``None``).

        Asked for every module the tracer meets, before the ``leaf`` of its SymInfo registration;
        when no plugin answers, that registration decides, else torch.fx's default (``torch.nn``
        modules are leaves).
        """


class HookComputesHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_hook_computes(self, module: nn.Module | None, hook: ForwardHook
                                ) -> bool | None:
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


class DerivedTensorsHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_derived_tensors(self, module: nn.Module, hook: ForwardHook
                                  ) -> DerivedTensors | None:
        """A :class:`fxsym.plugins.hookroles.DerivedTensors` if forward pre-hook ``hook`` on
        ``module`` recomputes tensors of the module from others before every forward (``weight``
        from ``weight_g``/``weight_v``: ``torch.nn.utils.weight_norm``), else ``None``.

        Such a hook is part of the computation: it stays on the module while traced, the
        module's family describes the tensor it computes, and a resize keeps entries of that
        tensor through the answer's ``keep`` (its sources resized consistently); an answer
        without ``keep`` pins the module's groups, its ``reason`` in the trace report.
        """


class RegisterOpRulesHook(Protocol):
    @hookspec
    def fxsym_register_op_rules(self, register: OpRuleRegistrar) -> None:
        """``register(target, rule)``: how a function or method moves elastic dimensions.

        ``target`` is the callable of a ``call_function`` node or the method name of a
        ``call_method`` node; ``rule(ctx: fxsym.analysis.OpContext)`` returns the layout of the
        node's value (see :mod:`fxsym.analysis.layout`).
        """


class RegisterProxiesHook(Protocol):
    @hookspec
    def fxsym_register_proxies(self, register: ProxyRegistrar) -> None:
        """``register(value_type, proxy_cls)``: trace values of that type with that Proxy class.

        ``proxy_cls`` must subclass :class:`fxsym.tracer.ShapeProxy`.
        """


class RegisterPatternsHook(Protocol):
    @hookspec
    def fxsym_register_patterns(self, register: PatternRegistrar) -> None:
        """Contribute graph-rewrite patterns and named passes to :func:`fxsym.optimize`."""


class TraceContextHook(Protocol):
    @hookspec
    def fxsym_trace_context(self, model: nn.Module, example_inputs: ExampleInputs | None
                                ) -> AbstractContextManager[object] | None:
        """Return a context manager active while ``model`` is traced, or ``None``.

        ``model`` is the module tree the trace runs: a shadow of the user's model (same classes,
        parameters, buffers and qualified names; see :mod:`fxsym.tracer.shadow`), so what the
        context changes in it never reaches the user's modules. A record kept by module should
        be keyed by :func:`fxsym.tracer.original_module` of it.
        """


class ExampleInputsHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_example_inputs(self, model: nn.Module) -> ExampleInputs | None:
        """Return default example inputs (a tuple of positional arguments or a dict of keyword
        arguments) for ``model``, or ``None``."""


class DefaultOutputsHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_default_outputs(self, model: nn.Module) -> Sequence[str | int] | None:
        """Return the default output contract of ``model``, or ``None`` (every output).

        The contract is a sequence of output names or positions (see
        :mod:`fxsym.analysis.outputs`): groups reaching them stay constant, other outputs may
        change size after a resize. A name missing from an actual output is skipped.
        """


class AfterResizeHook(Protocol):
    @hookspec
    def fxsym_after_resize(self, model: nn.Module, symmap: SymMap, kept: Kept,
                               sizes: SizeChanges) -> None:
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


class AnalysisOptionsHook(Protocol):
    @hookspec
    def fxsym_analysis_options(self) -> Sequence[AnalysisOption]:
        """The analysis options the plugin's rules read
        (:class:`~fxsym.plugins.contracts.AnalysisOption`: a keyword of
        :func:`fxsym.analyze`, its values, the default first): the nn plugin's
        ``norm_groups`` (how group norms change) and ``routing_groups`` (how the blocks of a
        group picked by value change). :func:`fxsym.analyze` refuses a keyword no plugin
        declares; several plugins declaring one name: the first declaration counts.

        Called by every plugin when an analysis is given options; it must be cheap and the
        same every time. The command line's flags (``--norm-groups``) are made of these
        declarations, read without torch where the plugins are not loaded
        (:mod:`fxsym.declarations`: the distribution names a torch-free object implementing
        this hook under the ``fxsym.declarations`` entry-point group).
        """


class SizeOptionsHook(Protocol):
    @hookspec
    def fxsym_size_options(self) -> Sequence[SizeOption]:
        """The sizes a request can give by role (:class:`~fxsym.declarations.SizeOption`:
        a name, the help of its flag): the keys of ``sizes={name: entries}``
        (:func:`fxsym.prune_checkpoint`, :class:`fxsym.PruneRequest`) and the command line's
        ``--name N`` flags, each the name of a role the same plugin declares for the models
        it knows (``fxsym_roles``, which maps a size to groups): the hf plugin's ``hidden``,
        ``ffn``, ``heads``, ... Model-independent and cheap; the command line reads them
        without torch where the plugins are not loaded (:mod:`fxsym.declarations`, as for
        ``fxsym_analysis_options``). Several plugins declaring one name: the first counts.
        """


class UndescribedGroupsHook(Protocol):
    @hookspec
    def fxsym_undescribed_groups(self, model: nn.Module, symmap: SymMap
                                     ) -> Mapping[str, Undescribed] | None:
        """The searchable groups of ``symmap`` that ``model``'s own description (a config its
        library rebuilds it from) could not follow if a resize changed them: ``{group name:
        Undescribed(reason)}`` (no change at all), or ``{group name: Undescribed(reason,
        step=entries)}`` (a kept size a multiple of ``entries`` entries, or the whole group);
        or ``None``.

        :func:`fxsym.plan` with ``describable=True`` keeps the first whole (and records the
        reasons in ``Plan.extra["undescribed"]``) and rounds the second to their step (recorded
        in ``Plan.extra["steps"]``), so the pruned model saves with its library's own
        ``save_pretrained``. Called before anything is resized; it must not change the model.
        (An answer of the old shapes, a reason string or an ``(entries, reason)`` tuple, is
        still read, with a ``DeprecationWarning``.)
        """


class GroupStepsHook(Protocol):
    @hookspec
    def fxsym_group_steps(self, model: nn.Module, symmap: SymMap
                              ) -> Mapping[str, GroupStep] | None:
        """The searchable groups of ``symmap`` whose sizes ``model``'s own kernels take only in
        steps: ``{group name: GroupStep(entries, reason)}`` (a kept size must be a multiple of
        ``entries`` entries of the group's dim, or the whole group; a plain ``(entries,
        reason)`` tuple is the same), or ``None``.

        Called once by :func:`fxsym.analyze`, after the groups are found; it must not change the
        model. The step becomes :attr:`fxsym.SymGroup.step` (in units; several plugins' steps
        combine to their least common multiple), which every plan rounds to.
        """


class UntracedPathsHook(Protocol):
    @hookspec
    def fxsym_untraced_paths(self, model: nn.Module, symmap: SymMap,
                             example_inputs: ExampleInputs) -> Mapping[str, str] | None:
        """The searchable groups of ``symmap`` that a path of ``model`` the trace did not run
        would break if resized: ``{group name: reason}``, or ``None``.

        The trace runs one program (a transformers model without its cache); the model may run
        others its library calls it with (``generate``'s cached decode), whose reads fxsym did
        not see. A plugin that knows such a path tries it and names the groups it cannot prove
        safe: :func:`fxsym.analyze` pins each (constant, its reason in the group table and an
        ``untraced-path`` trace-report line). A key naming no group is a line of the report
        only (``""``: the model's, "the path could not be tried"). Called once per analysis
        with the example inputs traced, after the groups and their steps are found (``symmap``
        holds the traced graph, ``symmap.graph``, as ``fxsym_group_steps``' does); it must not
        change the model.
        """


class GroupSourcesHook(Protocol):
    @hookspec
    def fxsym_group_sources(self, model: nn.Module, symmap: SymMap
                                ) -> Mapping[str, str] | None:
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


class RolesHook(Protocol):
    @hookspec
    def fxsym_roles(self, model: nn.Module, symmap: SymMap) -> RoleMap | None:
        """The roles the plugin recognises among the searchable groups of ``symmap``: a
        :class:`~fxsym.plugins.contracts.RoleMap` (a
        :class:`~fxsym.plugins.contracts.Role` per kind of group: its name, what it is, how
        the workflow treats it, its groups; and how a request's sizes become roles' sizes),
        or ``None``.

        What a role is to fxsym: a *name* a request sizes it by (``sizes_for(symmap,
        ffn=96)``, ``fxsym prune --ffn 96``) and the search's table shows, a *description*
        for messages, the *groups* it holds, and a *kind*
        (:class:`~fxsym.plugins.contracts.RoleKind`): the one stream width the search tries
        fractions of, the widths it sizes together (one fraction for every width class, each
        rounded to its groups' steps and ``round_to``), counts sized only when asked, and
        groups no size names. The core and the workflow name no role: a transformer's
        (hidden, FFN, heads, experts: the hf plugin, found by mechanisms, for any model) and
        any other plugin's (a UNet's channel levels) arrive the same way.

        Called by every plugin whenever roles are asked for (:func:`fxsym.prune.roles.roles`); it
        must not change the model. Several plugins: a role name is the first plugin's, and a
        group already held by a role of an earlier answer is left out of a later one.
        """


class BatchLossHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_batch_loss(self, output: object, batch: object) -> float | None:
        """The loss of a model's ``output`` on one calibration ``batch`` (what the model
        returned for it), where the plugin knows what the output means (the hf plugin: the
        next-token cross-entropy of ``logits`` for the batch's ``input_ids``), or ``None``.

        The architecture search scores each candidate by its mean over the calibration
        batches (lower is better); where no plugin answers, a model in memory is scored by the
        mean squared error to the unpruned model's output, a streamed checkpoint is refused.
        It must not change ``output`` or ``batch``.
        """


class ComparedOutputHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_compared_output(self, output: object) -> torch.Tensor | None:
        """The tensor of a model's ``output`` that stands for it where two models' outputs
        are compared, where the plugin knows what the output holds (the hf plugin: the
        ``logits`` of a transformers ``ModelOutput``), or ``None``.

        The architecture search in memory, where no plugin gives a loss
        (``fxsym_batch_loss``), scores a candidate by the mean squared error of this tensor to
        the unpruned model's; where no plugin answers, the output itself, or the first tensor
        of a tuple or list, is compared. It must not change ``output``.
        """


class UsageRecorderHook(Protocol):
    @hookspec
    def fxsym_usage_recorder(self, model: nn.Module, symmap: SymMap) -> UsageRecorder | None:
        """A :class:`~fxsym.plugins.contracts.UsageRecorder` of groups of ``symmap`` whose
        units are better scored by how a calibration run of ``model`` uses them than by their
        activations (the hf plugin: the experts of each routed group, by router load and
        routing-weighted output), or ``None``.

        Called by every plugin when an activation importance is recorded
        (:class:`fxsym.importance.ActivationRecorder`, in memory and streamed block by block);
        the recorder's scores replace the activations' for the groups it scores, its records
        go into a streamed checkpoint prune's ``plan.extra``. It must not change the model
        until attached.
        """


class AfterDepthHook(Protocol):
    @hookspec
    def fxsym_after_depth(self, model: nn.Module, group: DepthGroup, kept: Sequence[int]
                              ) -> Sequence[str] | None:
        """Bring what describes ``model`` up to date after :func:`fxsym.resize` dropped blocks of
        the depth group ``group`` (a :class:`~fxsym.symbols.DepthGroup`); ``kept`` is the list of
        the old positions kept, in order (block ``kept[j]`` is now block ``j``).

        Called inside the resize's transaction, after the blocks were dropped and renumbered,
        with the same rules as ``fxsym_after_resize`` (bind new objects; a raise disables the
        plugin and restores the model). Return the names of what selects a value per block
        that the plugin made follow the kept blocks (a Hugging Face config's ``layer_types``),
        or ``None``: a group with ``varying_inputs`` is dropped only if some plugin names one.
        """


class DepthKindsHook(Protocol):
    @hookspec
    def fxsym_depth_kinds(self, model: nn.Module, group: DepthGroup
                              ) -> Mapping[str, NeededBlocks] | None:
        """The kinds of blocks of the depth group ``group`` (a
        :class:`~fxsym.symbols.DepthGroup`) of which ``model`` must keep at least one block once
        blocks are dropped: ``{kind: NeededBlocks(positions, why)}`` (what tells the kind's
        blocks from the others, their positions in the stack, why one must stay: a hybrid's
        attention layers, without which transformers' cache cannot be used; a plain
        ``(positions, why)`` tuple is the same), or ``None``.

        Asked before any block is dropped (:func:`fxsym.depth.choose_blocks`): a count of blocks
        keeps the best-ranked block of a missing kind in place of the worst one kept, a choice of
        positions losing a kind is refused. It must not change the model.
        """


class DepthRefusalHook(Protocol):
    @hookspec
    def fxsym_depth_refusal(self, model: nn.Module, group: DepthGroup, kept: Sequence[int]
                                ) -> str | None:
        """Why the plugin's ``fxsym_after_depth`` would refuse keeping the blocks ``kept`` (old
        positions, increasing) of the depth group ``group``, as a message, or ``None``.

        Asked before any block is dropped, so that a caller choosing among several sets of
        blocks (the architecture search's depths) skips those refused; it must not change the
        model.
        """


class SaveFilesHook(Protocol):
    @hookspec
    def fxsym_save_files(self, model: nn.Module, plan: Plan) -> Mapping[str, bytes] | None:
        """The files :func:`fxsym.save` writes beside the weights and ``fxsym.json`` for
        ``model`` (pruned by ``plan``), so that the directory is also what the model's own
        library reads (the hf plugin: ``config.json``, as ``save_pretrained`` writes it):
        ``{file name: bytes}``, or ``None``.

        Called once per save, before anything is written. A name is a plain file name (no
        directory part), not ``fxsym.json`` or ``model.safetensors``, and given by one plugin
        only. If an implementation raises, the plugin is disabled and the save raises
        :class:`~fxsym.errors.PlanError` with nothing written.
        """


class CheckpointReaderHook(Protocol):
    @hookspec(firstresult=True)
    def fxsym_checkpoint_reader(self, directory: Path) -> CheckpointReader | None:
        """A reader of the checkpoint directory ``directory`` (a :class:`pathlib.Path`) for
        :func:`fxsym.prune_checkpoint`, or ``None`` when the plugin does not know its kind (the
        hf plugin: a directory with a ``config.json``). Answer quickly and read little: the reader
        (:class:`fxsym.prune.checkpoint.CheckpointReader`) does the work in its methods, which raise
        :class:`~fxsym.errors.CheckpointError` on bad input (an error raised here disables the
        plugin)."""


#: every hook specification, in the order of this module
HOOKS: tuple[type, ...] = (
    RegisterSymInfosHook, LeafModuleHook, HookComputesHook, DerivedTensorsHook,
    RegisterOpRulesHook, RegisterProxiesHook, RegisterPatternsHook, TraceContextHook,
    ExampleInputsHook, DefaultOutputsHook, AfterResizeHook, AnalysisOptionsHook, SizeOptionsHook,
    UndescribedGroupsHook,
    GroupStepsHook, UntracedPathsHook, GroupSourcesHook, RolesHook, BatchLossHook,
    ComparedOutputHook, UsageRecorderHook, AfterDepthHook, DepthKindsHook, DepthRefusalHook,
    SaveFilesHook,
    CheckpointReaderHook,
)
_BY_CLASS = {cls: name for cls in HOOKS for name in vars(cls) if name.startswith("fxsym_")}


def declared_hooks(cls: type) -> frozenset[str]:
    """The names of the hooks ``cls`` declares it implements: those of the hook protocols
    among its bases (:data:`HOOKS`)."""
    return frozenset(_BY_CLASS[base] for base in cls.__mro__ if base in _BY_CLASS)
