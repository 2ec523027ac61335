"""Fidelity: the emulator watching itself (Mininet-HiFi's lesson).

This module owns what tells a user whether a measurement can be trusted:

* snapshots of the machine around a repetition (:class:`Snapshot`) -- tc
  qdisc counters of every link interface (both ends), TCP retransmissions
  per host, CPU idle time;
* :func:`assess`, which flags a repetition whose offered datapath load
  exceeded the capacity ``emu calibrate`` measured on this machine, whose
  CPU saturated, whose messages could not meet the fabric profile's
  latency (``latency_floor``: the machine's own latency is above the
  target on some path, or the agents sent late), or whose agents fell
  behind the fabric (``emulator_lag``: the kernel's receive stamps and the
  sends' deadlines against when the agents acted,
  :func:`emulator.runs.metrics.agent_lag`), which sees a starved agent
  even while the CPU shows idle time;
* :func:`latency_model`: a fabric profile with the intrinsic latency the
  calibration measured, and netem where the kernel has it.

Packet captures of chosen links are :mod:`emulator.emulation.session.captures`'.

The calibration files themselves (one per MTU, valid only on the machine
that made them) are :mod:`emulator.emulation.machine.calibration_file`'s.

The pure parts (parsing, deltas, flags) are unit-tested without root.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator.base.naming import SWITCH_INTERFACE_RE, host_intf
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.machine.system import cpu_times, has_netem, run
from emulator.model.fabric import FabricProfile
from emulator.model.latency import Intrinsic, LatencyModel
from emulator.model.topology import Topology
from emulator.runs.metrics import LAG_SHARE, AgentLag
from emulator.runs.results import Fidelity

#: Used when this machine was never calibrated (docs/domain.md §4: 280 Mbit/s over 16 flows, userspace OVS, 2 cores).
UNCALIBRATED_CAPACITY_MBPS = 280.0
CPU_SATURATED_IDLE = 0.05
#: A repetition whose median send left this much of its target message latency late is flagged ``latency_floor``.
LATE_FRACTION = 0.05
#: The flags that make a repetition untrusted (``uncalibrated`` only says the capacity is the default).
SERIOUS_FLAGS = frozenset({"cpu_saturated", "over_capacity", "latency_floor", "emulator_lag"})


def latency_model(profile: FabricProfile, calibration: Calibration | None,
                  netem: bool | None = None) -> LatencyModel:
    """``profile`` with the calibration's intrinsic latency (none: zero); switch latency on the links where
    netem exists."""
    use_netem = has_netem() if netem is None else netem
    intrinsic = calibration.intrinsic() if calibration is not None else Intrinsic()
    return LatencyModel(profile, intrinsic, netem=use_netem and profile.switch_latency_s > 0)


# ------------------------------------------------------------------ snapshots
@dataclass(frozen=True)
class QdiscCounters:
    """A root qdisc's counters since it was made (``tc -s -j qdisc show``)."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0

    def minus(self, then: QdiscCounters) -> QdiscCounters:
        return QdiscCounters(self.bytes - then.bytes, self.packets - then.packets, self.drops - then.drops,
                             self.overlimits - then.overlimits)

    def to_json(self) -> dict[str, int]:
        return {"bytes": self.bytes, "packets": self.packets, "drops": self.drops, "overlimits": self.overlimits}


@dataclass(frozen=True)
class Snapshot:
    """The live network's counters at one instant (:func:`snapshot`)."""

    time: float  # CLOCK_MONOTONIC seconds
    qdisc: dict[str, QdiscCounters] = field(default_factory=dict)  # per interface
    retrans: dict[str, int] = field(default_factory=dict)  # TCP RetransSegs per host
    #: CPU seconds, summed over all CPUs since boot (see emulator.emulation.machine.system.cpu_times)
    cpu_idle: float = 0.0
    cpu_total: float = 0.0


