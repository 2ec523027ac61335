"""Experiment files: a typed, frozen grid of replay runs and its cells.

This module is pure: it imports nothing that starts a process or touches a
network or a results folder, so ``emu run --check`` and the unit tests use it
without root. It owns

* the experiment file format (``experiments/*.yaml``, documented in
  ``experiments/README.md``): :func:`load` / :func:`from_dict` parse and
  validate it into a frozen :class:`Experiment`; unknown keys and bad values
  raise :class:`~emulator.base.errors.FieldError` naming the file and the field,
  e.g. ``experiments/default.yaml: field 'series[1].sizes[0]': ...``;
* grid expansion (:func:`expand`): every series' runs become :class:`Cell`
  objects, one per topology x routing x ECMP seed x algorithm x placement x
  size, each with a stable, readable id such as
  ``compare.leafspine-4x4x4.ecmp-s1.hd.512KiB`` (the id names the cell's
  directory, so a cell keeps its id across runs of the same file);
* MPI runs (``mpi:`` instead of ``algorithms``, :class:`MpiProgram`): an Open
  MPI program as the cell's workload, checked with :mod:`emulator.runs.mpi_plan`'s
  functions; one cell per topology x routing x ECMP seed x placement, e.g.
  ``mpi.bigraph-2x2x2.bigraph.mpi-emu-allreduce-bench-ring-hdrm.np8``;
* :func:`prepare`: each cell's schedule and the model's prediction (the same
  ``schedule check`` the replay runs), which is what ``emu run --check``
  validates without starting anything (an MPI cell has neither: the model
  predicts schedules only);
* :func:`groups`: cells ordered so a network comes up once per (topology,
  routing, seed, fabric).

The results folder and its resume bookkeeping are in :mod:`emulator.study.run_folder`,
the live loop in :mod:`emulator.study.runner`, the report in :mod:`emulator.study.report`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from emulator.base.errors import MISSING, FieldError, UserError, int_field, printable
from emulator.model import fabric, routing, topology
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.model.schedule import generators, training
from emulator.model.schedule.check import CheckReport, predict
from emulator.model.schedule.format import PARSE_ERRORS, Schedule, describe_parse_error, format_size, parse_size
from emulator.model.topology import Topology
from emulator.runs import admission
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs import fault_plan as faults
from emulator.runs import mpi_plan as mpi
from emulator.runs.mpi_plan import MpiRunConfig

DEFAULT_LINK_MBPS = 10.0
DEFAULT_REPEAT = 2
DEFAULT_WARMUP = 1
DEFAULT_SEEDS = (0,)
DEFAULT_SIZES = (1 << 20,)
DEFAULT_REFERENCE = {"algorithm": "hdrm", "routing": "bigraph"}

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
TOP_KEYS = ("name", "description", "fabric", "link_mbps", "repeat", "warmup", "ecmp_seeds", "sizes", "timeout_s",
             "reference", "series")
SERIES_KEYS = ("name", "description", "fabric", "link_mbps", "sizes", "runs")
RUN_KEYS = ("topology", "routing", "algorithms", "placements", "seeds", "sizes", "faults", "fabric", "link_mbps",
            "collective", "model", "batch", "scale", "mpi")
MPI_KEYS = ("program", "np", "mca", "nice", "timeout_s")
#: Keys of a run that an MPI run cannot have: its program is its workload (and has its own sizes).
MPI_EXCLUDES = ("algorithms", "collective", "model", "batch", "scale", "faults", "sizes")
#: What a cell costs beyond its repetitions until measured: its agents' start-up (seconds; :func:`estimate_s`).
CELL_OVERHEAD_S = 1.5
#: The wall seconds an MPI cell is expected to take (no model predicts it): Open MPI's start-up and a short
#: benchmark, about what experiments/mpi.yaml's cells took here (37 to 58 s).
MPI_ESTIMATE_S = 45.0
MAX_MPI_TIMEOUT_S = 7 * 86400.0
REFERENCE_KEYS = ("algorithm", "routing")
_RATE_KEYS = ("bw", "host_bw", "switch_bw")


@dataclass(frozen=True)
class Run:
    """One entry of a series' ``runs``: a topology with its routings, algorithms and placements."""

    topology: str  # normalised spec, link rate included
    routing: tuple[str, ...]
    algorithms: tuple[str, ...]
    placements: tuple[str, ...] = ("identity",)
    seeds: tuple[int, ...] | None = None
    sizes: tuple[int, ...] | None = None
    faults: tuple[str, ...] = ()  # canonical fault specs (emulator.runs.fault_plan), for every cell of the run
    fabric: fabric.FabricProfile | None = None  # the run's own fabric (dilation), else the series'
    collective: str = "allreduce"
    workload: Workload | None = None  # a training iteration instead of one collective per size
    mpi: MpiProgram | None = None  # an MPI program instead of algorithms (then ``algorithms`` is empty)


