"""The results document of one replay (``results.json``), typed, with its schema version.

Every writer and reader of ``results.json`` goes through this module:
``emu replay`` and the runner build a :class:`CellResults` and
:meth:`CellResults.save` it after every repetition; the report, the runner's
resume logic, the probe and ``emu bench`` read it back with :func:`load`.

The layout (schema :data:`SCHEMA_VERSION`):

* ``schema`` -- this version; a document without it is schema 1, which has
  the same layout and is read as such, as are schemas 2 and 3 (results of
  earlier runs resume and report as before, their trust judged again by
  today's rule);
* ``config`` -- the input echoed back (the replay's or the cell's settings,
  the schedule's algorithm, ranks and size, topology, routing, seed,
  repetitions, MTU), free-form because each entry point echoes its own;
* ``fabric``, ``latency``, ``prediction`` -- the documents of the fabric
  profile, the latency model and ``schedule check``'s prediction, as their
  owners write them (:meth:`emulator.model.fabric.FabricProfile.to_json`,
  :meth:`emulator.model.latency.LatencyModel.to_json`,
  :meth:`emulator.model.prediction.check.CheckReport.to_json`);
* ``link_mbps``, ``switch_link_mbps``, ``datapath``, ``bringup_s`` -- the
  network as it was built;
* ``repetitions`` and ``warmup`` -- one :class:`Repetition` each (a
  fidelity's ``cpu_idle`` is null where the CPU counters did not advance:
  schema 4);
* ``busbw_mbps_median``, ``time_s_median``,
  ``measured_over_predicted_median``, ``trusted`` (true only when every
  check had its data and passed), ``verdict`` (``trusted``, ``flagged`` or
  ``unchecked``), ``flags`` and ``unchecked`` (the failed checks' flags, the
  checks without data: :class:`emulator.runs.trust.Trust`; schema 4) -- over
  the measured repetitions, present once there is one
  (:meth:`CellResults.summary`);
  for a schedule with compute (a training iteration, a trace: schema 3)
  also ``iteration_s_median``, ``compute_only_s`` and
  ``scaling_efficiency_median`` (compute-only time / iteration time, both
  emulated seconds; every repetition carries its own);
* ``status`` (``running``, ``ok``, ``failed``, ``interrupted``), ``outcome``
  (the status, or ``degraded`` when a fault fired), ``error``;
* ``faults`` -- one record per fault of the plan (:mod:`emulator.runs.fault_plan`);
* ``probe`` -- the network's probe (:class:`ProbeVerdict`), added by ``emu run``.

Keys this module does not know are kept and written back unchanged, so a
newer writer's additions survive an older reader's rewrite.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from emulator.base.files import read_json_object, write_json_atomic
from emulator.runs import clocks, trust
from emulator.runs.trust import Trust, Verdict

SCHEMA_VERSION = 4

#: Fault records are the documents of :mod:`emulator.runs.fault_plan` (action, target, when it fired, what it hit).
FaultRecord = dict[str, Any]


class SchemaError(ValueError):
    """A results document that this version cannot read (a newer schema, or not a results document)."""


@dataclass
class Fidelity:
    """What :func:`emulator.emulation.session.fidelity.assess` found about one repetition.

    ``cpu_idle`` is None where it is unknown (the CPU counters did not advance, or the repetition was flagged
    after it ran without having been assessed: :meth:`unmeasured`); ``trusted`` is False once a flag failed it.
    """

    cpu_idle: float | None
    datapath_load_mbps: float
    datapath_capacity_mbps: float
    qdisc_drops: int = 0
    tcp_retransmits: int = 0
    latency_floor_switches: list[int] = field(default_factory=list)
    late_fraction: float | None = None
    lag_share: float | None = None  # the worst rank's agent lag, share of the repetition (None: not measured)
    lag_rank: int | None = None
    flags: list[str] = field(default_factory=list)
    trusted: bool = True

    @classmethod
    def unmeasured(cls) -> Fidelity:
        """A repetition's fidelity where nothing was assessed (to carry a flag added later): nothing measured."""
        return cls(cpu_idle=None, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0)

    def flag(self, name: str) -> None:
        """Add ``name`` to the flags and mark the repetition untrusted."""
        self.flags = sorted({*self.flags, name})
        self.trusted = False

    @property
    def trust(self) -> Trust:
        """The machine's checks of the repetition: its flags, and the CPU idle time where it is unknown."""
        cpu = Trust(unchecked=(trust.CPU_IDLE,)) if self.cpu_idle is None else Trust()
        return trust.flags_check(self.flags, self.trusted) + cpu

    def to_json(self) -> dict[str, Any]:
        """Every field; the agents' lag only where it was measured (documents written before it stay as they were)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("lag_share", "lag_rank"):
            if doc[name] is None:
                del doc[name]
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fidelity:
        idle = data.get("cpu_idle")
        return cls(cpu_idle=float(idle) if idle is not None else None,
                   datapath_load_mbps=float(data.get("datapath_load_mbps", 0.0)),
                   datapath_capacity_mbps=float(data.get("datapath_capacity_mbps", 0.0)),
                   qdisc_drops=int(data.get("qdisc_drops", 0)), tcp_retransmits=int(data.get("tcp_retransmits", 0)),
                   latency_floor_switches=list(data.get("latency_floor_switches") or []),
                   late_fraction=data.get("late_fraction"), lag_share=data.get("lag_share"),
                   lag_rank=data.get("lag_rank"), flags=list(data.get("flags") or []),
                   trusted=bool(data.get("trusted", True)))


@dataclass
class StepTime:
    """One step of one repetition: from its first send to its last receive."""

    step: int
    start_s: float  # from the repetition's start
    time_s: float
    predicted_s: float | None = None
    measured_over_predicted: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "start_s": self.start_s, "time_s": self.time_s}
        if self.predicted_s is not None or self.measured_over_predicted is not None:
            out.update(predicted_s=self.predicted_s, measured_over_predicted=self.measured_over_predicted)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepTime:
        return cls(step=int(data["step"]), start_s=float(data["start_s"]), time_s=float(data["time_s"]),
                   predicted_s=data.get("predicted_s"), measured_over_predicted=data.get("measured_over_predicted"))


@dataclass(frozen=True)
class Iteration:
    """A repetition of a schedule with compute: its time, the time its compute alone takes, and their ratio."""

    iteration_s: float
    compute_only_s: float
    #: per kind of process group (:mod:`emulator.model.prediction.group_share`): its communication's share of the
    #: iteration, measured, and the timing model's for the same schedule
    comm_share: dict[str, float] = field(default_factory=dict)
    model_comm_share: dict[str, float] = field(default_factory=dict)

    @property
    def scaling_efficiency(self) -> float:
        """Compute-only time over iteration time: 1 when communication hides entirely behind compute."""
        return self.compute_only_s / self.iteration_s if self.iteration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"iteration_s": self.iteration_s, "compute_only_s": self.compute_only_s,
                               "scaling_efficiency": self.scaling_efficiency}
        if self.comm_share:
            out.update(comm_share=self.comm_share, model_comm_share=self.model_comm_share)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Iteration | None:
        if data.get("iteration_s") is None:
            return None
        return cls(float(data["iteration_s"]), float(data.get("compute_only_s") or 0.0),
                   {str(k): float(v) for k, v in (data.get("comm_share") or {}).items()},
                   {str(k): float(v) for k, v in (data.get("model_comm_share") or {}).items()})


@dataclass
class Repetition:
    """One repetition: time, algbw/busbw (nccl-tests definitions, Mbit/s), steps, correctness, fidelity."""

    rep: int
    time_s: float
    algbw_mbps: float
    busbw_mbps: float
    steps: list[StepTime] = field(default_factory=list)
    start_monotonic: float = 0.0
    correct: bool = True
    predicted_time_s: float | None = None
    measured_over_predicted: float | None = None
    fidelity: Fidelity | None = None
    faults: list[FaultRecord] = field(default_factory=list)
    iteration: Iteration | None = None
    agents_cpu_s: float | None = None  # every agent's CPU seconds in the repetition, summed (None: not reported)

    @property
    def trust(self) -> Trust:
        """Unchecked without fidelity data, else its fidelity's checks."""
        return self.fidelity.trust if self.fidelity is not None else Trust(unchecked=(trust.NO_FIDELITY,))

    @property
    def trusted(self) -> bool:
        """Every check of the repetition had its data and passed."""
        return self.trust.verdict is Verdict.TRUSTED

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rep": self.rep, "time_s": self.time_s, "algbw_mbps": self.algbw_mbps,
                               "busbw_mbps": self.busbw_mbps, "steps": [s.to_json() for s in self.steps],
                               "start_monotonic": self.start_monotonic, "correct": self.correct,
                               "faults": self.faults}
        if self.predicted_time_s is not None:
            out.update(predicted_time_s=self.predicted_time_s, measured_over_predicted=self.measured_over_predicted)
        if self.fidelity is not None:
            out["fidelity"] = self.fidelity.to_json()
        if self.iteration is not None:
            out.update(self.iteration.to_json())
        if self.agents_cpu_s is not None:
            out["agents_cpu_s"] = self.agents_cpu_s
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Repetition:
        fid = data.get("fidelity")
        return cls(rep=int(data.get("rep", 0)), time_s=float(data["time_s"]),
                   algbw_mbps=float(data.get("algbw_mbps", 0.0)), busbw_mbps=float(data["busbw_mbps"]),
                   steps=[StepTime.from_json(s) for s in data.get("steps") or []],
                   start_monotonic=float(data.get("start_monotonic", 0.0)), correct=bool(data.get("correct", True)),
                   predicted_time_s=data.get("predicted_time_s"),
                   measured_over_predicted=data.get("measured_over_predicted"),
                   fidelity=Fidelity.from_json(fid) if isinstance(fid, Mapping) else None,
                   faults=list(data.get("faults") or []), iteration=Iteration.from_json(data),
                   agents_cpu_s=float(data["agents_cpu_s"]) if data.get("agents_cpu_s") is not None else None)


