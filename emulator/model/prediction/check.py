"""``schedule check`` as a function: proof of correctness, contention, and the predicted time.

:func:`check` assumes a structurally valid :class:`Schedule` (as returned by
:func:`emulator.model.schedule.format.load`), checks that its hosts exist in the
topology, runs :func:`emulator.model.schedule.executor.execute` (the proof),
:func:`emulator.model.prediction.cost.analyze` (contention and the step models) and
:func:`emulator.model.prediction.timing.simulate` (the prediction), and returns one
:class:`CheckReport`. :func:`predict` is what a replay runs first: the same,
refusing anything that does not compute its collectives.

Schedules with ``compute`` operations (a training iteration,
:mod:`emulator.model.workloads.training`) are predicted with their compute dilated
like everything else (``compute_dilation``, by default the fabric profile's
``dilation``: a replay sleeps ``D·seconds``). The report then has the
iteration's time (:attr:`CheckReport.iteration_time_s`, the makespan), its
time with communication free (:attr:`CheckReport.compute_only_s`,
:func:`emulator.model.prediction.timing.compute_only_s`) and the scaling efficiency,
compute-only over iteration (1 when communication hides entirely behind
compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from emulator.base.errors import UserError
from emulator.model.fabric import dilation_of as dilation_of_profile
from emulator.model.latency import LatencyModel
from emulator.model.prediction import cost, timing
from emulator.model.schedule import executor
from emulator.model.schedule.format import Schedule, check_hosts
from emulator.model.schedule.semantics import MIXED, bus_bandwidth_mbps
from emulator.model.topology import DEFAULT_MTU, Topology, tcp_payload_bytes


@dataclass(frozen=True)
class StepLoad:
    """One step of a prediction: its transfers' count and bytes, those bytes times the switches each crosses, and
    the timing model's span (emulated seconds)."""

    step: int
    messages: int
    nbytes: int
    switch_hop_bytes: int
    span_s: float


@dataclass
class CheckReport:
    schedule: Schedule
    topology: str
    execution: executor.Execution
    costs: cost.CostReport
    timing: timing.Timing | None  # None when the proof failed
    #: What a compute op's ``seconds`` were multiplied by (emulated seconds per real one).
    compute_dilation: float = 1.0
    #: The time with communication free, emulated (dilated) seconds; None without compute ops or a proof.
    compute_only_s: float | None = None

    @property
    def valid(self) -> bool:
        return self.execution.valid

    @property
    def latency(self) -> LatencyModel:
        return self.costs.latency

    @property
    def predicted_time_s(self) -> float:
        """The timing model's makespan, emulated seconds (it accounts for contention and latency)."""
        return self.timing.makespan_s if self.timing is not None else self.costs.maxmin_time_s

    @property
    def real_time_s(self) -> float | None:
        """What :attr:`predicted_time_s` stands for on the real fabric (None without a fabric profile)."""
        profile = self.latency.profile
        return profile.real_seconds(self.predicted_time_s) if profile is not None else None

    @property
    def iteration_time_s(self) -> float:
        """The whole schedule's predicted time (a training iteration's, compute and communication), emulated seconds."""
        return self.predicted_time_s

    @property
    def real_compute_only_s(self) -> float | None:
        """What :attr:`compute_only_s` stands for in real seconds (the compute ops' own ``seconds`` along the
        longest chain)."""
        return None if self.compute_only_s is None else self.compute_only_s / self.compute_dilation

    @property
    def scaling_efficiency(self) -> float | None:
        """Compute-only time over iteration time (1: communication entirely hidden); None without compute ops."""
        if self.compute_only_s is None or self.predicted_time_s <= 0:
            return None
        return self.compute_only_s / self.predicted_time_s

    def step_times(self) -> dict[int, float]:
        """Per step, the timing model's span: from its first transfer's start to its last one's end."""
        if self.timing is None:
            return {st.step: st.maxmin_s for st in self.costs.steps}
        return {step: b - a for step, (a, b) in self.timing.step_spans().items()}

    @cached_property
    def step_loads(self) -> tuple[StepLoad, ...]:
        """Per step with a span, in step order: what its transfers carry (computed once per report)."""
        spans = self.step_times()
        count: dict[int, int] = {}
        nbytes: dict[int, int] = {}
        hops: dict[int, int] = {}
        for t in self.costs.transfers:
            count[t.step] = count.get(t.step, 0) + 1
            nbytes[t.step] = nbytes.get(t.step, 0) + t.bytes
            hops[t.step] = hops.get(t.step, 0) + t.bytes * t.datapath_switches
        return tuple(StepLoad(s, count[s], nbytes[s], hops[s], spans[s]) for s in sorted(count) if spans.get(s))

    def peak_load_mbps(self) -> float:
        """The busiest step's load on the switch datapath: switch-hop Mbit/s (bytes x switches crossed / the
        step's span), the unit of the calibrated datapath capacity (:mod:`emulator.selfcheck.live.calibration`)."""
        return max((s.switch_hop_bytes * 8 / s.span_s / 1e6 for s in self.step_loads), default=0.0)

    def latency_floors(self) -> list[int]:
        """Path lengths (switches) of this schedule where the machine cannot reach the profile's latency."""
        return self.latency.floors(self.costs.switch_counts)

    def to_json(self) -> dict[str, Any]:
        s = self.schedule
        dl = self.execution.deadlock
        spans = self.step_times()
        profile = self.latency.profile
        return {
            "valid": self.valid,
            "errors": self.execution.errors,
            "deadlock": None if dl is None else {
                "ranks": dl.ranks,
                "cycle": [{"rank": r, "op": i} for r, i in dl.cycle],
                "blocked": [{"rank": b.rank, "op": b.op_id, "description": b.description, "waits_for": b.waits_for}
                            for b in dl.blocked],
            },
            "algorithm": s.algorithm, "ranks": s.p, "size": s.size, "chunks": s.chunks,
            "topology": self.topology, "routing": self.costs.routing, "seed": self.costs.seed,
            "steps": s.steps, "rounds": self.execution.rounds,
            "max_flows_per_link": self.costs.max_flows_per_link,
            "time_s": self.predicted_time_s,
            "real_time_s": self.real_time_s,
            "predicted_time_s": self.predicted_time_s,
            "alpha_beta_time_s": self.costs.alpha_beta_time_s,
            "maxmin_time_s": self.costs.maxmin_time_s,
            "busbw_mbps": bus_bandwidth_mbps(s.collective_bytes, s.p, self.predicted_time_s, s.collective),
            "real_busbw_gbps": (profile.real_mbps(bus_bandwidth_mbps(s.collective_bytes, s.p,
                                                                          self.predicted_time_s, s.collective)) / 1e3
                                if profile is not None else None),
            "fabric": profile.to_json() if profile is not None else None,
            "compute_ops": s.compute_ops, "compute_dilation": self.compute_dilation,
            "iteration_time_s": self.iteration_time_s, "compute_only_s": self.compute_only_s,
            "real_compute_only_s": self.real_compute_only_s, "scaling_efficiency": self.scaling_efficiency,
            "latency": {"intrinsic": self.latency.intrinsic.to_json(), "netem": self.latency.netem,
                        "paths": [self.latency.path(n).to_json() for n in self.costs.switch_counts],
                        "latency_floor_switches": self.latency_floors()},
            "mtu": self.costs.mtu, "goodput": self.costs.goodput,
            "per_step": [{**st.to_json(), "time_s": spans.get(st.step)} for st in self.costs.steps],
        }


