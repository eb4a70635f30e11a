"""SymInfos and resize rules of the torch.nn module families.

Each family is a triple: ``factory(module) -> SymInfo``, ``resize(module, symbol, index)``
keeping the entries ``index`` of the symbol's dimension, and ``importance(module, symbol)``
scoring the entries of an OUTGOING symbol by the L1 norm of the weights producing them.
A symbol the family cannot resize safely is returned already disabled (constant), which
makes the analyzer fix the dimension it touches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxsym import Symbol, SymInfo
from fxsym.plugins.contracts import SymInfoRegistrar
from fxsym.resizing import keep_entries, l1_scores, resize_projection

from . import values
from .options import norm_groups

IN = Symbol.CLType.INCOMING
OUT = Symbol.CLType.OUTGOING

Conv = (nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.ConvTranspose1d | nn.ConvTranspose2d
        | nn.ConvTranspose3d)


# -- Linear ------------------------------------------------------------------------------------
def linear_info(mod: nn.Module) -> SymInfo:
    return SymInfo(
        leading_dims_are_batch=True,
        in_features=Symbol(cl_type=IN, elastic_dims={-1}),
        out_features=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}),
    )


def linear_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    resize_projection(mod, name, index)


def linear_importance(mod: Any, name: str) -> torch.Tensor:
    return l1_scores(mod.weight, 0)


# -- Conv / ConvTranspose ------------------------------------------------------------------------
def _channel_dims(mod: Conv) -> set[int]:
    return {1, -(len(mod.kernel_size) + 1)}


def conv_info(mod: Conv) -> SymInfo:
    dims = _channel_dims(mod)
    groups = mod.groups
    in_sym = Symbol(cl_type=IN, elastic_dims=dims)
    out_sym = Symbol(is_searchable=True, cl_type=OUT, elastic_dims=dims)
    if groups == 1:
        return SymInfo(in_channels=in_sym, out_channels=out_sym)
    if isinstance(mod, nn.modules.conv._ConvTransposeNd):  # grouped transposed: not yet
        in_sym.disable()
        out_sym.disable()
        return SymInfo(in_channels=in_sym, out_channels=out_sym)
    # grouped (and depthwise): output channels of conv group g read only the input channels of
    # group g, so channels can only go a whole conv group at a time, on both sides at once
    in_sym.units = groups
    out_sym = Symbol(cl_type=OUT, elastic_dims=dims)
    out_sym.link_to(in_sym)
    return SymInfo(in_channels=in_sym, out_channels=out_sym)


def conv_resize(mod: Conv, name: str, index: torch.Tensor) -> None:
    transposed = isinstance(mod, nn.modules.conv._ConvTransposeNd)
    out_dim, in_dim = (1, 0) if transposed else (0, 1)
    if mod.groups > 1:  # whole conv groups go: the per-group weight slice is unchanged
        if name == "out_channels":
            keep_entries(mod, "weight", 0, index)
            keep_entries(mod, "bias", 0, index)
            mod.out_channels = len(index)
        else:
            per_group = mod.in_channels // mod.groups
            mod.in_channels = len(index)
            mod.groups = len(index) // per_group
        return
    if name == "in_channels":
        keep_entries(mod, "weight", in_dim, index)
        mod.in_channels = len(index)
    else:
        keep_entries(mod, "weight", out_dim, index)
        keep_entries(mod, "bias", 0, index)
        mod.out_channels = len(index)


def conv_importance(mod: Conv, name: str) -> torch.Tensor:
    transposed = isinstance(mod, nn.modules.conv._ConvTransposeNd)
    return l1_scores(mod.weight, 1 if transposed and mod.groups == 1 else 0)


# -- norms ---------------------------------------------------------------------------------------
def batchnorm_info(mod: nn.Module) -> SymInfo:
    return SymInfo(is_shape_preserving=True,
                   num_features=Symbol(cl_type=IN, elastic_dims={1}))


def batchnorm_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        keep_entries(mod, p, 0, index)
    mod.num_features = len(index)


def layernorm_info(mod: nn.LayerNorm) -> SymInfo:
    shape = tuple(mod.normalized_shape)
    if len(shape) == 1:
        return SymInfo(is_shape_preserving=True,
                       normalized_shape=Symbol(cl_type=IN, elastic_dims={-1}))
    # normalized over several dims: none of them may change (the analyzer fixes them)
    return SymInfo()


def layernorm_resize(mod: nn.LayerNorm, name: str, index: torch.Tensor) -> None:
    keep_entries(mod, "weight", 0, index)
    keep_entries(mod, "bias", 0, index)
    mod.normalized_shape = (len(index),)


def layernorm2d_info(mod: nn.LayerNorm) -> SymInfo:
    if len(tuple(mod.normalized_shape)) != 1:
        return SymInfo()
    return SymInfo(is_shape_preserving=True,
                   normalized_shape=Symbol(cl_type=IN, elastic_dims={1}))


def groupnorm_info(mod: nn.GroupNorm) -> SymInfo:
    """GroupNorm normalises each run of ``num_channels // num_groups`` consecutive channels
    together: a run may move or go as a whole without changing the others' statistics, but
    a channel moved or dropped inside a run would change its run's. So the channels change
    a whole run at a time (``units=num_groups``) and ``num_groups`` follows the runs kept.
    One group (statistics over all channels, which any channel order keeps) has no runs.

    In an analysis with ``norm_groups="keep"`` (:mod:`fxsym.analysis.options`) the runs stay
    instead (``units_stay``): ``num_groups`` is not declared, and every run loses as many
    channels (a channel moved inside its run keeps the run's statistics)."""
    groups, channels = mod.num_groups, mod.num_channels
    if groups == 1:
        return SymInfo(is_shape_preserving=True,
                       num_channels=Symbol(cl_type=IN, elastic_dims={1}))
    if norm_groups() == "keep":
        return SymInfo(is_shape_preserving=True, num_channels=Symbol(
            cl_type=IN, elastic_dims={1}, units=groups, units_stay=True))
    per_group = channels // groups
    sym = Symbol(cl_type=IN, elastic_dims={1}, units=groups)
    return SymInfo(is_shape_preserving=True, num_channels=sym).declare(
        num_groups="num_channels" if per_group == 1 else f"num_channels // {per_group}")


def groupnorm_resize(mod: nn.GroupNorm, name: str, index: torch.Tensor) -> None:
    keep_entries(mod, "weight", 0, index)
    keep_entries(mod, "bias", 0, index)
    mod.num_channels = len(index)


def instancenorm_info(mod: nn.Module) -> SymInfo:
    return SymInfo(is_shape_preserving=True,
                   num_features=Symbol(cl_type=IN, elastic_dims={1}))


# -- embeddings, PReLU ---------------------------------------------------------------------------
def embedding_info(mod: nn.Module) -> SymInfo:
    return SymInfo(embedding_dim=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}))