@dataclass(frozen=True)
class ProbeVerdict:
    """The probe of the network a cell ran on (:mod:`emulator.runs.network_probe`)."""

    passed: bool
    pair: tuple[str, str]
    measured_s: float | None  # median over the measured repetitions
    predicted_s: float
    ratio: float | None  # measured / predicted
    reason: str  # one line: why it failed, or "ok"

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "pair": list(self.pair), "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "ratio": self.ratio, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeVerdict:
        a, b = data.get("pair") or ("", "")
        return cls(passed=bool(data.get("passed")), pair=(str(a), str(b)), measured_s=data.get("measured_s"),
                   predicted_s=float(data.get("predicted_s") or 0.0), ratio=data.get("ratio"),
                   reason=str(data.get("reason", "")))


@dataclass(frozen=True)
class Summary:
    """Medians over the measured repetitions, and the cell's checks (:meth:`CellResults.trust`)."""

    busbw_mbps: float
    time_s: float
    measured_over_predicted: float | None
    trust: Trust
    iteration_s: float | None = None
    compute_only_s: float | None = None
    scaling_efficiency: float | None = None

    @property
    def verdict(self) -> Verdict:
        return self.trust.verdict

    @property
    def trusted(self) -> bool:
        """Every check had its data and passed (unchecked is not trusted)."""
        return self.trust.verdict is Verdict.TRUSTED