@dataclass(frozen=True)
class Workload:
    """A run's training iteration (:mod:`emulator.model.schedule.training`): the model, per-accelerator batch, scale."""

    model: str
    batch: int | None = None  # None: the model's default
    scale: float = 1.0

    @property
    def slug(self) -> str:
        """How cell ids name it, where a size would go: ``resnet50``, ``resnet50-b32-s16``."""
        batch = f"-b{self.batch}" if self.batch is not None else ""
        scale = f"-s{self.scale:g}" if self.scale != 1 else ""
        return f"{self.model}{batch}{scale}"


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class MpiProgram:
    """A run's MPI program (``mpi:``): what ``emu mpirun`` would run, one rank per host (:mod:`emulator.emulation.mpi_run`).

    ``program`` is the command as given (its first word is resolved when the cell runs, as ``emu mpirun``
    does); ``np`` None means every host of the topology.
    """

    program: tuple[str, ...]
    np: int | None = None
    mca: tuple[tuple[str, str], ...] = ()
    nice: int = mpi.DEFAULT_NICE
    timeout_s: float = mpi.DEFAULT_TIMEOUT_S

    @property
    def name(self) -> str:
        """The program's file name: ``emu-allreduce-bench``."""
        return os.path.basename(self.program[0])

    @property
    def bench_algorithm(self) -> str | None:
        """The bundled benchmark's ``--algo`` (aliases resolved), or None for any other program."""
        if self.name != mpi.BENCH_PROGRAM:
            return None
        return mpi_bench.parse_args(list(self.program[1:])).algo

    @property
    def slug(self) -> str:
        """How cell ids name it, where an algorithm would go: ``mpi-emu-allreduce-bench-ring``, ``mpi-my_app-py``.

        Only letters, digits, ``-`` and ``_`` (a cell id is a directory name, its parts split at dots).
        """
        algo = self.bench_algorithm
        words = [self.name] + ([algo] if algo else [])
        return "mpi-" + "-".join(_UNSAFE.sub("-", w).strip("-") or "program" for w in words)

    def ranks(self, hosts: int) -> int:
        """How many ranks run on a topology of ``hosts`` hosts."""
        return self.np if self.np is not None else hosts

    def command(self) -> str:
        """The program and its arguments as one shell-quoted line."""
        return shlex.join(self.program)

    def to_json(self) -> dict[str, Any]:
        return {"program": list(self.program), "np": self.np, "mca": [list(kv) for kv in self.mca],
                "nice": self.nice, "timeout_s": self.timeout_s}


@dataclass(frozen=True)
class Series:
    name: str
    runs: tuple[Run, ...]
    sizes: tuple[int, ...] | None = None
    description: str = ""
    fabric: fabric.FabricProfile | None = None  # the series' own fabric (dilation), else the experiment's


@dataclass(frozen=True)
class Experiment:
    name: str
    series: tuple[Series, ...]
    description: str = ""
    fabric: fabric.FabricProfile = field(default_factory=fabric.default)
    link_mbps: float = DEFAULT_LINK_MBPS
    repeat: int = DEFAULT_REPEAT
    warmup: int = DEFAULT_WARMUP
    ecmp_seeds: tuple[int, ...] = DEFAULT_SEEDS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    timeout_s: float | None = None
    reference: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_REFERENCE))
    source: str = "experiment"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["reference"] = dict(self.reference)
        data["fabric"] = self.fabric.spec()
        for ser, raw_ser in zip(self.series, data["series"], strict=True):
            raw_ser["fabric"] = ser.fabric.spec() if ser.fabric is not None else None
            for run, raw_run in zip(ser.runs, raw_ser["runs"], strict=True):
                raw_run["fabric"] = run.fabric.spec() if run.fabric is not None else None
                # only MPI runs have the key: the documents (and fingerprints) of every other run stay as they were
                if run.mpi is None:
                    del raw_run["mpi"]
                else:
                    raw_run["mpi"] = run.mpi.to_json()
        return data

    def profile_of(self, series: Series, run: Run) -> FabricProfile:
        """The fabric a run's cells emulate: the run's own, else its series', else the experiment's."""
        return run.fabric or series.fabric or self.fabric

    def fingerprint(self) -> str:
        """A short hash of everything that decides what runs (not the name, description or source)."""
        data = self.to_json()
        for key in ("source", "description", "name"):
            data.pop(key)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    """One replay: a schedule on a network, ``warmup + repeat`` repetitions; or, with ``mpi``, one run of an MPI
    program on the network (then ``algorithm`` is the program's slug, ``size`` 0, and there is no schedule)."""

    id: str
    series: str
    field: str  # where it came from in the file, e.g. series[0].runs[2]
    topology: str
    kind: str
    hosts: int
    routing: str
    seed: int
    algorithm: str
    placement: str
    size: int
    repeat: int
    warmup: int
    timeout_s: float | None
    faults: tuple[str, ...] = ()
    fabric: str = ""  # the fabric profile's canonical spec
    collective: str = "allreduce"
    workload: Workload | None = None
    mpi: MpiProgram | None = None

    @property
    def group(self) -> tuple[str, str, int, str]:
        """Cells of one group share one network (and controller): topology, routing, seed and fabric profile."""
        return (self.topology, self.routing, self.seed, self.fabric)

    @property
    def ranks(self) -> int:
        """How many ranks take part: every host, or an MPI program's ``np``."""
        return self.mpi.ranks(self.hosts) if self.mpi is not None else self.hosts

    def to_json(self) -> dict[str, Any]:
        """As it reads back from results.json; only an MPI cell has the ``mpi`` key (every other cell's document
        is what it was before MPI cells existed, so their results folders resume as before)."""
        data = {**asdict(self), "faults": list(self.faults)}
        if self.mpi is None:
            del data["mpi"]
        else:
            data["mpi"] = self.mpi.to_json()
        return data

    def mpi_config(self, out: str) -> MpiRunConfig:
        """What ``emu mpirun`` would be given for this MPI cell, its results going to ``out``."""
        if self.mpi is None:
            raise ValueError(f"cell {self.id} replays a schedule, it runs no MPI program")
        m = self.mpi
        return MpiRunConfig(topology=self.topology, routing=self.routing, out=out, program=m.program, seed=self.seed,
                            placement=self.placement, np=m.np, mca=m.mca, fabric=self.fabric, timeout_s=m.timeout_s,
                            nice=m.nice)

    def schedule(self, topo: Topology) -> Schedule:
        """The cell's schedule: its collective at its size, or its workload's training iteration."""
        if self.mpi is not None:
            raise ValueError(f"cell {self.id} runs an MPI program: it has no schedule")
        if self.workload is not None:
            w = self.workload
            return training.gen(w.model, self.algorithm, topo, batch=w.batch, scale=w.scale,
                                placement=self.placement)
        return generators.generate(self.algorithm, topo, self.size, placement=self.placement,
                                   collective=self.collective)


