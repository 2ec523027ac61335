"""What an ``emu mpirun`` measured: its ``results.json`` (:class:`MpiResults`), typed, and reading it back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emulator.base.errors import UserError, printable
from emulator.base.files import read_json_object, write_json_atomic
from emulator.runs import trust
from emulator.runs.allreduce_bench import data_check
from emulator.runs.results import Fidelity
from emulator.runs.trust import Trust, Verdict


@dataclass(frozen=True)
class RankPlace:
    rank: int
    host: str
    ip: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "ip": self.ip}


@dataclass
class MpiResults:
    """``results.json`` of an ``emu mpirun`` folder.

    ``status``: ``running``, ``ok`` (the program exited 0), ``failed`` (it
    exited non-zero, or could not start), ``timeout``, ``interrupted``;
    ``exit_status`` the program's (mpirun's) status; ``wall_s`` from
    mpirun's start to its end (Open MPI's start-up included);
    ``fidelity`` over that time (CPU idle, the datapath's load from the
    switch ports' byte counters against its calibrated capacity, flags);
    ``bench`` the bundled benchmark's rows (:mod:`emulator.runs.allreduce_bench`), when
    it ran; ``learned_connections`` how many TCP connections the controller
    routed by their 5-tuple (``ecmp``: each as :func:`emulator.model.routing.route`
    predicts it from its ports); ``memory_limit_bytes`` the ``RLIMIT_DATA``
    every process of the run had (None: none), and ``out_of_memory`` the
    ranks whose output says an allocation was refused (then ``error`` says
    so in one line); ``predictions`` the benchmark's rows beside the timing
    model (:mod:`emulator.runs.mpi_prediction`); ``trusted`` (written, not
    read back) is true only when every check of :meth:`trust` had its data
    and passed, and ``verdict``, ``flags`` and ``unchecked`` say which.
    """

    config: dict[str, Any]
    ranks: list[RankPlace]
    command: list[str]
    link_mbps: float
    fabric: dict[str, Any] | None = None
    datapath: str = ""
    bringup_s: float | None = None
    status: str = "running"
    exit_status: int | None = None
    wall_s: float | None = None
    fidelity: Fidelity | None = None
    error: str | None = None
    bench: list[dict[str, Any]] = field(default_factory=list)
    learned_connections: int | None = None  # TCP connections the controller hashed by 5-tuple (ecmp)
    memory_limit_bytes: int | None = None
    out_of_memory: list[int] = field(default_factory=list)  # ranks that ran out of their memory limit
    #: The benchmark's rows beside the timing model (emulator.runs.mpi_prediction.MpiPrediction's JSON)
    predictions: list[dict[str, Any]] = field(default_factory=list)

    def largest_row(self) -> dict[str, Any] | None:
        """The benchmark's row at its largest size (None: the program wrote no rows)."""
        rows = [r for r in self.bench if isinstance(r, dict) and isinstance(r.get("size"), int)]
        return max(rows, key=lambda r: r["size"]) if rows else None

    def over_model(self, size: int) -> float | None:
        """The benchmark row of ``size``'s measured/predicted time (None: no prediction of it)."""
        for p in self.predictions:
            if isinstance(p, dict) and p.get("size") == size and isinstance(p.get("measured_over_predicted"), float):
                return float(p["measured_over_predicted"])
        return None

    def trust(self) -> Trust:
        """The run's checks: its fidelity (unchecked without), the benchmark's data where it ran, and its time
        at the largest size against :data:`emulator.runs.trust.MPI_BAND` (unchecked without a model of it)."""
        fidelity = self.fidelity.trust if self.fidelity is not None else Trust(unchecked=(trust.NO_FIDELITY,))
        top = self.largest_row()
        data = data_check(r.get("wrong") for r in self.bench if isinstance(r, dict)) if self.bench else Trust()
        ratio = self.over_model(top["size"]) if top is not None else None
        return fidelity + data + trust.model_check(ratio, trust.MPI_BAND)

    @property
    def trusted(self) -> bool:
        """Every check had its data and passed."""
        return self.trust().verdict is Verdict.TRUSTED

    def to_json(self) -> dict[str, Any]:
        return {"kind": "mpirun", "config": self.config, "ranks": [r.to_json() for r in self.ranks],
                "command": self.command, "link_mbps": self.link_mbps, "fabric": self.fabric,
                "datapath": self.datapath, "bringup_s": self.bringup_s, "status": self.status,
                "exit_status": self.exit_status, "wall_s": self.wall_s,
                "fidelity": self.fidelity.to_json() if self.fidelity is not None else None,
                "trusted": self.trusted, **self.trust().to_json(), "error": self.error, "bench": self.bench,
                "learned_connections": self.learned_connections, "memory_limit_bytes": self.memory_limit_bytes,
                "out_of_memory": self.out_of_memory, "predictions": self.predictions}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MpiResults:
        if data.get("kind") != "mpirun":
            raise UserError("results: not the results of emu mpirun (no \"kind\": \"mpirun\")")
        fid = data.get("fidelity")
        return cls(config=dict(data.get("config") or {}),
                   ranks=[RankPlace(int(r["rank"]), str(r["host"]), str(r["ip"])) for r in data.get("ranks") or []],
                   command=list(data.get("command") or []), link_mbps=float(data.get("link_mbps") or 0.0),
                   fabric=data.get("fabric"), datapath=str(data.get("datapath") or ""),
                   bringup_s=data.get("bringup_s"), status=str(data.get("status") or "running"),
                   exit_status=data.get("exit_status"), wall_s=data.get("wall_s"),
                   fidelity=Fidelity.from_json(fid) if fid else None, error=data.get("error"),
                   bench=list(data.get("bench") or []), learned_connections=data.get("learned_connections"),
                   memory_limit_bytes=data.get("memory_limit_bytes"),
                   out_of_memory=[int(r) for r in data.get("out_of_memory") or []],
                   predictions=list(data.get("predictions") or []))

    def save(self, path: str) -> None:
        write_json_atomic(path, self.to_json())


def load_results(path: str) -> MpiResults:
    data = read_json_object(path)
    if data is None:
        raise UserError(f"results: cannot read {printable(path)}")
    return MpiResults.from_json(data)
