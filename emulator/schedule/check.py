"""``schedule check`` as a function: proof of correctness, contention, and the predicted time.

:func:`check` assumes a structurally valid :class:`Schedule` (as returned by
:func:`emulator.schedule.format.load`), checks that its hosts exist in the
topology, runs :func:`emulator.schedule.executor.execute` (the proof),
:func:`emulator.schedule.cost.analyze` (contention and the step models) and
:func:`emulator.schedule.timing.simulate` (the prediction), and returns one
:class:`CheckReport`. :func:`predict` is what a replay runs first: the same,
refusing anything that is not a correct allreduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emulator.errors import UserError
from emulator.latency import LatencyModel
from emulator.schedule import cost, executor, timing
from emulator.schedule.format import Schedule, check_hosts
from emulator.topology import DEFAULT_MTU, Topology, tcp_payload_bytes


@dataclass
class CheckReport:
    schedule: Schedule
    topology: str
    execution: executor.Execution
    costs: cost.CostReport
    timing: timing.Timing | None  # None when the proof failed

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

    def step_times(self) -> dict[int, float]:
        """Per step, the timing model's span: from its first transfer's start to its last one's end."""
        if self.timing is None:
            return {st.step: st.maxmin_s for st in self.costs.steps}
        return {step: b - a for step, (a, b) in self.timing.step_spans().items()}

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
            "busbw_mbps": cost.bus_bandwidth_mbps(s.size, s.p, self.predicted_time_s),
            "real_busbw_gbps": (profile.real_mbps(cost.bus_bandwidth_mbps(s.size, s.p, self.predicted_time_s)) / 1e3
                                if profile is not None else None),
            "fabric": profile.to_json() if profile is not None else None,
            "latency": {"intrinsic": self.latency.intrinsic.to_json(), "netem": self.latency.netem,
                        "paths": [self.latency.path(n).to_json() for n in self.costs.switch_counts],
                        "latency_floor_switches": self.latency_floors()},
            "mtu": self.costs.mtu, "goodput": self.costs.goodput,
            "per_step": [{**st.to_json(), "time_s": spans.get(st.step)} for st in self.costs.steps],
        }


def check(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
          gamma: float = 0.0, mtu: int = DEFAULT_MTU, where: str = "schedule") -> CheckReport:
    """Prove ``schedule`` an allreduce and predict its contention and time on ``topo`` under ``policy``.

    ``latency`` holds the fabric profile and this machine's intrinsic latency
    (default: no latency at all, bandwidth alone); ``mtu`` is the emulated
    network's. Raises :class:`~emulator.errors.UserError` for hosts missing
    from the topology or an unknown routing policy; correctness problems are
    reported in the result (``valid`` false, ``execution.errors``) and then no
    timing is simulated.
    """
    check_hosts(schedule, topo, where)
    execution = executor.execute(schedule)
    model = latency or LatencyModel()
    costs = cost.analyze(schedule, topo, policy, seed=seed, latency=model, gamma=gamma, mtu=mtu)
    sim = None
    if execution.valid:
        path_of = cost.path_function(topo, costs.transfers, costs.goodput)
        sim = timing.simulate(schedule, path_of, model.path, mss=tcp_payload_bytes(mtu), gamma=gamma)
    return CheckReport(schedule=schedule, topology=topo.spec, execution=execution, costs=costs, timing=sim)


def predict(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
            mtu: int = DEFAULT_MTU, where: str = "schedule") -> CheckReport:
    """:func:`check`, raising :class:`UserError` unless the schedule is a correct allreduce (what a replay runs first)."""
    report = check(schedule, topo, policy, seed=seed, latency=latency, mtu=mtu, where=where)
    if not report.valid:
        first = (report.execution.errors or ["it deadlocks"])[0]
        raise UserError(f"{where} is not a correct allreduce: {first} (see `emu schedule check`)")
    return report
