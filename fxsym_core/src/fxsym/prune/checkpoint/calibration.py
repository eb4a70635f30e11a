"""Calibration text: a file read as texts (:func:`read_calibration_text`: JSON lines with a
``text`` field, or plain text), only as far as the tokens a prune asks need
(:func:`calibration_bytes`), by chunks each checked as it comes, so a binary or huge file is
refused at its first chunk and never held whole.

Imports from fxsym: errors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import CalibrationError

#: the most bytes of a calibration file read (:func:`read_calibration_text`); a prune reads
#: :func:`calibration_bytes` of its tokens
MAX_CALIBRATION_BYTES = 256 * 2**20


def calibration_bytes(tokens: int) -> int:
    """The bytes of calibration text read for ``tokens`` tokens: 64 a token (a token is a few
    bytes of text as a rule), at least 4 MiB, at most :data:`MAX_CALIBRATION_BYTES`."""
    return min(MAX_CALIBRATION_BYTES, max(4 * 2**20, 64 * tokens))


def read_calibration_text(path: str | os.PathLike[str], *,
                          limit: int = MAX_CALIBRATION_BYTES) -> list[str]:
    """The texts of a calibration file: JSON lines (every non-empty line an object with a
    string ``text``; a ``.jsonl`` file must be such) or plain text (the whole file, one
    text). :class:`~fxsym.errors.CalibrationError` for a missing, empty, whitespace-only or
    non-UTF-8 file, a binary one (a NUL byte), and JSON lines without ``text``.

    At most ``limit`` bytes are read (the calibration takes the first tokens; a longer file's
    rest is never read, its last partial line or character dropped), by chunks of 1 MiB, each
    checked as it comes: a binary or NUL-filled file (a 1 GB sparse one) is refused at its
    first chunk, never held whole."""
    import codecs

    p = Path(path)
    utf8 = codecs.getincrementaldecoder("utf-8-sig")()
    parts: list[str] = []
    size = 0
    try:
        with open(p, "rb") as f:
            while size < limit:
                chunk = f.read(min(2**20, limit - size))
                if not chunk:
                    break
                if b"\0" in chunk:
                    at = size + chunk.index(b"\0")
                    raise CalibrationError(f"calibration file {path} holds a NUL byte (at byte "
                                           f"{at}): a binary file, not text")
                try:
                    parts.append(utf8.decode(chunk))
                except UnicodeDecodeError as exc:
                    raise CalibrationError(f"calibration file {path} is not UTF-8 text "
                                           f"({exc.reason} at byte {size + exc.start})") from exc
                size += len(chunk)
            cut = size >= limit and bool(f.read(1))
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration file {path}: {exc}") from exc
    if not cut:
        try:
            parts.append(utf8.decode(b"", final=True))
        except UnicodeDecodeError as exc:
            raise CalibrationError(f"calibration file {path} is not UTF-8 text ({exc.reason} "
                                   "at its end)") from exc
    text = "".join(parts)
    if cut and "\n" in text:
        text = text[:text.rindex("\n") + 1]  # the last line, cut by the limit, dropped
    if not text.strip():
        raise CalibrationError(f"calibration file {path} "
                               + ("is empty (only whitespace)" if text else "is empty"))
    lines = [line for line in text.splitlines() if line.strip()]
    looks_json = p.suffix.lower() in (".jsonl", ".ndjson") or lines[0].lstrip().startswith("{")
    if not looks_json:
        return [text]
    texts = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if p.suffix.lower() not in (".jsonl", ".ndjson"):
                return [text]  # plain text whose first line happens to start with a brace
            raise CalibrationError(f"{path}, line {number}: not JSON ({exc.msg})") from exc
        value = record.get("text") if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise CalibrationError(f"{path}, line {number}: a JSON line needs a string "
                                   "\"text\" field")
        texts.append(value)
    if not any(t.strip() for t in texts):
        raise CalibrationError(f"calibration file {path} holds no text")
    return texts
