"""The calibration file of one MTU: what ``emu calibrate`` measured on this machine, typed.

:mod:`emulator.selfcheck.live.calibration` writes one file per MTU
(``$EF_STATE_DIR/calibration-mtuN.json``, default ``/var/lib/ef-emu``,
:func:`calibration_path`); the fidelity check (:func:`emulator.emulation.session.fidelity.assess`)
reads the datapath capacity from it, and the timing model and the agents the
intrinsic latency (:meth:`Calibration.intrinsic`). The layout (version
:data:`CALIBRATION_VERSION`):

* ``version``, ``quick``, ``minimal`` -- which calibration this is;
* ``machine`` -- the machine it describes (:class:`Machine`): kernel, Open
  vSwitch version and CPU count, which decide whether the file counts here
  (:func:`calibration_problem`), and the conditions it was made in;
* ``datapath_capacity_mbps`` (switch-hop Mbit/s, None when even the first
  rung of the ladder failed) with its ``datapath_capacity_unit``, and the
  ``recommended_link_mbps`` derived from it;
* ``one_link_ratio``, ``agent_over_iperf3`` -- in a full calibration only;
* ``agent_costs`` -- the agents' CPU seconds per message and per byte
  (:class:`emulator.runs.dilation.AgentCosts`); absent from a file made before
  they were measured (:meth:`Calibration.costs` then gives the defaults);
* ``latency`` -- the intrinsic latency per path length (:class:`LatencyCalibration`,
  what :func:`emulator.selfcheck.live.intrinsic_latency.summarise` returns);
* ``measurements`` -- every measurement's own document, as its function in
  :mod:`emulator.selfcheck.live.calibration` writes it (free-form: the capacity ladder, one
  link, agents against iperf3);
* ``duration_s`` -- how long the calibration took.

Keys this module does not know are kept and written back unchanged.
:meth:`Calibration.from_json` raises :class:`~emulator.base.errors.FieldError`
naming the field for a document it cannot read; :func:`load_calibration`
turns that into "no calibration".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from emulator.base.errors import MISSING, FieldError
from emulator.base.files import read_json, write_json_atomic
from emulator.emulation.machine.system import machine_identity
from emulator.model.latency import Intrinsic
from emulator.model.topology import DEFAULT_MTU
from emulator.runs.dilation import DEFAULT_AGENT_COSTS, AgentCosts, Envelope

CALIBRATION_VERSION = 2
CAPACITY_UNIT = "switch-hop Mbit/s: sum of bytes x switches traversed x 8 / seconds / 1e6"
#: The machine's properties a calibration is valid for (:func:`emulator.emulation.machine.system.machine_identity`).
IDENTITY_KEYS = ("kernel", "ovs_version", "nproc")
WHERE = "calibration"


def state_dir() -> str:
    return os.environ.get("EF_STATE_DIR", "/var/lib/ef-emu")


def calibration_path(mtu: int = DEFAULT_MTU) -> str:
    return os.path.join(state_dir(), f"calibration-mtu{mtu}.json")


# ------------------------------------------------------------- field readers
def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise FieldError(where, key, "a value", MISSING)
    return data[key]


def _number(data: Mapping[str, Any], key: str, where: str) -> float:
    """``data[key]`` as a float; :class:`FieldError` when it is absent or not a number."""
    value = _get(data, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(where, key, "a number", value)
    try:
        return float(value)
    except OverflowError:  # an integer past a float's range
        raise FieldError(where, key, "a number", value) from None


def _optional_number(data: Mapping[str, Any], key: str, where: str) -> float | None:
    """``data[key]`` as a float, None when absent or null."""
    return None if data.get(key) is None else _number(data, key, where)


def _int(data: Mapping[str, Any], key: str, where: str) -> int:
    value = _get(data, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(where, key, "an integer", value)
    return value


def _mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = _get(data, key, where)
    if not isinstance(value, Mapping):
        raise FieldError(where, key, "a mapping", value)
    return value


def _optional_mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    """``data[key]`` when it is a mapping, None when absent or null; :class:`FieldError` for anything else."""
    return None if data.get(key) is None else _mapping(data, key, where)


def _optional(data: Mapping[str, Any], key: str, kind: Callable[[Any], Any]) -> Any:
    value = data.get(key)
    return None if value is None else kind(value)


# ------------------------------------------------------------------- the parts
@dataclass(frozen=True)
class Machine:
    """The machine a calibration was made on, and the conditions it was made in."""

    kernel: str | None
    ovs_version: str | None
    nproc: int | None
    date: str | None = None  # ISO 8601, UTC
    datapath: str | None = None  # the Open vSwitch datapath the capacity was measured on
    mtu: int | None = None
    loadavg_before: list[float] = field(default_factory=list)
    loadavg_after: list[float] = field(default_factory=list)

    def identity(self) -> dict[str, Any]:
        """What :func:`emulator.emulation.machine.system.machine_identity` says of the machine that made the
        calibration."""
        return {key: getattr(self, key) for key in IDENTITY_KEYS}

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = f"{WHERE} machine") -> Machine:
        try:
            return cls(kernel=_optional(data, "kernel", str), ovs_version=_optional(data, "ovs_version", str),
                       nproc=_optional(data, "nproc", int), date=_optional(data, "date", str),
                       datapath=_optional(data, "datapath", str), mtu=_optional(data, "mtu", int),
                       loadavg_before=[float(x) for x in data.get("loadavg_before") or []],
                       loadavg_after=[float(x) for x in data.get("loadavg_after") or []])
        except (TypeError, ValueError, OverflowError) as exc:
            raise FieldError(where, "machine", "kernel, ovs_version, nproc, date, ... of the right types",
                             str(exc)) from None


@dataclass(frozen=True)
class PathMeasurement:
    """The latency probes over one path length (medians over ``messages`` exchanges, seconds)."""

    data_s: float  # sendall to the receiver's agent holding the message, less serialisation
    rendezvous_s: float  # receive posted to its clear to send in the sender's hand
    ack_s: float  # message received to its sender seeing the last byte acknowledged
    oneway_s: float  # half a ping's round trip, less serialisation
    agent_overhead_s: float  # data_s - oneway_s: the agents' own work per message
    data_p90_s: float
    messages: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> PathMeasurement:
        return cls(**{f.name: _number(data, f.name, where) for f in fields(cls) if f.name != "messages"},
                   messages=_int(data, "messages", where))


@dataclass(frozen=True)
class LatencyCalibration:
    """The intrinsic latency probes (:mod:`emulator.selfcheck.live.intrinsic_latency`): per path length, and the
    fitted curves."""

    link_mbps: float
    mtu: int
    bytes: int  # message size of the probes
    per_switches: dict[int, PathMeasurement]  # by switches crossed
    intrinsic: Intrinsic

    def to_json(self) -> dict[str, Any]:
        return {"link_mbps": self.link_mbps, "mtu": self.mtu, "bytes": self.bytes,
                "per_switches": {str(s): m.to_json() for s, m in sorted(self.per_switches.items())},
                "intrinsic": self.intrinsic.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = f"{WHERE} latency") -> LatencyCalibration:
        per = _mapping(data, "per_switches", where)
        try:
            switches = {int(s): m for s, m in per.items()}
        except ValueError:
            raise FieldError(where, "per_switches", "switch counts as keys", sorted(per)) from None
        for s, m in switches.items():
            if not isinstance(m, Mapping):
                raise FieldError(where, f"per_switches.{s}", "a mapping of the probes' medians", m)
        try:
            intrinsic = Intrinsic.from_json(_mapping(data, "intrinsic", where))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise FieldError(where, "intrinsic", "curves data, rendezvous and ack", str(exc)) from None
        return cls(link_mbps=_number(data, "link_mbps", where), mtu=_int(data, "mtu", where),
                   bytes=_int(data, "bytes", where),
                   per_switches={s: PathMeasurement.from_json(m, f"{where} per_switches {s}")
                                 for s, m in sorted(switches.items())},
                   intrinsic=intrinsic)


#: Written by a full calibration only (absent from a quick or minimal one's document).
_OPTIONAL_RATIOS = ("one_link_ratio", "agent_over_iperf3")


@dataclass(frozen=True)
class Calibration:
    """One calibration file (see the module docstring for the layout)."""

    version: int
    machine: Machine
    datapath_capacity_mbps: float | None
    recommended_link_mbps: float | None
    latency: LatencyCalibration | None
    quick: bool = False
    minimal: bool = False
    datapath_capacity_unit: str = CAPACITY_UNIT
    measurements: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    one_link_ratio: float | None = None
    agent_over_iperf3: float | None = None
    agent_costs: AgentCosts | None = None  # None: measured before the agents' costs were
    #: a document's keys this version does not know, written back as they were
    extra: dict[str, Any] = field(default_factory=dict)

    def intrinsic(self) -> Intrinsic:
        """The intrinsic latency this calibration measured, its source naming the calibration's date
        (none measured: zero, and the model says so)."""
        if self.latency is None:
            return Intrinsic()
        it = self.latency.intrinsic
        return Intrinsic(it.data, it.rendezvous, it.ack, source=f"emu calibrate of {self.machine.date or '?'}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, "version": self.version, "machine": self.machine.to_json(),
                               "quick": self.quick, "minimal": self.minimal,
                               "datapath_capacity_mbps": self.datapath_capacity_mbps,
                               "datapath_capacity_unit": self.datapath_capacity_unit,
                               "recommended_link_mbps": self.recommended_link_mbps,
                               "measurements": self.measurements, "duration_s": self.duration_s}
        if self.latency is not None:
            out["latency"] = self.latency.to_json()
        for key in _OPTIONAL_RATIOS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.agent_costs is not None:
            out["agent_costs"] = self.agent_costs.to_json()
        return out

    def costs(self) -> AgentCosts:
        """The agents' measured costs, else this project's defaults (a calibration made before they were measured)."""
        return self.agent_costs if self.agent_costs is not None else DEFAULT_AGENT_COSTS

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        """Read a calibration document; :class:`FieldError` naming the field when it is not one."""
        latency = _optional_mapping(data, "latency", WHERE)
        cal = cls(version=_int(data, "version", WHERE), machine=Machine.from_json(_mapping(data, "machine", WHERE)),
                  datapath_capacity_mbps=_optional_number(data, "datapath_capacity_mbps", WHERE),
                  recommended_link_mbps=_optional_number(data, "recommended_link_mbps", WHERE),
                  latency=LatencyCalibration.from_json(latency) if latency is not None else None,
                  quick=bool(data.get("quick", False)), minimal=bool(data.get("minimal", False)),
                  datapath_capacity_unit=str(data.get("datapath_capacity_unit", CAPACITY_UNIT)),
                  measurements=dict(_optional_mapping(data, "measurements", WHERE) or {}),
                  duration_s=_optional_number(data, "duration_s", WHERE),
                  one_link_ratio=_optional_number(data, "one_link_ratio", WHERE),
                  agent_over_iperf3=_optional_number(data, "agent_over_iperf3", WHERE),
                  agent_costs=_agent_costs(data.get("agent_costs")))
        known = {f.name for f in fields(cls)} - {"extra"}
        return replace(cal, extra={k: v for k, v in data.items() if k not in known})


def _agent_costs(data: Any) -> AgentCosts | None:
    if data is None:
        return None
    where = f"{WHERE} agent_costs"
    if not isinstance(data, Mapping):
        raise FieldError(WHERE, "agent_costs", "a mapping of per_message_s and per_byte_s", data)
    costs = AgentCosts(_number(data, "per_message_s", where), _number(data, "per_byte_s", where),
                       str(data.get("source", "")))
    if costs.per_message_s < 0 or costs.per_byte_s < 0:
        raise FieldError(where, "per_message_s", "CPU seconds of at least 0", data)
    return costs


def save_calibration(calibration: Calibration, mtu: int) -> str:
    """Write ``calibration`` as the calibration file of ``mtu`` (atomically); returns its path."""
    path = calibration_path(mtu)
    write_json_atomic(path, calibration.to_json())
    return path


# ------------------------------------------------------------------- loading
def calibration_problem(data: Any, identity: Mapping[str, Any]) -> str | None:
    """Why ``data`` (a document as read) is not a calibration of the machine ``identity`` describes (None if it is)."""
    if not isinstance(data, Mapping) or data.get("version") != CALIBRATION_VERSION:
        return f"not a version {CALIBRATION_VERSION} calibration"
    try:
        machine = Calibration.from_json(data).machine.to_json()
    except FieldError as exc:
        return str(exc)
    for key, value in identity.items():
        if machine.get(key) != value:
            return f"made with {key} {machine.get(key)!r}, this machine has {value!r}"
    return None


def load_calibration(mtu: int = DEFAULT_MTU, identity: Mapping[str, Any] | None = None) -> Calibration | None:
    """This machine's calibration at ``mtu``, or None (none made, unreadable, or made on another machine).

    ``identity`` defaults to this machine's (:func:`emulator.emulation.machine.system.machine_identity`).
    """
    data = read_json(calibration_path(mtu))
    if not isinstance(data, Mapping) or calibration_problem(data, machine_identity() if identity is None
                                                            else identity) is not None:
        return None
    return Calibration.from_json(data)


def envelope(calibration: Calibration | None, cores: int | None) -> Envelope:
    """What ``calibration`` says this machine gives an emulation on ``cores`` cores (no calibration: no capacity
    known, the default agent costs)."""
    return Envelope(calibration.datapath_capacity_mbps if calibration is not None else None,
                    calibration.costs() if calibration is not None else DEFAULT_AGENT_COSTS, cores or 1)
