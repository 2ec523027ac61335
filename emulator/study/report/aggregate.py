"""The report's numbers: typed cell rows read from a results folder, and everything computed from them.

Pure apart from reading the folder: nothing here draws or writes prose. It owns

* :class:`Plan` (what the report needs of ``experiment.json``) and
  :class:`CellRow` (one planned replay cell: its plan, its state in
  ``state.json`` and its ``results.json`` as :func:`emulator.runs.results.load`
  reads it), from :func:`load_rows`; :class:`MpiRow` (one planned MPI cell,
  its ``results.json`` an :class:`emulator.runs.mpi_plan.MpiResults`), from
  :func:`load_mpi_rows`, never a :class:`CellRow`, so no busbw comparison,
  training family or answer below sees it; and ``cells.csv``
  (:func:`write_csv`, columns :data:`CSV_FIELDS`, both kinds of rows);
* which rows busbw describes (:func:`busbw_rows`: one collective at a size)
  and which are training iterations (:func:`training_rows`); every busbw
  comparison below takes the former only;
* the speedup of the reference over every baseline family of a series, host
  count and collective (:func:`speedup_tables`), ECMP seeds folded by their
  median; one NIC per accelerator against a shared NIC
  (:func:`server_speedup_tables`); each with its 95% hierarchical bootstrap
  interval (:func:`speedup_interval`, :mod:`emulator.base.stats`); cells at
  different link rates compare efficiencies (busbw / link goodput), never busbw;
* scaling efficiency per family and host count (:func:`scaling_families`);
* the training iterations' scaling efficiency (compute-only / iteration
  time) per family and host count (:func:`training_families`), with its
  interval between two families (:func:`efficiency_interval`);
* the heat map's cells (:func:`pick_heatmap_cells`), their link x step
  matrices (:func:`link_step_matrix`) and first measured repetition's
  transfers and compute operations (:func:`first_measured_transfers`,
  :func:`read_transfers`, :func:`read_computes`).

Labels: a family is ``<topology slug> <routing> <algorithm>``
(:meth:`CellRow.family`); a collective other than allreduce prefixes the
algorithm (``leafspine-4x4x4 ecmp allgather-ring``), so allreduce labels read
as they always did.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from emulator.base import stats
from emulator.base.errors import UserError
from emulator.base.files import read_json, read_jsonl, write_atomic
from emulator.model import fabric, routing, topology
from emulator.model.schedule import cost
from emulator.model.schedule import format as sformat
from emulator.runs import results
from emulator.runs.mpi_plan import MpiResults
from emulator.runs.results import FaultRecord
from emulator.study.experiment import Workload
from emulator.study.run_folder import CellState, RunFolder

CSV_FIELDS = ("id", "series", "topology", "kind", "hosts", "routing", "seed", "collective", "algorithm", "placement",
              "size", "workload", "status", "outcome", "busbw_mbps", "busbw_min_mbps", "busbw_max_mbps", "time_s",
              "predicted_time_s", "predicted_busbw_mbps", "alpha_beta_time_s", "measured_over_predicted",
              "iteration_s", "compute_only_s", "scaling_efficiency", "predicted_scaling_efficiency",
              "max_flows_per_link", "trusted", "flags", "qdisc_drops", "tcp_retransmits", "repetitions", "wall_s",
              "error", "program", "ranks", "exit_status")
LEGACY_GOODPUT = 1448 / 1514  # TCP payload per wire byte at MTU 1500, for results whose prediction has no goodput
RESAMPLES = stats.DEFAULT_RESAMPLES  # bootstrap resamples behind every speedup's interval
DEFAULT_REFERENCE = {"algorithm": "hdrm", "routing": "bigraph"}


# ------------------------------------------------------------------ rows
@dataclass(frozen=True)
class Reference:
    """The experiment's reference: the algorithm and routing every other cell is compared against."""

    algorithm: str
    routing: str

    def matches(self, row: CellRow) -> bool:
        return row.algorithm == self.algorithm and row.routing == self.routing


@dataclass(frozen=True)
class Plan:
    """What the report reads of ``experiment.json``'s ``experiment``."""

    name: str
    description: str
    reference: Reference
    link_mbps: float
    fabric: str | None  # the fabric profile's spec; None for runs older than fabric profiles
    warmup: int
    repeat: int
    ecmp_seeds: tuple[int, ...]

    @classmethod
    def from_json(cls, exp: Mapping[str, Any]) -> Plan:
        ref = exp.get("reference") or DEFAULT_REFERENCE
        return cls(name=str(exp["name"]), description=str(exp.get("description") or ""),
                   reference=Reference(algorithm=ref["algorithm"], routing=ref["routing"]),
                   link_mbps=float(exp["link_mbps"]), fabric=exp.get("fabric") or None, warmup=int(exp["warmup"]),
                   repeat=int(exp["repeat"]), ecmp_seeds=tuple(int(s) for s in exp["ecmp_seeds"]))


