"""Writing results so that nothing is ever half-written.

Every result file goes through :func:`write_atomic`: the data lands in a
temporary file in the same directory, is flushed to disk, and replaces the
target in one ``rename``. JSON-lines logs are appended line by line with
:func:`append_jsonl`, so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (same-directory temp file + rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ef-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are for everyone to read
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: str, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def append_jsonl(path: str, record: Any) -> None:
    """Append one JSON object as a line and flush it."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()


def read_json(path: str) -> Any | None:
    """The JSON document at ``path``, or None when it is missing, unreadable or not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
