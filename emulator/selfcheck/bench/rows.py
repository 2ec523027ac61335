"""The bench's typed rows, made from the results documents the live sections return, and written back as the
results document's JSON (the same keys and values as ever): a replay, an Open MPI pair, agents against
iperf3, the bring-ups, and the summary of the replays' predictions. Pure: no network, no files."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from emulator.model.nccl import cost
from emulator.runs.nccl_packets import Measured, NotRun
from emulator.selfcheck.bench.cases import (
    MPI_SIZE,
    TARGET_MPI,
    TARGET_NCCL_PACKETS,
    TARGET_PREDICTION,
    TARGET_WITHIN_SHARE,
    TARGET_WORST,
    Case,
)

Json = dict[str, Any]


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def within(ratio: float | None, tolerance: float = TARGET_PREDICTION) -> bool | None:
    return None if ratio is None else abs(ratio - 1.0) <= tolerance


@dataclass(frozen=True)
class SectionError:
    """A section that failed as a whole: the exception, named."""

    error: str

    @classmethod
    def of(cls, exc: BaseException) -> SectionError:
        return cls(f"{type(exc).__name__}: {exc}")

    def to_json(self) -> Json:
        return {"error": self.error}


@dataclass(frozen=True)
class ReplayRow:
    """The bench's summary of one replay's results document (``results.json``,
    :meth:`emulator.runs.results.CellResults.to_json`)."""

    topology: str
    routing: str
    seed: int
    algorithm: str
    size: int
    status: str | None
    error: str | None
    time_s: float | None
    predicted_s: float | None
    measured_over_predicted: float | None
    measured_over_predicted_reps: tuple[float | None, ...]
    busbw_mbps: float | None
    busbw_over_link: float | None
    datapath_load_mbps: float | None
    cpu_idle_min: float | None
    tcp_retransmits: tuple[int | None, ...]
    flags: tuple[str, ...]
    within_target: bool | None

    @classmethod
    def of(cls, case: Case, algo: str, results: Mapping[str, Any], link_mbps: float, size: int = 0) -> ReplayRow:
        reps = results.get("repetitions", [])
        measured = [r["fidelity"] for r in reps if "fidelity" in r]
        busbw = results.get("busbw_mbps_median")
        mp = results.get("measured_over_predicted_median")
        return cls(
            case.topology, case.routing, case.seed, algo, size, results.get("status"), results.get("error"),
            time_s=results.get("time_s_median"),
            predicted_s=(results.get("prediction") or {}).get("predicted_time_s"),
            measured_over_predicted=mp,
            measured_over_predicted_reps=tuple(r.get("measured_over_predicted") for r in reps),
            busbw_mbps=busbw, busbw_over_link=busbw / link_mbps if busbw else None,
            datapath_load_mbps=max((f["datapath_load_mbps"] for f in measured), default=None),
            cpu_idle_min=min((f["cpu_idle"] for f in measured if f.get("cpu_idle") is not None), default=None),
            tcp_retransmits=tuple(f.get("tcp_retransmits") for f in measured),
            flags=tuple(sorted({f for r in reps for f in r.get("fidelity", {}).get("flags", [])
                                if f != "uncalibrated"})),
            within_target=within(mp))

    @classmethod
    def failed(cls, case: Case, algo: str, error: str, link_mbps: float, size: int = 0) -> ReplayRow:
        return cls.of(case, algo, {"status": "failed", "error": error}, link_mbps, size)

    def same_run(self, case: Case, algo: str) -> bool:
        return (self.topology, self.routing, self.seed, self.algorithm) == (case.topology, case.routing, case.seed,
                                                                           algo)

    def to_json(self) -> Json:
        return asdict(self)


@dataclass(frozen=True)
class NcclPacketRow:
    """One size of NCCL's all-reduce on one cluster: NCCL's choice and the model's time, and the packets' time on
    the real fabric's clock with its verdict (``trusted``, ``flagged``, ``failed``, or ``not run`` with why)."""

    cluster: str
    size: int
    choice: str
    model_us: float
    packets_us: float | None
    verdict: str
    link_mbps: float | None
    why_not_run: str | None = None

    @classmethod
    def measured(cls, cluster: str, m: Measured) -> NcclPacketRow:
        return cls(cluster, m.prediction.nbytes, choice_text(m.prediction), m.prediction.time_us, m.time_us,
                   m.verdict, m.link_mbps)

    @classmethod
    def not_run(cls, cluster: str, s: NotRun) -> NcclPacketRow:
        return cls(cluster, s.prediction.nbytes, choice_text(s.prediction), s.prediction.time_us, None, "not run",
                   None, s.why)

    @classmethod
    def failed(cls, cluster: str, prediction: cost.Prediction, error: str) -> NcclPacketRow:
        return cls(cluster, prediction.nbytes, choice_text(prediction), prediction.time_us, None, "failed", None,
                   error)

    @property
    def ratio(self) -> float | None:
        return None if self.packets_us is None else self.packets_us / self.model_us

    @property
    def passed(self) -> bool | None:
        """Within the target and trusted; None (unchecked) where nothing ran."""
        if self.verdict == "not run":
            return None
        return self.verdict == "trusted" and bool(within(self.ratio, TARGET_NCCL_PACKETS))

    def to_json(self) -> Json:
        return {**asdict(self), "ratio": self.ratio, "passed": self.passed}