# ---------------------------------------------------------------- parsing
def load(path: str) -> Experiment:
    """Read and validate an experiment file; :class:`UserError` for anything wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UserError(f"experiment file {path!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"experiment file {path!r}: not a UTF-8 text file") from None
    try:
        data = yaml.safe_load(text)
    except PARSE_ERRORS as exc:
        raise UserError(f"{printable(path)}: not valid YAML ({describe_parse_error(exc)})") from None
    default_name = os.path.splitext(os.path.basename(path))[0]
    return from_dict(data, where=path, default_name=default_name)


def _reject_unknown(where: str, prefix: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise FieldError(where, f"{prefix}{key}", f"one of the keys {', '.join(allowed)}",
                             f"unknown key {key}")


def _mapping(where: str, name: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FieldError(where, name, "a mapping of keys to values", value)
    return value


def _list(where: str, name: str, value: object, *, allow_scalar: bool = False) -> list[Any]:
    if allow_scalar and isinstance(value, str | int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, list) or not value:
        raise FieldError(where, name, "a non-empty list", value)
    return value


def _name(where: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise FieldError(where, name, "a name of letters, digits, '-' and '_' (at most 64)", value)
    return value


def _sizes(where: str, name: str, value: object) -> tuple[int, ...]:
    items = _list(where, name, value, allow_scalar=True)
    sizes = tuple(parse_size(v, where, f"{name}[{i}]") for i, v in enumerate(items))
    if len(set(sizes)) != len(sizes):
        raise FieldError(where, name, "distinct sizes", value)
    return sizes


def _seeds(where: str, name: str, value: object) -> tuple[int, ...]:
    items = _list(where, name, value, allow_scalar=True)
    seeds = tuple(int_field(where, f"{name}[{i}]", v, 0) for i, v in enumerate(items))
    if len(set(seeds)) != len(seeds):
        raise FieldError(where, name, "distinct seeds", value)
    return seeds


def _choices(where: str, name: str, value: object, allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = _list(where, name, value, allow_scalar=True)
    for i, v in enumerate(items):
        if v not in allowed:
            raise FieldError(where, f"{name}[{i}]", f"one of {', '.join(allowed)}", v)
    if len(set(items)) != len(items):
        raise FieldError(where, name, "distinct values", value)
    return tuple(items)


def _topology(where: str, name: str, value: object, link_mbps: float) -> topology.Topology:
    """The run's topology with the experiment's link rate unless the spec sets its own."""
    if isinstance(value, str):
        try:
            _, raw = topology.split_spec(value)
        except FieldError as exc:
            raise FieldError(where, f"{name}.{exc.field}", exc.expected, exc.given) from None
        except UserError as exc:
            raise UserError(f"{printable(where)}: field '{name}': {printable(exc)}") from None
        spec: str | dict[str, Any] = value if any(k in raw for k in _RATE_KEYS) else f"{value},bw={link_mbps:g}"
    elif isinstance(value, Mapping):
        spec = dict(value)
        if not any(k in spec for k in _RATE_KEYS):
            spec["bw"] = link_mbps
    else:
        raise FieldError(where, name, "a topology spec such as 'fattree:k=4' or a mapping with kind:", value)
    try:
        return topology.build(spec)
    except FieldError as exc:
        raise FieldError(where, f"{name}.{exc.field}", exc.expected, exc.given) from None
    except UserError as exc:
        raise UserError(f"{printable(where)}: field '{name}': {printable(exc)}") from None


def from_dict(data: object, where: str = "experiment", default_name: str = "experiment") -> Experiment:
    """Validate a parsed experiment file (see ``experiments/README.md``).

    Fields are checked in file order (top level, then each series and its
    runs), so the first mistake is the one reported; the grid is expanded
    once at the end because duplicate cells are an error of the file.
    """
    top = _mapping(where, "(top level)", data)
    _reject_unknown(where, "", top, TOP_KEYS)
    name = _name(where, "name", top.get("name", default_name))
    description = _string(where, "description", top.get("description", ""))
    profile = _fabric(where, top, "", fabric.default())
    repeat = int_field(where, "repeat", top.get("repeat", DEFAULT_REPEAT), 1)
    warmup = int_field(where, "warmup", top.get("warmup", DEFAULT_WARMUP), 0)
    seeds = _seeds(where, "ecmp_seeds", top["ecmp_seeds"]) if "ecmp_seeds" in top else DEFAULT_SEEDS
    sizes = _sizes(where, "sizes", top["sizes"]) if "sizes" in top else DEFAULT_SIZES
    timeout = _timeout(where, top.get("timeout_s"))
    ref = _reference(where, top)
    if "series" not in top:
        raise FieldError(where, "series", "a non-empty list of series (name, runs)", MISSING)
    series_list: list[Series] = []
    for si, raw_series in enumerate(_list(where, "series", top["series"])):
        series_list.append(_series(where, f"series[{si}]", raw_series, profile, repeat,
                                   {s.name for s in series_list}))
    exp = Experiment(name=name, series=tuple(series_list), description=description, fabric=profile,
                     link_mbps=profile.emulated_link_mbps, repeat=repeat, warmup=warmup, ecmp_seeds=seeds,
                     sizes=sizes, timeout_s=timeout, reference=ref, source=where)
    expand(exp)  # duplicate cells are an error of the file
    return exp


def _string(where: str, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise FieldError(where, name, "a string", value)
    return value


def _timeout(where: str, value: object) -> float | None:
    """``timeout_s``: seconds > 0 per repetition, or None when it is left out."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise FieldError(where, "timeout_s", "seconds > 0 per repetition (or leave it out)", value)
    return value


