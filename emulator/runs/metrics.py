"""What one repetition of a replay measured, computed from the agents' operation times.

Pure functions, unit-tested without root; :class:`emulator.emulation.session.replay.ReplaySession`
feeds them what the agents report (:class:`emulator.emulation.agents.fleet.RankReport`):

* :func:`repetition_metrics` -- the repetition's time, algbw/busbw
  (nccl-tests definitions for the schedule's collective,
  :func:`emulator.model.schedule.semantics.bus_factor`, Mbit/s) and per-step
  times, against the prediction, as a :class:`emulator.runs.results.Repetition`;
* :func:`timeline_records` -- one ``timeline.jsonl`` record per transfer, and
  :func:`compute_records` one per compute operation (``"kind": "compute"``);
* :func:`send_paths` and :func:`send_lateness` -- the latency terms of every
  sender's path (what the agents' latency plan holds) and how late each send
  left against its target, for :func:`emulator.emulation.session.fidelity.lateness`;
* :func:`agent_lag` -- the share of the repetition the slowest rank's agent
  spent behind the emulated fabric, for
  :func:`emulator.emulation.session.fidelity.assess`;
* :func:`nccl_table` -- the nccl-tests style table ``emu replay`` prints.

Times are seconds on the shared CLOCK_MONOTONIC clock; ``op_times[rank][op_id]
= (start, end)``; ``sends[rank][op_id] = [posted, cts_at, sent, late_s]``
(the receive posted, the clear to send in hand, ``sendall`` begun, lateness);
``arrivals[rank][op_id]`` = when a receive's last byte reached its host (the
kernel's stamp).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator.model import topology
from emulator.model.latency import SHAPER_BURST_BYTES, LatencyModel, PathLatency
from emulator.model.prediction import check as scheck
from emulator.model.prediction import cost as scost
from emulator.model.prediction import group_share
from emulator.model.schedule.format import COMPUTE, RECV, RECV_REDUCE, SEND, Schedule, match_transfers
from emulator.model.schedule.semantics import ROOTED, bus_factor
from emulator.runs.results import Iteration, Repetition, StepTime

OpTimes = Mapping[int, Mapping[int, tuple[float, float]]]
SendTimes = Mapping[int, Mapping[int, Sequence[float]]]
Arrivals = Mapping[int, Mapping[int, float]]
#: A repetition in which some rank's agent was behind the fabric for more than this share of its time is flagged
#: ``emulator_lag`` (:func:`emulator.emulation.session.fidelity.assess`): its time may be that much the emulator's own,
#: the ±10 % the model is held to.
LAG_SHARE = 0.10


@dataclass(frozen=True)
class AgentLag:
    """The rank whose agent lagged most in a repetition, and for what share of the repetition's time."""

    rank: int
    share: float


def _covered_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def agent_lag(op_times: OpTimes, sends: SendTimes, arrivals: Arrivals, elapsed_s: float) -> AgentLag | None:
    """The share of ``elapsed_s`` during which some rank's agent was behind the fabric, for the worst rank.

    A rank lags from when a message's last byte reached its host (the
    kernel's stamp) until the agent was done with it (read, and reduced), and
    while a send of it left later than its latency deadline (``late_s``):
    time the emulated fabric had no part in. Overlapping lags count once.
    None when no rank reported a receive stamp or a send, or ``elapsed_s`` is 0.
    """
    if elapsed_s <= 0:
        return None
    worst: AgentLag | None = None
    for rank in sorted({*arrivals, *sends}):
        lags = [(at, op_times[rank][i][1]) for i, at in arrivals.get(rank, {}).items()
                if i in op_times.get(rank, {})]
        lags += [(info[2] - info[3], info[2]) for info in sends.get(rank, {}).values() if info[3] > 0]
        share = min(1.0, _covered_s(lags) / elapsed_s)
        if worst is None or share > worst.share:
            worst = AgentLag(rank, share)
    return worst