def choice_text(p: cost.Prediction) -> str:
    """NCCL's choice as ``tree/ll128, 16 channels``."""
    return f"{p.algorithm}/{p.protocol}, {p.channels} channels"


@dataclass(frozen=True)
class HdrmMissing:
    """No replay row of hdrm on BiGraph 4/4/2 at the largest size."""

    size: int
    error: str = "no hdrm row on BiGraph 4/4/2"

    def to_json(self) -> Json:
        return {"error": self.error, "size": self.size}


@dataclass(frozen=True)
class PredictionSummary:
    """How many rows' measured / predicted times are within the target, and the worst one."""

    rows: int
    measured: int
    within: int
    beyond_worst: int
    worst: float | None
    passed: bool

    @classmethod
    def of(cls, rows: Sequence[ReplayRow]) -> PredictionSummary:
        ratios = [r.measured_over_predicted for r in rows if r.measured_over_predicted]
        worst = max(ratios, key=lambda x: abs(x - 1), default=None)
        inside = sum(1 for x in ratios if abs(x - 1) <= TARGET_PREDICTION)
        beyond = sum(1 for x in ratios if abs(x - 1) > TARGET_WORST)
        passed = bool(rows) and len(ratios) == len(rows) and inside >= TARGET_WITHIN_SHARE * len(rows) and beyond == 0
        return cls(len(rows), len(ratios), inside, beyond, worst, passed)


@dataclass(frozen=True)
class AgentsVsIperf:
    """Agents against iperf3 on the same flows: ``--bidir`` on one link
    (:func:`emulator.selfcheck.live.calibration.measure_agents_vs_iperf`), or every flow of a ring at once
    (:func:`~emulator.selfcheck.live.calibration.measure_agents_aggregate`); its document, which the results keep
    whole."""

    ratio: float | None
    agent_mbps: float
    iperf3_mbps: float
    document: Mapping[str, Any]

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> AgentsVsIperf:
        return cls(document.get("ratio"), document["agent_mbps"], document["iperf3_mbps"], document)

    def to_json(self) -> Json:
        return dict(self.document)


