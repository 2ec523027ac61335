"""The MPI cell: an Open MPI program run on its network as ``emu mpirun`` runs it.

:class:`MpiKind` is the :class:`~emulator.study.cell_kinds.base.CellKind` of every
cell with an MPI program (:attr:`emulator.study.experiment.Cell.mpi`). It runs
the program through the :class:`MpiCellRunner` it is made with (``emu run``'s
is :func:`emulator.study.live.runner.run_mpi_cell`; reading and reporting need
none); its ``results.json`` is an :class:`emulator.runs.mpi_results.MpiResults`
(kind ``mpirun``) with its network's probe added; a program that exits
non-zero, times out or cannot start is a failed cell. Its progress line is
:func:`mpi_line`, its report row an :class:`MpiRow`: the bundled benchmark's
rows beside the timing model's prediction of the same algorithm
(:mod:`emulator.runs.mpi_prediction`), never in a busbw comparison of the
agents' cells.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from emulator.base.files import write_json_atomic
from emulator.model import fabric, topology
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.format import format_size
from emulator.runs.mpi_results import MpiResults
from emulator.runs.results import Fidelity, ProbeVerdict
from emulator.runs.trust import Trust
from emulator.study import experiment as xp
from emulator.study.cell_kinds.base import CSV_FIELDS, PlanDefaults, Session, TrustedRow, read_fabric
from emulator.study.cell_kinds.replay import verdict_tail
from emulator.study.folder.cell_state import CellState
from emulator.study.progress import QUIET_FLAGS

#: ``results.json``'s ``kind`` of an MPI cell (:meth:`emulator.runs.mpi_results.MpiResults.to_json`).
RESULTS_KIND = "mpirun"


class MpiCellRunner(Protocol):
    """Runs an MPI cell's program on a started session into ``out`` (an empty directory) and returns its results
    (also written to ``out/results.json``, with ``config`` added to theirs)."""

    def __call__(self, session: Session, cell: xp.Cell, out: str, *, config: dict[str, Any],
                 echo: Callable[[str], None]) -> MpiResults: ...


def mpi_line(res: MpiResults) -> str:
    """The tail of a finished MPI cell's progress line: wall time, the benchmark's largest size and its time over
    the model's, its flags (``model_disagrees`` among them), and its verdict when it is unchecked."""
    text = f"MPI program exited {res.exit_status} after {res.wall_s or 0.0:.1f} s"
    top = res.largest_row()
    if top is not None:
        ratio = res.over_model(top["size"])
        model = f"measured/predicted {ratio:.2f}" if ratio is not None else "no model"
        text += f", busbw {float(top.get('busbw_mbps') or 0.0):.2f} Mbit/s at {format_size(top['size'])} ({model})"
    checks = res.trust()
    flags = sorted({*(f for f in (res.fidelity.flags if res.fidelity else []) if f not in QUIET_FLAGS),
                    *checks.flags})
    return text + (f" [fidelity: {', '.join(flags)}]" if flags else "") + verdict_tail(checks)


