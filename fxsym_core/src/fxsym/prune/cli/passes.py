"""``fxsym passes``: the optimize passes and patterns, with the op knowledge they use."""

from __future__ import annotations

import argparse


def cmd_passes(args: argparse.Namespace) -> int:
    from ...passes import format_passes
    from ...passes.listing import pass_listing
    from ...plugins import load_plugins
    from ..console import is_terminal, print_table

    load_plugins()
    if not is_terminal():
        print(format_passes())
        return 0
    listing = pass_listing()
    for title, header, rows in listing.tables:
        print_table(rows, header, title=title)
        print()
    if listing.notes:
        print("Op knowledge used by the passes")
        print("\n".join(listing.notes))
    return 0
