"""A cell's entry in a results folder's ``state.json`` (:class:`CellState`), and the readers of its values.

Its own module so that the cell kinds (:mod:`emulator.study.cell_kinds`), which a
row reads the state through, and the run folder (:mod:`emulator.study.folder.results_folder`),
which writes it and imports the kinds, both import it at module level.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def timestamp() -> str:
    """Now, local time to the second (ISO 8601): the ``at`` of a state entry and of a run's records."""
    return datetime.datetime.now().isoformat(timespec="seconds")


def json_number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (booleans included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def json_text(value: object) -> str | None:
    """A JSON string; None for anything else."""
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class CellState:
    """One cell's entry in ``state.json``: its last outcome (``running``, ``ok``, ``failed``, ``interrupted``).

    ``at`` is None for a cell that was found finished without an entry of its
    own (its results came from an earlier folder state); such an entry is
    written as the status alone.
    """

    status: str
    wall_s: float | None = None
    error: str | None = None
    at: str | None = None

    @classmethod
    def recorded(cls, status: str, wall_s: float, error: str | None) -> CellState:
        """An outcome as the runner records it: wall seconds to the millisecond, stamped now."""
        return cls(status=status, wall_s=round(wall_s, 3), error=error, at=timestamp())

    def to_json(self) -> dict[str, Any]:
        if self.at is None:
            return {"status": self.status}
        return {"status": self.status, "wall_s": self.wall_s, "error": self.error, "at": self.at}

    @classmethod
    def from_json(cls, data: object) -> CellState | None:
        """None for an entry that is not an object with a string ``status``."""
        if not isinstance(data, Mapping) or not isinstance(data.get("status"), str):
            return None
        return cls(status=data["status"], wall_s=json_number(data.get("wall_s")), error=json_text(data.get("error")),
                   at=json_text(data.get("at")))
