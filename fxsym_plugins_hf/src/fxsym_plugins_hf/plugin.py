"""The ``hf`` plugin's hook implementations (entry point ``fxsym = hf``).

Importing this module imports transformers; without it installed the plugin fails to load,
and ``fxsym plugins`` reports why.
"""

from __future__ import annotations

import transformers  # noqa: F401  (the plugin is inactive without transformers)
