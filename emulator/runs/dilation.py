"""Time dilation chosen from this machine's calibrated figures (``dilation: auto``).

A network at ``R/D`` stands for one at ``R`` as long as the machine's own
costs per dilated second stay small (docs/emulation.md). The choice
(:func:`choose_dilation`) is the smallest dilation ``D`` at which a network's
cells fit an :class:`Envelope`, each rule giving a lower bound on ``D``:

* **datapath**: the busiest step's offered load (switch-hop Mbit/s) within
  :data:`LOAD_FRACTION` of the datapath capacity calibrated at the run's MTU,
  scaled to the network's switch ports (:meth:`Envelope.capacity_for`);
* **agents**: every step's agent work (CPU seconds: messages x
  :attr:`AgentCosts.per_message_s` + bytes x :attr:`AgentCosts.per_byte_s`)
  within :data:`CPU_FRACTION` of the step's dilated span on all cores, and the
  whole repetition's work within the same share of its makespan;
* **messages**: one message's agent work within :data:`MESSAGE_FRACTION` of
  the shortest step's span (it delays the step whatever the cores);
* **latency**: the profile's dilated latencies at least this machine's own
  (no ``latency_floor`` on the paths the cells use);
* **link rate**: at most what the shapers emulate (``fabric.MAX_LINK_MBPS``);
  below ``fabric.MIN_LINK_MBPS`` nothing fits (:class:`NoDilationFits` says
  what the rules ask for).

Under dilation every time the model predicts scales with ``D`` and every
load with ``1/D`` (both bandwidth and the profile's latencies dilate), so the
cells are predicted once, at the profile's own dilation ``D0``, and each rule
is solved for ``D`` from that prediction (its per-step loads,
:attr:`~emulator.model.prediction.check.CheckReport.step_loads`), with
:data:`MARGIN` on top. The dilation is then rounded up so that the emulated
link rate has two significant digits (a rate people can read, never faster
than the rules allow); the caller predicts the cells again at it
(:mod:`emulator.study.experiment.auto_dilation`).

:func:`fit_agent_costs` turns the calibration's measured repetitions (the
agents' summed CPU seconds against their messages and bytes) into
:class:`AgentCosts`. Pure: the calibration is read at the edges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from emulator.base.errors import UserError
from emulator.model import fabric
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import CheckReport
from emulator.model.schedule.format import SEND, Schedule

#: Share of the datapath capacity (at the network's ports) the busiest step may offer, and share of the machine's
#: CPU time (all cores) the agents' work may take, per step and per repetition. Both set from the runs measured
#: on this machine (docs/fidelity.md, 2026-12-03): every run within 5% of the model offered at most 0.45 of the
#: capacity at its ports with agents at most 0.10 of the CPU (`make bench`'s 16 MiB hdrm); every run off by 10% or
#: more offered 0.57 or more, or had agents at 0.17 or more (a 32-host hd on ECMP and a 64-host ring at 20 Mbit/s).
LOAD_FRACTION = 0.5
CPU_FRACTION = 0.15
#: Share of every step's span one message's agent work may take (it lies on the step's critical path: the
#: sender's and the receiver's handling, in series). Measured on 4 hosts (docs/fidelity.md, 2026-12-03): at
#: 0.04-0.05 of the shortest step the replay was 1.09-1.16 of the model, at 0.02 1.02-1.06, at 0.01 1.00-1.04.
MESSAGE_FRACTION = 0.01
#: The dilation chosen is this much above what the rules ask for: spans do not dilate quite in proportion (this
#: machine's own latency does not dilate), so a choice made exactly at a rule's fraction could be just over it
#: when the cells are predicted again at it, and admission would refuse it (a 64-host ResNet-50 iteration did).
MARGIN = 1.05
#: How the datapath's capacity shrinks beyond the calibration network's ports: as (ports / calibrated ports) to
#: this power. An empirical fit to the runs measured here (docs/fidelity.md, 2026-12-03): with it, every run within
#: 5% of the model offered at most 0.45 of the capacity at its ports (16 hosts on 48 ports at 20 Mbit/s, 64 on
#: 192 at 2.5, 256 on 768 at 0.5), and every run off by 10% or more 0.57 or more (32 hosts on 64 ports at 20, 64
#: on 192 at 5 and 10). Capacity in inverse proportion to the ports (a power of 1) refused the 256-host run that
#: measured 1.02.
PORT_EXPONENT = 0.5
#: Switch ports of the network the datapath capacity is calibrated on (emulator.selfcheck.live.calibration's
#: CAPACITY_TOPOLOGY, leaf-spine 4 x 4 x 4: 16 host links and 16 links between switches).
CALIBRATION_PORTS = 48


@dataclass(frozen=True)
class AgentCosts:
    """What the agents spend per message and per byte they send (CPU seconds, sender and receiver together)."""

    per_message_s: float
    per_byte_s: float
    source: str = ""  # where the figures come from (a calibration's date, or the defaults)

    def work_s(self, messages: float, nbytes: float) -> float:
        return messages * self.per_message_s + nbytes * self.per_byte_s

    def to_json(self) -> dict[str, float | str]:
        return {"per_message_s": self.per_message_s, "per_byte_s": self.per_byte_s, "source": self.source}


#: Used where a calibration predates the agents' cost measurement: 2-core Debian 12 machine of docs/fidelity.md
#: (2026-12-03, `emu calibrate`'s agent-cost measurement, rounded up).
DEFAULT_AGENT_COSTS = AgentCosts(per_message_s=3e-4, per_byte_s=5e-9,
                                 source="this project's defaults (docs/fidelity.md, 2026-12-03)")


@dataclass(frozen=True)
class CostSample:
    """One measured repetition: the messages and bytes every agent sent, and the CPU seconds all agents spent."""

    messages: int
    nbytes: int
    cpu_s: float


def traffic(schedule: Schedule) -> tuple[int, int]:
    """One repetition's messages (send operations) and their bytes, over every rank."""
    sends = [op for prog in schedule.ranks for op in prog.ops if op.kind == SEND]
    return len(sends), sum(op.bytes for op in sends)


