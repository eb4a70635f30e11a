"""Trace preparation for transformers models (the ``fxsym_trace_context`` hook).

For the duration of one trace, and restored afterwards even when tracing raises:

* every config of the model (the model's and its submodules') asks for no KV cache
  (``use_cache=False``: a cache object cannot be a graph value), and an attention
  implementation other than ``eager``/``sdpa`` (flash, flex, paged) is switched to ``sdpa``,
  whose masks and kernels run on the meta device; mixture-of-experts layers use the
  ``batched_mm`` experts kernel (``eager`` loops over the experts hit, which depends on data;
  ``grouped_mm`` has no meta kernel for float32);
* the attention-mask builders become single opaque calls (:mod:`.masks`), and transformers'
  checks of the inputs' values leave traced conditions unchecked (:mod:`.checks`);
* attention leaves handed a per-head tensor are recorded (:mod:`.perhead`);
  rotary modules whose update depends on data compute their trace-time value without it
  (:mod:`.rotary`).

Nothing else is patched: decorators, ``**kwargs`` and output objects are handled by fxsym's
tracer (keyword root call, plain-dict outputs), shape and dtype control flow by its
shape-aware proxies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

from . import rotary
from .checks import value_checks_on_proxies
from .masks import mask_builders_as_leaves
from .perhead import PerHeadInputs

TRACEABLE_ATTENTION = ("eager", "sdpa")
#: mixture-of-experts kernels that run on meta tensors without data-dependent control flow
TRACEABLE_EXPERTS = ("batched_mm",)


def transformers_hook(hook: Any) -> bool:
    """Whether a module hook is transformers' own: part of how the model computes (the
    output-capturing hooks carry every layer's hidden state to the heads that read them), so
    it runs while the model is traced (``fxsym_hook_computes``)."""
    owner = getattr(hook, "__module__", None) or type(hook).__module__
    return owner == "transformers" or owner.startswith("transformers.")


def model_configs(model: nn.Module) -> list[Any]:
    """Every distinct transformers config reachable from ``model``'s modules."""
    from transformers import PretrainedConfig

    seen: dict[int, Any] = {}
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if isinstance(cfg, PretrainedConfig) and id(cfg) not in seen:
            seen[id(cfg)] = cfg
            for sub in _sub_configs(cfg):
                seen.setdefault(id(sub), sub)
    return list(seen.values())


def _sub_configs(cfg: Any) -> Iterator[Any]:
    from transformers import PretrainedConfig

    for key in getattr(cfg, "sub_configs", {}) or {}:
        sub = getattr(cfg, key, None)
        if isinstance(sub, PretrainedConfig):
            yield sub


def is_transformers_model(model: Any) -> bool:
    return isinstance(model, nn.Module) and bool(model_configs(model))


@contextmanager
def _config_overrides(configs: list[Any], *, no_cache: bool = True) -> Iterator[None]:
    saved: list[tuple[Any, str, Any, bool]] = []

    def put(cfg: Any, attr: str, value: Any) -> None:
        had = attr in vars(cfg)
        saved.append((cfg, attr, vars(cfg).get(attr), had))
        vars(cfg)[attr] = value  # plain attributes: bypass validation side effects

    try:
        for cfg in configs:
            if no_cache and getattr(cfg, "use_cache", False):
                put(cfg, "use_cache", False)
            impl = vars(cfg).get("_attn_implementation_internal")
            if impl is not None and impl not in TRACEABLE_ATTENTION:
                put(cfg, "_attn_implementation_internal", "sdpa")
            experts = vars(cfg).get("_experts_implementation_internal")
            if experts is not None and experts not in TRACEABLE_EXPERTS:
                put(cfg, "_experts_implementation_internal", "batched_mm")
        yield
    finally:
        for cfg, attr, value, had in reversed(saved):
            if had:
                vars(cfg)[attr] = value
            else:
                vars(cfg).pop(attr, None)


def traceable_kernels(configs: list[Any]) -> Any:
    """The trace's attention and experts kernels for ``configs`` (those that run on the meta
    device), the cache left as configured: how :mod:`.cachepath` runs the cached path."""
    return _config_overrides(configs, no_cache=False)


@contextmanager
def hf_trace_context(model: nn.Module, per_head: PerHeadInputs) -> Iterator[None]:
    """Everything a transformers model needs to be traced, undone on exit; the attention
    leaves handed a per-head tensor are recorded in ``per_head``."""
    with ExitStack() as stack:
        stack.enter_context(per_head.watch(model))
        stack.enter_context(_config_overrides(model_configs(model)))
        stack.enter_context(mask_builders_as_leaves())
        stack.enter_context(value_checks_on_proxies())
        stack.enter_context(rotary.meta_friendly(model))
        yield
