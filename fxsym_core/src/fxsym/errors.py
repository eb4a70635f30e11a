"""Typed errors. Each message says what failed, where, and how to fix it.

Imports from fxsym: nothing (every room may use it)."""

from __future__ import annotations

__all__ = [
    "AnalysisError",
    "CalibrationError",
    "CheckpointError",
    "FxsymError",
    "ModelError",
    "PassError",
    "PlanError",
    "PlanMismatchError",
    "PluginError",
    "PluginWarning",
    "ResizeError",
    "ResizeWarning",
    "StaleStateError",
    "TraceError",
]


class FxsymError(Exception):
    """Base class of every error fxsym raises on purpose."""


class TraceError(FxsymError):
    """The model could not be traced into a torch.fx graph."""


class ModelError(TraceError):
    """The model itself raised on the example inputs (not a limit of tracing)."""


class AnalysisError(FxsymError):
    """The traced graph could not be analyzed."""


class ResizeError(FxsymError):
    """A resize request was invalid; the model was left untouched."""


class StaleStateError(ResizeError):
    """A resize would leave a module holding tensors derived from what it changes, which no
    trace showed to be recomputed when missing (the message names the attribute); the model
    was left untouched."""


class PlanError(FxsymError):
    """A pruning plan could not be made, read or applied (a bad target, an unknown criterion,
    a file that is not an fxsym save)."""


class CheckpointError(FxsymError):
    """A checkpoint directory could not be read or pruned (not a checkpoint, a tensor missing
    from its shards, a tensor the plan does not size); the output directory was not written."""


class CalibrationError(CheckpointError):
    """Calibration text could not be read or tokenised (an empty file, not UTF-8, JSON lines
    without a ``text`` field, no tokenizer in the checkpoint)."""


class PlanMismatchError(PlanError):
    """A saved plan does not fit the model it is applied to (another architecture, a renamed
    module, an index out of range); the message names the first mismatch, and the model was
    left as it was."""


class PluginError(FxsymError):
    """A plugin failed to load or to contribute (raised in strict mode)."""


class PassError(FxsymError):
    """A pass of the optimize pipeline failed or changed the model's outputs."""


class PassWarning(UserWarning):
    """A pass refused a rewrite, or was rolled back because it changed the outputs."""


class ResizeWarning(UserWarning):
    """A resize did something the caller may not expect (it untied a shared parameter)."""


class ImportanceWarning(UserWarning):
    """The ranking of units chosen for the caller (no ranking asked) is known to cost quality:
    weight magnitude where no calibration text was given."""


class PluginWarning(UserWarning):
    """A plugin failed to load or to contribute and was skipped."""