#: The keys of the document that :class:`CellResults` owns; the rest go to ``extra`` and back.
_SUMMARY_KEYS = ("busbw_mbps_median", "time_s_median", "measured_over_predicted_median", "trusted", "verdict",
                 "flags", "unchecked", "iteration_s_median", "compute_only_s", "scaling_efficiency_median")


@dataclass
class CellResults:
    """``results.json`` of one replay (see the module docstring for the layout)."""

    config: dict[str, Any] = field(default_factory=dict)
    fabric: dict[str, Any] | None = None
    latency: dict[str, Any] = field(default_factory=dict)
    prediction: dict[str, Any] = field(default_factory=dict)
    link_mbps: float | None = None
    switch_link_mbps: float | None = None
    datapath: str | None = None
    bringup_s: float | None = None
    repetitions: list[Repetition] = field(default_factory=list)
    warmup: list[Repetition] = field(default_factory=list)
    status: str = "running"
    outcome: str = "running"
    error: str | None = None
    faults: list[FaultRecord] = field(default_factory=list)
    probe: ProbeVerdict | None = None
    #: on a cluster: each other server's clock against the head's when the agents started (ClockOffset.to_json)
    clocks: list[dict[str, Any]] = field(default_factory=list)
    #: with a servers' interconnect: how many transfers its arbiter timed, and the most it woke late for one
    #: (``flows``, ``arbiter_late_max_s``; emulator.emulation.agents.interconnect)
    domain: dict[str, Any] | None = None
    #: a document's keys this version does not know, written back as they were
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted_time_s(self) -> float | None:
        value = self.prediction.get("predicted_time_s")
        return float(value) if value is not None else None

    @property
    def finished(self) -> bool:
        return self.status == "ok"

    def cell_id(self) -> str | None:
        """The id of the ``emu run`` cell this replay ran (None for a plain ``emu replay``)."""
        cell = self.config.get("cell")
        return cell.get("id") if isinstance(cell, Mapping) else None

    def summary(self) -> Summary | None:
        """Medians over the measured repetitions; None before the first one."""
        if not self.repetitions:
            return None
        time_s = statistics.median(r.time_s for r in self.repetitions)
        predicted = self.predicted_time_s
        ratio = time_s / predicted if predicted else None
        iterations = [r.iteration for r in self.repetitions if r.iteration is not None]
        return Summary(busbw_mbps=statistics.median(r.busbw_mbps for r in self.repetitions), time_s=time_s,
                       measured_over_predicted=ratio, trust=self._trust(ratio),
                       iteration_s=statistics.median(i.iteration_s for i in iterations) if iterations else None,
                       compute_only_s=iterations[0].compute_only_s if iterations else None,
                       scaling_efficiency=(statistics.median(i.scaling_efficiency for i in iterations)
                                           if iterations else None))

    def _trust(self, ratio: float | None) -> Trust:
        """Every measured repetition's checks, the clocks' (on a cluster) and the measured/model time's against
        :data:`emulator.runs.trust.REPLAY_BAND`."""
        clock = clocks.check(self.clocks, self.prediction.get("per_step") or []) if self.clocks else Trust()
        return (trust.combine(r.trust for r in self.repetitions) + clock
                + trust.model_check(ratio, trust.REPLAY_BAND))

    def trust(self) -> Trust | None:
        """The cell's checks (:class:`emulator.runs.trust.Trust`); None before the first measured repetition."""
        summary = self.summary()
        return summary.trust if summary is not None else None

    @property
    def trusted(self) -> bool | None:
        """Every check had its data and passed; None before the first measured repetition."""
        summary = self.summary()
        return summary.trusted if summary is not None else None

    def flags(self) -> list[str]:
        """Every fidelity flag of a measured repetition, and the cell's own (``model_disagrees``)."""
        summary = self.summary()
        own = summary.trust.flags if summary is not None else ()
        return sorted({*own, *(f for r in self.repetitions if r.fidelity is not None for f in r.fidelity.flags)})

    def flag_all(self, name: str) -> None:
        """Flag every repetition (warm-up included) with ``name``, which makes the result untrusted; a
        repetition without fidelity data gets one that measured nothing (:meth:`Fidelity.unmeasured`)."""
        for rep in [*self.warmup, *self.repetitions]:
            if rep.fidelity is None:
                rep.fidelity = Fidelity.unmeasured()
            rep.fidelity.flag(name)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, "schema": SCHEMA_VERSION, "config": self.config,
                               "fabric": self.fabric, "latency": self.latency, "prediction": self.prediction,
                               "link_mbps": self.link_mbps, "switch_link_mbps": self.switch_link_mbps,
                               "datapath": self.datapath, "bringup_s": self.bringup_s,
                               "repetitions": [r.to_json() for r in self.repetitions],
                               "warmup": [r.to_json() for r in self.warmup], "status": self.status,
                               "outcome": self.outcome, "error": self.error, "faults": self.faults}
        summary = self.summary()
        if summary is not None:
            out.update(busbw_mbps_median=summary.busbw_mbps, time_s_median=summary.time_s,
                       measured_over_predicted_median=summary.measured_over_predicted, trusted=summary.trusted,
                       **summary.trust.to_json())
            if summary.iteration_s is not None:
                out.update(iteration_s_median=summary.iteration_s, compute_only_s=summary.compute_only_s,
                           scaling_efficiency_median=summary.scaling_efficiency)
        if self.probe is not None:
            out["probe"] = self.probe.to_json()
        if self.clocks:
            out["clocks"] = self.clocks
        if self.domain is not None:
            out["domain"] = self.domain
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellResults:
        """Read a document of schema 1 or :data:`SCHEMA_VERSION`; :class:`SchemaError` for anything else."""
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA_VERSION:
            raise SchemaError(f"results schema {schema!r}: this version reads schemas 1..{SCHEMA_VERSION}")
        try:
            probe = data.get("probe")
            res = cls(config=dict(data.get("config") or {}), fabric=data.get("fabric"),
                      latency=dict(data.get("latency") or {}), prediction=dict(data.get("prediction") or {}),
                      link_mbps=data.get("link_mbps"), switch_link_mbps=data.get("switch_link_mbps"),
                      datapath=data.get("datapath"), bringup_s=data.get("bringup_s"),
                      repetitions=[Repetition.from_json(r) for r in data.get("repetitions") or []],
                      warmup=[Repetition.from_json(r) for r in data.get("warmup") or []],
                      status=str(data.get("status", "running")), outcome=str(data.get("outcome") or data.get("status")
                                                                             or "running"),
                      error=data.get("error"), faults=list(data.get("faults") or []),
                      probe=ProbeVerdict.from_json(probe) if isinstance(probe, Mapping) else None,
                      clocks=list(data.get("clocks") or []),
                      domain=dict(data["domain"]) if isinstance(data.get("domain"), Mapping) else None)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"not a results document ({type(exc).__name__}: {exc})") from None
        known = {f.name for f in fields(cls)} | set(_SUMMARY_KEYS) | {"schema"}
        res.extra = {k: v for k, v in data.items() if k not in known}
        return res

    def save(self, path: str) -> None:
        write_json_atomic(path, self.to_json())


def load(path: str) -> CellResults | None:
    """The results at ``path``; None when the file is missing, unreadable, or not a results document we can read."""
    data = read_json_object(path)
    if data is None:
        return None
    try:
        return CellResults.from_json(data)
    except SchemaError:
        return None