def _reference(where: str, top: Mapping[str, Any]) -> dict[str, str]:
    """The reference the report compares against: :data:`DEFAULT_REFERENCE` with the file's ``reference`` keys."""
    ref = dict(DEFAULT_REFERENCE)
    if "reference" not in top:
        return ref
    raw = _mapping(where, "reference", top["reference"])
    _reject_unknown(where, "reference.", raw, REFERENCE_KEYS)
    if "algorithm" in raw:
        ref["algorithm"] = _choices(where, "reference.algorithm", raw["algorithm"], generators.ALGORITHMS)[0]
    if "routing" in raw:
        ref["routing"] = _choices(where, "reference.routing", raw["routing"], routing.POLICIES)[0]
    return ref


def _series(where: str, sp: str, raw: object, profile: FabricProfile, repeat: int, taken: set[str]) -> Series:
    """One entry of ``series`` at field ``sp``; ``taken``: the names of the series before it."""
    ser = _mapping(where, sp, raw)
    _reject_unknown(where, f"{sp}.", ser, SERIES_KEYS)
    if "name" not in ser:
        raise FieldError(where, f"{sp}.name", "a name for the series", MISSING)
    sname = _name(where, f"{sp}.name", ser["name"])
    if sname in taken:
        raise FieldError(where, f"{sp}.name", "a name no other series has", sname)
    sdesc = _string(where, f"{sp}.description", ser.get("description", ""))
    sprofile = _fabric(where, ser, f"{sp}.", profile) if "fabric" in ser or "link_mbps" in ser else None
    ssizes = _sizes(where, f"{sp}.sizes", ser["sizes"]) if "sizes" in ser else None
    if "runs" not in ser:
        raise FieldError(where, f"{sp}.runs", "a non-empty list of runs (topology, routing, algorithms)", MISSING)
    runs = tuple(_run(where, f"{sp}.runs[{ri}]", raw_run, sprofile or profile, repeat)
                 for ri, raw_run in enumerate(_list(where, f"{sp}.runs", ser["runs"])))
    return Series(name=sname, runs=runs, sizes=ssizes, description=sdesc, fabric=sprofile)


def _run(where: str, rp: str, raw: object, enclosing: FabricProfile, repeat: int) -> Run:
    """One entry of a series' ``runs`` at field ``rp``; ``enclosing``: the series' fabric, else the experiment's."""
    run = _mapping(where, rp, raw)
    _reject_unknown(where, f"{rp}.", run, RUN_KEYS)
    if "mpi" in run:
        for key in MPI_EXCLUDES:
            if key in run:
                raise FieldError(where, f"{rp}.{key}", "nothing beside mpi: an MPI run's program is its workload "
                                 "(with its own sizes)", run[key])
    for key in ("topology", "routing") if "mpi" in run else ("topology", "routing", "algorithms"):
        if key not in run:
            raise FieldError(where, f"{rp}.{key}", "a value (see experiments/README.md)", MISSING)
    rprofile = _fabric(where, run, f"{rp}.", enclosing) if "fabric" in run or "link_mbps" in run else None
    topo = _topology(where, f"{rp}.topology", run["topology"], (rprofile or enclosing).emulated_link_mbps)
    policies = _routings(where, f"{rp}.routing", run["routing"], topo)
    if "mpi" in run:
        return _mpi_run(where, rp, run, topo, policies, rprofile)
    collective = run.get("collective", "allreduce")
    if collective not in generators.GENERATED:
        raise FieldError(where, f"{rp}.collective", f"one of {', '.join(generators.GENERATED)} (one per run)",
                         collective)
    workload = _workload(where, rp, run)
    if workload is not None and collective != "allreduce":
        raise FieldError(where, f"{rp}.collective", f"allreduce for a {workload.model} iteration (DDP allreduces "
                         "its gradients)", collective)
    if workload is not None and "sizes" in run:
        raise FieldError(where, f"{rp}.sizes", f"nothing: a {workload.model} iteration has its own sizes",
                         run["sizes"])
    algos = _choices(where, f"{rp}.algorithms", run["algorithms"], generators.algorithms(collective))
    placements = (_choices(where, f"{rp}.placements", run["placements"], generators.PLACEMENTS)
                  if "placements" in run else ("identity",))
    for i, placement in enumerate(placements):
        _check_placement(where, f"{rp}.placements[{i}]", topo, placement)
    if "hdrm" in algos:
        _check_placement(where, f"{rp}.algorithms[{algos.index('hdrm')}]", topo, "hdrm")
    return Run(topology=topo.spec, routing=policies, algorithms=algos, placements=placements,
               seeds=_seeds(where, f"{rp}.seeds", run["seeds"]) if "seeds" in run else None,
               sizes=_sizes(where, f"{rp}.sizes", run["sizes"]) if "sizes" in run else None,
               faults=_faults(where, f"{rp}.faults", run["faults"], topo, repeat) if "faults" in run else (),
               fabric=rprofile, collective=collective, workload=workload)