def parse_tc_json(text: str) -> dict[str, QdiscCounters]:
    """``tc -s -j qdisc show`` -> per device, the root qdisc's bytes/packets/drops/overlimits."""
    out: dict[str, QdiscCounters] = {}
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return out
    for q in data:
        dev = q.get("dev")
        if dev is None or not q.get("root"):
            continue
        out[dev] = QdiscCounters(**{k: int(q.get(k, 0)) for k in ("bytes", "packets", "drops", "overlimits")})
    return out


def parse_tcp_retrans(text: str) -> int:
    """RetransSegs from ``/proc/<pid>/net/snmp``."""
    lines = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    if len(lines) < 2:
        return 0
    return int(lines[1][lines[0].index("RetransSegs")])


def snapshot(en: Any, topo: Topology) -> Snapshot:
    """Counters of the live network ``en`` (an
    :class:`emulator.emulation.network.emulated_network.EmulatedNetwork`) now."""
    if getattr(en, "cluster", None) is not None:
        qdiscs, retrans = _cluster_counters(en, topo)
    else:
        qdiscs = {dev: v for dev, v in parse_tc_json(run(["tc", "-s", "-j", "qdisc", "show"]).stdout).items()
                  if dev.startswith("efs")}
        retrans = {}
        for h in topo.hosts:
            node = en.host(h.name)
            res = run(["mnexec", "-a", str(node.pid), "tc", "-s", "-j", "qdisc", "show", "dev", host_intf(h.name)])
            qdiscs.update(parse_tc_json(res.stdout))
            try:
                with open(f"/proc/{node.pid}/net/snmp", encoding="ascii") as fh:
                    retrans[h.name] = parse_tcp_retrans(fh.read())
            except OSError:
                retrans[h.name] = 0
    idle, total = cpu_times()
    return Snapshot(time=time.monotonic(), qdisc=qdiscs, retrans=retrans, cpu_idle=idle, cpu_total=total)


#: Separates the parts of :func:`_cluster_counters`' output (a line of its own).
PART_MARK = "@@ef-part "


def _cluster_counters(en: Any, topo: Topology) -> tuple[dict[str, QdiscCounters], dict[str, int]]:
    """The same counters on every server of a cluster network, one command per server: its root namespace's
    qdiscs, then each of its hosts' qdisc and TCP counters (the host's pid is on that server)."""
    qdiscs: dict[str, QdiscCounters] = {}
    retrans: dict[str, int] = {}
    for server, runner in en.runners.items():
        hosts = [h.name for h in topo.hosts if en.placement.of[h.name] == server]
        script = [f"echo '{PART_MARK}root'; tc -s -j qdisc show"]
        for name in hosts:
            pid = en.host(name).pid
            script.append(f"echo '{PART_MARK}tc {name}'; mnexec -a {pid} tc -s -j qdisc show dev {host_intf(name)}; "
                          f"echo '{PART_MARK}snmp {name}'; mnexec -a {pid} cat /proc/net/snmp")
        out = runner(["sh", "-c", "; ".join(script)]).stdout
        for part in out.split(PART_MARK)[1:]:
            head, _, body = part.partition("\n")
            kind, _, name = head.partition(" ")
            if kind == "root":
                qdiscs.update((dev, v) for dev, v in parse_tc_json(body).items() if dev.startswith("efs"))
            elif kind == "tc":
                qdiscs.update(parse_tc_json(body))
            elif kind == "snmp":
                retrans[name] = parse_tcp_retrans(body)
    return qdiscs, retrans


def link_records(before: Snapshot, after: Snapshot, rep: int) -> list[dict[str, Any]]:
    """Per interface and per host, what changed during one repetition (the lines of ``links.jsonl``)."""
    seconds = max(after.time - before.time, 1e-9)
    out: list[dict[str, Any]] = []
    for dev, now in sorted(after.qdisc.items()):
        delta = now.minus(before.qdisc.get(dev, QdiscCounters()))
        out.append({"source": "tc", "rep": rep, "interface": dev, **delta.to_json(),
                    "mbps": delta.bytes * 8 / seconds / 1e6, "seconds": seconds})
    for host, count in sorted(after.retrans.items()):
        out.append({"source": "tcp", "rep": rep, "host": host, "retransmits": count - before.retrans.get(host, 0)})
    return out


