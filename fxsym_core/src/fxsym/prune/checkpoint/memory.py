"""Memory given back to the system between the steps of a streamed run (:func:`trim`): the
tensors of a layer, freed, would otherwise stay resident in the C library's heap, and a
streamed run's peak would grow with every layer.

Imports from fxsym: nothing.
"""

from __future__ import annotations


def trim() -> None:
    """Give the memory just freed back to the system where the C library keeps it (glibc's
    ``malloc_trim``: the tensors of a layer, freed, would otherwise stay resident)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
