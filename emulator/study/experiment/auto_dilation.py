"""``dilation: auto`` in an experiment: each run's dilation chosen from this machine's calibration.

:func:`choose` takes the cells as :func:`~emulator.study.experiment.prediction.prepare`
predicted them (at the profile's own dilation), and per run of the file:

* a run under ``dilation: auto`` gets the least dilation at which all its
  cells fit the machine's :class:`~emulator.runs.dilation.Envelope`
  (:func:`emulator.runs.dilation.choose_dilation`); its topology takes the
  rate that dilation gives, and its cells are predicted again at it;
* a run with a rate or dilation of its own keeps it; where that is faster
  than the envelope allows, its :class:`RunDilation` says so (``outside``),
  and ``emu run`` prints it.

One dilation per run, not per network: the cells of a run (its routings,
seeds, algorithms, sizes) are compared with each other, so they share one
rate. No model predicts an MPI program's load: an ``auto`` MPI run takes the
rate chosen for the first ``auto`` replay run of the same topology (so they
share its network), else keeps its profile's dilation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator.base.errors import UserError
from emulator.base.progress import Meter
from emulator.model import topology
from emulator.runs.dilation import DilationChoice, Envelope, choose_dilation
from emulator.study.experiment.cells import Experiment, Run, Series
from emulator.study.experiment.grid import expand
from emulator.study.experiment.prediction import LatencyOf, PreparedCell, prepare


@dataclass(frozen=True)
class RunDilation:
    """One run's dilation: chosen (``auto``) or its own, with what the envelope allows."""

    field: str  # series[i].runs[j]
    auto: bool
    link_mbps: float  # the rate the run's cells run at
    choice: DilationChoice | None  # None: nothing to choose from (an MPI run)
    error: str | None = None  # why no rate fits (then the run keeps its own)
    follows: str | None = None  # an MPI run under auto: the replay run whose rate it takes
    dilation: float | None = None  # the dilation its cells run at, where no rate fits (auto's or the file's own)

    @property
    def outside(self) -> bool:
        """An explicit rate faster than the envelope allows."""
        return (not self.auto and self.choice is not None
                and self.link_mbps > self.choice.link_mbps * (1 + 1e-9))

    def line(self) -> str:
        """What ``emu run`` prints for this run."""
        if self.error is not None:
            own = f"{self.link_mbps:g} Mbit/s" + (f" (dilation {self.dilation:g})" if self.dilation else "")
            if self.auto:
                return f"{self.field}: dilation auto: no rate fits this machine, the run keeps {own}: {self.error}"
            return (f"{self.field}: {own} as the file sets; `dilation: auto` would find no rate this machine "
                    f"keeps up with: {self.error}")
        if self.follows is not None:
            return (f"{self.field}: {self.link_mbps:g} Mbit/s, the rate chosen for {self.follows} on the same "
                    "topology (an MPI program: no model of its load to choose by)")
        if self.choice is None:
            return f"{self.field}: {self.link_mbps:g} Mbit/s (an MPI program: no model of its load to choose by)"
        if self.auto:
            return f"{self.field}: dilation auto: {self.choice.reason()}"
        verdict = "faster than this machine's envelope" if self.outside else "within this machine's envelope"
        return (f"{self.field}: {self.link_mbps:g} Mbit/s as the file sets, {verdict} (auto would choose "
                f"{self.choice.reason()})")

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "auto": self.auto, "link_mbps": self.link_mbps, "outside": self.outside,
                "error": self.error, "follows": self.follows,
                "choice": self.choice.to_json() if self.choice is not None else None}