def embedding_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    keep_entries(mod, "weight", 1, index)
    mod.embedding_dim = len(index)


def embedding_importance(mod: Any, name: str) -> torch.Tensor:
    return l1_scores(mod.weight, 1)


def prelu_info(mod: nn.PReLU) -> SymInfo:
    if mod.num_parameters == 1:
        return SymInfo(is_shape_preserving=True)
    return SymInfo(is_shape_preserving=True,
                   num_parameters=Symbol(cl_type=IN, elastic_dims={1}))


def prelu_resize(mod: nn.PReLU, name: str, index: torch.Tensor) -> None:
    keep_entries(mod, "weight", 0, index)
    mod.num_parameters = len(index)


# -- MultiheadAttention --------------------------------------------------------------------------
def mha_info(mod: nn.MultiheadAttention) -> SymInfo:
    """nn.MultiheadAttention ties its input width to its packed q/k/v width (``embed_dim`` =
    ``num_heads * head_dim``): the embedding dim can only change a whole head at a time, and
    the output (``out_proj``) follows it. ``embed_dim``, ``kdim``, ``vdim`` and ``num_heads``
    are declared from it (``head_dim`` stays)."""
    embed = Symbol(cl_type=IN, elastic_dims={-1})
    out = Symbol(cl_type=OUT, elastic_dims={-1})
    if not mod._qkv_same_embed_dim or mod.bias_k is not None or mod.add_zero_attn:
        embed.disable()
        out.disable()
        return SymInfo(embed_dim=embed, embed_dim_out=out)
    embed.units = mod.num_heads
    out.link_to(embed)
    return SymInfo(embed_dim=embed, embed_dim_out=out).declare(
        embed_dim="embed_dim", kdim="embed_dim", vdim="embed_dim",
        num_heads=f"embed_dim // {mod.head_dim}")


