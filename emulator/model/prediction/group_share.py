"""How much of an iteration each kind of process group spends communicating: measured and by the model alike.

A composed schedule (a training iteration, an imported trace) names its
segments by what they are: ``tp fwd L3 mb0``, ``dp rs``, ``bucket 2``. The
segment's *kind* is the first word of its name (``tp``, ``pp``, ``dp``,
``ep``, ``bucket``). A transfer is in flight from its send's start to its
receive's end. A rank's communication time of a kind is the union of the
in-flight intervals of the transfers of that kind it sends or receives (two
overlapping ones count once), and the kind's *share* is that time over the
iteration's, averaged over the ranks that take part in the kind at all.
Shares of different kinds may overlap each other and compute, so they need
not add up to anything.

The same rule reads a replay's recorded operation times
(:func:`measured_intervals`) and the timing model's simulated transfers
(:func:`model_intervals`), so the two shares sit side by side.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from emulator.model.prediction.timing import Timing
from emulator.model.schedule.format import SEND, Schedule, match_transfers

#: One transfer in flight: sender rank, receiver rank, send op id, start and end (seconds).
Interval = tuple[int, int, int, float, float]


def kind_of(segment_name: str) -> str:
    """A segment's kind: the first word of its name (``tp fwd L3 mb0`` -> ``tp``)."""
    words = segment_name.split()
    return words[0] if words else segment_name


def send_kinds(schedule: Schedule) -> dict[tuple[int, int], str]:
    """``(rank, send op id) -> kind`` of every send in a schedule of segments (none without segments).

    Parts of a composed schedule take disjoint step ranges, so a segment's
    steps are those of the operations on its ``data`` or ``output`` ranges,
    and a send on ``scratch`` belongs to the segment whose steps it shares.
    """
    if not schedule.segments:
        return {}
    ranges = {buf: sorted((first, first + n, kind_of(seg.name)) for seg in schedule.segments
                          for first, n in [(seg.chunk, seg.chunks) if buf == "data" else
                                           (seg.output_chunk, seg.output_chunks)] if n)
              for buf in ("data", "output")}
    starts = {buf: [lo for lo, _, _ in spans] for buf, spans in ranges.items()}
    by_step: dict[int, str] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if not op.is_comm or op.step in by_step or op.buffer not in ranges:
                continue
            i = bisect.bisect_right(starts[op.buffer], op.chunk) - 1
            if i >= 0 and op.chunk < ranges[op.buffer][i][1]:
                by_step[op.step] = ranges[op.buffer][i][2]
    return {(prog.rank, op.id): by_step[op.step] for prog in schedule.ranks for op in prog.ops
            if op.kind == SEND and op.step in by_step}


@dataclass(frozen=True)
class GroupShare:
    """One kind's communication: its share of the iteration (averaged over its ranks) and how many ranks."""

    kind: str
    share: float
    ranks: int


def shares(schedule: Schedule, intervals: Iterable[Interval], iteration_s: float) -> list[GroupShare]:
    """Every kind's :class:`GroupShare` (see the module docstring), by kind name."""
    kinds = send_kinds(schedule)
    per: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for src, dst, send_id, start, end in intervals:
        kind = kinds.get((src, send_id))
        if kind is None:
            continue
        for rank in (src, dst):
            per.setdefault(kind, {}).setdefault(rank, []).append((start, end))
    out = []
    for kind in sorted(per):
        busy = [_union(spans) for spans in per[kind].values()]
        share = sum(busy) / len(busy) / iteration_s if iteration_s > 0 else 0.0
        out.append(GroupShare(kind, share, len(busy)))
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def measured_intervals(schedule: Schedule, op_times: Mapping[int, Mapping[int, tuple[float, float]]]
                       ) -> list[Interval]:
    """A replay's transfers in flight: each send's recorded start to its receive's recorded end."""
    out = []
    for a, send_id, b, recv_id in match_transfers(schedule):
        if send_id in op_times.get(a, {}) and recv_id in op_times.get(b, {}):
            out.append((a, b, send_id, op_times[a][send_id][0], op_times[b][recv_id][1]))
    return out


def model_intervals(timing: Timing) -> list[Interval]:
    """The timing model's transfers in flight: their simulated start to end."""
    return [(t.src, t.dst, t.send_id, t.start, t.end) for t in timing.transfers
            if t.start is not None and t.end is not None]
