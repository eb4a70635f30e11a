"""An example third-party fxsym plugin (entry point ``fxsym = example``).

It ships its own layer, :class:`ScaledLinear`, and tells fxsym about it; see ``README.md``.
"""

from __future__ import annotations

from .modules import ScaledLinear

__all__ = ["ScaledLinear"]
__version__ = "0.1.0"
