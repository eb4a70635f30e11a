"""Value rules of torch.nn leaves: a leaf's output on meta inputs, computed from metadata.

``rule(module, args, kwargs)`` gives what running the module on the meta device gives (shape,
dtype, strides) or ``None``: the tracer then runs it, as it does for a family without a rule,
and a wrong input raises the same error as before. So each rule gives a value only when its
preconditions hold: the module is of exactly the class (a subclass may compute otherwise)
with torch's own forward, one floating input (row-major for convolutions; of any layout for
``nn.Linear`` and Swin's attention, whose outputs are new row-major tensors), the weights of
that dtype and of the shapes the input needs. Outside of that (channels-last inputs of a
convolution, other padding modes, a channel count that does not match, ...) it says
``None``. ``tests/test_value_rules.py`` compares
every rule with running over many configurations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxsym.tracer.values import (
    meta_empty,
    nonempty,
    plain_float,
    row_major,
    strides_row_major,
)


def _methods(cls: type) -> tuple[Any, ...]:
    return getattr(cls, "forward", None), getattr(cls, "_conv_forward", None)


#: the forwards the rules describe, torch's own (defined in ``torch.nn.modules``): a class
#: whose forward was replaced (a library patching ``nn.Linear.forward``, before this module
#: was imported or after) computes something else, and is run
_FORWARDS: dict[type, tuple[Any, ...]] = {
    cls: _methods(cls)
    for cls in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                nn.ConvTranspose2d, nn.ConvTranspose3d)
    if all(m is None or getattr(m, "__module__", "").startswith("torch.nn.modules.")
           for m in _methods(cls))}


def _torch_forward(cls: type) -> bool:
    """``cls`` is one of torch.nn's classes above, its forward as torch defines it."""
    known = _FORWARDS.get(cls)
    return known is not None and known == _methods(cls)


