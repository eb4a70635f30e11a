"""Probes: tensors whose every element is its own flat index, so that what survives a resize
says which slices of each dim were kept (:func:`survivor_masks`), in a float type that holds
every index exactly (:func:`probe_dtype`). The derivation's fallback and the layout oracle
(:func:`fxsym.oracles.probe_layout`) both read probes.
"""

from __future__ import annotations

import torch


def probe_dtype(p: torch.Tensor) -> torch.dtype:
    """A float type holding every flat index of ``p`` exactly (probes stay parameters, which
    must be floating point)."""
    return torch.float32 if p.numel() <= 1 << 24 else torch.float64


def survivor_masks(t: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """Per dim of a probe of ``shape`` (each element its flat index), which slices are in
    ``t`` (the probe after a resize kept some of them)."""
    strides = torch.ones(len(shape), dtype=torch.long)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    masks = []
    for d, size in enumerate(shape):
        mask = torch.zeros(size, dtype=torch.bool)
        if t.numel():
            line = t.detach()
            for other in range(len(shape) - 1, -1, -1):  # views: nothing copied
                if other != d:
                    line = line.select(other, 0)
            mask.index_fill_(0, (line.long() // strides[d]) % size, True)
        masks.append(mask)
    return masks