def _step_spans(schedule: Schedule, op_times: OpTimes) -> dict[int, list[float]]:
    """Per step, from its first send's start to its last receive's end.

    A receive is posted early and waits, so its start says nothing about the network.
    """
    steps: dict[int, list[float]] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.id not in op_times.get(prog.rank, {}) or op.kind not in (SEND, RECV, RECV_REDUCE):
                continue
            s, e = op_times[prog.rank][op.id]
            span = steps.setdefault(op.step, [float("inf"), float("-inf")])
            if op.kind == SEND:
                span[0] = min(span[0], s)
            else:
                span[1] = max(span[1], e)
    return {k: v for k, v in steps.items() if v[0] != float("inf") and v[1] != float("-inf")}


def repetition_metrics(schedule: Schedule, op_times: OpTimes, predicted: scheck.CheckReport | None = None,
                       rep: int = 0) -> Repetition:
    """Time, algbw/busbw and per-step times of repetition ``rep``; with ``predicted`` (``schedule check``'s
    report) the measured/predicted ratios of the whole and of every step.

    A schedule with compute (a training iteration) also gets its
    :class:`~emulator.runs.results.Iteration`: the repetition's time against the
    prediction's compute-only time (its compute ops' recorded seconds,
    dilated, along the longest chain: what the iteration would take with
    communication free).

    Correctness, fidelity and faults are the caller's to fill in.
    """
    starts = [t[0] for per_rank in op_times.values() for t in per_rank.values()]
    ends = [t[1] for per_rank in op_times.values() for t in per_rank.values()]
    t0, t1 = min(starts), max(ends)
    elapsed = t1 - t0
    algbw = schedule.collective_bytes / elapsed * 8 / 1e6 if elapsed > 0 else 0.0
    per_step = predicted.step_times() if predicted is not None else {}
    steps = []
    for k, (start, end) in sorted(_step_spans(schedule, op_times).items()):
        pred = per_step.get(k)
        steps.append(StepTime(step=k, start_s=start - t0, time_s=end - start, predicted_s=pred,
                              measured_over_predicted=(end - start) / pred if pred else None))
    out = Repetition(rep=rep, time_s=elapsed, algbw_mbps=algbw,
                     busbw_mbps=algbw * bus_factor(schedule.collective, schedule.p), steps=steps, start_monotonic=t0)
    if predicted is not None:
        out.predicted_time_s = predicted.predicted_time_s
        out.measured_over_predicted = elapsed / predicted.predicted_time_s if predicted.predicted_time_s else None
        if predicted.compute_only_s is not None:
            measured: list[group_share.GroupShare] = []
            model: list[group_share.GroupShare] = []
            if schedule.segments and predicted.timing is not None:
                measured = group_share.shares(schedule, group_share.measured_intervals(schedule, op_times), elapsed)
                model = group_share.shares(schedule, group_share.model_intervals(predicted.timing),
                                           predicted.predicted_time_s)
            out.iteration = Iteration(iteration_s=elapsed, compute_only_s=predicted.compute_only_s,
                                      comm_share={g.kind: g.share for g in measured},
                                      model_comm_share={g.kind: g.share for g in model})
    return out


def timeline_records(schedule: Schedule, rep: int, op_times: OpTimes,
                     sends: SendTimes | None = None) -> list[dict[str, Any]]:
    """One record per transfer: its start (the agents' virtual start) to the receive's end at the destination,
    and when the send completed (``send_end``: for a send others wait for, when its last byte was acknowledged).

    With the agents' ``sends`` those are added as ``posted``, ``cts_at``,
    ``sent`` and ``late_s``.
    """
    ops = {(prog.rank, op.id): op for prog in schedule.ranks for op in prog.ops}
    out = []
    for a, send_id, b, recv_id in match_transfers(schedule):
        if send_id not in op_times.get(a, {}) or recv_id not in op_times.get(b, {}):
            continue
        op = ops[(a, send_id)]
        rec: dict[str, Any] = {"rep": rep, "step": op.step, "src": a, "dst": b, "src_host": schedule.ranks[a].host,
                               "dst_host": schedule.ranks[b].host, "bytes": op.bytes,
                               "start": op_times[a][send_id][0], "end": op_times[b][recv_id][1],
                               "send_end": op_times[a][send_id][1]}
        info = (sends or {}).get(a, {}).get(send_id)
        if info is not None:
            rec.update(posted=info[0], cts_at=info[1], sent=info[2], late_s=info[3])
        out.append(rec)
    return out


