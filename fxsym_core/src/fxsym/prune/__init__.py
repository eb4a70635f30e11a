"""The pruning workflow, built on the kernel: what to keep, and writing the smaller model.

``fxsym`` is two layers in one distribution. The **kernel** (every room directly under
``fxsym/`` but this one: errors, naming, modstate, plugins, registry, symbols, tracer, analysis,
resizing, paramlayout, oracles, passes) answers *which sizes can change together* and changes
them: trace, analyze, resize, optimize, and the oracles that check the analysis. This package,
the **workflow**, decides *how much to cut and where* and carries it out: importance scores
units, planning chooses them (a Plan), depth chooses blocks, search an architecture for a
parameter target, persist saves and loads a pruned model, checkpoint prunes a checkpoint
directory streamed, report_html draws an analysis, cli is the ``fxsym`` command.

Which room goes where, decided by what imports it:

* a room the kernel imports (at any time, in a function too) stays in the kernel;
* a room only the workflow, the CLI or the plugins' workflow parts import lives here, with the
  small helpers it alone needs (paths, options, request, console, phases, spans, lockstep,
  embeddings, shortlist, demo; report_assets are the report's files).

The kernel imports nothing from here at run time (``tests/test_layering.py``); it names the
workflow's types in annotations only (``fxsym.plugins.hookspecs``: the checkpoint reader and
Plan of two hooks). The old paths (``fxsym.checkpoint``, ``fxsym.cli``, ...) still import, the
same module objects, with a DeprecationWarning (:mod:`fxsym._moved`); the facade's names
(``fxsym.plan``, ``fxsym.importance``, ``fxsym.prune_checkpoint``, ``fxsym.save`` ...) are
unchanged.

Importing this package imports none of its rooms (``fxsym --help`` imports no torch).

Imports from fxsym: nothing.
"""
