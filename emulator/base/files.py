"""Reading and writing the project's files, so that nothing is ever half-written or half-read.

Every result file goes through :func:`write_atomic`: the data lands in a
temporary file in the same directory, is flushed to disk, and replaces the
target in one ``rename``. JSON-lines logs are appended line by line with
:func:`append_jsonl`, so a crash loses at most the line being written, and
:func:`read_jsonl` passes over such a cut line. The readers return None (or
nothing) for a file that is missing or unreadable: callers decide whether
that is an error.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from emulator.base.errors import UserError

#: The checkout this package runs from (its ``results/`` folder, and the ``PYTHONPATH`` of the processes it starts).
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_text(path: str, where: str) -> str:
    """A user's UTF-8 text file; :class:`UserError` naming it (``where``) when it cannot be read as such."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{where}: not a UTF-8 text file") from None
    except ValueError as exc:  # a NUL in the path
        raise UserError(f"{where}: cannot read it ({exc})") from None


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
    except (OSError, ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, a NUL in the path; nesting
        return None


def read_json_object(path: str) -> dict[str, Any] | None:
    """The JSON object at ``path``; None when it is missing, unreadable, not JSON or not an object."""
    data = read_json(path)
    return data if isinstance(data, dict) else None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, passing over lines cut short by a crash; [] if it is missing."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except (OSError, ValueError):
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out
