"""The replay cell: a schedule replayed by the host agents on its network, measured against the timing model.

:class:`ReplayKind` is the :class:`~emulator.study.cell_kinds.base.CellKind` of every
cell without an MPI program: it runs through :meth:`Session.run` with the
cell's schedule, prediction and fault plan, its ``results.json`` is an
:class:`emulator.runs.results.CellResults` (read as
:func:`emulator.runs.results.load` reads it), its progress line is
:func:`cell_line` and its report row a :class:`CellRow`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.model import routing, topology
from emulator.model.collectives import registry
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.semantics import ALLREDUCE, qualified
from emulator.runs import fault_plan as faults
from emulator.runs.results import CellResults, FaultRecord, Iteration, ProbeVerdict, SchemaError, Summary
from emulator.runs.trust import Trust
from emulator.study import experiment as xp
from emulator.study.cell_kinds.base import CSV_FIELDS, PlanDefaults, Session, TrustedRow, read_fabric
from emulator.study.folder.cell_state import CellState
from emulator.study.progress import QUIET_FLAGS

LEGACY_GOODPUT = 1448 / 1514  # TCP payload per wire byte at MTU 1500, for results whose prediction has no goodput


def cell_line(res: CellResults) -> str:
    """The tail of a finished cell's progress line: median busbw (a training iteration: its time and scaling
    efficiency) against the model's, its fidelity flags, and its verdict when it is not trusted."""
    summary = res.summary()
    pred = res.prediction.get("busbw_mbps") or 0.0
    flags = [f for f in res.flags() if f not in QUIET_FLAGS]
    busbw = summary.busbw_mbps if summary is not None else 0.0
    ratio = (summary.measured_over_predicted if summary is not None else None) or 0.0
    tail = (f", measured/predicted {ratio:.2f}" + (f" [fidelity: {', '.join(flags)}]" if flags else "")
            + verdict_tail(summary.trust if summary is not None else None))
    if summary is not None and summary.scaling_efficiency is not None:
        model = res.prediction.get("scaling_efficiency") or 0.0
        return f"iteration {summary.iteration_s:.1f} s, scaling efficiency {summary.scaling_efficiency:.2f} " \
               f"(model {model:.2f})" + tail
    return f"busbw {busbw:.2f} Mbit/s (model {pred:.2f})" + tail


def verdict_tail(trust: Trust | None) -> str:
    """`` [unchecked: no fidelity data]`` after a progress line whose cell is unchecked ("" otherwise: a trusted
    cell says nothing, a flagged one shows its flags already)."""
    return f" [{trust.text()}]" if trust is not None and not trust.flags and trust.unchecked else ""


@dataclass(frozen=True)
class CellRow(TrustedRow):
    """One planned replay cell as the report sees it (``cells.csv`` holds the fields of :data:`CSV_FIELDS`).

    Measured fields (busbw, times, ``trust``, ``rep_busbw``) are None or
    empty unless the cell finished; predictions come from the cell's results,
    else from the plan.
    """

    id: str
    series: str
    topology: str
    kind: str
    hosts: int
    routing: str
    seed: int
    algorithm: str
    placement: str
    size: int
    topology_slug: str
    status: str  # ok, failed, interrupted, not run
    busbw_mbps: float | None
    busbw_min_mbps: float | None
    busbw_max_mbps: float | None
    time_s: float | None
    predicted_time_s: float | None
    predicted_busbw_mbps: float | None
    alpha_beta_time_s: float | None
    measured_over_predicted: float | None
    max_flows_per_link: int
    trust: Trust | None  # the cell's checks (emulator.runs.trust); None: not measured
    flags: list[str]
    qdisc_drops: int
    tcp_retransmits: int
    repetitions: int
    wall_s: float | None
    error: str | None
    goodput: float | None  # TCP payload per wire byte of the prediction
    link_mbps: float
    capacity_mbps: float  # link goodput: link_mbps x goodput
    rep_busbw: list[float]  # busbw of every measured repetition
    datapath: str | None
    outcome: str
    servers: int | None
    accels_per_server: int | None
    nics_per_server: int | None
    server_design: str | None  # "shared NIC", "NIC per accelerator", "N NICs for A"; None without servers
    faults: list[FaultRecord]
    dir: str  # the cell's folder
    collective: str = ALLREDUCE
    workload: str = ""  # a training iteration's model (e.g. "resnet50-s16"); "" for one collective per size
    iteration_s: float | None = None
    compute_only_s: float | None = None
    scaling_efficiency: float | None = None  # compute-only / iteration time, median over repetitions
    predicted_scaling_efficiency: float | None = None
    workload_scale: float = 1.0  # a training iteration's scale (gradients and compute divided by it)
    workload_model: str = ""  # the workload's slug without its scale (``resnet50-b32``): its training family
    fabric: FabricProfile | None = None  # the cell's fabric profile; None in plans older than fabric profiles
    rep_efficiency: list[float] = field(default_factory=list)  # scaling efficiency of every measured repetition
    #: per kind of process group, its communication's share of the iteration: the median over the measured
    #: repetitions, and the timing model's (:mod:`emulator.model.prediction.group_share`)
    comm_share: dict[str, float] = field(default_factory=dict)
    model_comm_share: dict[str, float] = field(default_factory=dict)
    llm: xp.Workload | None = None  # a language model's iteration: its split (``workload`` is its slug)

    @property
    def is_training(self) -> bool:
        return bool(self.workload)

    @property
    def ranks(self) -> int:
        """A replay's ranks: one per host."""
        return self.hosts

    def csv(self) -> dict[str, Any]:
        """The row of ``cells.csv``: the columns of :data:`CSV_FIELDS` (``program`` and ``exit_status`` are an
        MPI cell's, empty here)."""
        special = {"flags": " ".join(self.flags), "trusted": self.trust_word(), "program": "", "exit_status": ""}
        return {name: special[name] if name in special else getattr(self, name) for name in CSV_FIELDS}

    @property
    def algorithm_label(self) -> str:
        """``hd``, or ``hd-random`` for a placement other than the algorithm's own (``hdrm``'s is HDRM's)."""
        own = registry.own_placement(self.collective, self.algorithm)
        return self.algorithm if self.placement == own else f"{self.algorithm}-{self.placement}"

    @property
    def op_label(self) -> str:
        """The algorithm label, prefixed by the collective unless it is allreduce: ``hd``, ``allgather-ring``."""
        return qualified(self.collective, self.algorithm_label)

    def family(self, with_seed: bool = False) -> str:
        """``leafspine-4x4x4 ecmp hd`` (the label of a line or a table row); ``ecmp-s1`` with its seed.

        A collective other than allreduce is named: ``leafspine-4x4x4 ecmp allgather-ring``.
        """
        policy = routing.label(self.routing, self.seed) if with_seed else self.routing
        return f"{self.topology_slug} {policy} {self.op_label}"


