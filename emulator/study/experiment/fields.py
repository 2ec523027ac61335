"""The experiment file's field readers: one value of the parsed YAML checked and converted, or a
:class:`~emulator.base.errors.FieldError` naming the file (``where``) and the field (``name``).

Every reader is a small pure function used by the keys' modules
(:mod:`~emulator.study.experiment.parse`, :mod:`~emulator.study.experiment.run_keys`,
:mod:`~emulator.study.experiment.mpi_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from emulator.base.errors import FieldError, int_field
from emulator.base.naming import USER_NAME_RE, USER_NAME_WORDS
from emulator.model.schedule.format import MAX_MESSAGE_BYTES, parse_size
from emulator.runs.admission import MAX_DURATION_S, MAX_DURATION_TEXT, MAX_REPEAT, MAX_SEED, MAX_WARMUP, parse_duration


def reject_unknown(where: str, prefix: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Every key of ``data`` is one of ``allowed`` (named ``<prefix><key>`` in the error)."""
    for key in data:
        if key not in allowed:
            raise FieldError(where, f"{prefix}{key}", f"one of the keys {', '.join(allowed)}",
                             f"unknown key {key}")


def mapping_field(where: str, name: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FieldError(where, name, "a mapping of keys to values", value)
    return value


def list_field(where: str, name: str, value: object, *, allow_scalar: bool = False) -> list[Any]:
    """A non-empty list; with ``allow_scalar`` one string or integer stands for the list of it."""
    if allow_scalar and isinstance(value, str | int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, list) or not value:
        raise FieldError(where, name, "a non-empty list", value)
    return value


def name_field(where: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not USER_NAME_RE.fullmatch(value):
        raise FieldError(where, name, USER_NAME_WORDS, value)
    return value


def string_field(where: str, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise FieldError(where, name, "a string", value)
    return value


def sizes_field(where: str, name: str, value: object) -> tuple[int, ...]:
    """Distinct message sizes (``1MiB``, ``65536``), one or a list."""
    items = list_field(where, name, value, allow_scalar=True)
    sizes = tuple(parse_size(v, where, f"{name}[{i}]", MAX_MESSAGE_BYTES) for i, v in enumerate(items))
    if len(set(sizes)) != len(sizes):
        raise FieldError(where, name, "distinct sizes", value)
    return sizes


def seeds_field(where: str, name: str, value: object) -> tuple[int, ...]:
    """Distinct ECMP seeds (integers in 0..:data:`~emulator.runs.admission.MAX_SEED`), one or a list."""
    items = list_field(where, name, value, allow_scalar=True)
    seeds = tuple(int_field(where, f"{name}[{i}]", v, 0, MAX_SEED) for i, v in enumerate(items))
    if len(set(seeds)) != len(seeds):
        raise FieldError(where, name, "distinct seeds", value)
    return seeds


def choices_field(where: str, name: str, value: object, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Distinct values of ``allowed``, one or a list."""
    items = list_field(where, name, value, allow_scalar=True)
    for i, v in enumerate(items):
        if v not in allowed:
            raise FieldError(where, f"{name}[{i}]", f"one of {', '.join(allowed)}", v)
    if len(set(items)) != len(items):
        raise FieldError(where, name, "distinct values", value)
    return tuple(items)


def repeat_field(where: str, value: object) -> int:
    """``repeat``: measured repetitions per cell, 1..:data:`~emulator.runs.admission.MAX_REPEAT`."""
    return int_field(where, "repeat", value, 1, MAX_REPEAT)


def warmup_field(where: str, value: object) -> int:
    """``warmup``: unmeasured repetitions first, 0..:data:`~emulator.runs.admission.MAX_WARMUP`."""
    return int_field(where, "warmup", value, 0, MAX_WARMUP)


def max_time_field(where: str, value: object) -> float | None:
    """``max_time``: what ``--max-time`` is for this file when the command line gives none (seconds, or a
    duration such as ``45m``, at most :data:`~emulator.runs.admission.MAX_DURATION_S`); None when it is left
    out."""
    if value is None:
        return None
    expected = f"a duration > 0 such as 2700, 45m or 1h, {MAX_DURATION_TEXT} (or leave it out)"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FieldError(where, "max_time", expected, value)
    try:
        return parse_duration(str(value))
    except (ValueError, OverflowError):
        raise FieldError(where, "max_time", expected, value) from None


def timeout_field(where: str, value: object) -> float | None:
    """``timeout_s``: seconds > 0 per repetition, at most :data:`~emulator.runs.admission.MAX_DURATION_S`, or
    None when it is left out."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_DURATION_S:
        raise FieldError(where, "timeout_s", f"seconds > 0 per repetition, {MAX_DURATION_TEXT} (or leave it out)",
                         value)
    return float(value)
