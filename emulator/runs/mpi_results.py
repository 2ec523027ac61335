"""What an ``emu mpirun`` measured: its ``results.json`` (:class:`MpiResults`), typed, and reading it back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emulator.base.errors import UserError, printable
from emulator.base.files import read_json_object, write_json_atomic
from emulator.runs.results import Fidelity


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
    model (:mod:`emulator.runs.mpi_prediction`).
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

    @property
    def trusted(self) -> bool:
        return self.fidelity is not None and self.fidelity.trusted

    def to_json(self) -> dict[str, Any]:
        return {"kind": "mpirun", "config": self.config, "ranks": [r.to_json() for r in self.ranks],
                "command": self.command, "link_mbps": self.link_mbps, "fabric": self.fabric,
                "datapath": self.datapath, "bringup_s": self.bringup_s, "status": self.status,
                "exit_status": self.exit_status, "wall_s": self.wall_s,
                "fidelity": self.fidelity.to_json() if self.fidelity is not None else None,
                "trusted": self.trusted, "error": self.error, "bench": self.bench,
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