def fit_agent_costs(samples: Sequence[CostSample], source: str = "") -> AgentCosts:
    """Least squares of ``cpu_s = messages x per_message + bytes x per_byte`` over ``samples``, neither term
    below zero; ValueError without two samples that tell the terms apart."""
    if len(samples) < 2:
        raise ValueError(f"expected at least 2 samples, got {len(samples)}")
    a = np.array([[s.messages, s.nbytes] for s in samples], dtype=float)
    y = np.array([s.cpu_s for s in samples], dtype=float)
    if np.linalg.matrix_rank(a) < 2:
        raise ValueError("expected samples of different messages-to-bytes ratios, got proportional ones")
    per_message, per_byte = np.linalg.lstsq(a, y, rcond=None)[0]
    if per_byte < 0:  # the bytes explain nothing: all of it per message
        per_message, per_byte = float(np.dot(a[:, 0], y) / np.dot(a[:, 0], a[:, 0])), 0.0
    elif per_message < 0:
        per_message, per_byte = 0.0, float(np.dot(a[:, 1], y) / np.dot(a[:, 1], a[:, 1]))
    return AgentCosts(float(per_message), float(per_byte), source)


@dataclass(frozen=True)
class Envelope:
    """What the machine gives an emulation: its calibrated datapath capacity, its agents' costs, its cores."""

    capacity_mbps: float | None  # None: not calibrated at this MTU (the datapath rule is skipped, and said so)
    costs: AgentCosts
    cores: int
    load_fraction: float = LOAD_FRACTION
    cpu_fraction: float = CPU_FRACTION
    message_fraction: float = MESSAGE_FRACTION
    calibration_ports: int = CALIBRATION_PORTS

    def capacity_for(self, ports: int) -> float | None:
        """The datapath capacity of a network of ``ports`` switch ports: the calibrated one, shrunk by
        :data:`PORT_EXPONENT` beyond the calibration network's ports (the userspace datapath's one thread passes
        over every port, so its cost per packet grows with them)."""
        if self.capacity_mbps is None:
            return None
        return self.capacity_mbps * min(1.0, self.calibration_ports / max(ports, 1)) ** PORT_EXPONENT