@dataclass(frozen=True)
class CellRow:
    """One planned cell as the report sees it (``cells.csv`` holds the fields of :data:`CSV_FIELDS`).

    Measured fields (busbw, times, ``trusted``, ``rep_busbw``) are None or
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
    trusted: bool | None
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
    collective: str = "allreduce"
    workload: str = ""  # a training iteration's model (e.g. "resnet50-s16"); "" for one collective per size
    iteration_s: float | None = None
    compute_only_s: float | None = None
    scaling_efficiency: float | None = None  # compute-only / iteration time, median over repetitions
    predicted_scaling_efficiency: float | None = None
    workload_scale: float = 1.0  # a training iteration's scale (gradients and compute divided by it)
    workload_model: str = ""  # the workload's slug without its scale (``resnet50-b32``): its training family
    fabric: str = ""  # the cell's fabric profile spec ("" in plans older than fabric profiles)
    rep_efficiency: list[float] = field(default_factory=list)  # scaling efficiency of every measured repetition

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
        return {name: " ".join(self.flags) if name == "flags" else
                "" if name in ("program", "exit_status") else getattr(self, name) for name in CSV_FIELDS}

    @property
    def algorithm_label(self) -> str:
        """``hd``, or ``hd-packed`` for a placement other than the algorithm's own."""
        return self.algorithm if self.placement in ("identity", "hdrm") else f"{self.algorithm}-{self.placement}"

    @property
    def op_label(self) -> str:
        """The algorithm label, prefixed by the collective unless it is allreduce: ``hd``, ``allgather-ring``."""
        label = self.algorithm_label
        return label if self.collective == "allreduce" else f"{self.collective}-{label}"

    def family(self, with_seed: bool = False) -> str:
        """``leafspine-4x4x4 ecmp hd`` (the label of a line or a table row); ``ecmp-s1`` with its seed.

        A collective other than allreduce is named: ``leafspine-4x4x4 ecmp allgather-ring``.
        """
        policy = f"{self.routing}-s{self.seed}" if with_seed and self.routing == "ecmp" else self.routing
        return f"{self.topology_slug} {policy} {self.op_label}"