def _mpi_run(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology, policies: tuple[str, ...],
             rprofile: FabricProfile | None) -> Run:
    """An MPI run (``mpi:`` instead of ``algorithms``): its placements fit the program's ranks."""
    placements = (_choices(where, f"{rp}.placements", run["placements"], generators.PLACEMENTS)
                  if "placements" in run else ("identity",))
    program = _mpi(where, f"{rp}.mpi", run["mpi"], topo)
    for i, placement in enumerate(placements):
        try:
            hosts = mpi.rank_hosts(topo, placement, program.np)
        except FieldError as exc:
            name = f"{rp}.placements[{i}]" if exc.field == "placement" else f"{rp}.mpi.{exc.field}"
            raise FieldError(where, name, exc.expected, exc.given) from None
        if len(hosts) < 2:
            raise FieldError(where, f"{rp}.mpi.np", "at least 2 ranks", len(hosts))
    return Run(topology=topo.spec, routing=policies, algorithms=(), placements=placements,
               seeds=_seeds(where, f"{rp}.seeds", run["seeds"]) if "seeds" in run else None,
               fabric=rprofile, mpi=program)


def _own_bin() -> str:
    """This emulator's scripts (the venv's bin), where the bundled MPI programs are; as
    :func:`emulator.emulation.mpi_run.own_bin` (a live module this one does not import) finds them."""
    return os.path.dirname(sys.executable)


def _mpi(where: str, mp: str, value: object, topo: topology.Topology) -> MpiProgram:
    """The ``mpi`` mapping at field ``mp``, checked with :mod:`emulator.runs.mpi_plan`'s functions as ``emu mpirun``
    checks its command line (the program is found, the bundled benchmark's arguments parse)."""
    raw = _mapping(where, mp, value)
    _reject_unknown(where, f"{mp}.", raw, MPI_KEYS)
    if "program" not in raw:
        raise FieldError(where, f"{mp}.program", "a program and its arguments, e.g. [emu-allreduce-bench, --algo, "
                         "ring, --sizes, 1MiB]", MISSING)
    program = _program(where, f"{mp}.program", raw["program"])
    np = int_field(where, f"{mp}.np", raw["np"], 2) if raw.get("np") is not None else None
    if np is not None:
        try:
            mpi.rank_hosts(topo, "identity", np)
        except FieldError as exc:
            raise FieldError(where, f"{mp}.{exc.field}", exc.expected, exc.given) from None
    mca = _mca(where, f"{mp}.mca", raw["mca"]) if "mca" in raw else ()
    nice = int_field(where, f"{mp}.nice", raw["nice"], 0, 19) if "nice" in raw else mpi.DEFAULT_NICE
    timeout = raw.get("timeout_s", mpi.DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_MPI_TIMEOUT_S:
        raise FieldError(where, f"{mp}.timeout_s", f"seconds > 0 (at most {MAX_MPI_TIMEOUT_S:g}) for the whole "
                         f"program, or leave it out ({mpi.DEFAULT_TIMEOUT_S:g})", timeout)
    return MpiProgram(program=program, np=np, mca=mca, nice=nice, timeout_s=float(timeout))


def _program(where: str, name: str, value: object) -> tuple[str, ...]:
    """``program``: a list of words or one string split as a shell would (no shell runs it); the first word a
    program :func:`emulator.runs.mpi_plan.resolve_program` finds; the bundled benchmark's arguments as it parses them."""
    expected = "a program and its arguments: a list of strings or one string, e.g. emu-allreduce-bench --algo ring"
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise FieldError(where, name, f"{expected} ({exc})", value) from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise FieldError(where, name, expected, value)
    if not words:
        raise FieldError(where, name, expected, value)
    for i, word in enumerate(words):
        if not word.isprintable() or (i == 0 and not word.strip()):
            raise FieldError(where, name, "printable words (one line each), a program first", word)
    try:
        mpi.resolve_program(words[0], own_bin=_own_bin())
    except FieldError as exc:
        raise FieldError(where, name, exc.expected, exc.given) from None
    if os.path.basename(words[0]) == mpi.BENCH_PROGRAM:
        _bench_arguments(where, name, words[1:])
    return tuple(words)


def _bench_arguments(where: str, name: str, args: list[str]) -> None:
    """The bundled benchmark's arguments parse (the cell's folder gets its ``--json``, so none is given)."""
    if any(a == "-h" or (a.startswith("--h") and "--help".startswith(a.split("=", 1)[0])) for a in args):
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments that run it (not --help)", "--help")
    try:
        # argparse prints and exits for a help option it still finds (in a cluster of short options)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            options = mpi_bench.parse_args(args)
    except SystemExit:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments that run it (not --help)", " ".join(args)) \
            from None
    except FieldError as exc:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments: --{exc.field} must be {exc.expected}",
                         exc.given) from None
    except UserError as exc:
        raise UserError(f"{printable(where)}: field '{printable(name)}': {printable(exc)}") from None
    if options.json_path is not None:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments without --json (emu run collects its rows "
                         f"into the cell's {mpi.BENCH_JSON})", options.json_path)