def _decide(exp: Experiment, ser: Series, run: Run, where: str, pcs: Sequence[PreparedCell],
            envelope_of: Callable[[int], Envelope]) -> tuple[RunDilation, Run | None]:
    """One run's dilation, and the run at its chosen rate when it is ``auto`` (else None: it stays as it is)."""
    auto = exp.auto_of(ser, run)
    reports = [pc.report for pc in pcs if pc.report is not None]
    if not reports:  # an MPI run: see _follow
        return RunDilation(where, False, exp.profile_of(ser, run).emulated_link_mbps, None), None
    rate = pcs[0].topo.host_bw
    profile = pcs[0].cell.fabric  # the run's, with a workload's latencies scaled
    try:
        choice = choose_dilation(reports, profile, envelope_of(profile.emulated_mtu),
                                 topology.switch_ports(pcs[0].topo))
    except UserError as exc:  # NoDilationFits, or a rate the profile refuses
        return RunDilation(where, auto, rate, None, error=str(exc), dilation=profile.dilation), None
    if not auto:
        return RunDilation(where, False, rate, choice), None
    chosen = replace(run, fabric=exp.profile_of(ser, run).changed(where, dilation=choice.profile.dilation),
                     topology=topology.at_link_rate(run.topology, choice.link_mbps))
    return RunDilation(where, True, choice.link_mbps, choice), chosen


def choose(exp: Experiment, prepared: Sequence[PreparedCell], envelope_of: Callable[[int], Envelope],
           latency_of: LatencyOf, meter: Meter | None = None) -> tuple[list[PreparedCell], list[RunDilation]]:
    """Every run's dilation (see the module docstring); the cells, those of ``auto`` runs at their chosen rate
    and predicted again (counted on ``meter``), in file order."""
    by_field: dict[str, list[PreparedCell]] = {}
    for pc in prepared:
        by_field.setdefault(pc.cell.field, []).append(pc)
    decisions: dict[str, RunDilation] = {}  # by field, in file order
    new_runs: dict[str, Run] = {}
    by_topology: dict[str, RunDilation] = {}  # the first auto replay run's choice per topology
    for si, ser in enumerate(exp.series):
        for ri, run in enumerate(ser.runs):
            where = f"series[{si}].runs[{ri}]"
            decision, chosen = _decide(exp, ser, run, where, by_field.get(where, []), envelope_of)
            if chosen is not None:
                new_runs[where] = chosen
                by_topology.setdefault(run.topology, decision)
            decisions[where] = decision
    _follow(exp, decisions, new_runs, by_topology)
    if not new_runs:
        return list(prepared), list(decisions.values())
    return _predict_again(exp, prepared, new_runs, latency_of, meter), list(decisions.values())


def _follow(exp: Experiment, decisions: dict[str, RunDilation], new_runs: dict[str, Run],
            by_topology: dict[str, RunDilation]) -> None:
    """MPI runs under ``auto`` take the rate of the first ``auto`` replay run of their topology (in place)."""
    for si, ser in enumerate(exp.series):
        for ri, run in enumerate(ser.runs):
            where = f"series[{si}].runs[{ri}]"
            leader = by_topology.get(run.topology)
            if run.mpi is None or not exp.auto_of(ser, run) or leader is None or leader.choice is None:
                continue
            new_runs[where] = replace(run, fabric=exp.profile_of(ser, run).changed(
                where, dilation=leader.choice.profile.dilation), topology=new_runs[leader.field].topology)
            decisions[where] = RunDilation(where, True, leader.link_mbps, None, follows=leader.field)


def _predict_again(exp: Experiment, prepared: Sequence[PreparedCell], new_runs: dict[str, Run],
                   latency_of: LatencyOf, meter: Meter | None) -> list[PreparedCell]:
    """The cells, those of the runs in ``new_runs`` (by field) replaced by theirs predicted again, in file order."""
    chosen = replace(exp, series=tuple(
        replace(ser, runs=tuple(new_runs.get(f"series[{si}].runs[{ri}]", run) for ri, run in enumerate(ser.runs)))
        for si, ser in enumerate(exp.series)))
    cells = [c for c in expand(chosen) if c.field in new_runs]
    if meter is not None:
        meter.phase("predicting again at the chosen dilations", len(cells), "cells")
    again = prepare(chosen, cells, latency_of, meter)
    kept = [pc for pc in prepared if pc.cell.field not in new_runs]
    order = {f"series[{si}].runs[{ri}]": (si, ri) for si, ser in enumerate(exp.series) for ri in range(len(ser.runs))}
    return sorted([*kept, *again], key=lambda pc: order[pc.cell.field])
