"""``python -m fxsym.cli``: the ``fxsym`` command."""

from __future__ import annotations

from .parser import main

if __name__ == "__main__":
    raise SystemExit(main())
