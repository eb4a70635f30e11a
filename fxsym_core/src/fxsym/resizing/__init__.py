"""The resize engine: transactional, validated resizing of groups."""

from .engine import resize
from .helpers import keep_entries, l1_scores

__all__ = ["keep_entries", "l1_scores", "resize"]