@dataclass(frozen=True)
class MpiRow(TrustedRow):
    """One planned MPI cell as the report sees it: the program's run, never a busbw or model comparison.

    ``busbw_mbps`` is the bundled benchmark's at its largest size (``busbw_size``), None when the program is
    another one or wrote no rows; ``efficiency`` that busbw over the link's TCP goodput (as a replay row's
    ``capacity_mbps``); ``measured_over_predicted`` its time over the timing model's (None: not predicted). Measured fields are None unless the cell's results exist; ``status`` as for a replay
    row (``ok``: the program exited 0).
    """

    id: str
    series: str
    topology: str
    topology_slug: str
    kind: str
    hosts: int
    routing: str
    seed: int
    placement: str
    algorithm: str  # the program's slug in the cell id (``mpi-emu-allreduce-bench-ring``)
    program: str  # the command line as given
    ranks: int
    status: str  # ok, failed, interrupted, not run (as state.json says, else the results)
    exit_status: int | None
    run_status: str | None  # the results' own: ok, failed, timeout, interrupted, running; None without results
    time_s: float | None  # mpirun's wall time, Open MPI's start-up included
    wall_s: float | None  # the cell's, from state.json
    bench: list[dict[str, Any]]
    busbw_mbps: float | None
    busbw_size: int | None
    link_mbps: float
    capacity_mbps: float  # link goodput: link_mbps x the TCP goodput at the fabric's MTU
    fabric: FabricProfile  # the cell's (else the experiment's, else the default one): its MTU sets capacity_mbps
    trust: Trust | None  # the run's checks (MpiResults.trust); None: no results
    flags: list[str]
    qdisc_drops: int
    tcp_retransmits: int
    cpu_idle: float | None
    error: str | None
    learned_connections: int | None
    datapath: str | None
    dir: str
    measured_over_predicted: float | None = None

    @property
    def efficiency(self) -> float | None:
        return self.busbw_mbps / self.capacity_mbps if self.busbw_mbps and self.capacity_mbps else None

    def csv(self) -> dict[str, Any]:
        """The row of ``cells.csv``: the columns that apply (``size`` and ``busbw_mbps`` are the benchmark's
        largest size and its busbw; ``time_s`` is mpirun's wall time; ``outcome`` the results' status, e.g.
        ``timeout``), the model's and the replays' empty."""
        own = {"id": self.id, "series": self.series, "topology": self.topology, "kind": self.kind,
               "hosts": self.hosts, "routing": self.routing, "seed": self.seed, "algorithm": self.algorithm,
               "placement": self.placement, "size": self.busbw_size if self.busbw_size is not None else "",
               "status": self.status, "outcome": self.run_status or self.status, "busbw_mbps": self.busbw_mbps,
               "time_s": self.time_s, "trusted": self.trust_word(), "flags": " ".join(self.flags),
               "qdisc_drops": self.qdisc_drops, "tcp_retransmits": self.tcp_retransmits, "wall_s": self.wall_s,
               "error": self.error, "program": self.program, "ranks": self.ranks, "exit_status": self.exit_status,
               "measured_over_predicted": self.measured_over_predicted}
        return {name: own.get(name, "") for name in CSV_FIELDS}


def _fabric(entry: Mapping[str, Any], plan: PlanDefaults) -> FabricProfile:
    """The cell's fabric profile: its plan entry's, else the experiment's; the default one when neither has one
    and when the entry's does not parse."""
    if entry.get("fabric"):
        return read_fabric(entry["fabric"]) or fabric.default()
    return plan.fabric or fabric.default()


