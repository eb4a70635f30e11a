"""The resize engine: transactional, validated resizing of groups.

``fxsym.resize`` is the function; ``from fxsym.resizing import keep_entries, l1_scores`` gives
plugin authors the helpers.

Imports from fxsym: errors, modstate, plugins, registry, symbols (room order:
``tests/test_layering.py``).
"""

from .engine import resize
from .helpers import keep_entries, l1_scores

__all__ = ["keep_entries", "l1_scores", "resize"]
