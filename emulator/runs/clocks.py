"""Clocks across a cluster's servers: what a run recorded of them, and whether its times can be trusted.

Every agent dates its operations on its own server's monotonic clock; the
head measures how far each server's clock is ahead of its own when the
agents start and again when they end (the shortest of a few round trips;
the error is at most half of it). A cell's times are moved onto the head's
clock by the first measurement, so what limits them is the measurement's
error plus how far the clock moved during the cell (drift). A run is
flagged ``clock_offset`` when that exceeds :data:`CLOCK_SHARE` of its
shortest predicted step: the step times would then measure the clocks. A
run with no predicted step, or a server whose clock was measured only at
the start, is unchecked (:func:`check`), never trusted.
On one machine (the namespace servers of the tests) both are microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from emulator.runs import trust
from emulator.runs.trust import Trust

#: The share of the shortest step a server's clock may be uncertain by.
CLOCK_SHARE = 0.01
FLAG = "clock_offset"


def clock_records(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One record per server: its offset at the start and the end (seconds; None where not measured), the
    larger error, and the drift between them."""
    ends = {c["server"]: c for c in after}
    out = []
    for start in before:
        end = ends.get(start["server"])
        record = {"server": start["server"], "offset_s": start["offset_s"], "error_s": start["error_s"],
                  "offset_after_s": None, "drift_s": None}
        if end is not None:
            record.update(offset_after_s=end["offset_s"], error_s=max(start["error_s"], end["error_s"]),
                          drift_s=end["offset_s"] - start["offset_s"])
        out.append(record)
    return out


def uncertainty_s(records: Sequence[Mapping[str, Any]]) -> float:
    """How far any server's times may be off the head's: its error plus its drift (0 where not measured)."""
    return max((r["error_s"] + abs(r["drift_s"] or 0.0) for r in records), default=0.0)


def shortest_step_s(per_step: Sequence[Mapping[str, Any]]) -> float | None:
    """The shortest predicted step time of a prediction's ``per_step`` (None without one)."""
    times = [float(st["time_s"]) for st in per_step if st.get("time_s")]
    return min(times) if times else None


def check(records: Sequence[Mapping[str, Any]], per_step: Sequence[Mapping[str, Any]]) -> Trust:
    """Flagged :data:`FLAG` when the clocks' uncertainty exceeds :data:`CLOCK_SHARE` of the shortest predicted
    step; unchecked when there is no predicted step to compare with, or a server's clock was measured only
    once (its drift unknown) and the rest are within the share."""
    step = shortest_step_s(per_step)
    if step is None:
        return Trust(unchecked=(trust.CLOCKS,))
    if uncertainty_s(records) > CLOCK_SHARE * step:
        return Trust(flags=(FLAG,))
    return Trust(unchecked=(trust.CLOCKS,)) if any(r.get("drift_s") is None for r in records) else Trust()
