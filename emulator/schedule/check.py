"""``schedule check`` as a function: proof of correctness plus contention and cost.

:func:`check` assumes a structurally valid :class:`Schedule` (as returned by
:func:`emulator.schedule.format.load`), checks that its hosts exist in the
topology, runs :func:`emulator.schedule.executor.execute` and
:func:`emulator.schedule.cost.analyze`, and returns one :class:`CheckReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emulator.schedule import cost, executor
from emulator.schedule.format import Schedule, check_hosts
from emulator.topology import Topology


@dataclass
class CheckReport:
    schedule: Schedule
    topology: str
    execution: executor.Execution
    costs: cost.CostReport

    @property
    def valid(self) -> bool:
        return self.execution.valid

    @property
    def predicted_time_s(self) -> float:
        """The max-min fair flow-level prediction (it accounts for contention)."""
        return self.costs.maxmin_time_s

    def to_json(self) -> dict[str, Any]:
        s = self.schedule
        dl = self.execution.deadlock
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
            "predicted_time_s": self.predicted_time_s,
            "alpha_beta_time_s": self.costs.alpha_beta_time_s,
            "maxmin_time_s": self.costs.maxmin_time_s,
            "busbw_mbps": cost.bus_bandwidth_mbps(s.size, s.p, self.predicted_time_s),
            "alpha_s": self.costs.alpha_s, "goodput": self.costs.goodput,
            "per_step": [st.to_json() for st in self.costs.steps],
        }


def check(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, alpha: float = cost.DEFAULT_ALPHA_S,
          gamma: float = 0.0, goodput: float = cost.TCP_GOODPUT, where: str = "schedule") -> CheckReport:
    """Prove ``schedule`` an allreduce and predict its contention and time on ``topo`` under ``policy``.

    Raises :class:`~emulator.errors.UserError` for hosts missing from the
    topology or an unknown routing policy; correctness problems are reported
    in the result (``valid`` false, ``execution.errors``).
    """
    check_hosts(schedule, topo, where)
    execution = executor.execute(schedule)
    costs = cost.analyze(schedule, topo, policy, seed=seed, alpha=alpha, gamma=gamma, goodput=goodput)
    return CheckReport(schedule=schedule, topology=topo.spec, execution=execution, costs=costs)