def mha_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    if name != "embed_dim":
        return  # embed_dim_out carries the same index: everything is done once
    e = mod.embed_dim
    rows = torch.cat([index + i * e for i in range(3)])
    keep_entries(mod, "in_proj_weight", 0, rows)
    keep_entries(mod, "in_proj_weight", 1, index)
    keep_entries(mod, "in_proj_bias", 0, rows)
    keep_entries(mod.out_proj, "weight", 0, index)
    keep_entries(mod.out_proj, "weight", 1, index)
    keep_entries(mod.out_proj, "bias", 0, index)
    mod.out_proj.in_features = mod.out_proj.out_features = len(index)


# -- recurrent: RNN, GRU, LSTM -------------------------------------------------------------------
def _rnn_state_places(mod: nn.RNNBase, which: int | None) -> list[tuple[str, tuple[Any, ...]]]:
    """Where a state of the RNN (LSTM: ``which`` 0 for ``h``, 1 for ``c``; GRU and RNN: the
    one state, ``None``) lies in the output ``(output, state)`` and in the input ``hx``: its
    last dim."""
    path: tuple[int, ...] = (-1,) if which is None else (which, -1)
    return [("output", (1, *path)), ("input", (1, *path)), ("input", ("hx", *path))]


def rnn_info(mod: nn.RNNBase) -> SymInfo:
    """``nn.RNN``/``nn.GRU``/``nn.LSTM``: every layer and direction has ``hidden_size`` units
    (the rows of each weight in 1, 3 or 4 gate blocks, the columns of the recurrent weight),
    so the hidden size is one group across layers. Its output holds the forward then (when
    bidirectional) the backward half, the same units kept in each (``copies``); the
    states ``h_n``/``c_n`` and ``h_0``/``c_0`` carry it too. With ``proj_size`` the output and
    ``h`` are the projection's, a group of its own, and the hidden size is internal (it sizes
    ``c`` only). ``input_size`` sizes the input's last dim (layer 0 reads it)."""
    copies = 2 if mod.bidirectional else 1
    lstm = isinstance(mod, nn.LSTM)
    inp = Symbol(cl_type=IN, elastic_dims={-1})
    h_places = _rnn_state_places(mod, 0 if lstm else None)
    if not mod.proj_size:
        hidden = Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}, copies=copies,
                        places=h_places + (_rnn_state_places(mod, 1) if lstm else []))
        return SymInfo(input_size=inp, hidden_size=hidden)
    hidden = Symbol(is_searchable=True, size=mod.hidden_size,
                    places=_rnn_state_places(mod, 1))
    proj = Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}, copies=copies,
                  places=h_places)
    return SymInfo(input_size=inp, hidden_size=hidden, proj_size=proj)


def _rnn_weights(mod: nn.RNNBase) -> list[tuple[int, str]]:
    """``(layer, suffix)`` of every layer and direction: ``weight_ih_l{layer}{suffix}``."""
    return [(layer, sfx) for layer in range(mod.num_layers)
            for sfx in ("", "_reverse")[:2 if mod.bidirectional else 1]]


def _rnn_gates(mod: nn.RNNBase) -> int:
    return {"LSTM": 4, "GRU": 3}.get(mod.mode, 1)


