"""The resize engine: transactional, validated resizing of groups.

``fxsym.resize`` is the function; ``from fxsym.resizing import keep_entries, l1_scores,
resize_projection`` gives plugin authors the helpers (``resize_projection``: the whole resize
rule of a linear projection, ``nn.Linear`` or a transposed one).

Imports from fxsym: errors, modstate, plugins, registry, symbols (room order:
``tests/test_layering.py``).
"""

from .engine import resize
from .helpers import keep_entries, l1_scores, resize_projection

__all__ = ["keep_entries", "l1_scores", "resize", "resize_projection"]
