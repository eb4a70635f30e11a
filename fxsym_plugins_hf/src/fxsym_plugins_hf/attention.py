"""Attention modules: described as one leaf each, by their structure.

Every transformers attention module is built from the same blocks: query/key/value
projections (separate ``nn.Linear``/``Conv1D`` children, or one fused ``c_attn``), an
optional output projection, and a head layout read from attributes (``num_heads``,
``head_dim``, ...) or the config. :func:`describe` reads that structure, so a family needs no
code of its own. Structure alone does not say that heads are independent: it is applied only to
modules whose ``forward`` the plugin knows (:func:`.discovery.known_attention`); anything else
is traced through. A recognized module is traced as a leaf with these symbols:

* ``hidden`` (INCOMING, last dim): the projections' input features;
* ``out_features`` (OUTGOING, searchable): the output projection's rows; without an output
  projection (BERT's self-attention) the output is the concatenated heads, and ``heads``
  itself is the OUTGOING symbol, one unit per head of ``head_dim`` features (``block``);
* ``heads`` (searchable, ``size`` = key/value heads): one unit is a key/value head *with its
  group of query heads* (grouped-query attention); for plain multi-head attention that is one
  query head;
* ``queries_per_kv`` (grouped-query attention only): the query heads sharing one key/value
  head, kept alike in every group;
* ``head_dim``: the features of one head, kept alike in every head. Not resizable where
  rotary position embeddings pair its two halves (the rotation mixes entry ``i`` with
  ``i + head_dim/2``, and ``cos``/``sin`` are shared by all layers), where a query/key norm
  weighs it, nor where the heads leave the module unprojected.

A module is *not* made a leaf — it is traced through, and fxsym follows its projections and
head splits op by op — where a leaf would hide a tie: cross-attention (keys and values come
from a second input), attention sharing a per-head bias across layers (T5's
``position_bias``), and attention holding other sized tensors (per-head sinks, a norm over
all heads) that the resize rule would not know how to slice.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxsym import Symbol, SymInfo

from .modules import IN, OUT, conv1d_resize, linear_resize

Q_NAMES = ("q_proj", "query", "q", "q_lin", "to_q")
K_NAMES = ("k_proj", "key", "k", "k_lin", "to_k")
V_NAMES = ("v_proj", "value", "v", "v_lin", "to_v")
O_NAMES = ("o_proj", "out_proj", "o", "out_lin", "c_proj", "dense", "proj", "to_out")
FUSED_NAMES = ("c_attn",)
HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "n_head")
KV_COUNT_ATTRS = ("num_key_value_heads", "num_kv_heads")
HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "head_size", "key_value_proj_dim")
TOTAL_ATTRS = ("all_head_size", "inner_dim", "split_size")
#: forward parameters that mean a leaf would hide a tie (see the module docstring)
CROSS_PARAMS = ("key_value_states", "position_bias")


@dataclass(frozen=True)
class AttnSpec:
    """The structure of one attention module."""

    q: str | None  #: child names (``None`` when fused)
    k: str | None
    v: str | None
    fused: str | None  #: the fused q/k/v projection
    o: str | None  #: the output projection (``None``: heads leave the module unprojected)
    n_q: int
    n_kv: int
    head_dim: int
    rotary: bool  #: ``head_dim`` is paired by rotary embeddings or normed per head: constant
    leaf: bool  #: trace as one leaf (else traced through)
    why_not_leaf: str = ""

    @property
    def rep(self) -> int:
        return self.n_q // self.n_kv


def _is_projection(mod: Any) -> bool:
    return isinstance(mod, nn.Linear) or (type(mod).__name__ == "Conv1D" and hasattr(mod, "nf"))


def _features(mod: Any) -> tuple[int, int]:
    """(in, out) of a Linear or Conv1D."""
    if isinstance(mod, nn.Linear):
        return mod.in_features, mod.out_features
    return mod.nx, mod.nf


def projection_features(mod: Any) -> tuple[int, int] | None:
    """(in, out) features of an ``nn.Linear`` or GPT-2 ``Conv1D``; ``None`` for another
    module."""
    return _features(mod) if _is_projection(mod) else None


def _projection(module: nn.Module, name: str | None) -> nn.Module:
    """The projection child ``name`` (one :func:`describe` found)."""
    if name is None:
        raise ValueError(f"{type(module).__name__}: no such projection")
    return module.get_submodule(name)


def _out_in_weight(mod: nn.Module) -> torch.Tensor:
    """A projection's weight, detached, as ``(out, in)`` (GPT-2's ``Conv1D`` stores it
    transposed)."""
    w = mod.get_parameter("weight").detach()
    return w if isinstance(mod, nn.Linear) else w.t()


def _child(module: nn.Module, names: tuple[str, ...]) -> str | None:
    for name in names:
        if _is_projection(module._modules.get(name)):
            return name
    return None


def _int_attr(obj: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = vars(obj).get(name) if hasattr(obj, "__dict__") else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _forward_params(module: nn.Module) -> frozenset[str]:
    return _forward_params_of(type(module).forward)


@functools.lru_cache(maxsize=1024)
def _forward_params_of(forward: Any) -> frozenset[str]:
    """The parameter names of a ``forward`` (by function: ``inspect.signature`` costs ~10 ms
    on a transformers forward, and every resize and layout trial asks)."""
    try:
        return frozenset(inspect.signature(inspect.unwrap(forward)).parameters)
    except (TypeError, ValueError):
        return frozenset()


def describe(module: nn.Module) -> AttnSpec | None:
    """The attention structure of ``module``, or ``None`` if it is not an attention module."""
    fused = _child(module, FUSED_NAMES)
    q, k, v = (_child(module, names) for names in (Q_NAMES, K_NAMES, V_NAMES))
    if fused is None and None in (q, k, v):
        return None
    params = _forward_params(module)
    if "hidden_states" not in params:
        return None
    if fused is not None:
        d_in, d_out = _features(_projection(module, fused))
        if d_out % 3:
            return None
        q_out = kv_out = d_out // 3
    else:
        d_in, q_out = _features(_projection(module, q))
        k_in, kv_out = _features(_projection(module, k))
        v_in, v_out = _features(_projection(module, v))
        if (k_in, v_in) != (d_in, d_in) or v_out != kv_out:
            return None
    # head counts: the module's own attributes, else the current weights, else the config
    head_dim = _int_attr(module, HEAD_DIM_ATTRS)
    n_q = _int_attr(module, HEAD_COUNT_ATTRS)
    if n_q is None and head_dim:
        n_q = q_out // head_dim
    cfg = getattr(module, "config", None)
    if n_q is None and cfg is not None:
        n_q = _int_attr(cfg, ("num_attention_heads",))
    if not n_q:
        return None
    head_dim = head_dim or q_out // n_q
    if q_out != n_q * head_dim or kv_out % head_dim:
        return None
    n_kv = kv_out // head_dim
    if n_kv == 0 or n_q % n_kv:
        return None
    o = _child(module, O_NAMES)
    if o is not None and _features(_projection(module, o))[0] != q_out:
        o = None
    why = ""
    projections = {p for p in (q, k, v, fused, o) if p is not None}
    per_head_dim, other = _other_tensors(module, projections, head_dim)
    if getattr(module, "is_cross_attention", False) or any(p in params for p in CROSS_PARAMS):
        why = "its keys and values may come from a second input, or it shares a per-head " \
              "bias across layers"
    elif o is None and n_kv != n_q:
        why = "grouped-query heads leave it unprojected"
    elif other:
        why = f"it holds other sized tensors ({', '.join(other)})"
    return AttnSpec(q, k, v, fused, o, n_q, n_kv, head_dim,
                    rotary="position_embeddings" in params or per_head_dim,
                    leaf=not why, why_not_leaf=why)


def current_layout(module: nn.Module) -> tuple[int, int, int, int] | None:
    """``(hidden, query heads, key/value heads, head_dim)`` of an attention module as its
    weights are now (after a resize), or ``None`` if it has no query/key/value projections.

    ``head_dim`` is the module's attribute (the resize rule of a leaf updates it; a module
    traced through keeps it, since its head split pins ``head_dim``), else the query width
    over the head count."""
    fused = _child(module, FUSED_NAMES)
    q, k, v = (_child(module, names) for names in (Q_NAMES, K_NAMES, V_NAMES))
    if (fused is None and None in (q, k, v)) or "hidden_states" not in _forward_params(module):
        return None
    if fused is not None:
        d_in, d_out = _features(_projection(module, fused))
        q_out = kv_out = d_out // 3
    else:
        d_in, q_out = _features(_projection(module, q))
        kv_out = _features(_projection(module, k))[1]
    hd = _int_attr(module, HEAD_DIM_ATTRS)
    if hd is None:
        n_q = _int_attr(module, HEAD_COUNT_ATTRS)
        hd = q_out // n_q if n_q and q_out % n_q == 0 else None
    if not hd or q_out % hd or kv_out % hd:
        return None
    return d_in, q_out // hd, kv_out // hd, hd


def _other_tensors(module: nn.Module, projections: set[str],
                   head_dim: int) -> tuple[bool, list[str]]:
    """Parameters and buffers outside the projections: whether some are per-head_dim
    vectors (a query/key norm: ``head_dim`` must stay), and the names of any others (a
    resize of the heads would not know how to slice them)."""
    per_head_dim = False
    other: list[str] = []
    for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        if t.numel() > 1:
            other.append(name)
    for child_name, child in module.named_children():
        if child_name in projections:
            continue
        for name, t in [*child.named_parameters(), *child.named_buffers()]:
            if t.dim() == 1 and t.numel() == head_dim:
                per_head_dim = True
            elif t.numel() > 1:
                other.append(f"{child_name}.{name}")
    return per_head_dim, other


# -- SymInfo ---------------------------------------------------------------------------------
def _internal(size: int, covers: list[tuple[str, str]], *, sortable: bool = True,
              constant: bool = False) -> Symbol:
    sym = Symbol(is_searchable=not constant, is_sortable=sortable, size=size, covers=covers)
    if constant:
        sym.disable()
    return sym


def _covers(spec: AttnSpec) -> dict[str, list[tuple[str, str]]]:
    """The projections' symbols each leaf symbol sizes (:attr:`fxsym.Symbol.covers`): the
    leaf's resize rule resizes them, and they are members of the leaf symbol's groups."""
    qkv = [spec.fused] if spec.fused else [spec.q, spec.k, spec.v]
    ins = [(p, "in_features") for p in qkv if p is not None]
    outs = [(p, "out_features") for p in qkv if p is not None]
    o_in = [(spec.o, "in_features")] if spec.o is not None else []
    o_out = [(spec.o, "out_features")] if spec.o is not None else []
    q_out = [(spec.fused or spec.q or "", "out_features")]
    return {"hidden": ins, "out_features": o_out, "heads": outs + o_in,
            "queries_per_kv": q_out + o_in, "head_dim": outs + o_in}


def attention_info(module: nn.Module, pinned: bool = False) -> SymInfo:
    """The leaf's symbols (see the module docstring). Heads are constant if ``pinned``: the
    latest trace handed the module a per-head tensor (:mod:`.perhead`). The module's head
    counts, ``head_dim`` and total width are declared from them (:func:`_declare`)."""
    spec = describe(module)
    if spec is None or not spec.leaf:
        return SymInfo()
    covers = _covers(spec)
    hidden = Symbol(cl_type=IN, elastic_dims={-1}, covers=covers["hidden"])
    if spec.o is None:  # the concatenated heads leave the module
        heads = Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}, block=spec.head_dim,
                       covers=covers["heads"])
        if pinned:
            heads.disable()
        return _declare(module, SymInfo(hidden=hidden, heads=heads), spec)
    out = Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1},
                 covers=covers["out_features"])
    heads = _internal(spec.n_kv, covers["heads"], constant=pinned)
    group = (_internal(spec.rep, covers["queries_per_kv"], constant=pinned)
             if spec.rep > 1 else None)
    head_dim = _internal(spec.head_dim, covers["head_dim"], sortable=not spec.rotary,
                         constant=spec.rotary)
    if group is None:
        info = SymInfo(hidden=hidden, out_features=out, heads=heads, head_dim=head_dim)
    else:
        info = SymInfo(hidden=hidden, out_features=out, heads=heads, queries_per_kv=group,
                       head_dim=head_dim)
    return _declare(module, info, spec)


def _declare(module: nn.Module, info: SymInfo, spec: AttnSpec) -> SymInfo:
    """Declare the head layout attributes ``module`` holds (:meth:`fxsym.SymInfo.declare`):
    query heads ``heads * queries_per_kv``, key/value heads ``heads``, ``head_dim`` and the
    total width, so ``fxsym.resize`` keeps them with the projections. Without an output
    projection ``heads`` counts query heads (one unit of ``head_dim`` features each) and
    ``head_dim`` is fixed. An attribute whose value is not what its name says here (the lists
    hold several spellings) is left out."""
    per_kv = " * queries_per_kv" if "queries_per_kv" in info.symbols else ""
    dim = " * head_dim" if "head_dim" in info.symbols else f" * {spec.head_dim}"
    wanted: list[tuple[tuple[str, ...], str, int]] = [
        (HEAD_COUNT_ATTRS, "heads" + per_kv, spec.n_q),
        (KV_COUNT_ATTRS, "heads", spec.n_kv),
        (TOTAL_ATTRS, "heads" + per_kv + dim, spec.n_q * spec.head_dim),
    ]
    if per_kv:
        wanted.append((("num_key_value_groups",), "queries_per_kv", spec.rep))
    if "head_dim" in info.symbols:
        wanted.append((HEAD_DIM_ATTRS, "head_dim", spec.head_dim))
    state = vars(module)
    info.declare(**{name: expr for names, expr, value in wanted for name in names
                    if type(state.get(name)) is int and state[name] == value})
    return info


# -- resize ----------------------------------------------------------------------------------
def _layout(module: nn.Module, spec: AttnSpec) -> tuple[int, int, int]:
    """The current (key/value heads, queries per key/value head, head_dim)."""
    hd = _int_attr(module, HEAD_DIM_ATTRS) or spec.head_dim
    if spec.fused is not None:
        q_out = _features(_projection(module, spec.fused))[1] // 3
        kv_out = q_out
    else:
        q_out = _features(_projection(module, spec.q))[1]
        kv_out = _features(_projection(module, spec.k))[1]
    n_kv = kv_out // hd
    return n_kv, q_out // (n_kv * hd), hd


def _rows(heads: torch.Tensor, reps: torch.Tensor, dims: torch.Tensor, rep: int,
          hd: int) -> torch.Tensor:
    """Feature indices ``(head * rep + r) * hd + d`` for every kept head, r and d."""
    idx = (heads[:, None, None] * rep + reps[None, :, None]) * hd + dims[None, None, :]
    return idx.flatten()


def _keep_out(mod: nn.Module, index: torch.Tensor) -> None:
    """Keep output features of a projection (``nn.Linear`` or GPT-2's ``Conv1D``)."""
    if isinstance(mod, nn.Linear):
        linear_resize(mod, "out_features", index)
    else:
        conv1d_resize(mod, "out_features", index)


def _keep_in(mod: nn.Module, index: torch.Tensor) -> None:
    """Keep input features of a projection (``nn.Linear`` or GPT-2's ``Conv1D``)."""
    if isinstance(mod, nn.Linear):
        linear_resize(mod, "in_features", index)
    else:
        conv1d_resize(mod, "in_features", index)


def attention_resize(module: nn.Module, name: str, index: torch.Tensor) -> None:
    """Keep ``index`` of symbol ``name`` in the projections. The head layout attributes are
    declared (:func:`_declare`): ``fxsym.resize`` sets them after each call, so the next call
    reads a ``head_dim`` that matches the projections."""
    spec = describe(module)
    if spec is None:
        raise ValueError(f"{type(module).__name__} is no longer a recognized attention module")
    if name == "hidden":
        for p in [spec.fused] if spec.fused else [spec.q, spec.k, spec.v]:
            _keep_in(_projection(module, p), index)
        return
    if name == "out_features":
        _keep_out(_projection(module, spec.o), index)
        return
    n_kv, rep, hd = _layout(module, spec)
    heads, reps, dims = torch.arange(n_kv), torch.arange(rep), torch.arange(hd)
    if name == "heads":
        heads = index[::hd] // hd if spec.o is None else index  # block-expanded without o
    elif name == "queries_per_kv":
        reps = index
    elif name == "head_dim":
        dims = index
    else:
        raise KeyError(name)
    q_rows = _rows(heads, reps, dims, rep, hd)
    kv_rows = _rows(heads, torch.zeros(1, dtype=torch.long), dims, 1, hd)
    if spec.fused is not None:
        width = n_kv * rep * hd
        _keep_out(_projection(module, spec.fused),
                  torch.cat([q_rows, kv_rows + width, kv_rows + 2 * width]))
    else:
        _keep_out(_projection(module, spec.q), q_rows)
        _keep_out(_projection(module, spec.k), kv_rows)
        _keep_out(_projection(module, spec.v), kv_rows)
    if spec.o is not None:
        _keep_in(_projection(module, spec.o), q_rows)


def attention_importance(module: nn.Module, name: str) -> torch.Tensor:
    spec = describe(module)
    assert spec is not None
    if name == "out_features":
        return _out_in_weight(_projection(module, spec.o)).abs().sum(1)
    n_kv, rep, hd = _layout(module, spec)
    if spec.fused is not None:
        w = _out_in_weight(_projection(module, spec.fused))[: n_kv * rep * hd]
    else:
        w = _out_in_weight(_projection(module, spec.q))
    scores = w.float().abs().sum(1).reshape(n_kv, rep, hd)
    if name == "heads":
        return scores.sum((1, 2))
    if name == "queries_per_kv":
        return scores.sum((0, 2))
    return scores.sum((0, 1))