def _mca(where: str, name: str, value: object) -> tuple[tuple[str, str], ...]:
    """``mca``: Open MPI parameters and their values, as :func:`emulator.runs.mpi_plan.parse_mca` checks ``--mca``."""
    raw = _mapping(where, name, value)
    pairs: list[tuple[str, str]] = []
    for key, val in raw.items():
        if not isinstance(key, str) or isinstance(val, bool) or not isinstance(val, str | int | float):
            raise FieldError(where, f"{name}.{key}", "a parameter name and a value (a string or a number)", val)
        try:
            pairs.extend(mpi.parse_mca([(key, str(val))]))
        except FieldError as exc:
            raise FieldError(where, f"{name}.{key}", exc.expected, exc.given) from None
    return tuple(pairs)


def _workload(where: str, rp: str, run: Mapping[str, Any]) -> Workload | None:
    """A run's ``model`` (with ``batch`` and ``scale``), or None for a collective per size."""
    if "model" not in run:
        for key in ("batch", "scale"):
            if key in run:
                raise FieldError(where, f"{rp}.{key}", "a model to go with it (model: resnet50)", run[key])
        return None
    name = _choices(where, f"{rp}.model", run["model"], tuple(training.MODELS))[0]
    batch = int_field(where, f"{rp}.batch", run["batch"], 1, 1 << 16) if "batch" in run else None
    scale = run.get("scale", 1)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 1 <= scale <= 1e6:
        raise FieldError(where, f"{rp}.scale", "a number >= 1 (gradients and compute divided by it)", scale)
    return Workload(name, batch, float(scale))


def _routings(where: str, name: str, value: object, topo: topology.Topology) -> tuple[str, ...]:
    """Routing policies, each one that ``topo`` supports."""
    policies = _choices(where, name, value, routing.POLICIES)
    for i, policy in enumerate(policies):
        try:
            routing.check_policy(topo, policy)
        except FieldError as exc:
            raise FieldError(where, f"{name}[{i}]", exc.expected, exc.given) from None
    return policies


def _fabric(where: str, data: Mapping[str, Any], prefix: str,
            enclosing: fabric.FabricProfile) -> fabric.FabricProfile:
    """The fabric profile from the ``fabric:`` and ``link_mbps:`` keys of ``data`` (top level, a series or a run).

    ``fabric`` alone sets it; ``link_mbps`` alone keeps the enclosing
    profile's real fabric (the experiment's, or the default one at the top
    level) and sets the dilation that maps it onto that rate; both must agree.
    """
    link = data.get("link_mbps")
    if link is not None and (isinstance(link, bool) or not isinstance(link, int | float)
                             or not fabric.MIN_LINK_MBPS <= link <= fabric.MAX_LINK_MBPS):
        raise FieldError(where, f"{prefix}link_mbps", f"a rate in Mbit/s from {fabric.MIN_LINK_MBPS:g} to "
                         f"{fabric.MAX_LINK_MBPS:g}", link)
    if "fabric" in data:
        raw = data["fabric"]
        if not isinstance(raw, str | Mapping):
            raise FieldError(where, f"{prefix}fabric", "a preset name, key=value pairs or a mapping of them", raw)
        try:
            profile = fabric.parse(raw)
        except FieldError as exc:
            name = "fabric" if exc.field == "(spec)" else f"fabric.{exc.field}"
            raise FieldError(where, f"{prefix}{name}", exc.expected, exc.given) from None
        if link is not None and abs(link - profile.emulated_link_mbps) > 1e-9 * link:
            raise FieldError(where, f"{prefix}link_mbps", f"the fabric's emulated rate "
                             f"{profile.emulated_link_mbps:g} (or leave link_mbps out)", link)
        return profile
    if link is not None:
        return fabric.at_link_rate(enclosing, link, where=f"{where}: {prefix}link_mbps")
    return enclosing


def _faults(where: str, name: str, value: object, topo: topology.Topology, repeat: int) -> tuple[str, ...]:
    """Fault specs checked against the topology (steps are checked per cell in :func:`prepare`)."""
    plan = faults.parse_faults(_list(where, name, value), topo, len(topo.hosts), 1 << 30, repeat,
                               where=f"{where}: {name}")
    return tuple(f.describe() for f in plan)


