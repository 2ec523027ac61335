"""The bench's results: its conditions and every section's rows, typed, and the document written as
``results/bench-<timestamp>.json`` (:meth:`BenchResults.to_json`: a section not measured yet is absent)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.selfcheck.bench.cases import Size, targets_json
from emulator.selfcheck.bench.crossovers import CrossoverRow
from emulator.selfcheck.bench.rows import (
    AgentsVsIperf,
    BringupSummary,
    HdrmMissing,
    MpiPairRow,
    NcclPacketRow,
    ReplayRow,
    SectionError,
)


@dataclass
class BenchResults:
    """One bench run; the sections fill in as they are measured (None: not yet).

    ``machine`` is :func:`emulator.selfcheck.live.calibration.machine_info`'s document, with the datapath used and the
    load average after the run once they are known.
    """

    date: str
    machine: dict[str, Any]
    profile: FabricProfile
    latency: LatencyModel
    sizes: tuple[Size, ...]
    calibration_capacity_mbps: float | None
    path: str
    runs_dir: str
    duration_s: float | None = None
    agents: AgentsVsIperf | SectionError | None = None
    agents_aggregate: AgentsVsIperf | SectionError | None = None
    replays: list[ReplayRow] = field(default_factory=list)
    hdrm: ReplayRow | HdrmMissing | None = None
    crossovers: list[CrossoverRow] | None = None
    mpi: list[MpiPairRow] | None = None
    bringup: BringupSummary | SectionError | None = None
    nccl_packets: list[NcclPacketRow] | SectionError | None = None
    #: at :data:`~emulator.selfcheck.bench.cases.SCALE_BRINGUP_TOPOLOGIES`, one per topology measured
    bringup_at_scale: list[BringupSummary | SectionError] | None = None

    @property
    def link_mbps(self) -> float:
        return self.profile.emulated_link_mbps

    @property
    def mtu(self) -> int:
        return self.profile.emulated_mtu

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "date": self.date, "machine": self.machine, "mtu": self.mtu, "fabric": self.profile.spec(),
            "fabric_profile": self.profile.to_json(), "latency": self.latency.to_json(),
            "sizes": [asdict(s) for s in self.sizes], "link_mbps": self.link_mbps, "dilation": self.profile.dilation,
            "calibration_source": self.latency.intrinsic.source,
            "calibration_capacity_mbps": self.calibration_capacity_mbps, "targets": targets_json(),
            "replays": [r.to_json() for r in self.replays], "path": self.path, "runs_dir": self.runs_dir,
        }
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        for key, section in (("agents", self.agents), ("agents_aggregate", self.agents_aggregate),
                             ("hdrm", self.hdrm), ("bringup", self.bringup)):
            if section is not None:
                out[key] = section.to_json()
        if isinstance(self.nccl_packets, SectionError):
            out["nccl_packets"] = self.nccl_packets.to_json()
        elif self.nccl_packets is not None:
            out["nccl_packets"] = [r.to_json() for r in self.nccl_packets]
        rows_of: tuple[tuple[str, Sequence[Any] | None], ...] = (
            ("crossovers", self.crossovers), ("mpi", self.mpi), ("bringup_at_scale", self.bringup_at_scale))
        for key, rows in rows_of:
            if rows is not None:
                out[key] = [r.to_json() for r in rows]
        return out