def compute_records(schedule: Schedule, rep: int, op_times: OpTimes) -> list[dict[str, Any]]:
    """One record per compute operation that ran: ``kind`` compute, its rank and host, op id, start and end."""
    out = []
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind == COMPUTE and op.id in op_times.get(prog.rank, {}):
                start, end = op_times[prog.rank][op.id]
                out.append({"rep": rep, "kind": "compute", "step": op.step, "rank": prog.rank, "host": prog.host,
                            "op": op.id, "seconds": op.seconds, "start": start, "end": end})
    return out


def send_paths(topo: topology.Topology, planned: Sequence[scost.Transfer], model: LatencyModel,
               mtu: int) -> dict[tuple[int, int], PathLatency]:
    """Per (sending rank, receiving rank): the latency terms of its path (what the agents' plan holds),
    with its links' seconds per byte for what the shapers do not charge (:meth:`PathLatency.unshaped_s`)."""
    out = {}
    goodput = topology.tcp_goodput_factor(mtu)
    for t in planned:
        if t.domain:  # timed by the agents, no frames and no shaper (emulator.emulation.agents.interconnect)
            out[(t.src, t.dst)] = model.path(t.switches)
            continue
        byte_s = scost.path_byte_s(topo, t.path, goodput)
        out[(t.src, t.dst)] = replace(model.path(t.switches), byte_s=byte_s, mss=topology.tcp_payload_bytes(mtu),
                                      burst_bytes=SHAPER_BURST_BYTES)
    return out


def send_lateness(schedule: Schedule, sends: SendTimes,
                  paths: Mapping[tuple[int, int], PathLatency]) -> tuple[list[float], list[float]]:
    """Every send's lateness and its path's target message latency, for
    :func:`emulator.emulation.session.fidelity.lateness`."""
    late, target = [], []
    for prog in schedule.ranks:
        for op in prog.ops:
            info = sends.get(prog.rank, {}).get(op.id)
            if op.kind == SEND and info is not None:
                late.append(info[3])
                target.append(paths[(prog.rank, op.partner)].message_target_s)
    return late, target


def nccl_table(schedule: Schedule, reps: Sequence[Repetition]) -> str:
    """The nccl-tests layout: one row per measured repetition (in-place, Mbit/s of the emulated fabric)."""
    lines = [
        f"# {schedule.algorithm} {schedule.collective}, {schedule.p} ranks, emulated bandwidths in Mbit/s",
        "#",
        f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} "
        f"{'busbw':>8} {'#wrong':>6}",
        f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(Mb/s)':>8} {'(Mb/s)':>8} {'':>6}",
    ]
    for rep in reps:
        size = schedule.collective_bytes
        root = schedule.root if schedule.collective in ROOTED else -1
        lines.append(f"  {size:>12} {size // 4:>12} {'float':>6} {'sum':>6} {root:>5} "
                     f"{rep.time_s * 1e6:>10.0f} {rep.algbw_mbps:>8.2f} {rep.busbw_mbps:>8.2f} "
                     f"{0 if rep.correct else 1:>6}")
    if reps:
        lines.append(f"# Avg bus bandwidth    : {statistics.mean(r.busbw_mbps for r in reps):.2f} Mb/s")
    return "\n".join(lines)
