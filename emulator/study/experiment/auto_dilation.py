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
rate. MPI runs keep their profile's dilation (no model predicts their load).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator.base.errors import UserError
from emulator.model import topology
from emulator.runs.dilation import DilationChoice, Envelope, choose_dilation
from emulator.study.experiment.cells import Experiment, Run
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

    @property
    def outside(self) -> bool:
        """An explicit rate faster than the envelope allows."""
        return (not self.auto and self.choice is not None
                and self.link_mbps > self.choice.link_mbps * (1 + 1e-9))

    def line(self) -> str:
        """What ``emu run`` prints for this run."""
        if self.error is not None:
            return f"{self.field}: no rate fits this machine: {self.error}"
        if self.choice is None:
            return f"{self.field}: {self.link_mbps:g} Mbit/s (an MPI program: no model of its load to choose by)"
        if self.auto:
            return f"{self.field}: dilation auto: {self.choice.reason()}"
        verdict = "faster than this machine's envelope" if self.outside else "within this machine's envelope"
        return (f"{self.field}: {self.link_mbps:g} Mbit/s as the file sets, {verdict} (auto would choose "
                f"{self.choice.reason()})")

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "auto": self.auto, "link_mbps": self.link_mbps, "outside": self.outside,
                "error": self.error, "choice": self.choice.to_json() if self.choice is not None else None}


def choose(exp: Experiment, prepared: Sequence[PreparedCell], envelope_of: Callable[[int], Envelope],
           latency_of: LatencyOf) -> tuple[list[PreparedCell], list[RunDilation]]:
    """Every run's dilation (see the module docstring); the cells, those of ``auto`` runs at their chosen rate
    and predicted again, in file order."""
    by_field: dict[str, list[PreparedCell]] = {}
    for pc in prepared:
        by_field.setdefault(pc.cell.field, []).append(pc)
    decisions: list[RunDilation] = []
    new_runs: dict[str, Run] = {}
    for si, ser in enumerate(exp.series):
        for ri, run in enumerate(ser.runs):
            where = f"series[{si}].runs[{ri}]"
            pcs = [pc for pc in by_field.get(where, []) if pc.report is not None]
            auto = exp.auto_of(ser, run)
            rate = pcs[0].topo.host_bw if pcs else exp.profile_of(ser, run).emulated_link_mbps
            if not pcs:
                decisions.append(RunDilation(where, False, rate, None))
                continue
            profile = pcs[0].cell.fabric
            try:
                choice = choose_dilation([pc.report for pc in pcs if pc.report is not None], profile,
                                         envelope_of(profile.emulated_mtu), topology.switch_ports(pcs[0].topo))
            except UserError as exc:  # NoDilationFits, or a rate the profile refuses
                decisions.append(RunDilation(where, False, rate, None, error=str(exc)))
                continue
            if auto:
                rate = choice.link_mbps
                new_runs[where] = replace(run, fabric=exp.profile_of(ser, run).changed(
                    where, dilation=choice.profile.dilation), topology=topology.at_link_rate(run.topology, rate))
            decisions.append(RunDilation(where, auto, rate, choice))
    if not new_runs:
        return list(prepared), decisions
    chosen = replace(exp, series=tuple(
        replace(ser, runs=tuple(new_runs.get(f"series[{si}].runs[{ri}]", run) for ri, run in enumerate(ser.runs)))
        for si, ser in enumerate(exp.series)))
    again = prepare(chosen, [c for c in expand(chosen) if c.field in new_runs], latency_of)
    kept = [pc for pc in prepared if pc.cell.field not in new_runs]
    order = {f"series[{si}].runs[{ri}]": (si, ri) for si, ser in enumerate(exp.series) for ri in range(len(ser.runs))}
    return sorted([*kept, *again], key=lambda pc: order[pc.cell.field]), decisions
