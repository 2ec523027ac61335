"""The experiment's types: the validated file (:class:`Experiment`, its :class:`Series` and :class:`Run` entries,
a run's :class:`Workload` or :class:`MpiProgram`) and the grid's :class:`Cell`.

Frozen values, built by :mod:`~emulator.study.experiment.parse` and
:mod:`~emulator.study.experiment.grid`; a cell writes itself as it reads back
from ``results.json`` (:meth:`Cell.to_json`: the fabric profile as its
canonical spec string).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from emulator.model import fabric
from emulator.model.collectives import generators
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.format import Schedule
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.model.topology import DEFAULT_LINK_MBPS, Topology
from emulator.model.workloads import llm, llm_models, training
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs import mpi_plan as mpi
from emulator.runs.mpi_plan import MpiRunConfig

DEFAULT_REPEAT = 2
DEFAULT_WARMUP = 1
DEFAULT_SEEDS = (0,)
DEFAULT_SIZES = (1 << 20,)
DEFAULT_REFERENCE = {"algorithm": "hdrm", "routing": "bigraph"}


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
    fabric: FabricProfile | None = None  # the run's own fabric (dilation), else the series'
    collective: str = ALLREDUCE
    workload: Workload | None = None  # a training iteration instead of one collective per size
    mpi: MpiProgram | None = None  # an MPI program instead of algorithms (then ``algorithms`` is empty)
    dilation_auto: bool | None = None  # ``dilation: auto`` (True), a rate of its own (False), else the series'


@dataclass(frozen=True)
class Workload:
    """A run's training iteration: the model, per-accelerator batch and scale of a data-parallel one
    (:mod:`emulator.model.workloads.training`), or a language model's hybrid-parallel split
    (:mod:`emulator.model.workloads.llm`: ``tp``, ``pp``, ``ep``, microbatches; ``dp`` is the hosts over
    ``tp·pp``). Flat, so that a plan's entry reads back with ``Workload(**entry)``."""

    model: str
    batch: int | None = None  # None: the model's default (a language model: its micro-batch of 1 sequence)
    scale: float = 1.0
    tp: int = 1
    pp: int = 1
    ep: int = 1
    microbatches: int = 0  # 0: a data-parallel model (no pipeline)
    sequence_parallel: bool = False
    layers_per_collective: int = 1
    accelerator: str = ""

    @property
    def is_llm(self) -> bool:
        return self.model in llm_models.MODELS

    @property
    def slug(self) -> str:
        """How cell ids name it, where a size would go: ``resnet50``, ``resnet50-b32-s16``,
        ``gpt3-13b-t8p2m4-h100-s1000``."""
        batch = f"-b{self.batch}" if self.batch is not None else ""
        scale = f"-s{self.scale:g}" if self.scale != 1 else ""
        if not self.is_llm:
            return f"{self.model}{batch}{scale}"
        split = f"-t{self.tp}p{self.pp}" + (f"e{self.ep}" if self.ep > 1 else "") + f"m{self.microbatches}"
        extra = ("-sp" if self.sequence_parallel else "") + (
            f"-l{self.layers_per_collective}" if self.layers_per_collective > 1 else "")
        acc = f"-{self.accelerator}" if self.accelerator else ""
        return f"{self.model}{split}{batch}{extra}{acc}{scale}"

    def dp(self, hosts: int) -> int:
        """The data-parallel degree on ``hosts`` ranks."""
        return hosts // (self.tp * self.pp)

    def llm_config(self, hosts: int) -> llm.LlmConfig:
        """A language model's configuration on ``hosts`` ranks (``batch``: sequences per microbatch)."""
        return llm.LlmConfig(llm_models.model(self.model), self.tp, self.pp, self.dp(hosts), self.ep,
                             self.microbatches, self.batch or 1, self.sequence_parallel,
                             llm_models.ACCELERATORS[self.accelerator or "a100"], self.layers_per_collective)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class MpiProgram:
    """A run's MPI program (``mpi:``): what ``emu mpirun`` would run, one rank per host
    (:mod:`emulator.emulation.mpi.mpi_run`).

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
        """The bundled benchmark's ``--algo`` (aliases resolved), or None for any other program (its arguments
        were checked when the file was read)."""
        opts = mpi_bench.program_options(self.program)
        return opts.algo if opts is not None else None

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
    fabric: FabricProfile | None = None  # the series' own fabric (dilation), else the experiment's
    dilation_auto: bool | None = None  # as Run.dilation_auto: None, the experiment's


@dataclass(frozen=True)
class Experiment:
    name: str
    series: tuple[Series, ...]
    description: str = ""
    fabric: FabricProfile = field(default_factory=fabric.default)
    link_mbps: float = DEFAULT_LINK_MBPS
    repeat: int = DEFAULT_REPEAT
    warmup: int = DEFAULT_WARMUP
    ecmp_seeds: tuple[int, ...] = DEFAULT_SEEDS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    timeout_s: float | None = None
    reference: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_REFERENCE))
    max_time_s: float | None = None  # the file's ``max_time``: --max-time when the command line gives none
    source: str = "experiment"
    dilation_auto: bool = True  # ``dilation: auto``, the default (emulator.runs.dilation)

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

    def auto_of(self, series: Series, run: Run) -> bool:
        """Whether a run's dilation is chosen from the calibration when it starts (``dilation: auto``). An MPI
        program's load has no model: such a run follows a replay run of the same topology
        (:mod:`emulator.study.experiment.auto_dilation`)."""
        for level in (run.dilation_auto, series.dilation_auto):
            if level is not None:
                return level
        return self.dilation_auto

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
    fabric: FabricProfile = dataclasses.field(default_factory=fabric.default)  # written as its canonical spec
    collective: str = ALLREDUCE
    workload: Workload | None = None
    mpi: MpiProgram | None = None

    @property
    def group(self) -> tuple[str, str, int, str]:
        """Cells of one group share one network (and controller): topology, routing, seed and fabric profile."""
        return (self.topology, self.routing, self.seed, self.fabric.spec())

    @property
    def ranks(self) -> int:
        """How many ranks take part: every host, or an MPI program's ``np``."""
        return self.mpi.ranks(self.hosts) if self.mpi is not None else self.hosts

    def to_json(self) -> dict[str, Any]:
        """As it reads back from results.json; only an MPI cell has the ``mpi`` key (every other cell's document
        is what it was before MPI cells existed, so their results folders resume as before)."""
        data = {**asdict(self), "faults": list(self.faults), "fabric": self.fabric.spec()}
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
        return MpiRunConfig(network=fabric.rebuild(self.topology, self.fabric, interconnect=False),
                            routing=self.routing, out=out, program=m.program, seed=self.seed,
                            placement=self.placement, np=m.np, mca=m.mca, timeout_s=m.timeout_s, nice=m.nice)

    def schedule(self, topo: Topology) -> Schedule:
        """The cell's schedule: its collective at its size, or its workload's training iteration."""
        if self.mpi is not None:
            raise ValueError(f"cell {self.id} runs an MPI program: it has no schedule")
        if self.workload is not None and self.workload.is_llm:
            w = self.workload
            return llm.iteration(topo, w.llm_config(len(topo.hosts)), dp_algo=self.algorithm, scale=w.scale)
        if self.workload is not None:
            w = self.workload
            return training.gen(w.model, self.algorithm, topo, batch=w.batch, scale=w.scale,
                                placement=self.placement)
        return generators.generate(self.algorithm, topo, self.size, placement=self.placement,
                                   collective=self.collective)
