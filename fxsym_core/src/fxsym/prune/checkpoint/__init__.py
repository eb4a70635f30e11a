"""``fxsym.prune_checkpoint``: a checkpoint directory in, a pruned checkpoint directory out,
streamed so that no step holds the whole model.

A *checkpoint directory* is what a library's ``save_pretrained`` writes (a config, the weights
as safetensors, tokenizer files); a plugin's reader knows it (:mod:`.reader`:
:class:`CheckpointReader`, :func:`open_checkpoint`). The steps (:mod:`.run`, in order), none of
which holds more than one decoder layer's weights:

1. **analysis** on the meta model (:func:`fxsym.analyze`), then the
   :class:`~fxsym.paramlayout.ParamLayout` of its groups; the checkpoint's tensors, read
   lazily by the model's names, their headers checked against the meta model first
   (:mod:`.tensors`);
2. **importance** (:mod:`.scores`), one of *activation* (:func:`stream_activations`: every
   calibration batch (:mod:`.calibration`, the text) runs the model's own ``forward``, the
   batches held in lock step at the model's repeated blocks, each block's tensors read when
   every batch waits at it: :mod:`.streaming`; ShortGPT's block importance beside) or
   *weights* (``l1``, ``l2``: each parameter read, scored and dropped in turn);
3. **planning** with those scores (:func:`fxsym.plan`; a number of ``layers`` kept by the
   block importance of the same run), or the architecture search for a parameter target
   (:func:`fxsym.prune.search.search`), each uniform candidate scored by its next-token loss in
   the same kind of lock-step run of the meta model pruned by the candidate, each tensor read
   and cut as the output would hold it (:mod:`.cuts`), all the candidates in one run that reads
   each tensor once (:mod:`.losses`: :func:`stream_losses`); the plan is applied to the meta
   model, whose resized config the plugins write (``fxsym_save_files``);
4. **writing**, tensor by tensor, in chunks of rows, straight into shards whose headers go
   first (:mod:`.writing`).

The directory is written atomically (:func:`fxsym.prune.persist.replace_directory`):
``output`` holds what it held, or the complete pruned checkpoint, whatever fails; it is
checked and locked before anything is read (:mod:`.output`). Beside the weights and the
plugin's config go the input's other files (tokenizer, chat template; the generation config,
which the plugin rewrites from the one it read), but never weights the prune did not write;
``plan.extra["carried"]`` and ``plan.extra["left_out"]`` (with why) say which. Then
``fxsym.json`` with the plan. The calibration runs in the checkpoint's dtype. Peak memory is
about the largest block or module outside the blocks (an embedding, the head) plus the
calibration hidden states; the memory freed is given back between steps (:mod:`.memory`).

The package's modules import one another downward in this order: ``reader``,
``calibration``, ``memory``, ``tensors``, ``cuts``, ``streaming``, ``scores``, ``losses``,
``writing``, ``output``, ``run`` (``tests/test_layering.py`` checks it). This ``__init__``
only gives their public names.

Imports from fxsym: analysis, collector, depth, errors, importance, memo, paths, persist, phases,
planning, plugins, request, search, spans (console and lockstep inside functions).
"""

from __future__ import annotations

from .calibration import MAX_CALIBRATION_BYTES, calibration_bytes, read_calibration_text
from .cuts import kept_positions
from .losses import stream_loss, stream_losses
from .output import WEIGHT_SUFFIXES, check_output
from .reader import CheckpointReader, StoredLayout, loading_note, open_checkpoint
from .run import apply_with_notes, prune_checkpoint
from .scores import StreamedScores, stream_activations
from .streaming import block_list
from .tensors import CHUNK_BYTES
from .writing import DEFAULT_SHARD_BYTES, SHARD

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_SHARD_BYTES",
    "MAX_CALIBRATION_BYTES",
    "SHARD",
    "WEIGHT_SUFFIXES",
    "CheckpointReader",
    "StoredLayout",
    "StreamedScores",
    "apply_with_notes",
    "block_list",
    "calibration_bytes",
    "check_output",
    "kept_positions",
    "loading_note",
    "open_checkpoint",
    "prune_checkpoint",
    "read_calibration_text",
    "stream_activations",
    "stream_loss",
    "stream_losses",
]