def _status(finished: bool, res: CellResults | None, state: CellState | None) -> str:
    """``ok`` when finished, else the state's (a cell left ``running`` was interrupted), the results' or
    ``not run``."""
    status = "ok" if finished else ((state.status if state else None) or (res.status if res else None) or "not run")
    return "interrupted" if status == "running" else status


def _measured(res: CellResults | None, finished: bool) -> dict[str, Any]:
    """The row's measured fields: medians over the measured repetitions, their spread and fidelity counters."""
    reps = res.repetitions if res else []
    summary: Summary | None = res.summary() if res and finished else None
    busbws = [r.busbw_mbps for r in reps]
    fidelity = [r.fidelity for r in reps if r.fidelity is not None]
    return {"busbw_mbps": summary.busbw_mbps if summary else None,
            "busbw_min_mbps": min(busbws) if busbws and finished else None,
            "busbw_max_mbps": max(busbws) if busbws and finished else None,
            "time_s": summary.time_s if summary else None,
            "measured_over_predicted": summary.measured_over_predicted if summary else None,
            "trust": summary.trust if summary else None,
            "qdisc_drops": sum(f.qdisc_drops for f in fidelity),
            "tcp_retransmits": sum(f.tcp_retransmits for f in fidelity), "repetitions": len(reps),
            "rep_busbw": busbws if finished else [],
            "iteration_s": summary.iteration_s if summary else None,
            "scaling_efficiency": summary.scaling_efficiency if summary else None,
            "rep_efficiency": [r.iteration.scaling_efficiency for r in reps if r.iteration is not None]
            if finished else [],
            **_shares([r.iteration for r in reps if r.iteration is not None] if finished else [])}


def _shares(iterations: list[Iteration]) -> dict[str, dict[str, float]]:
    """The median of every kind's communication share over the repetitions, measured and by the model."""
    out: dict[str, dict[str, float]] = {"comm_share": {}, "model_comm_share": {}}
    for name in out:
        kinds = sorted({k for it in iterations for k in getattr(it, name)})
        out[name] = {k: statistics.median(getattr(it, name)[k] for it in iterations if k in getattr(it, name))
                     for k in kinds}
    return out


def _predicted(entry: Mapping[str, Any], res: CellResults | None, finished: bool) -> dict[str, Any]:
    """The row's model fields: the results' prediction, else the plan's."""
    pred = res.prediction if res else {}
    summary = res.summary() if res and finished else None
    return {"predicted_time_s": pred.get("predicted_time_s", entry.get("predicted_time_s")),
            "predicted_busbw_mbps": pred.get("busbw_mbps", entry.get("predicted_busbw_mbps")),
            "alpha_beta_time_s": pred.get("alpha_beta_time_s", entry.get("alpha_beta_time_s")),
            "max_flows_per_link": max(pred.get("max_flows_per_link") or [entry.get("max_flows_per_link", 0)]),
            "goodput": pred.get("goodput"),
            "compute_only_s": summary.compute_only_s if summary else pred.get("compute_only_s"),
            "predicted_scaling_efficiency": pred.get("scaling_efficiency",
                                                     entry.get("predicted_scaling_efficiency"))}