@dataclass(frozen=True)
class MpiPairRow:
    """One pair of :data:`~emulator.selfcheck.bench.cases.MPI_PAIRS` on one of
    :data:`~emulator.selfcheck.bench.cases.MPI_FABRICS` (its label): Open MPI's busbw over our agents'.

    ``complete`` is false for the rows of a section that failed as a whole: they carry the error and no
    figures, and their JSON only the keys they have.
    """

    fabric: str
    mpi_algorithm: str
    agents_algorithm: str
    ratio: float | None
    passed: bool | None
    mpi_error: str | None
    mpi_busbw_mbps: float | None = None
    agents_busbw_mbps: float | None = None
    mpi_status: str | None = None
    agents_status: str | None = None
    agents_error: str | None = None
    mpi_correct: bool = False
    mpi_cpu_idle: float | None = None
    mpi_flags: tuple[str, ...] = ()
    agents_flags: tuple[str, ...] = ()
    size: int = MPI_SIZE
    complete: bool = True
    #: Each run's time over the timing model's (emu mpirun's prediction of its last row; the agents' median).
    mpi_over_model: float | None = None
    agents_over_model: float | None = None

    @classmethod
    def of(cls, fabric: str, mpi_algo: str, agents_algo: str, mpi: Mapping[str, Any],
           agents: Mapping[str, Any]) -> MpiPairRow:
        """One pair's row from emu mpirun's and the replay's results documents."""
        rows = mpi.get("bench") or []
        mpi_bw = rows[-1]["busbw_mbps"] if rows and mpi.get("status") == "ok" else None
        agents_bw = agents.get("busbw_mbps_median") if agents.get("status") == "ok" else None
        reps = agents.get("repetitions") or []
        fid = mpi.get("fidelity") or {}
        ratio = mpi_bw / agents_bw if mpi_bw and agents_bw else None
        predictions = mpi.get("predictions") or []
        return cls(fabric, mpi_algo, agents_algo, ratio, ratio >= TARGET_MPI if ratio is not None else None,
                   mpi.get("error"), mpi_bw, agents_bw, mpi.get("status"), agents.get("status"), agents.get("error"),
                   mpi_correct=bool(rows) and all(r.get("wrong") == 0 for r in rows), mpi_cpu_idle=fid.get("cpu_idle"),
                   mpi_flags=tuple(fid.get("flags") or []),
                   agents_flags=tuple(sorted({f for r in reps for f in ((r.get("fidelity") or {}).get("flags") or [])})),
                   mpi_over_model=predictions[-1].get("measured_over_predicted") if predictions else None,
                   agents_over_model=agents.get("measured_over_predicted_median"))

    @classmethod
    def not_run(cls, fabric: str, mpi_algo: str, agents_algo: str, error: str) -> MpiPairRow:
        return cls(fabric, mpi_algo, agents_algo, None, None, error, complete=False)

    def to_json(self) -> Json:
        head = {"fabric": self.fabric, "mpi_algorithm": self.mpi_algorithm, "agents_algorithm": self.agents_algorithm, "size": self.size,
                "ratio": self.ratio, "pass": self.passed, "mpi_error": self.mpi_error}
        if not self.complete:
            return head
        return {**head, "mpi_busbw_mbps": self.mpi_busbw_mbps, "agents_busbw_mbps": self.agents_busbw_mbps,
                "mpi_status": self.mpi_status, "agents_status": self.agents_status, "agents_error": self.agents_error,
                "mpi_correct": self.mpi_correct, "mpi_cpu_idle": self.mpi_cpu_idle, "mpi_flags": list(self.mpi_flags),
                "agents_flags": list(self.agents_flags), "mpi_over_model": self.mpi_over_model,
                "agents_over_model": self.agents_over_model}


@dataclass(frozen=True)
class BringupTimes:
    """One bring-up and tear-down (``datapath``: the one ours used; plain Mininet's rows have none)."""

    up_s: float
    down_s: float
    datapath: str | None = None

    @property
    def total_s(self) -> float:
        return self.up_s + self.down_s

    def to_json(self) -> Json:
        out: Json = {"up_s": self.up_s, "down_s": self.down_s, "total_s": self.total_s}
        return out if self.datapath is None else {**out, "datapath": self.datapath}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


@dataclass(frozen=True)
class BringupSummary:
    """Our bring-ups against plain Mininet's on one topology: their medians and the ratio ours / plain."""

    topology: str
    hosts: int
    switches: int
    links: int
    ours: tuple[BringupTimes, ...]
    plain: tuple[BringupTimes, ...]

    def median(self, who: str, key: str) -> float | None:
        """The median of ``key`` (``up_s``, ``down_s``, ``total_s``) of ``who`` (``ours``, ``plain``)."""
        return _median([getattr(t, key) for t in getattr(self, who)])

    @property
    def up_ratio(self) -> float | None:
        return _ratio(self.median("ours", "up_s"), self.median("plain", "up_s"))

    def per_host(self, who: str, key: str) -> float | None:
        """:meth:`median` of ``key`` divided by the hosts."""
        value = self.median(who, key)
        return value / self.hosts if value is not None and self.hosts else None

    @property
    def total_ratio(self) -> float | None:
        return _ratio(self.median("ours", "total_s"), self.median("plain", "total_s"))

    def to_json(self) -> Json:
        out: Json = {"topology": self.topology, "hosts": self.hosts, "switches": self.switches, "links": self.links,
                     "ours": [t.to_json() for t in self.ours], "plain": [t.to_json() for t in self.plain]}
        for who in ("ours", "plain"):
            for key in ("up_s", "down_s", "total_s"):
                out[f"{who}_{key}"] = self.median(who, key)
        for key, ratio in (("up_ratio", self.up_ratio), ("total_ratio", self.total_ratio)):
            if ratio is not None:
                out[key] = ratio
        return out