@dataclass(frozen=True)
class Bound:
    """One rule's least dilation, and why."""

    rule: str  # "datapath", "agents", "messages", "latency", "link rate"
    dilation: float
    why: str


@dataclass(frozen=True)
class DilationChoice:
    """The dilation chosen for one network, the profile that carries it (its links at ``link_mbps``), and every
    rule's bound."""

    profile: FabricProfile
    link_mbps: float
    bounds: tuple[Bound, ...]

    @property
    def binding(self) -> Bound:
        return max(self.bounds, key=lambda b: b.dilation)

    def reason(self) -> str:
        """One line: the rate, the dilation and the rule that set it."""
        b = self.binding
        return (f"{self.link_mbps:g} Mbit/s links (dilation {self.profile.dilation:g}), set by "
                f"the {b.rule}: {b.why}")

    def to_json(self) -> dict[str, object]:
        return {"fabric": self.profile.spec(), "link_mbps": self.link_mbps,
                "dilation": self.profile.dilation, "reason": self.reason(),
                "bounds": [{"rule": b.rule, "dilation": b.dilation, "why": b.why} for b in self.bounds]}


def datapath_bound(reports: Sequence[CheckReport], d0: float, env: Envelope, ports: int) -> Bound | None:
    capacity = env.capacity_for(ports)
    if capacity is None:
        return None
    peak = max(r.peak_load_mbps() for r in reports)
    return Bound("datapath", d0 * peak / (env.load_fraction * capacity),
                 f"busiest step {peak:.4g} switch-hop Mbit/s at dilation {d0:g}, within {env.load_fraction:.0%} of "
                 f"the capacity {capacity:.0f} at its {ports} switch ports (calibrated {env.capacity_mbps:.0f} at "
                 f"{env.calibration_ports})")


@dataclass(frozen=True)
class AgentsShare:
    """The largest share of the machine's CPU time (all cores) the agents' work takes, in a step or over a
    repetition, at the dilation the cells were predicted at; and where."""

    share: float
    where: str


def agents_share(reports: Sequence[CheckReport], costs: AgentCosts, cores: int) -> AgentsShare:
    """Per step of every report, its agent work over the step's span on ``cores`` cores; and per report, the
    repetition's work over its makespan: the largest."""
    worst = AgentsShare(0.0, "no messages")
    for r in reports:
        for w in r.step_loads:
            share = costs.work_s(w.messages, w.nbytes) / (cores * w.span_s)
            if share > worst.share:
                worst = AgentsShare(share, f"{r.schedule.algorithm} step {w.step}: {w.messages} messages, "
                                           f"{w.nbytes} bytes, {costs.work_s(w.messages, w.nbytes) * 1e3:.1f} ms "
                                           f"of CPU in {w.span_s * 1e3:.1f} ms")
        messages, nbytes = traffic(r.schedule)
        if r.predicted_time_s > 0:
            share = costs.work_s(messages, nbytes) / (cores * r.predicted_time_s)
            if share > worst.share:
                worst = AgentsShare(share, f"{r.schedule.algorithm}: {messages} messages, {nbytes} bytes per "
                                           f"repetition of {r.predicted_time_s:.2f} s")
    return worst


def agents_bound(reports: Sequence[CheckReport], d0: float, env: Envelope) -> Bound:
    """The least dilation at which every step's agent work, and every repetition's, fits the CPU share."""
    worst = agents_share(reports, env.costs, env.cores)
    return Bound("agents", d0 * worst.share / env.cpu_fraction,
                 f"{worst.where} at dilation {d0:g}, within {env.cpu_fraction:.0%} of {env.cores} cores "
                 f"(agent costs: {env.costs.source})")


def message_bound(reports: Sequence[CheckReport], d0: float, env: Envelope) -> Bound | None:
    """The least dilation at which one message's agent work is within the message fraction of every step."""
    spans = [(w.span_s, r.schedule.algorithm, w.step) for r in reports for w in r.step_loads]
    if not spans or env.costs.per_message_s <= 0:
        return None
    span, algo, step = min(spans)
    return Bound("messages", d0 * env.costs.per_message_s / (env.message_fraction * span),
                 f"{env.costs.per_message_s * 1e3:.2f} ms of agent work per message within "
                 f"{env.message_fraction:.0%} of the shortest step ({algo} step {step}, {span * 1e3:.1f} ms at "
                 f"dilation {d0:g})")