def rnn_resize(mod: nn.RNNBase, name: str, index: torch.Tensor) -> None:
    """Keep the hidden units (or projection outputs, or input features) ``index``: rows of
    every gate block, the recurrent columns, and layer ``k > 0``'s input columns, which read
    the previous layer's output (each direction's half). The output symbols receive the
    entries of the whole output dim (both halves): the first half names the units. Then
    ``_init_flat_weights`` rebuilds the flat list ``forward`` passes to the kernel."""
    copies = 2 if mod.bidirectional else 1
    if name == "input_size":
        for layer, sfx in _rnn_weights(mod):
            if layer == 0:
                keep_entries(mod, f"weight_ih_l0{sfx}", 1, index)
        mod.input_size = len(index)
    elif name == "hidden_size":
        h = mod.hidden_size
        one = index if mod.proj_size else index[:len(index) // copies]
        rows = torch.cat([one + g * h for g in range(_rnn_gates(mod))])
        for layer, sfx in _rnn_weights(mod):
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                keep_entries(mod, f"{w}_l{layer}{sfx}", 0, rows)
            if mod.proj_size:
                keep_entries(mod, f"weight_hr_l{layer}{sfx}", 1, one)
                continue
            keep_entries(mod, f"weight_hh_l{layer}{sfx}", 1, one)
            if layer:
                keep_entries(mod, f"weight_ih_l{layer}{sfx}", 1,
                             torch.cat([one + d * h for d in range(copies)]))
        mod.hidden_size = len(one)
    else:  # proj_size
        p = mod.proj_size
        one = index[:len(index) // copies]
        for layer, sfx in _rnn_weights(mod):
            keep_entries(mod, f"weight_hr_l{layer}{sfx}", 0, one)
            keep_entries(mod, f"weight_hh_l{layer}{sfx}", 1, one)
            if layer:
                keep_entries(mod, f"weight_ih_l{layer}{sfx}", 1,
                             torch.cat([one + d * p for d in range(copies)]))
        mod.proj_size = len(one)
    mod._init_flat_weights()


def rnn_importance(mod: nn.RNNBase, name: str) -> torch.Tensor:
    """Per hidden unit (or projection output): the L1 norm of every weight row producing it,
    over all gates, layers and directions."""
    if name == "proj_size":
        return sum((l1_scores(getattr(mod, f"weight_hr_l{layer}{sfx}"), 0)
                    for layer, sfx in _rnn_weights(mod)), torch.zeros(mod.proj_size))
    total = torch.zeros(mod.hidden_size)
    for layer, sfx in _rnn_weights(mod):
        for w in ("weight_ih", "weight_hh"):
            total = total + l1_scores(getattr(mod, f"{w}_l{layer}{sfx}"), 0).reshape(
                -1, mod.hidden_size).sum(0)
    return total


# -- torchvision's Swin window attention (named: torchvision stays optional) ---------------------
def swin_attention_info(mod: Any) -> SymInfo:
    """Like MultiheadAttention: the width is ``num_heads * head_dim`` on both sides, so the
    embedding dim changes a whole head at a time and the output follows the input;
    ``num_heads`` is declared from it."""
    dim = Symbol(cl_type=IN, elastic_dims={-1}, units=mod.num_heads)
    out = Symbol(cl_type=OUT, elastic_dims={-1})
    out.link_to(dim)
    return SymInfo(dim=dim, dim_out=out).declare(
        num_heads=f"dim // {mod.proj.in_features // mod.num_heads}")


def swin_attention_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    if name != "dim":
        return  # dim_out carries the same index
    c = mod.proj.in_features
    head_dim = c // mod.num_heads
    heads = index[::head_dim] // head_dim
    rows = torch.cat([index + i * c for i in range(3)])
    for lin, out_idx in ((mod.qkv, rows), (mod.proj, index)):
        keep_entries(lin, "weight", 0, out_idx)
        keep_entries(lin, "weight", 1, index)
        keep_entries(lin, "bias", 0, out_idx)
        lin.in_features, lin.out_features = len(index), len(out_idx)
    if hasattr(mod, "relative_position_bias_table"):
        keep_entries(mod, "relative_position_bias_table", 1, heads)
    if hasattr(mod, "logit_scale"):  # V2: per-head scale and continuous position bias
        keep_entries(mod, "logit_scale", 0, heads)
        last = mod.cpb_mlp[-1]
        keep_entries(last, "weight", 0, heads)
        keep_entries(last, "bias", 0, heads)
        last.out_features = len(heads)


# -- stateless, shape-preserving -----------------------------------------------------------------
def shape_preserving_info(mod: nn.Module) -> SymInfo:
    return SymInfo(is_shape_preserving=True)


def no_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Nothing to resize (stateless modules)."""


SHAPE_PRESERVING: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid,
    nn.Hardtanh, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.Mish, nn.Softplus, nn.Softsign,
    nn.Tanhshrink, nn.LogSigmoid, nn.Threshold, nn.RReLU, nn.Softmax, nn.LogSoftmax,
    nn.Softmin, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
    nn.AlphaDropout, nn.FeatureAlphaDropout,
)

Family = tuple[Any, Callable[..., SymInfo], Any, Any]

FAMILIES: list[Family] = [
    (nn.Linear, linear_info, linear_resize, linear_importance),
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
      nn.ConvTranspose3d), conv_info, conv_resize, conv_importance),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm), batchnorm_info,
     batchnorm_resize, None),
    # LayerNorm subclasses of optional packages that only change how they compute: named, so
    # torchvision and timm stay optional
    ((nn.LayerNorm, nn.RMSNorm, "timm.layers.norm.LayerNorm"), layernorm_info, layernorm_resize,
     None),
    (("torchvision.models.convnext.LayerNorm2d", "timm.layers.norm.LayerNorm2d"),
     layernorm2d_info, layernorm_resize, None),
    (nn.GroupNorm, groupnorm_info, groupnorm_resize, None),
    ((nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), instancenorm_info,
     batchnorm_resize, None),
    (nn.Embedding, embedding_info, embedding_resize, embedding_importance),
    (nn.PReLU, prelu_info, prelu_resize, None),
    (nn.MultiheadAttention, mha_info, mha_resize, None),
    ((nn.RNN, nn.GRU, nn.LSTM), rnn_info, rnn_resize, rnn_importance),
    (("torchvision.models.swin_transformer.ShiftedWindowAttention",
      "torchvision.models.swin_transformer.ShiftedWindowAttentionV2"),
     swin_attention_info, swin_attention_resize, None),
    (SHAPE_PRESERVING, shape_preserving_info, no_resize, None),
]

#: torch.nn modules that are one functional call: traced into, so the op rules see them
TRACE_INTO: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.Flatten, nn.Unflatten, nn.Upsample,
    nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ReflectionPad2d,
    nn.ReplicationPad2d, nn.LPPool2d, nn.PixelShuffle, nn.PixelUnshuffle, nn.ChannelShuffle,
)


def trace_into_functional(module: nn.Module, qualname: str) -> bool | None:
    """Leaf policy: stateless torch.nn wrappers of one functional op are traced into."""
    return False if type(module) in TRACE_INTO else None


#: each family's value rule (:mod:`fxsym_plugins_nn.values`), by its SymInfo factory
VALUE_RULES: dict[Callable[..., SymInfo], Callable[..., Any]] = {
    linear_info: values.linear_value,
    conv_info: values.conv_value,
    swin_attention_info: values.swin_attention_value,
}


def register_sym_infos(register: SymInfoRegistrar) -> None:
    for classes, factory, resize, importance in FAMILIES:
        register(classes, factory, resize=resize, importance=importance,
                 value=VALUE_RULES.get(factory))


def guess_example_inputs(model: nn.Module) -> tuple[torch.Tensor, ...] | None:
    """Default example inputs from the model's first module that fixes an input size: an
    image for a 2-d conv (224x224), a sequence for a 1-d conv, token ids for an embedding,
    a feature vector for a linear. ``None`` when nothing tells."""
    for mod in model.modules():
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            spatial = {1: (256,), 2: (224, 224), 3: (16, 112, 112)}[len(mod.kernel_size)]
            return (torch.randn(1, mod.in_channels, *spatial),)
        if isinstance(mod, nn.Embedding):
            return (torch.zeros(1, 16, dtype=torch.long),)
        if isinstance(mod, nn.Linear):
            return (torch.randn(1, mod.in_features),)
    return None
