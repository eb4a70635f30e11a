"""The core passes: dead-code elimination, in-place removal, no-op removal.

Part of the passes room; imports the op table (:mod:`fxsym.passes.table`), never the catalog
that lists these passes.
"""