def _planned(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The row's fields from the plan alone: the cell's identity, servers and workload."""
    params = topology.parse_spec(entry["topology"])[1]
    workload = entry.get("workload")
    return {**{k: entry[k] for k in ("id", "series", "topology", "kind", "hosts", "routing", "seed", "algorithm",
                                     "placement", "size")},
            "topology_slug": entry["id"].split(".")[1], "servers": params.get("servers"),
            "accels_per_server": params.get("accels_per_server"), "nics_per_server": params.get("nics_per_server"),
            "server_design": _server_design(params), "collective": entry.get("collective", ALLREDUCE),
            "workload": _workload_slug(workload),
            "workload_model": _workload_slug({**workload, "scale": 1.0}) if workload else "",
            "workload_scale": float((workload or {}).get("scale") or 1.0), "fabric": read_fabric(entry.get("fabric")),
            "llm": _llm(workload)}


def _llm(workload: Mapping[str, Any] | None) -> xp.Workload | None:
    """A plan entry's language-model workload (None for any other cell)."""
    w = xp.Workload(**workload) if workload else None
    return w if w is not None and w.is_llm else None


def _workload_slug(workload: Mapping[str, Any] | None) -> str:
    """A plan entry's training workload as cell ids name it (``resnet50-s16``); "" for none."""
    return xp.Workload(**workload).slug if workload else ""


def _server_design(params: Mapping[str, Any]) -> str | None:
    if "servers" not in params:
        return None
    a, n = params["accels_per_server"], params["nics_per_server"]
    return "shared NIC" if n == 1 else "NIC per accelerator" if n == a else f"{n} NICs for {a}"


class ReplayKind:
    """A cell that replays a schedule (every cell without an MPI program)."""

    name = "replay"
    predicted = True

    def claims(self, cell: xp.Cell) -> bool:
        return cell.mpi is None

    def claims_entry(self, entry: Mapping[str, Any]) -> bool:
        return entry.get("mpi") is None

    def run(self, session: Session, pc: xp.PreparedCell, out: str, *, config: dict[str, Any],
            echo: Callable[[str], None]) -> None:
        """The cell's schedule on the session, with its prediction and its faults (parsed for its network)."""
        cell = pc.cell
        if pc.schedule is None or pc.report is None:
            raise ValueError(f"cell {cell.id}: a replay cell needs a schedule and a prediction")
        plan = faults.parse_faults(cell.faults, pc.topo, pc.schedule.p, pc.schedule.steps, cell.repeat)
        session.run(pc.schedule, out, repeat=cell.repeat, warmup=cell.warmup, timeout_s=cell.timeout_s,
                    report=pc.report, fault_plan=plan, config=config)

    def read(self, data: Mapping[str, Any]) -> CellResults | None:
        """None for another kind's results (a replay's document has no ``kind``; an MPI program's says
        ``mpirun``), a newer schema or not a results document: as :func:`emulator.runs.results.load` reads it."""
        if "kind" in data:
            return None
        try:
            return CellResults.from_json(data)
        except SchemaError:
            return None

    def save(self, path: str, res: CellResults, probe: ProbeVerdict | None) -> None:
        if probe is not None:
            res.probe = probe
        res.save(path)

    def failure(self, res: CellResults | None) -> str:
        status = res.status if res is not None else None
        return (res.error if res is not None else None) or f"status {status!r}"

    def flag(self, res: CellResults, name: str) -> None:
        res.flag_all(name)

    def line(self, res: CellResults) -> str:
        return cell_line(res)

    def row(self, entry: Mapping[str, Any], res: CellResults | None, state: CellState | None, plan: PlanDefaults,
            cell_dir: str) -> CellRow:
        finished = res is not None and res.finished and res.cell_id() == entry["id"]
        status = _status(finished, res, state)
        pred = res.prediction if res else {}
        link_mbps = (res.link_mbps if res else None) or plan.link_mbps
        return CellRow(
            **_planned(entry), **_measured(res, finished), **_predicted(entry, res, finished), status=status,
            flags=res.flags() if res else [], wall_s=state.wall_s if state else None,
            error=None if finished else ((state.error if state else None) or (res.error if res else None)),
            link_mbps=link_mbps, capacity_mbps=link_mbps * (pred.get("goodput") or LEGACY_GOODPUT),
            datapath=res.datapath if res else None, outcome=res.outcome if res else status,
            faults=res.faults if res else [], dir=cell_dir)