def _weight(t: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """``t`` is a plain strided tensor (or Parameter) of ``dtype`` and ``shape``."""
    return (type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided
            and t.dtype == dtype and tuple(t.shape) == shape)


def _input(args: tuple[Any, ...], kwargs: dict[str, Any],
           any_layout: bool = False) -> torch.Tensor | None:
    """The one input of a module called as ``module(x)``, if it is a floating meta tensor
    without empty dims, and row-major unless ``any_layout``."""
    if kwargs or len(args) != 1:
        return None
    x = args[0]
    if not plain_float(x):
        return None
    return x if (nonempty(x) if any_layout else row_major(x)) else None


def _ints(value: Any, n: int, least: int) -> bool:
    if type(value) is not tuple or len(value) != n:
        return False
    for v in value:  # a loop: all() of a generator costs more for two or three items
        if type(v) is not int or v < least:
            return False
    return True


# -- Linear -----------------------------------------------------------------------------------
def linear_value(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``nn.Linear`` on ``(..., in_features)``: ``(..., out_features)``, row-major whatever
    the input's layout (torch computes it as one matrix product of the input reshaped to
    rows, an ``addmm`` for 2 dims, or a batched product, each giving a new row-major
    tensor)."""
    x = _input(args, kwargs, any_layout=True)
    if (type(mod) is not nn.Linear or not _torch_forward(nn.Linear) or x is None
            or x.dim() == 0):
        return None
    weight = mod.weight
    out = weight.shape[0] if weight.dim() == 2 else 0
    if out == 0 or not _weight(weight, x.dtype, (out, x.shape[-1])):
        return None
    if mod.bias is not None and not _weight(mod.bias, x.dtype, (out,)):
        return None
    return meta_empty((*x.shape[:-1], out), x.dtype)


# -- Conv / ConvTranspose -----------------------------------------------------------------------
_CONV_DIMS: dict[type, int] = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3,
                               nn.ConvTranspose1d: 1, nn.ConvTranspose2d: 2,
                               nn.ConvTranspose3d: 3}


def conv_value(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``nn.Conv{1,2,3}d`` and ``nn.ConvTranspose{1,2,3}d`` with zeros padding, on a batched
    or unbatched input: the output of torch's shape formula, row-major."""
    n = _CONV_DIMS.get(type(mod))
    x = _input(args, kwargs)
    if n is None or not _torch_forward(type(mod)) or x is None or x.dim() not in (n + 1, n + 2):
        return None
    assert isinstance(mod, nn.modules.conv._ConvNd)
    groups, weight, bias = mod.groups, mod.weight, mod.bias
    transposed = isinstance(mod, nn.modules.conv._ConvTransposeNd)
    if type(weight) not in (torch.Tensor, nn.Parameter):
        return None
    shape = tuple(weight.shape)  # read once: each read of a Parameter's metadata costs ~1 us
    kernel = shape[2:]
    channels = x.shape[-n - 1]
    if (type(groups) is not int or groups < 1 or len(shape) != n + 2
            or mod.padding_mode != "zeros"):
        return None
    if transposed:
        out = shape[1] * groups
        ok = shape[0] == channels and channels % groups == 0
    else:
        out = shape[0]
        ok = shape[1] * groups == channels and out % groups == 0
    if (not ok or out == 0 or weight.layout != torch.strided or weight.dtype != x.dtype
            or not strides_row_major(shape, weight.stride())):  # some torch versions follow
        return None  # a channels-last weight
    if bias is not None and not _weight(bias, x.dtype, (out,)):
        return None
    stride, dilation = mod.stride, mod.dilation
    padding: Any = mod.padding
    extra: Any = getattr(mod, "output_padding", None)
    if not (_ints(stride, n, 1) and _ints(dilation, n, 1)):
        return None
    spatial = x.shape[-n:]
    if padding == "same" and not transposed:
        if any(s != 1 for s in stride):
            return None
        sizes = list(spatial)
    else:
        if padding == "valid":
            padding = (0,) * n
        if not _ints(padding, n, 0):
            return None
        if transposed:
            if not _ints(extra, n, 0) or any(
                    e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
                return None
            sizes = [(size - 1) * s - 2 * p + d * (k - 1) + e + 1 for size, s, p, d, k, e
                     in zip(spatial, stride, padding, dilation, kernel, extra)]
        else:
            sizes = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, s, p, d, k
                     in zip(spatial, stride, padding, dilation, kernel)]
    if any(size < 1 for size in sizes):
        return None
    return meta_empty((*x.shape[:-n - 1], out, *sizes), x.dtype)


# -- torchvision's Swin window attention --------------------------------------------------------
_SWIN = "torchvision.models.swin_transformer"


def swin_attention_value(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ShiftedWindowAttention``/``V2`` on ``(B, H, W, C)``: the same shape, when its
    projections and tables have the shapes that ``C`` and ``num_heads`` give. Whatever the
    input's layout, the windows are reshaped into a new tensor before the attention, and the
    output is ``x[:, :H, :W, :].contiguous()`` of a new row-major ``x`` padded to whole
    windows (:func:`_unpadded`)."""
    x = _input(args, kwargs, any_layout=True)
    cls = type(mod)
    if x is None or x.dim() != 4 or cls.__module__ != _SWIN:
        return None
    v2 = cls.__qualname__ == "ShiftedWindowAttentionV2"
    if not v2 and cls.__qualname__ != "ShiftedWindowAttention":
        return None
    for method in (cls.forward, cls.get_relative_position_bias):
        if getattr(method, "__module__", None) != _SWIN:  # replaced: run it
            return None
    dtype, c = x.dtype, x.shape[3]
    heads, window, shift = mod.num_heads, mod.window_size, mod.shift_size
    if (type(heads) is not int or heads < 1 or c % heads or not _window(window)
            or not _window(shift, least=0)):
        return None
    for p in (mod.attention_dropout, mod.dropout):
        if type(p) not in (int, float) or not 0 <= p <= 1:
            return None
    qkv, proj = mod.qkv, mod.proj
    if type(qkv) is not nn.Linear or type(proj) is not nn.Linear:
        return None
    if not (_weight(qkv.weight, dtype, (3 * c, c)) and _weight(proj.weight, dtype, (c, c))):
        return None
    if qkv.bias is not None and not _weight(qkv.bias, dtype, (3 * c,)):
        return None
    if proj.bias is not None and not _weight(proj.bias, dtype, (c,)):
        return None
    span = (2 * window[0] - 1, 2 * window[1] - 1)
    index = mod.relative_position_index
    if (type(index) is not torch.Tensor or index.dtype != torch.int64
            or tuple(index.shape) != ((window[0] * window[1]) ** 2,)):
        return None
    if v2:
        if not _swin_v2_bias(mod, dtype, heads, span):
            return None
    elif not _weight(mod.relative_position_bias_table, dtype, (span[0] * span[1], heads)):
        return None
    return _unpadded(x.shape, window, dtype)


def _unpadded(shape: torch.Size, window: list[int], dtype: torch.dtype) -> torch.Tensor:
    """What ``x[:, :H, :W, :].contiguous()`` gives for a row-major ``x`` of ``shape`` padded
    to whole windows: the slice itself where torch calls it contiguous (it ignores the
    strides of dims of size 1), else a row-major copy."""
    h, w, c = shape[1:]
    padded_w = -(-w // window[1]) * window[1]
    padded_h = -(-h // window[0]) * window[0]
    strides = (padded_h * padded_w * c, padded_w * c, c, 1)
    sliced = torch.empty_strided(tuple(shape), strides, dtype=dtype, device="meta")
    return sliced if sliced.is_contiguous() else meta_empty(shape, dtype)


def _window(value: Any, least: int = 1) -> bool:
    return (type(value) is list and len(value) == 2
            and all(type(v) is int and v >= least for v in value))


def _swin_v2_bias(mod: Any, dtype: torch.dtype, heads: int, span: tuple[int, int]) -> bool:
    """V2's position bias comes from ``cpb_mlp`` (Linear(2, h), ReLU, Linear(h, heads)) on
    ``relative_coords_table``; its logits are scaled by ``logit_scale`` (heads, 1, 1)."""
    mlp = mod.cpb_mlp
    if type(mlp) is not nn.Sequential or len(mlp) != 3:
        return False
    first, act, last = mlp[0], mlp[1], mlp[2]
    if type(first) is not nn.Linear or type(act) is not nn.ReLU or type(last) is not nn.Linear:
        return False
    hidden = first.weight.shape[0]
    if not (_weight(first.weight, dtype, (hidden, 2)) and _weight(last.weight, dtype,
                                                                   (heads, hidden))):
        return False
    if hidden == 0 or last.bias is not None or (
            first.bias is not None and not _weight(first.bias, dtype, (hidden,))):
        return False
    table = mod.relative_coords_table
    return (_weight(table, dtype, (1, span[0], span[1], 2))
            and _weight(mod.logit_scale, dtype, (heads, 1, 1)))
