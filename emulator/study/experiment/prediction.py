"""Each cell's schedule and the model's prediction: what ``emu run --check`` validates without starting anything.

:func:`prepare` generates every cell's schedule and predicts it (the same
``schedule check`` the replay runs), with the latency model of the cell's
fabric profile; an MPI cell has neither schedule nor prediction (the model
predicts schedules only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulator.base.errors import FieldError, UserError, printable
from emulator.base.progress import Meter
from emulator.model import topology
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import CheckReport, predict
from emulator.model.schedule.format import Schedule
from emulator.runs import fault_plan as faults
from emulator.study.experiment.cells import Cell, Experiment
from emulator.study.experiment.grid import expand


@dataclass
class PreparedCell:
    """A cell with its topology, schedule and the model's prediction (``schedule check``).

    An MPI cell has neither schedule nor prediction (None), only the latency model of its fabric (which the
    network it runs on is built with).
    """

    cell: Cell
    topo: topology.Topology
    schedule: Schedule | None
    report: CheckReport | None
    latency: LatencyModel | None = None  # default: the report's

    @property
    def latency_model(self) -> LatencyModel:
        """The latency model of the cell's fabric, with this machine's intrinsic latency."""
        if self.latency is not None:
            return self.latency
        assert self.report is not None, "a prepared cell has a latency model or a prediction"
        return self.report.latency

    @property
    def predicted_s(self) -> float | None:
        """The model's seconds per repetition; None for an MPI cell."""
        return float(self.report.predicted_time_s) if self.report is not None else None

    def peak_load_mbps(self) -> float:
        """The model's busiest step: switch-hop Mbit/s (bytes x switches crossed / the step's span), the unit of
        the calibrated datapath capacity (:mod:`emulator.selfcheck.live.calibration`); 0 for an MPI cell (no model of
        its load)."""
        return self.report.peak_load_mbps() if self.report is not None else 0.0


def cell_profile(cell: Cell) -> FabricProfile:
    """The fabric profile a cell emulates."""
    return cell.fabric


LatencyOf = Callable[[FabricProfile], LatencyModel]


def prepare(exp: Experiment, cells: list[Cell] | None = None, latency_of: LatencyOf = LatencyModel,
            meter: Meter | None = None) -> list[PreparedCell]:
    """Generate every cell's schedule and predict it, as the replay would; :class:`UserError` on failure.

    ``latency_of(profile)`` is the latency model of a cell's fabric profile,
    with this machine's intrinsic latency
    (``lambda p: fidelity.latency_model(p, calibration)``); by default the
    profile alone. ``meter`` counts the cells done.
    """
    models: dict[FabricProfile, LatencyModel] = {}
    topos: dict[str, topology.Topology] = {}
    out = []
    for cell in expand(exp) if cells is None else cells:
        topo = topos.setdefault(cell.topology, topology.build(cell.topology))
        model = models.setdefault(cell.fabric, latency_of(cell.fabric))
        if cell.mpi is not None:  # a program of its own: nothing to generate, nothing the model predicts
            out.append(PreparedCell(cell=cell, topo=topo, schedule=None, report=None, latency=model))
        else:
            schedule, report = _predicted(exp, cell, topo, model)
            out.append(PreparedCell(cell=cell, topo=topo, schedule=schedule, report=report))
        if meter is not None:
            meter.advance()
    return out


def _predicted(exp: Experiment, cell: Cell, topo: topology.Topology,
               model: LatencyModel) -> tuple[Schedule, CheckReport]:
    """A replay cell's schedule and its prediction, its faults checked; errors name the cell's field of ``exp``."""
    profile = cell.fabric
    try:
        schedule = cell.schedule(topo)
        report = predict(schedule, topo, cell.routing, seed=cell.seed, latency=model, mtu=profile.emulated_mtu,
                         where=f"cell {cell.id}", compute_dilation=profile.dilation)
        faults.parse_faults(cell.faults, topo, schedule.p, schedule.steps, cell.repeat, where=f"cell {cell.id}")
    except FieldError as exc:
        raise FieldError(exp.source, f"{cell.field}", f"a runnable cell ({cell.id}): {exc.field} "
                         f"must be {exc.expected}", exc.given) from None
    except UserError as exc:
        raise UserError(f"{printable(exp.source)}: field '{cell.field}': cell {cell.id}: {printable(exc)}") \
            from None
    return schedule, report