def _bench_top(res: MpiResults | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The benchmark's rows that have a size, and the one at the largest size (None without rows)."""
    rows = [r for r in (res.bench if res else []) if isinstance(r, Mapping) and isinstance(r.get("size"), int)]
    return rows, (res.largest_row() if res is not None else None)


def _fidelity_fields(res: MpiResults | None, finished: bool) -> dict[str, Any]:
    """The run's checks (a finished run's), its flags (``model_disagrees`` among them) and fidelity counters."""
    fid = res.fidelity if res else None
    checks = res.trust() if res is not None and finished else None
    flags = sorted({*(fid.flags if fid else []), *(checks.flags if checks else ())})
    return {"trust": checks, "flags": flags,
            "qdisc_drops": fid.qdisc_drops if fid else 0, "tcp_retransmits": fid.tcp_retransmits if fid else 0,
            "cpu_idle": fid.cpu_idle if fid else None}


def _ranks(entry: Mapping[str, Any], res: MpiResults | None) -> int:
    """The ranks the program ran with; before it ran, the file's ``np`` (else one per host)."""
    np = entry["mpi"].get("np")
    return len(res.ranks) if res and res.ranks else (np if isinstance(np, int) else entry["hosts"])


class MpiKind:
    """A cell that runs an MPI program; ``runner`` runs it (None: this kind only reads and reports)."""

    name = "mpi"
    predicted = False

    def __init__(self, runner: MpiCellRunner | None = None):
        self.runner = runner

    def claims(self, cell: xp.Cell) -> bool:
        return cell.mpi is not None

    def claims_entry(self, entry: Mapping[str, Any]) -> bool:
        return entry.get("mpi") is not None

    def run(self, session: Session, pc: xp.PreparedCell, out: str, *, config: dict[str, Any],
            echo: Callable[[str], None]) -> None:
        """The program on the session; what it returns is not used (its ``results.json`` is what counts)."""
        if self.runner is None:
            raise RuntimeError(f"cell {pc.cell.id}: no MPI cell runner was given to run its program")
        self.runner(session, pc.cell, out, config=config, echo=echo)

    def read(self, data: Mapping[str, Any]) -> MpiResults | None:
        """None for another kind's document and a damaged one (the cell then runs again)."""
        if data.get("kind") != RESULTS_KIND:
            return None
        try:
            return MpiResults.from_json(dict(data))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    def save(self, path: str, res: MpiResults, probe: ProbeVerdict | None) -> None:
        """The results with the network's probe (as a replay cell's results have it)."""
        data = res.to_json()
        if probe is not None:
            data["probe"] = probe.to_json()
        write_json_atomic(path, data)

    def failure(self, res: MpiResults | None) -> str:
        """Why the program did not finish: its error, the signal that ended it, its exit status."""
        if res is None:
            return f"no results.json of kind {RESULTS_KIND}"
        if res.error:
            return res.error
        if res.exit_status is not None and res.exit_status < 0:  # subprocess's way of saying a signal ended it
            return f"the program was ended by signal {-res.exit_status}"
        if res.exit_status is not None:
            return f"the program exited with status {res.exit_status}"
        return f"status {res.status!r}"

    def flag(self, res: MpiResults, name: str) -> None:
        if res.fidelity is None:
            res.fidelity = Fidelity.unmeasured()
        res.fidelity.flag(name)

    def line(self, res: MpiResults) -> str:
        return mpi_line(res)

    def row(self, entry: Mapping[str, Any], res: MpiResults | None, state: CellState | None, plan: PlanDefaults,
            cell_dir: str) -> MpiRow:
        if res is not None and (res.config.get("cell") or {}).get("id") != entry["id"]:
            res = None  # another cell's results
        finished = res is not None and res.status == "ok"
        status = "ok" if finished else ((state.status if state else None) or (res.status if res else None)
                                        or "not run")
        if status == "running":
            status = "interrupted"
        bench, top = _bench_top(res)
        busbw = top.get("busbw_mbps") if top else None
        link_mbps = (res.link_mbps if res else None) or plan.link_mbps
        profile = _fabric(entry, plan)
        return MpiRow(
            id=entry["id"], series=entry["series"], topology=entry["topology"],
            topology_slug=entry["id"].split(".")[1], kind=entry["kind"], hosts=entry["hosts"],
            routing=entry["routing"], seed=entry["seed"], placement=entry["placement"], algorithm=entry["algorithm"],
            program=shlex.join(str(w) for w in entry["mpi"].get("program") or []), ranks=_ranks(entry, res),
            status=status, exit_status=res.exit_status if res else None, run_status=res.status if res else None,
            time_s=res.wall_s if res else None, wall_s=state.wall_s if state else None, bench=bench,
            busbw_mbps=float(busbw) if isinstance(busbw, int | float) else None,
            busbw_size=top["size"] if top else None, link_mbps=link_mbps, fabric=profile,
            capacity_mbps=link_mbps * topology.tcp_goodput_factor(profile.emulated_mtu), **_fidelity_fields(res, finished),
            error=None if finished else ((state.error if state else None) or (res.error if res else None)),
            learned_connections=res.learned_connections if res else None,
            datapath=(res.datapath or None) if res else None, dir=cell_dir,
            measured_over_predicted=res.over_model(top["size"]) if res is not None and top else None)