@dataclass(frozen=True)
class MpiRow:
    """One planned MPI cell as the report sees it: the program's run, never a busbw or model comparison.

    ``busbw_mbps`` is the bundled benchmark's at its largest size (``busbw_size``), None when the program is
    another one or wrote no rows; ``efficiency`` that busbw over the link's TCP goodput (as
    :attr:`CellRow.capacity_mbps`). Measured fields are None unless the cell's results exist; ``status`` as
    for :class:`CellRow` (``ok``: the program exited 0).
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
    trusted: bool | None
    flags: list[str]
    qdisc_drops: int
    tcp_retransmits: int
    cpu_idle: float | None
    error: str | None
    learned_connections: int | None
    datapath: str | None
    dir: str

    @property
    def efficiency(self) -> float | None:
        return ratio(self.busbw_mbps, self.capacity_mbps)

    def csv(self) -> dict[str, Any]:
        """The row of ``cells.csv``: the columns that apply (``size`` and ``busbw_mbps`` are the benchmark's
        largest size and its busbw; ``time_s`` is mpirun's wall time; ``outcome`` the results' status, e.g.
        ``timeout``), the model's and the replays' empty."""
        own = {"id": self.id, "series": self.series, "topology": self.topology, "kind": self.kind,
               "hosts": self.hosts, "routing": self.routing, "seed": self.seed, "algorithm": self.algorithm,
               "placement": self.placement, "size": self.busbw_size if self.busbw_size is not None else "",
               "status": self.status, "outcome": self.run_status or self.status, "busbw_mbps": self.busbw_mbps,
               "time_s": self.time_s, "trusted": self.trusted, "flags": " ".join(self.flags),
               "qdisc_drops": self.qdisc_drops, "tcp_retransmits": self.tcp_retransmits, "wall_s": self.wall_s,
               "error": self.error, "program": self.program, "ranks": self.ranks, "exit_status": self.exit_status}
        return {name: own.get(name, "") for name in CSV_FIELDS}


def _plan_cells(out: str) -> tuple[Plan, list[Mapping[str, Any]]]:
    plan = read_json(os.path.join(out, "experiment.json"))
    if not isinstance(plan, dict):
        raise FileNotFoundError(f"{out}: no experiment.json (not a results folder of `emu run`)")
    return Plan.from_json(plan["experiment"]), plan["cells"]


def _is_mpi(cell: Mapping[str, Any]) -> bool:
    """A plan entry of an MPI cell (its ``mpi`` key: :meth:`emulator.study.experiment.Cell.to_json`)."""
    return cell.get("mpi") is not None


def load_rows(out: str) -> tuple[Plan, list[CellRow]]:
    """The experiment and one row per replay cell (planned cells that never ran have status ``not run``);
    MPI cells are :func:`load_mpi_rows`'.

    Raises FileNotFoundError when ``out`` has no ``experiment.json``.
    """
    header, cells = _plan_cells(out)
    folder = RunFolder(out)
    states = folder.read_states()
    return header, [_row(folder, cell, states.get(cell["id"]), header) for cell in cells if not _is_mpi(cell)]


def load_mpi_rows(out: str) -> list[MpiRow]:
    """One row per MPI cell of the plan, in its order (none for an experiment without them)."""
    header, cells = _plan_cells(out)
    folder = RunFolder(out)
    states = folder.read_states()
    return [_mpi_row(folder, cell, states.get(cell["id"]), header) for cell in cells if _is_mpi(cell)]


def _goodput(spec: str | None) -> float:
    """TCP payload per wire byte at the MTU of a fabric spec (the default fabric's without one)."""
    try:
        profile = fabric.parse(spec) if spec else fabric.default()
    except UserError:
        profile = fabric.default()
    return topology.tcp_goodput_factor(profile.emulated_mtu)


def _mpi_row(folder: RunFolder, cell: Mapping[str, Any], st: CellState | None, plan: Plan) -> MpiRow:
    """One MPI cell's row from its plan entry, its state and its results (any of the last two may be missing)."""
    res: MpiResults | None = folder.mpi_results_of(cell["id"])
    own = res is not None and (res.config.get("cell") or {}).get("id") == cell["id"]
    if not own:
        res = None
    finished = res is not None and res.status == "ok"
    status = "ok" if finished else ((st.status if st else None) or (res.status if res else None) or "not run")
    if status == "running":
        status = "interrupted"
    program = cell["mpi"].get("program") or []
    rows = [r for r in (res.bench if res else []) if isinstance(r, Mapping) and isinstance(r.get("size"), int)]
    top = max(rows, key=lambda r: r["size"]) if rows else None
    busbw = top.get("busbw_mbps") if top else None
    link_mbps = (res.link_mbps if res else None) or plan.link_mbps
    fid = res.fidelity if res else None
    np = cell["mpi"].get("np")
    return MpiRow(
        id=cell["id"], series=cell["series"], topology=cell["topology"], topology_slug=cell["id"].split(".")[1],
        kind=cell["kind"], hosts=cell["hosts"], routing=cell["routing"], seed=cell["seed"],
        placement=cell["placement"], algorithm=cell["algorithm"],
        program=shlex.join(str(w) for w in program),
        ranks=len(res.ranks) if res and res.ranks else (np if isinstance(np, int) else cell["hosts"]),
        status=status, exit_status=res.exit_status if res else None, run_status=res.status if res else None,
        time_s=res.wall_s if res else None,
        wall_s=st.wall_s if st else None, bench=rows,
        busbw_mbps=float(busbw) if isinstance(busbw, int | float) else None,
        busbw_size=top["size"] if top else None, link_mbps=link_mbps,
        capacity_mbps=link_mbps * _goodput(cell.get("fabric") or plan.fabric),
        trusted=res.trusted if res and fid else None, flags=sorted(fid.flags) if fid else [],
        qdisc_drops=fid.qdisc_drops if fid else 0, tcp_retransmits=fid.tcp_retransmits if fid else 0,
        cpu_idle=fid.cpu_idle if fid else None,
        error=None if finished else ((st.error if st else None) or (res.error if res else None)),
        learned_connections=res.learned_connections if res else None, datapath=(res.datapath or None) if res else None,
        dir=folder.cell_dir(cell["id"]))


def _row(folder: RunFolder, cell: Mapping[str, Any], st: CellState | None, plan: Plan) -> CellRow:
    """One cell's row from its plan entry, its state and its results (any of the last two may be missing)."""
    cdir = folder.cell_dir(cell["id"])
    res = folder.results_of(cell["id"])
    finished = res is not None and res.finished and res.cell_id() == cell["id"]
    status = "ok" if finished else ((st.status if st else None) or (res.status if res else None) or "not run")
    if status == "running":
        status = "interrupted"
    reps = res.repetitions if res else []
    summary = res.summary() if res and finished else None
    pred = res.prediction if res else {}
    busbws = [r.busbw_mbps for r in reps]
    params = topology.parse_spec(cell["topology"])[1]
    link_mbps = (res.link_mbps if res else None) or plan.link_mbps
    fidelity = [r.fidelity for r in reps if r.fidelity is not None]
    return CellRow(
        **{k: cell[k] for k in ("id", "series", "topology", "kind", "hosts", "routing", "seed", "algorithm",
                                "placement", "size")},
        topology_slug=cell["id"].split(".")[1], status=status,
        busbw_mbps=summary.busbw_mbps if summary else None,
        busbw_min_mbps=min(busbws) if busbws and finished else None,
        busbw_max_mbps=max(busbws) if busbws and finished else None,
        time_s=summary.time_s if summary else None,
        predicted_time_s=pred.get("predicted_time_s", cell.get("predicted_time_s")),
        predicted_busbw_mbps=pred.get("busbw_mbps", cell.get("predicted_busbw_mbps")),
        alpha_beta_time_s=pred.get("alpha_beta_time_s", cell.get("alpha_beta_time_s")),
        measured_over_predicted=summary.measured_over_predicted if summary else None,
        max_flows_per_link=max(pred.get("max_flows_per_link") or [cell.get("max_flows_per_link", 0)]),
        trusted=summary.trusted if summary else None,
        flags=res.flags() if res else [],
        qdisc_drops=sum(f.qdisc_drops for f in fidelity), tcp_retransmits=sum(f.tcp_retransmits for f in fidelity),
        repetitions=len(reps), wall_s=st.wall_s if st else None,
        error=None if finished else ((st.error if st else None) or (res.error if res else None)),
        goodput=pred.get("goodput"), link_mbps=link_mbps,
        capacity_mbps=link_mbps * (pred.get("goodput") or LEGACY_GOODPUT),
        rep_busbw=busbws if finished else [],
        datapath=res.datapath if res else None, outcome=res.outcome if res else status,
        servers=params.get("servers"), accels_per_server=params.get("accels_per_server"),
        nics_per_server=params.get("nics_per_server"), server_design=_server_design(params),
        faults=res.faults if res else [], dir=cdir, collective=cell.get("collective", "allreduce"),
        workload=_workload_slug(cell.get("workload")),
        workload_model=_workload_slug({**cell["workload"], "scale": 1.0}) if cell.get("workload") else "",
        iteration_s=summary.iteration_s if summary else None,
        compute_only_s=summary.compute_only_s if summary else pred.get("compute_only_s"),
        scaling_efficiency=summary.scaling_efficiency if summary else None,
        predicted_scaling_efficiency=pred.get("scaling_efficiency", cell.get("predicted_scaling_efficiency")),
        workload_scale=float((cell.get("workload") or {}).get("scale") or 1.0), fabric=str(cell.get("fabric") or ""),
        rep_efficiency=[r.iteration.scaling_efficiency for r in reps if r.iteration is not None] if finished else [])


def _workload_slug(workload: Mapping[str, Any] | None) -> str:
    """A plan entry's training workload as cell ids name it (``resnet50-s16``); "" for none."""
    return Workload(**workload).slug if workload else ""


def _server_design(params: Mapping[str, Any]) -> str | None:
    if "servers" not in params:
        return None
    a, n = params["accels_per_server"], params["nics_per_server"]
    return "shared NIC" if n == 1 else "NIC per accelerator" if n == a else f"{n} NICs for {a}"


def write_csv(path: str, rows: list[CellRow], mpi_rows: Iterable[MpiRow] = ()) -> None:
    """``cells.csv``: one line per row, the columns of :data:`CSV_FIELDS`, flags separated by spaces; the
    replay cells' rows first, then the MPI cells' (:meth:`MpiRow.csv`: the columns that apply)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow(row.csv())
    for mrow in mpi_rows:
        w.writerow(mrow.csv())
    write_atomic(path, buf.getvalue())


# ---------------------------------------------------------------- numbers
def busbw_rows(rows: Iterable[CellRow]) -> list[CellRow]:
    """The rows that busbw describes: one collective at a size (training iterations are left out).

    Every busbw comparison (speedups, server designs, busbw against size, the heat map, scaling, the model's
    error at paper scale, the answers to Q1, Q2 and scaling) takes these rows only.
    """
    return [r for r in rows if not r.is_training]


def training_rows(rows: Iterable[CellRow]) -> list[CellRow]:
    """The rows of training iterations (a workload instead of a size)."""
    return [r for r in rows if r.is_training]


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None when there is none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def by_efficiency(rows: Iterable[CellRow]) -> bool:
    """Whether a comparison of these rows must divide efficiencies: their cells ran at different link rates."""
    return len({r.link_mbps for r in rows}) > 1


def speedup_interval(num: list[CellRow], den: list[CellRow], efficiency: bool = False) -> stats.Interval | None:
    """The bootstrap interval of median(num) / median(den) over the repetitions of the cells, a group per cell.

    Per-repetition busbw, or busbw / link goodput when ``efficiency``. None when a side has no measured
    repetition.
    """
    def groups(rows: list[CellRow]) -> list[list[float]]:
        return [[v / (r.capacity_mbps if efficiency else 1.0) for v in r.rep_busbw] for r in rows if r.rep_busbw]

    n, d = groups(num), groups(den)
    if not n or not d:
        return None
    return stats.ratio_interval(n, d, resamples=RESAMPLES)


@dataclass(frozen=True)
class Speedup:
    """A measured and a model speedup, with the measured one's 95% bootstrap interval.

    ``significant``: the interval excludes 1 (None without an interval). ``by_efficiency``: the cells ran at
    different link rates, so the ratio is of busbw / link goodput.
    """

    speedup: float | None
    model_speedup: float | None
    interval: tuple[float, float] | None
    significant: bool | None
    by_efficiency: bool


def _interval_of(iv: stats.Interval | None) -> tuple[tuple[float, float] | None, bool | None]:
    return ((iv.low, iv.high), stats.significant(iv)) if iv else (None, None)


@dataclass(frozen=True)
class BaselineEntry(Speedup):
    """The reference against one baseline family at one size (ECMP: one cell per seed).

    ``speedup`` is the reference's busbw over the median of the family's, ``range`` the lowest and highest
    over seeds (None for one seed); ``busbw`` and ``model_busbw`` the family's medians.
    """

    busbw: float | None
    model_busbw: float | None
    seeds: int
    cells: list[CellRow]
    range: tuple[float, float] | None


@dataclass(frozen=True)
class SpeedupTable:
    """One (series, hosts) that has reference cells: per size, the reference and every baseline family."""

    series: str
    hosts: int
    sizes: list[int]
    reference: dict[int, CellRow]  # size -> the reference's cell
    baselines: dict[str, dict[int, BaselineEntry]]  # family -> size -> entry
    collective: str = "allreduce"


def _baseline_entry(rr: CellRow | None, cells: list[CellRow]) -> BaselineEntry:
    """The reference ``rr`` against one baseline family's cells (one per ECMP seed) at one size."""
    eff = by_efficiency([rr, *cells]) if rr else False

    def values(rows: list[CellRow], value: Callable[[CellRow], float | None]) -> list[float]:
        """busbw, or busbw / link goodput when the link rates differ, of the rows that have one."""
        return [v / (r.capacity_mbps if eff else 1.0) for r in rows if (v := value(r))]

    speedup = spread = model_speedup = None
    iv = None
    if rr is not None:
        ok, ref_v = values(cells, lambda r: r.busbw_mbps), values([rr], lambda r: r.busbw_mbps)
        if ref_v and ok:
            speedup = ref_v[0] / statistics.median(ok)
            if len(ok) > 1:
                spread = (ref_v[0] / max(ok), ref_v[0] / min(ok))
        model = values(cells, lambda r: r.predicted_busbw_mbps)
        ref_m = values([rr], lambda r: r.predicted_busbw_mbps)
        if ref_m and model:
            model_speedup = ref_m[0] / statistics.median(model)
        iv = speedup_interval([rr], cells, eff)
    interval, significant = _interval_of(iv)
    return BaselineEntry(speedup=speedup, model_speedup=model_speedup, interval=interval, significant=significant,
                         by_efficiency=eff, busbw=median(c.busbw_mbps for c in cells),
                         model_busbw=median(c.predicted_busbw_mbps for c in cells), seeds=len(cells), cells=cells,
                         range=spread)


def speedup_tables(rows: list[CellRow], ref: Reference) -> list[SpeedupTable]:
    """Per (series, hosts, collective) that has reference cells: the reference's busbw over every other
    family's, per size (training rows are left out: :func:`busbw_rows`).

    Families are :meth:`CellRow.family` labels; ECMP seeds fold into one family (see :class:`BaselineEntry`).
    Sorted by series and hosts, allreduce before the other collectives.
    """
    rows = busbw_rows(rows)
    out = []
    keys = sorted({(r.series, r.hosts, r.collective != "allreduce", r.collective) for r in rows if ref.matches(r)})
    for series, hosts, _, collective in keys:
        group = [r for r in rows if r.series == series and r.hosts == hosts and r.collective == collective]
        refs = {r.size: r for r in group if ref.matches(r)}
        fams: dict[str, dict[int, list[CellRow]]] = {}
        for r in group:
            if not ref.matches(r):
                fams.setdefault(r.family(), {}).setdefault(r.size, []).append(r)
        base = {fam: {size: _baseline_entry(refs.get(size), cells) for size, cells in by_size.items()}
                for fam, by_size in fams.items()}
        out.append(SpeedupTable(series=series, hosts=hosts, sizes=sorted({r.size for r in group}), reference=refs,
                                baselines=base, collective=collective))
    return out


@dataclass(frozen=True)
class ServerComparison(Speedup):
    """One NIC per accelerator (``own``) against a shared NIC (``shared``): speedup = own busbw / shared busbw."""

    family: str  # ``bigraph-2x2x2 2x4 bigraph hier``: fabric, servers x accelerators, routing, algorithm
    size: int
    own: CellRow
    shared: CellRow


def _server_comparison(o: CellRow, sh: CellRow, family: str) -> ServerComparison:
    eff = by_efficiency([o, sh])

    def per(r: CellRow, value: float | None) -> float | None:
        return value / r.capacity_mbps if value and eff else value

    interval, significant = _interval_of(speedup_interval([o], [sh], eff))
    return ServerComparison(
        speedup=ratio(per(o, o.busbw_mbps), per(sh, sh.busbw_mbps)),
        model_speedup=ratio(per(o, o.predicted_busbw_mbps), per(sh, sh.predicted_busbw_mbps)),
        interval=interval, significant=significant, by_efficiency=eff, family=family, size=o.size, own=o, shared=sh)


#: fabric (the topology slug without its servers), servers, accelerators per server, routing, seed, algorithm,
#: placement, size, collective
ServerKey = tuple[str, int | None, int | None, str, int, str, str, int, str]


def server_speedup_tables(rows: list[CellRow]) -> list[ServerComparison]:
    """One NIC per accelerator against a shared NIC, for every (fabric, servers, routing, algorithm, size,
    collective); training rows are left out (:func:`busbw_rows`).

    Cells match when everything but ``nics_per_server`` and the NIC placement is the same; sorted by that key.
    """
    def key(r: CellRow) -> ServerKey:
        return (r.topology_slug.split("-srv")[0], r.servers, r.accels_per_server, r.routing, r.seed, r.algorithm,
                r.placement, r.size, r.collective)

    own: dict[ServerKey, CellRow] = {}
    shared: dict[ServerKey, CellRow] = {}
    for r in busbw_rows(rows):
        if r.servers is None or r.nics_per_server is None:
            continue
        if r.nics_per_server == r.accels_per_server and r.nics_per_server > 1:
            own[key(r)] = r
        elif r.nics_per_server == 1:
            shared[key(r)] = r
    out = []
    for k in sorted(set(own) & set(shared)):
        fabric, servers, accels, policy, seed, algo, _, _, collective = k
        routing_label = f"{policy}-s{seed}" if policy == "ecmp" else policy
        if collective != "allreduce":
            algo = f"{collective}-{algo}"
        out.append(_server_comparison(own[k], shared[k], f"{fabric} {servers}x{accels} {routing_label} {algo}"))
    return out


class ScalingKey(NamedTuple):
    """A family measured at several host counts: kind, routing, algorithm (with placement and, unless
    allreduce, the collective: :attr:`CellRow.op_label`) and size."""

    kind: str
    routing: str
    algorithm: str
    size: int


@dataclass(frozen=True)
class ScalingPoint:
    """A family at one host count: median efficiency (busbw / link goodput), the model's, and median busbw."""

    efficiency: float | None
    model_efficiency: float | None
    busbw: float | None


def scaling_families(rows: list[CellRow]) -> dict[ScalingKey, dict[int, ScalingPoint]]:
    """Per family measured at two or more host counts: hosts -> its point (ECMP seeds folded by median).

    Training rows are left out (:func:`busbw_rows`; :func:`training_families` has theirs).
    """
    acc: dict[ScalingKey, dict[int, list[CellRow]]] = {}
    for r in busbw_rows(rows):
        acc.setdefault(ScalingKey(r.kind, r.routing, r.op_label, r.size), {}).setdefault(r.hosts, []).append(r)
    out = {}
    for key, by_hosts in acc.items():
        if len(by_hosts) < 2:
            continue
        out[key] = {hosts: ScalingPoint(efficiency=median(c.busbw_mbps / c.capacity_mbps for c in cells
                                                          if c.busbw_mbps),
                                        model_efficiency=median(c.predicted_busbw_mbps / c.capacity_mbps
                                                                for c in cells if c.predicted_busbw_mbps),
                                        busbw=median(c.busbw_mbps for c in cells))
                    for hosts, cells in sorted(by_hosts.items())}
    return out


class TrainingKey(NamedTuple):
    """A family of training cells: kind, routing, algorithm (with placement) and workload without its scale
    (``resnet50-b32``: an experiment may shrink the iteration by a different scale at each host count, an
    emulation setting like the link rate, so the family's line goes on through them)."""

    kind: str
    routing: str
    algorithm: str
    workload: str

    @property
    def label(self) -> str:
        """``bigraph bigraph hdrm resnet50-b32``."""
        return f"{self.kind} {self.routing} {self.algorithm} {self.workload}"


@dataclass(frozen=True)
class TrainingPoint:
    """A training family at one host count (ECMP seeds folded by their median), emulated seconds.

    ``efficiency`` is the median over cells of each cell's median scaling efficiency (compute-only / iteration
    time) over its measured repetitions; ``efficiency_range`` the lowest and highest repetition's over every
    cell; the model's are the timing model's (``schedule check``) on the same routes.
    """

    efficiency: float | None
    efficiency_range: tuple[float, float] | None
    model_efficiency: float | None
    iteration_s: float | None
    model_iteration_s: float | None
    compute_only_s: float | None
    cells: list[CellRow]

    @property
    def scales(self) -> list[float]:
        """The workload scales of the cells (one, unless cells of the same host count ran at several)."""
        return sorted({c.workload_scale for c in self.cells})

    @property
    def measured_over_model(self) -> float | None:
        """Measured over the model's iteration time."""
        return ratio(self.iteration_s, self.model_iteration_s)


def training_key(row: CellRow) -> TrainingKey:
    return TrainingKey(row.kind, row.routing, row.algorithm_label, row.workload_model)


def training_families(rows: list[CellRow]) -> dict[TrainingKey, dict[int, TrainingPoint]]:
    """Every family of training cells (:func:`training_rows`), also one measured at a single host count:
    hosts -> its :class:`TrainingPoint`, host counts in increasing order."""
    acc: dict[TrainingKey, dict[int, list[CellRow]]] = {}
    for r in training_rows(rows):
        acc.setdefault(training_key(r), {}).setdefault(r.hosts, []).append(r)
    out = {}
    for key, by_hosts in sorted(acc.items()):
        points = {}
        for hosts, cells in sorted(by_hosts.items()):
            reps = [e for c in cells for e in c.rep_efficiency]
            points[hosts] = TrainingPoint(
                efficiency=median(c.scaling_efficiency for c in cells),
                efficiency_range=(min(reps), max(reps)) if reps else None,
                model_efficiency=median(c.predicted_scaling_efficiency for c in cells),
                iteration_s=median(c.iteration_s for c in cells),
                model_iteration_s=median(c.predicted_time_s for c in cells),
                compute_only_s=median(c.compute_only_s for c in cells), cells=cells)
        out[key] = points
    return out


def efficiency_interval(num: list[CellRow], den: list[CellRow]) -> stats.Interval | None:
    """The bootstrap interval of median(num) / median(den) scaling efficiency, a group per cell (as
    :func:`speedup_interval`); None when a side has no measured repetition."""
    n = [r.rep_efficiency for r in num if r.rep_efficiency]
    d = [r.rep_efficiency for r in den if r.rep_efficiency]
    if not n or not d:
        return None
    return stats.ratio_interval(n, d, resamples=RESAMPLES)


# ------------------------------------------------------------- heat map
def pick_heatmap_cells(rows: list[CellRow], ref: Reference) -> tuple[CellRow | None, CellRow | None]:
    """One congested cell and one clean reference cell, at the largest size.

    Congested: an ECMP hd cell if one shares a link (the paper's case), else the cell with the most flows on a
    link; ties go to the lowest busbw. Clean: a reference cell with at most one flow per link. Allreduce cells
    come first, the clean cell is of the congested one's collective if it can be, and training rows are never
    picked (:func:`busbw_rows`).
    """
    ok = [r for r in busbw_rows(rows) if r.status == "ok" and not topology.is_ideal(r.kind)]
    if not ok:
        return None, None
    largest = max(r.size for r in ok)
    pool = [r for r in ok if r.size == largest] or ok
    # the paper's case first: halving-doubling hashed by ECMP; then whatever shares links most
    # at the host count most cells have (the main comparison), not a scaling point
    hosts = statistics.mode(r.hosts for r in pool)
    congested = max(pool, key=lambda r: (r.collective == "allreduce",
                                         r.routing == "ecmp" and r.algorithm == "hd" and r.max_flows_per_link > 1,
                                         r.hosts == hosts, r.max_flows_per_link, -(r.busbw_mbps or 0)))
    clean_pool = [r for r in pool if ref.matches(r) and r.max_flows_per_link <= 1] or \
                 [r for r in pool if r.max_flows_per_link <= 1]
    clean = max(clean_pool, key=lambda r: (r.collective == congested.collective, r.hosts == congested.hosts,
                                           r.busbw_mbps or 0)) if clean_pool else None
    if congested.max_flows_per_link <= 1:
        return None, clean
    return congested, clean


@dataclass(frozen=True)
class Transfer:
    """One transfer of ``timeline.jsonl`` (:func:`emulator.runs.metrics.timeline_records`): monotonic seconds."""

    rep: int
    step: int
    src: int  # sending rank
    src_host: str
    dst_host: str
    bytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Compute:
    """One compute operation of ``timeline.jsonl`` (:func:`emulator.runs.metrics.compute_records`): monotonic seconds.

    ``seconds`` is the op's own (real accelerator) time in the schedule; ``end - start`` the dilated time it ran.
    """

    rep: int
    step: int
    rank: int
    host: str
    op: int
    seconds: float
    start: float
    end: float


def _timeline_records(cell_dir: str, rep: int) -> list[dict[str, Any]]:
    return [t for t in read_jsonl(os.path.join(cell_dir, "timeline.jsonl")) if t.get("rep") == rep]


def _transfer(t: Mapping[str, Any]) -> Transfer:
    return Transfer(rep=t["rep"], step=t["step"], src=t["src"], src_host=t["src_host"], dst_host=t["dst_host"],
                    bytes=t["bytes"], start=t["start"], end=t["end"])


def _compute(t: Mapping[str, Any]) -> Compute:
    return Compute(rep=t["rep"], step=t["step"], rank=t["rank"], host=t["host"], op=t["op"],
                   seconds=float(t["seconds"]), start=t["start"], end=t["end"])


def read_transfers(cell_dir: str, rep: int) -> list[Transfer]:
    """The transfers of repetition ``rep`` in the cell's timeline (compute records are left out)."""
    return [_transfer(t) for t in _timeline_records(cell_dir, rep) if t.get("kind") != "compute"]


def read_computes(cell_dir: str, rep: int) -> list[Compute]:
    """The compute operations of repetition ``rep`` in the cell's timeline (``"kind": "compute"`` records)."""
    return [_compute(t) for t in _timeline_records(cell_dir, rep) if t.get("kind") == "compute"]


def _first_measured(res: results.CellResults | None) -> int:
    """The index of the first measured repetition: after the warm-up ones."""
    return int((res.config if res else {}).get("warmup", 0))


@dataclass(frozen=True)
class Timeline:
    """One cell's first measured repetition, transfer by transfer and compute op by op (the Gantt chart's data)."""

    row: CellRow
    rep: int
    transfers: list[Transfer]
    computes: list[Compute] = field(default_factory=list)

    @property
    def start(self) -> float:
        """The first send's or compute op's start (the timeline has at least one of them)."""
        return min([t.start for t in self.transfers] + [c.start for c in self.computes])

    @property
    def end(self) -> float:
        return max([t.end for t in self.transfers] + [c.end for c in self.computes])


def first_measured_transfers(rows: Iterable[CellRow]) -> list[Timeline]:
    """Each row's first measured repetition (transfers and compute ops), for the rows whose timeline has one."""
    out = []
    for row in rows:
        rep = _first_measured(results.load(os.path.join(row.dir, "results.json")))
        records = _timeline_records(row.dir, rep)
        transfers = [_transfer(t) for t in records if t.get("kind") != "compute"]
        computes = [_compute(t) for t in records if t.get("kind") == "compute"]
        if transfers or computes:
            out.append(Timeline(row=row, rep=rep, transfers=transfers, computes=computes))
    return out


@dataclass(frozen=True)
class LinkStepMatrix:
    """Per step x directed switch-to-switch link (``s1>s3``): flows the model routes, mean measured goodput.

    ``flows[i][j]`` and ``measured_mbps[i][j]`` are of step ``steps[i]`` and link ``links[j]``; measured is
    None where no transfer of repetition ``rep`` crossed the link in that step.
    """

    links: list[str]
    steps: list[int]
    flows: list[list[int]]
    measured_mbps: list[list[float | None]]
    rep: int


def link_step_matrix(cell_dir: str, rep: int | None = None) -> LinkStepMatrix:
    """The cell's :class:`LinkStepMatrix` for repetition ``rep`` (default: the first measured one).

    Reads the cell's schedule, topology, results (routing, seed) and timeline, and routes every transfer's
    host pair as the cell did (:func:`emulator.model.routing.route`).
    """
    res = results.load(os.path.join(cell_dir, "results.json"))
    cfg = res.config if res else {}
    topo = topology.load(os.path.join(cell_dir, "topology.json"))
    schedule = sformat.load(os.path.join(cell_dir, "schedule.json"))
    policy, seed = cfg.get("routing", "shortest"), int(cfg.get("seed", 0))
    costs = cost.analyze(schedule, topo, policy, seed=seed)
    links = sorted({lk for st in costs.steps for lk in st.flows_per_link
                    if topo.is_switch(lk[0]) and topo.is_switch(lk[1])},
                   key=lambda lk: (int(lk[0][1:]), int(lk[1][1:])))
    steps = [st.step for st in costs.steps]
    flows = [[st.flows_per_link.get(lk, 0) for lk in links] for st in costs.steps]
    if rep is None:
        rep = _first_measured(res)
    rates: dict[tuple[int, tuple[str, str]], list[float]] = {}
    paths: dict[tuple[str, str], list[str]] = {}
    for t in read_transfers(cell_dir, rep):
        if t.end <= t.start:
            continue
        pair = (t.src_host, t.dst_host)
        if pair not in paths:
            paths[pair] = routing.route(topo, policy, routing.agent_flow(topo, *pair), seed=seed)
        mbps = t.bytes * 8 / (t.end - t.start) / 1e6
        for lk in routing.switch_links_of(paths[pair]):
            rates.setdefault((t.step, lk), []).append(mbps)
    measured = [[statistics.mean(rates[(s, lk)]) if (s, lk) in rates else None for lk in links] for s in steps]
    return LinkStepMatrix(links=[f"{a}>{b}" for a, b in links], steps=steps, flows=flows, measured_mbps=measured,
                          rep=rep)

