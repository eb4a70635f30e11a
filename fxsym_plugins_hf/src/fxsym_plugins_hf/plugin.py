"""The ``hf`` plugin (entry point ``fxsym = hf``, naming :class:`HuggingFacePlugin`).

Each plugin manager registers an instance of its own, which holds what it found in models
(:class:`.discovery.Known`) and which attention leaves were handed per-head tensors
(:class:`.perhead.PerHeadInputs`): two managers never share that state.

Loading the plugin does not import transformers (a model built with it has imported it
already); it fails, and ``fxsym plugins`` says why, when transformers is not installed. The
work is done in small modules: :mod:`.context` (trace preparation), :mod:`.masks`,
:mod:`.inputs` (default example inputs and outputs), :mod:`.attention` and :mod:`.discovery`
(attention modules), :mod:`.rotary`, :mod:`.modules` (``Conv1D``, activations), :mod:`.ops`
(op rules), :mod:`.configs` (``model.config`` after a resize), :mod:`.describable` (the
sizes a config can describe), :mod:`.kernels` (sizes transformers' kernels take),
:mod:`.sources` (the config fields each group's size is read from), :mod:`.cachepath` (the
cached path ``generate`` runs, tried after a trial resize), :mod:`.checkpoint` (the
files ``fxsym.save`` adds for a transformers model), :mod:`.pretrained` (a
``save_pretrained`` directory read for ``fxsym.prune_checkpoint``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

import fxsym
from fxsym.plugins import get_plugin_manager, hookspecs
from fxsym.plugins.contracts import (
    ExampleInputs,
    ForwardHook,
    GroupStep,
    Kept,
    NeededBlocks,
    OpRuleRegistrar,
    RoleMap,
    SizeChanges,
    SizeOption,
    SymInfoRegistrar,
    Undescribed,
    UsageRecorder,
)

from . import (
    attention,
    cachepath,
    checkpoint,
    configs,
    context,
    describable,
    diffusers_configs,
    discovery,
    inputs,
    kernels,
    modules,
    rotary,
    sources,
)
from .perhead import PerHeadInputs

if TYPE_CHECKING:
    from fxsym.prune.checkpoint import CheckpointReader
    from fxsym.prune.planning import Plan
    from fxsym.symbols import DepthGroup, SymMap

if importlib.util.find_spec("transformers") is None:
    raise ImportError("fxsym-plugins-hf needs transformers (pip install 'transformers>=5')")


def _transformers_imported() -> bool:
    """No model holds a transformers class unless transformers was imported."""
    return "transformers" in sys.modules


class HuggingFacePlugin(
        hookspecs.RegisterSymInfosHook, hookspecs.LeafModuleHook, hookspecs.HookComputesHook,
        hookspecs.RegisterOpRulesHook, hookspecs.TraceContextHook, hookspecs.ExampleInputsHook,
        hookspecs.DefaultOutputsHook, hookspecs.AfterResizeHook, hookspecs.GroupStepsHook,
        hookspecs.UntracedPathsHook, hookspecs.GroupSourcesHook, hookspecs.RolesHook,
        hookspecs.BatchLossHook, hookspecs.ComparedOutputHook, hookspecs.UsageRecorderHook,
        hookspecs.UndescribedGroupsHook,
        hookspecs.AfterDepthHook, hookspecs.DepthKindsHook, hookspecs.DepthRefusalHook,
        hookspecs.SaveFilesHook, hookspecs.CheckpointReaderHook, hookspecs.SizeOptionsHook):
    """The hook implementations, with the state of one plugin manager; its bases are the
    hooks it implements, so mypy checks each against fxsym's specification."""

    def __init__(self) -> None:
        self.known = discovery.Known()
        self.per_head = PerHeadInputs()

    def attention_info(self, module: nn.Module) -> fxsym.SymInfo:
        return attention.attention_info(module, pinned=self.per_head.reason(module) is not None)

    @fxsym.hookimpl
    def fxsym_register_sym_infos(self, register: SymInfoRegistrar) -> None:
        register(modules.CONV1D, modules.conv1d_info, resize=modules.conv1d_resize,
                 importance=modules.conv1d_importance)
        register(list(self.known.activations), modules.activation_info,
                 resize=modules.no_resize)
        for cls in self.known.attention:
            register(cls, self.attention_info, leaf=False, resize=attention.attention_resize,
                     importance=attention.attention_importance)
        for cls in self.known.rotary:
            register(cls, rotary.rotary_info, leaf=False, resize=rotary.no_resize)

    @fxsym.hookimpl
    def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
        if not _transformers_imported():
            return None
        return discovery.leaf_policy(module, qualname)

    @fxsym.hookimpl
    def fxsym_hook_computes(self, module: nn.Module | None, hook: ForwardHook
                            ) -> bool | None:
        if not _transformers_imported():
            return None
        return context.transformers_hook(hook) or None

    @fxsym.hookimpl
    def fxsym_register_op_rules(self, register: OpRuleRegistrar) -> None:
        from . import ops

        ops.register_op_rules(register)

    @fxsym.hookimpl
    def fxsym_trace_context(self, model: nn.Module, example_inputs: ExampleInputs | None
                            ) -> AbstractContextManager[object] | None:
        if not _transformers_imported() or not isinstance(model, nn.Module):
            return None
        if self.known.discover(model):
            get_plugin_manager().contributions_changed()  # register the new classes
        if not context.is_transformers_model(model):
            return None
        return context.hf_trace_context(model, self.per_head)

    @fxsym.hookimpl
    def fxsym_example_inputs(self, model: nn.Module) -> ExampleInputs | None:
        return inputs.example_inputs(model) if _transformers_imported() else None

    @fxsym.hookimpl
    def fxsym_default_outputs(self, model: nn.Module) -> Sequence[str | int] | None:
        return inputs.default_outputs(model) if _transformers_imported() else None

    @fxsym.hookimpl
    def fxsym_after_resize(self, model: nn.Module, symmap: SymMap, kept: Kept,
                           sizes: SizeChanges) -> None:
        if _transformers_imported() and isinstance(model, nn.Module):
            configs.update_config(model, sizes, configs.attributes_read(symmap))
        if diffusers_configs.is_diffusers_model(model):
            diffusers_configs.update_config(model, sizes, configs.attributes_read(symmap))

    @fxsym.hookimpl
    def fxsym_group_steps(self, model: nn.Module, symmap: SymMap
                          ) -> Mapping[str, GroupStep] | None:
        if _transformers_imported() and isinstance(model, nn.Module):
            return kernels.group_steps(model, symmap) or None
        return None

    @fxsym.hookimpl
    def fxsym_untraced_paths(self, model: nn.Module, symmap: SymMap,
                             example_inputs: ExampleInputs) -> Mapping[str, str] | None:
        if _transformers_imported() and context.is_transformers_model(model):
            return cachepath.untraced_paths(model, symmap, example_inputs) or None
        return None

    @fxsym.hookimpl
    def fxsym_group_sources(self, model: nn.Module, symmap: SymMap
                            ) -> Mapping[str, str] | None:
        if _transformers_imported() and context.is_transformers_model(model):
            return sources.group_sources(model, symmap) or None
        return None

    @fxsym.hookimpl
    def fxsym_roles(self, model: nn.Module, symmap: SymMap) -> RoleMap | None:
        from .roles import transformer_roles

        return transformer_roles(symmap)  # found by mechanisms: any model may have them

    @fxsym.hookimpl
    def fxsym_size_options(self) -> Sequence[SizeOption]:
        from .declarations import SIZES

        return SIZES

    @fxsym.hookimpl
    def fxsym_batch_loss(self, output: object, batch: object) -> float | None:
        from .loss import next_token_loss

        return next_token_loss(output, batch)  # any model returning logits for input_ids

    @fxsym.hookimpl
    def fxsym_compared_output(self, output: object) -> torch.Tensor | None:
        from .loss import compared_output

        return compared_output(output)

    @fxsym.hookimpl
    def fxsym_usage_recorder(self, model: nn.Module, symmap: SymMap) -> UsageRecorder | None:
        from .experts import ExpertRecorder

        return ExpertRecorder(model, symmap)  # routed groups found by mechanisms: any model

    @fxsym.hookimpl
    def fxsym_undescribed_groups(self, model: nn.Module, symmap: SymMap
                                 ) -> Mapping[str, Undescribed] | None:
        if diffusers_configs.is_diffusers_model(model):
            return diffusers_configs.undescribed_groups(model, symmap)
        if _transformers_imported() and context.is_transformers_model(model):
            return describable.undescribed_groups(model, symmap) or None
        return None

    @fxsym.hookimpl
    def fxsym_after_depth(self, model: nn.Module, group: DepthGroup, kept: Sequence[int]
                          ) -> Sequence[str] | None:
        if _transformers_imported() and isinstance(model, nn.Module):
            from .stack_config import update_config_depth

            return update_config_depth(model, group, kept)
        return None

    @fxsym.hookimpl
    def fxsym_depth_kinds(self, model: nn.Module, group: DepthGroup
                          ) -> Mapping[str, NeededBlocks] | None:
        if _transformers_imported() and isinstance(model, nn.Module):
            from .blockkinds import needed_kinds

            return needed_kinds(model, group)
        return None

    @fxsym.hookimpl
    def fxsym_depth_refusal(self, model: nn.Module, group: DepthGroup, kept: Sequence[int]
                            ) -> str | None:
        if _transformers_imported() and isinstance(model, nn.Module):
            from .blockkinds import refused

            return refused(model, group, kept)
        return None

    @fxsym.hookimpl
    def fxsym_save_files(self, model: nn.Module, plan: Plan
                         ) -> Mapping[str, bytes] | None:
        if _transformers_imported() and isinstance(model, nn.Module):
            return checkpoint.save_files(model)
        return None

    @fxsym.hookimpl
    def fxsym_checkpoint_reader(self, directory: Path) -> CheckpointReader | None:
        from .pretrained import PretrainedDirectory

        return PretrainedDirectory(directory) if (directory / "config.json").is_file() else None