def lateness(late_s: Sequence[float], targets_s: Sequence[float]) -> float | None:
    """The median send's lateness as a fraction of its path's target message latency (None: no target)."""
    ratios = sorted(late / target for late, target in zip(late_s, targets_s, strict=True) if target > 0)
    return ratios[len(ratios) // 2] if ratios else None


def assess(before: Snapshot, after: Snapshot, elapsed_s: float, datapath_bytes: int,
           calibration: Calibration | None, floors: Sequence[int] | None = None,
           late_fraction: float | None = None, lag: AgentLag | None = None) -> Fidelity:
    """Fidelity of one repetition: CPU idle, offered datapath load against capacity, latency, flags.

    CPU idle is None when the CPU counters did not advance between the snapshots: the repetition is then
    unchecked (:attr:`emulator.runs.results.Fidelity.trust`), not idle.

    ``datapath_bytes`` is the bytes the schedule makes switches forward (each
    transfer's bytes times the switches on its path); ``calibration`` this
    machine's (None: the capacity is :data:`UNCALIBRATED_CAPACITY_MBPS` and
    the repetition is flagged ``uncalibrated``); ``floors`` the path lengths
    (switches) where the calibrated intrinsic latency exceeds the profile's
    target; ``late_fraction`` what :func:`lateness` found; ``lag`` the
    worst rank's agent lag (:func:`emulator.runs.metrics.agent_lag`).
    """
    d_total = after.cpu_total - before.cpu_total
    # counters that did not advance say nothing of the CPU: its idle share is unknown, not all idle
    idle = (after.cpu_idle - before.cpu_idle) / d_total if d_total > 0 else None
    measured = calibration.datapath_capacity_mbps if calibration is not None else None
    capacity = measured or UNCALIBRATED_CAPACITY_MBPS
    offered = datapath_bytes * 8 / elapsed_s / 1e6 if elapsed_s > 0 else 0.0
    flags = []
    if idle is not None and idle < CPU_SATURATED_IDLE:
        flags.append("cpu_saturated")
    if offered > capacity:
        flags.append("over_capacity")
    if calibration is None:
        flags.append("uncalibrated")
    if floors or (late_fraction is not None and late_fraction > LATE_FRACTION):
        flags.append("latency_floor")
    if lag is not None and lag.share > LAG_SHARE:
        flags.append("emulator_lag")
    drops = sum(now.drops - before.qdisc.get(dev, QdiscCounters()).drops for dev, now in after.qdisc.items())
    retrans = sum(count - before.retrans.get(h, 0) for h, count in after.retrans.items())
    return Fidelity(cpu_idle=idle, datapath_load_mbps=offered, datapath_capacity_mbps=capacity, qdisc_drops=drops,
                    tcp_retransmits=retrans, latency_floor_switches=list(floors or []), late_fraction=late_fraction,
                    lag_share=lag.share if lag is not None else None, lag_rank=lag.rank if lag is not None else None,
                    flags=flags, trusted=not (SERIOUS_FLAGS & set(flags)))


def flag_text(fid: Fidelity | None) -> str:
    """The serious flags of a repetition as the console shows them after its line (empty when none)."""
    serious = [f for f in (fid.flags if fid is not None else []) if f != "uncalibrated"]
    return f"  [fidelity: {', '.join(serious)}]" if serious else ""


def switch_egress_bytes(before: Snapshot, after: Snapshot) -> int:
    """Bytes the switch ports sent between two snapshots: every byte once per switch it crossed, measured.

    The datapath's offered load when nothing predicts the traffic (an MPI
    program); a schedule's is :func:`datapath_bytes`.
    """
    return sum(now.bytes - before.qdisc.get(dev, QdiscCounters()).bytes for dev, now in after.qdisc.items()
               if SWITCH_INTERFACE_RE.match(dev))


def datapath_bytes(transfers: Sequence[Any]) -> int:
    """Bytes times switches of the datapath traversed, summed over transfers (``cost.Transfer`` objects)."""
    return sum(t.bytes * t.datapath_switches for t in transfers)