def latency_bound(reports: Sequence[CheckReport], profile: FabricProfile) -> Bound | None:
    """The least dilation (to 1%) at which no path the cells use is below this machine's own latency.

    Each cell is held to its own profile's latencies (a training iteration's are divided by its workload
    scale: :func:`emulator.model.fabric.for_workload_scale`), at the dilation tried."""
    cells = [(r.latency.profile, r.latency.intrinsic, r.costs.switch_counts) for r in reports
             if r.latency.profile is not None]
    if not cells:
        return None
    switches = sorted({s for _, _, counts in cells for s in counts})

    def fits(d: float) -> bool:
        return not any(LatencyModel(own.changed(dilation=d), intrinsic).floors(counts)
                       for own, intrinsic, counts in cells)

    lo, hi = profile.link_gbps * 1000.0 / fabric.MAX_LINK_MBPS, profile.link_gbps * 1000.0 / fabric.MIN_LINK_MBPS
    if fits(lo):  # no bound: the profile's latencies stay above this machine's at any rate
        return None
    if not fits(hi):
        return Bound("latency", hi, "this machine's own latency exceeds the profile's at every rate")
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return Bound("latency", hi, f"the profile's latency on {switches[-1] if switches else 0}-switch paths x D "
                                "at least this machine's own")


def readable_rate(mbps: float) -> float:
    """``mbps`` rounded down to two significant digits (2.37 -> 2.3, 0.0456 -> 0.045)."""
    if mbps <= 0:
        return mbps
    exponent = math.floor(math.log10(mbps)) - 1
    digits = math.floor(mbps / 10.0 ** exponent + 1e-9)
    return round(digits * 10.0 ** exponent, max(0, -exponent))


class NoDilationFits(UserError):
    """The rules ask for a link rate below what the shapers emulate; says what they ask for and what a repetition
    would then take."""

    def __init__(self, need: float, rate_mbps: float, binding: Bound, repetition_s: float):
        self.need, self.rate_mbps, self.binding, self.repetition_s = need, rate_mbps, binding, repetition_s
        super().__init__(f"the rules ask for dilation {need:.4g}, {rate_mbps:.3g} Mbit/s links, "
                         f"below the {fabric.MIN_LINK_MBPS:g} Mbit/s the shapers emulate (set by the {binding.rule}: "
                         f"{binding.why}); a repetition there would take about {repetition_s / 3600:.1f} h")


def choose_dilation(reports: Sequence[CheckReport], profile: FabricProfile, env: Envelope,
                    ports: int) -> DilationChoice:
    """The least dilation at which every one of ``reports`` (one network's cells, predicted at ``profile``'s own
    dilation, on a network of ``ports`` switch ports) fits ``env``; see the module docstring.
    :class:`NoDilationFits` when even the slowest rate does not."""
    d0 = profile.dilation
    bounds = [b for b in (datapath_bound(reports, d0, env, ports), agents_bound(reports, d0, env),
                          message_bound(reports, d0, env),
                          latency_bound(reports, profile)) if b is not None]
    fastest = profile.link_gbps * 1000.0 / fabric.MAX_LINK_MBPS
    need = max([b.dilation * MARGIN for b in bounds] + [fastest])
    bounds.append(Bound("link rate", fastest, f"at most {fabric.MAX_LINK_MBPS:g} Mbit/s per link"))
    rate = readable_rate(profile.link_gbps * 1000.0 / need)
    if rate < fabric.MIN_LINK_MBPS:
        slowest = max(r.predicted_time_s for r in reports) * need / d0
        raise NoDilationFits(need, profile.link_gbps * 1000.0 / need, max(bounds, key=lambda b: b.dilation), slowest)
    chosen = fabric.at_link_rate(profile, rate, where="dilation: auto")
    return DilationChoice(chosen, rate, tuple(bounds))