def _check_placement(where: str, name: str, topo: topology.Topology, placement: str) -> None:
    try:
        generators.placement_hosts(topo, placement)
    except FieldError as exc:
        raise FieldError(where, name, f"a placement that fits {topo.spec}: {exc.expected}", placement) from None


# ------------------------------------------------------------- the grid
def topology_slug(spec: str, link_mbps: float) -> str:
    """``leafspine:leaves=4,spines=4,hosts_per_leaf=4,...`` -> ``leafspine-4x4x4`` (+ rates if not the default)."""
    kind, params = topology.parse_spec(spec)
    dims = "x".join(str(params[k]) for k in topology.fabric_keys(kind))
    slug = f"{kind}-{dims}"
    if params["host_bw"] != link_mbps or params["switch_bw"] != link_mbps:
        slug += f"-h{params['host_bw']:g}-s{params['switch_bw']:g}"
    if "servers" in params:
        # servers x accelerators, NICs each, their placement; PCIe rate when not the NIC's
        slug += (f"-srv{params['servers']}x{params['accels_per_server']}n{params['nics_per_server']}"
                 f"{params['nic_placement'][0]}")
        if params["pcie_bw"] != params["host_bw"]:
            slug += f"-p{params['pcie_bw']:g}"
    return slug


def expand(exp: Experiment) -> list[Cell]:
    """Every cell of the experiment in file order; :class:`FieldError` if two cells would be the same."""
    cells: list[Cell] = []
    ids: dict[str, str] = {}
    for si, ser in enumerate(exp.series):
        for ri, run in enumerate(ser.runs):
            where_field = f"series[{si}].runs[{ri}]"
            kind, params = topology.parse_spec(run.topology)
            hosts = len(topology.build(run.topology).hosts)
            sizes = run.sizes or ser.sizes or exp.sizes
            profile = exp.profile_of(ser, run)
            if run.workload is not None:
                profile = fabric.for_workload_scale(profile, run.workload.scale)
            slug = topology_slug(run.topology, profile.emulated_link_mbps)
            for policy in run.routing:
                seeds = (run.seeds or exp.ecmp_seeds) if policy == "ecmp" else (0,)
                for seed in seeds:
                    rname = f"{policy}-s{seed}" if policy == "ecmp" else policy
                    if run.mpi is not None:
                        for placement in run.placements:
                            cells.append(_mpi_cell(exp, ser, run, where_field, ids, slug, rname, policy, seed,
                                                   placement, kind, hosts, profile.spec()))
                    for algo in run.algorithms:
                        placements = ("hdrm",) if algo == "hdrm" else run.placements
                        for placement in placements:
                            default = "hdrm" if algo == "hdrm" else "identity"
                            aname = algo if placement == default else f"{algo}-{placement}"
                            if run.collective != "allreduce":
                                aname = f"{run.collective}-{aname}"
                            for size in (0,) if run.workload is not None else sizes:
                                what = run.workload.slug if run.workload is not None else format_size(size)
                                cid = f"{ser.name}.{slug}.{rname}.{aname}.{what}"
                                if cid in ids:
                                    raise FieldError(exp.source, where_field, "runs that add new cells, not one "
                                                     f"that {ids[cid]} already has", cid)
                                ids[cid] = where_field
                                cells.append(Cell(id=cid, series=ser.name, field=where_field, topology=run.topology,
                                                  kind=kind, hosts=hosts, routing=policy, seed=seed,
                                                  algorithm=algo, placement=placement, size=size,
                                                  repeat=exp.repeat, warmup=exp.warmup, timeout_s=exp.timeout_s,
                                                  faults=run.faults, fabric=profile.spec(),
                                                  collective=run.collective, workload=run.workload))
    return cells


def _mpi_cell(exp: Experiment, ser: Series, run: Run, where_field: str, ids: dict[str, str], slug: str, rname: str,
              policy: str, seed: int, placement: str, kind: str, hosts: int, profile: str) -> Cell:
    """One cell of an MPI run: ``<series>.<topology>.<routing>.mpi-<program>[-<algo>][-<placement>].np<ranks>``."""
    assert run.mpi is not None
    aname = run.mpi.slug if placement == "identity" else f"{run.mpi.slug}-{placement}"
    cid = f"{ser.name}.{slug}.{rname}.{aname}.np{run.mpi.ranks(hosts)}"
    if cid in ids:
        raise FieldError(exp.source, where_field, f"runs that add new cells, not one that {ids[cid]} already has "
                         "(MPI cells are named by program, --algo, placement and ranks: put runs that differ "
                         "otherwise in series of their own)", cid)
    ids[cid] = where_field
    return Cell(id=cid, series=ser.name, field=where_field, topology=run.topology, kind=kind, hosts=hosts,
                routing=policy, seed=seed, algorithm=run.mpi.slug, placement=placement, size=0, repeat=exp.repeat,
                warmup=exp.warmup, timeout_s=run.mpi.timeout_s, fabric=profile, mpi=run.mpi)


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
        the calibrated datapath capacity (:mod:`emulator.selfcheck.calibration`); 0 for an MPI cell (no model of its load)."""
        return self.report.peak_load_mbps() if self.report is not None else 0.0


def cell_profile(cell: Cell) -> fabric.FabricProfile:
    """The fabric profile a cell emulates (its canonical spec parsed back)."""
    return _profile_of_spec(cell.fabric)


@functools.cache
def _profile_of_spec(spec: str) -> fabric.FabricProfile:
    return fabric.parse(spec)


def profiles(exp: Experiment) -> list[fabric.FabricProfile]:
    """Every distinct fabric profile the experiment's cells emulate, in file order."""
    return list(dict.fromkeys(cell_profile(c) for c in expand(exp)))