def dilation_of(latency: LatencyModel | None, compute_dilation: float | None = None) -> float:
    """``compute_dilation`` if given, else the latency model's fabric profile's ``dilation``, else 1."""
    if compute_dilation is not None:
        return compute_dilation
    return dilation_of_profile(latency.profile if latency is not None else None)


def check(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
          gamma: float = 0.0, mtu: int = DEFAULT_MTU, compute_dilation: float | None = None,
          where: str = "schedule", flow_of: cost.FlowOf | None = None) -> CheckReport:
    """Prove that ``schedule`` computes its collectives and predict its contention and time on ``topo`` under ``policy``.

    ``latency`` holds the fabric profile and this machine's intrinsic latency
    (default: no latency at all, bandwidth alone); ``mtu`` is the emulated
    network's; a compute op takes its ``seconds`` times ``compute_dilation``
    (default :func:`dilation_of`: the profile's dilation, 1 without a
    profile); ``flow_of`` the 5-tuple of each connection, where it is not the
    agents' (:func:`emulator.model.prediction.cost.transfers`). Raises :class:`~emulator.base.errors.UserError` for
    hosts missing
    from the topology or an unknown routing policy; correctness problems are
    reported in the result (``valid`` false, ``execution.errors``) and then no
    timing is simulated.
    """
    check_hosts(schedule, topo, where)
    execution = executor.execute(schedule)
    model = latency or LatencyModel()
    dilation = dilation_of(model, compute_dilation)
    costs = cost.analyze(schedule, topo, policy, seed=seed, latency=model, gamma=gamma, mtu=mtu, flow_of=flow_of)
    sim = None
    compute_only = None
    if execution.valid:
        sim = _simulate(schedule, topo, costs, model, mtu, gamma, dilation)
        if schedule.compute_ops:
            compute_only = timing.compute_only_s(schedule, dilation)
    return CheckReport(schedule=schedule, topology=topo.spec, execution=execution, costs=costs, timing=sim,
                       compute_dilation=dilation, compute_only_s=compute_only)


def time_only(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
              mtu: int = DEFAULT_MTU) -> float:
    """The timing model's makespan of ``schedule`` (emulated seconds), without its proof: for a schedule made of
    generators' parts at a size where the proof cannot run (its count vectors hold a field per rank for every
    chunk: a projection's 1024 ranks of 50,000 chunks are tens of GiB). The same parts are proved at the sizes
    that run. Raises :class:`ValueError` if it deadlocks."""
    check_hosts(schedule, topo, "schedule")
    model = latency or LatencyModel()
    costs = cost.analyze(schedule, topo, policy, seed=seed, latency=model, mtu=mtu)
    return _simulate(schedule, topo, costs, model, mtu, 0.0, dilation_of(model, None)).makespan_s


def _simulate(schedule: Schedule, topo: Topology, costs: cost.CostReport, model: LatencyModel, mtu: int,
              gamma: float, dilation: float) -> timing.Timing:
    """The timing model on the routes ``costs`` found, every lane's connection its own route."""
    path_of = cost.path_function(topo, costs.transfers, costs.goodput)
    return timing.simulate(schedule, path_of, model.path, mss=tcp_payload_bytes(mtu), gamma=gamma,
                           compute_dilation=dilation)


def predict(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
            mtu: int = DEFAULT_MTU, compute_dilation: float | None = None, where: str = "schedule") -> CheckReport:
    """:func:`check`, raising :class:`UserError` unless the schedule computes its collectives (what a replay runs
    first)."""
    report = check(schedule, topo, policy, seed=seed, latency=latency, mtu=mtu, compute_dilation=compute_dilation,
                   where=where)
    if not report.valid:
        first = (report.execution.errors or ["it deadlocks"])[0]
        what = "schedule of collectives" if schedule.collective == MIXED else schedule.collective
        raise UserError(f"{where} is not a correct {what}: {first} (see `emu schedule check`)")
    return report