LatencyOf = Callable[[fabric.FabricProfile], LatencyModel]


def prepare(exp: Experiment, cells: list[Cell] | None = None, latency_of: LatencyOf = LatencyModel) -> list[PreparedCell]:
    """Generate every cell's schedule and predict it, as the replay would; :class:`UserError` on failure.

    ``latency_of(profile)`` is the latency model of a cell's fabric profile,
    with this machine's intrinsic latency
    (``lambda p: fidelity.latency_model(p, calibration)``); by default the
    profile alone.
    """
    models: dict[fabric.FabricProfile, LatencyModel] = {}
    topos: dict[str, topology.Topology] = {}
    out = []
    for cell in expand(exp) if cells is None else cells:
        topo = topos.setdefault(cell.topology, topology.build(cell.topology))
        profile = cell_profile(cell)
        model = models.setdefault(profile, latency_of(profile))
        if cell.mpi is not None:  # a program of its own: nothing to generate, nothing the model predicts
            out.append(PreparedCell(cell=cell, topo=topo, schedule=None, report=None, latency=model))
            continue
        try:
            schedule = cell.schedule(topo)
            report = predict(schedule, topo, cell.routing, seed=cell.seed, latency=model,
                             mtu=profile.emulated_mtu, where=f"cell {cell.id}", compute_dilation=profile.dilation)
            faults.parse_faults(cell.faults, topo, schedule.p, schedule.steps, cell.repeat, where=f"cell {cell.id}")
        except FieldError as exc:
            raise FieldError(exp.source, f"{cell.field}", f"a runnable cell ({cell.id}): {exc.field} "
                             f"must be {exc.expected}", exc.given) from None
        except UserError as exc:
            raise UserError(f"{printable(exp.source)}: field '{cell.field}': cell {cell.id}: {printable(exc)}") \
                from None
        out.append(PreparedCell(cell=cell, topo=topo, schedule=schedule, report=report))
    return out


def groups(cells: list[Cell]) -> list[tuple[tuple[str, str, int, str], list[Cell]]]:
    """Cells by (topology, routing, seed, fabric), groups in order of their first cell, cells in file order."""
    out: dict[tuple[str, str, int, str], list[Cell]] = {}
    for cell in cells:
        out.setdefault(cell.group, []).append(cell)
    return list(out.items())


def estimate_s(pc: PreparedCell, overhead_s: float) -> float:
    """Wall seconds a cell should take if the network met the model: repetitions plus agent start-up; for an
    MPI cell (no model) :data:`MPI_ESTIMATE_S`."""
    if pc.predicted_s is None:
        return MPI_ESTIMATE_S + overhead_s
    return (pc.cell.warmup + pc.cell.repeat) * pc.predicted_s + overhead_s


def experiment_request(todo: Sequence[PreparedCell], capacity_of: Callable[[int], float | None]) -> admission.Request:
    """The unfinished cells of ``emu run``: one network at a time, so memory is the largest cell's; time the sum
    of every cell and every network's bring-up and probe. ``capacity_of(mtu)``: the calibrated capacity."""
    memory: list[admission.MemoryEstimate] = []
    loads: list[admission.Load] = []
    cells_s = 0.0
    for pc in todo:
        cells_s += estimate_s(pc, CELL_OVERHEAD_S)
        if pc.cell.mpi is not None:
            memory.append(admission.mpi_memory(pc.cell.ranks, admission.mpi_program_bytes(pc.cell.mpi.program), pc.topo))
        elif pc.schedule is not None and pc.report is not None:
            memory.append(admission.replay_memory(pc.schedule, pc.topo))
            profile = cell_profile(pc.cell)
            loads.append(admission.Load(pc.report.peak_load_mbps(), capacity_of(profile.emulated_mtu), pc.cell.id,
                              pc.topo.host_bw, profile))
    networks = groups([pc.cell for pc in todo])
    by_id = {pc.cell.id: pc for pc in todo}
    networks_s = sum(admission.bringup_estimate_s(by_id[cells[0].id].topo) + admission.PROBE_S for _, cells in networks)
    mpi_cells = sum(pc.cell.mpi is not None for pc in todo)
    guess = f", MPI cells {MPI_ESTIMATE_S:g} s each (a guess)" if mpi_cells else ""
    empty = admission.MemoryEstimate(ranks=0, rank_bytes=0, programs_bytes=0, network_bytes=0, session_bytes=0)
    return admission.Request("run", admission.largest(memory) if memory else empty, cells_s + networks_s,
                   f"{len(todo)} cells left at the model's times, {len(networks)} bring-ups and probes{guess}",
                   tuple(loads))
