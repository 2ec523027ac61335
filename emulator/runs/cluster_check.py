"""``emu cluster check``'s findings: what each server of a cluster has, compared with the head's.

Pure: the probes that read a server (:mod:`emulator.emulation.cluster.cluster_probe`)
fill in one :class:`ServerFindings` per server; :func:`failures` compares
them with the head's and with what the cluster file promises, one
:class:`Failure` (server, check, expected, found) per problem; :func:`table`
and :func:`document` render them. The checks:

* **ssh**: a command runs there (the head's run locally, ``local``);
* **kernel**, **ovs**, **mininet**, **project**: each server's equals the
  head's (Mininet as the project imports it, and the project's version with
  a digest of its code, both read with the head's interpreter path: the
  project must be installed at the same path on every server);
* **mtu**: a VXLAN tunnel between the head and the server carries frames of
  the cluster file's ``underlay_mtu`` less the VXLAN overhead, unfragmented
  (:func:`tunnel_names` names what the probe creates);
* **clock**: the server's clock against the head's (:func:`offset_from`),
  with chrony's own estimate where it runs; reported, never failed on;
* **calibration**: the server has a calibration of its own at the fabric's
  MTU, or one was made (a minimal one, as one machine makes it).

A server that ssh cannot reach gets the one failure for ssh and no other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.errors import FieldError, printable
from emulator.base.naming import CHECK_NAMESPACE_PREFIX, NAME_PREFIX
from emulator.runs.cluster_file import VXLAN_OVERHEAD, Cluster

#: What a version check reads, by check name: (the column's title, what is run there).
VERSION_CHECKS = {
    "kernel": ("kernel", "uname -r"),
    "ovs": ("Open vSwitch", "ovs-vsctl --version"),
    "mininet": ("Mininet", "mininet.net.VERSION, imported by the project's interpreter"),
    "project": ("project", "the project's version and code digest"),
}
#: The checks, in the order of the table's columns and of the failure lines.
CHECKS = ("ssh", *VERSION_CHECKS, "mtu", "clock", "calibration")
#: The probe's tunnel: VNIs from here up (24 bits), the UDP port, the two ends' addresses (a /30 of its own).
PROBE_VNI_BASE = 0xEF0000
PROBE_DSTPORT = 4789
PROBE_ADDRESSES = ("10.254.0.1", "10.254.0.2")
PROBE_PREFIX = 30
#: Echo requests the probe sends through the tunnel.
PROBE_PINGS = 3
#: The header bytes of an ICMP echo over IPv4: ping's -s is the MTU less these.
ICMP_HEADERS = 28


@dataclass(frozen=True)
class Reading:
    """One value read on a server (``value``), or why it could not be read (``error``)."""

    value: str | None
    error: str = ""

    @property
    def text(self) -> str:
        return self.value if self.value is not None else "?"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "error": self.error}


@dataclass(frozen=True)
class Versions:
    """The versions a server runs (:data:`VERSION_CHECKS`)."""

    kernel: Reading
    ovs: Reading
    mininet: Reading
    project: Reading

    def items(self) -> list[tuple[str, Reading]]:
        return [(check, getattr(self, check)) for check in VERSION_CHECKS]

    def to_json(self) -> dict[str, Any]:
        return {check: reading.to_json() for check, reading in self.items()}


@dataclass(frozen=True)
class Ssh:
    """Whether a command ran on the server over ssh, and how long the round trip (a login included) took."""

    ok: bool
    local: bool = False  # the head: its checks run here, without ssh
    rtt_s: float | None = None
    error: str = ""

    @property
    def text(self) -> str:
        if self.local:
            return "local"
        return f"ok {self.rtt_s * 1e3:.0f} ms" if self.ok and self.rtt_s is not None else "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "local": self.local, "rtt_s": self.rtt_s, "error": self.error}


@dataclass(frozen=True)
class ClockSample:
    """One reading of a server's clock: the head's clock when the command was sent and when its answer came,
    the server's clock in between (all CLOCK_REALTIME, seconds)."""

    sent: float
    remote: float
    received: float

    @property
    def rtt_s(self) -> float:
        return self.received - self.sent


@dataclass(frozen=True)
class ClockOffset:
    """The server's clock less the head's (``offset_s``), within ``± uncertainty_s``; chrony's own line."""

    offset_s: float | None
    uncertainty_s: float | None
    samples: int = 0
    chrony: str = ""  # chronyc tracking's "System time", or why there is none
    error: str = ""

    @property
    def text(self) -> str:
        if self.offset_s is None or self.uncertainty_s is None:
            return "?"
        if self.samples == 0:
            return "0"
        return f"{self.offset_s * 1e3:+.3f} ms ± {self.uncertainty_s * 1e3:.3f}"

    def to_json(self) -> dict[str, Any]:
        return {"offset_s": self.offset_s, "uncertainty_s": self.uncertainty_s, "samples": self.samples,
                "chrony": self.chrony, "error": self.error}


def offset_from(samples: Sequence[ClockSample], chrony: str = "") -> ClockOffset:
    """The offset of the sample with the shortest round trip: the server read its clock somewhere in that round
    trip, so its clock less the round trip's midpoint is the offset, to within half the round trip."""
    if not samples:
        return ClockOffset(None, None, 0, chrony, "no clock reading")
    best = min(samples, key=lambda s: s.rtt_s)
    return ClockOffset(best.remote - (best.sent + best.received) / 2, best.rtt_s / 2, len(samples), chrony)


#: The head's own row: its clock is the reference.
HEAD_CLOCK = ClockOffset(0.0, 0.0, 0)


@dataclass(frozen=True)
class TunnelNames:
    """What the MTU probe creates on both ends: a network namespace, a VXLAN device (in the root namespace, then
    moved into the namespace) and the VXLAN id."""

    namespace: str
    device: str
    vni: int


def tunnel_names(server: str, index: int, pid: int) -> TunnelNames:
    """The probe's names for the tunnel to ``server`` (the ``index``-th server of the check run by process ``pid``):
    the project's prefix, a device name of at most 15 characters, a VNI no other check of the moment uses."""
    vni = PROBE_VNI_BASE + (pid * 64 + index) % 0x10000
    return TunnelNames(f"{CHECK_NAMESPACE_PREFIX}{server}", f"{NAME_PREFIX}vx{vni:x}", vni)


@dataclass(frozen=True)
class Tunnel:
    """Whether frames of ``mtu`` crossed the tunnel between the head and the server whole; ``detail`` says how
    many echo replies came back, or what failed."""

    mtu: int
    ok: bool
    detail: str = ""

    @property
    def text(self) -> str:
        return "ok" if self.ok else "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {"mtu": self.mtu, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class CalibrationStatus:
    """A server's calibration at one MTU, as ``emu cluster calibration`` reports it there."""

    path: str
    mtu: int
    found: bool  # a calibration of that machine is there (made now or earlier)
    minimal: bool = False
    quick: bool = False
    date: str | None = None
    problem: str | None = None  # why a file that is there does not count for that machine
    made: bool = False  # made by this check
    error: str = ""  # the probe itself failed

    @property
    def text(self) -> str:
        if self.error:
            return "?"
        if not self.found:
            return f"none at MTU {self.mtu}"
        kind = "minimal" if self.minimal else "quick" if self.quick else "full"
        return f"{'made ' if self.made else ''}{kind} {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "mtu": self.mtu, "found": self.found, "minimal": self.minimal,
                "quick": self.quick, "date": self.date, "problem": self.problem, "made": self.made,
                "error": self.error}

    @classmethod
    def from_json(cls, data: object, where: str = "calibration status") -> CalibrationStatus:
        """Read what ``emu cluster calibration --json`` printed; :class:`FieldError` naming what is wrong."""
        if not isinstance(data, dict):
            raise FieldError(where, "(document)", "a mapping", data)
        for key, kind in (("path", str), ("mtu", int), ("found", bool)):
            if not isinstance(data.get(key), kind):
                raise FieldError(where, key, f"a {kind.__name__}", data.get(key))
        date, problem = data.get("date"), data.get("problem")
        return cls(data["path"], data["mtu"], data["found"], bool(data.get("minimal")), bool(data.get("quick")),
                   date if isinstance(date, str) else None, problem if isinstance(problem, str) else None,
                   bool(data.get("made")))


@dataclass(frozen=True)
class ServerFindings:
    """Everything the check found on one server (None: not checked, the server not reached)."""

    name: str
    head: bool
    ssh: Ssh
    versions: Versions | None = None
    clock: ClockOffset | None = None
    tunnel: Tunnel | None = None  # None on the head: no tunnel to itself
    calibration: CalibrationStatus | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "head": self.head, "ssh": self.ssh.to_json(),
                "versions": self.versions.to_json() if self.versions else None,
                "clock": self.clock.to_json() if self.clock else None,
                "tunnel": self.tunnel.to_json() if self.tunnel else None,
                "calibration": self.calibration.to_json() if self.calibration else None}


@dataclass(frozen=True)
class Failure:
    """One check that failed on one server."""

    server: str
    check: str
    expected: str
    found: str

    @property
    def line(self) -> str:
        return f"server {self.server}: {self.check}: expected {self.expected}, found {self.found}"

    def to_json(self) -> dict[str, Any]:
        return {"server": self.server, "check": self.check, "expected": self.expected, "found": self.found,
                "line": self.line}


def tunnel_mtu(cluster: Cluster) -> int:
    """The frames the cluster file says a tunnel carries whole: its underlay MTU less VXLAN's overhead."""
    return cluster.underlay_mtu - VXLAN_OVERHEAD


def failures(cluster: Cluster, findings: Sequence[ServerFindings], python: str) -> list[Failure]:
    """Every failed check, server by server in the cluster file's order, checks in :data:`CHECKS`' order.

    ``python`` is the head's interpreter, which reads the project's version on every server.
    """
    head = next((f for f in findings if f.head), None)
    out: list[Failure] = []
    for f in findings:
        if not f.ssh.ok:
            server = cluster.server(f.name)
            out.append(Failure(f.name, "ssh", f"a command to run as {server.user}@{server.ssh}:{server.port} "
                               f"with the key {server.key}", _one_line(f.ssh.error) or "no answer"))
            continue
        if f.versions is not None:
            out += _version_failures(f, head.versions if head is not None else None, python)
        if f.tunnel is not None and not f.tunnel.ok:
            out.append(Failure(f.name, "mtu", f"{f.tunnel.mtu}-byte packets through a VXLAN tunnel from "
                               f"{cluster.head} unfragmented (underlay_mtu {cluster.underlay_mtu} less "
                               f"{VXLAN_OVERHEAD})", _one_line(f.tunnel.detail)))
        if f.clock is not None and f.clock.error:
            out.append(Failure(f.name, "clock", "its clock read with date +%s.%N", _one_line(f.clock.error)))
        c = f.calibration
        if c is not None and (c.error or not c.found):
            out.append(Failure(f.name, "calibration", f"a calibration of {f.name} at MTU {c.mtu} (or a minimal "
                               "one made)", _one_line(c.error or c.problem or f"none at {c.path}")))
    return out


def _version_failures(f: ServerFindings, head: Versions | None, python: str) -> list[Failure]:
    assert f.versions is not None
    out = []
    for check, reading in f.versions.items():
        title, how = VERSION_CHECKS[check]
        where = f"the project installed for {python} (the same path on every server)" if check == "project" \
            else f"{title} ({how})"
        if reading.value is None:
            out.append(Failure(f.name, check, where, _one_line(reading.error) or "no answer"))
            continue
        want = getattr(head, check).value if head is not None else None
        if not f.head and want is not None and reading.value != want:
            extra = f" from {python} (the project must be installed at the same path on every server)" \
                if check == "project" else ""
            out.append(Failure(f.name, check, f"{title} {want}, the head's{extra}", reading.value))
    return out


def _one_line(text: str) -> str:
    """The last non-empty line of a command's error output (the one that says why), printable."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return printable(lines[-1]) if lines else ""


def table(cluster: Cluster, findings: Sequence[ServerFindings], found: Sequence[Failure]) -> str:
    """The check's table: one row per server, a column per check, and the row's verdict."""
    failed: dict[str, list[str]] = {}
    for x in found:
        failed.setdefault(x.server, []).append(x.check)
    header = ["server", "ssh", "kernel", "ovs", "mininet", "project", f"mtu {tunnel_mtu(cluster)}", "clock offset",
              "chrony", "calibration", "result"]
    rows = [header]
    for f in findings:
        v = f.versions
        readings = [r.text for _, r in v.items()] if v else ["-"] * len(VERSION_CHECKS)
        row = [f"{f.name} (head)" if f.head else f.name, f.ssh.text, *readings,
               "-" if f.tunnel is None else f.tunnel.text,
               f.clock.text if f.clock else "-", (f.clock.chrony or "-") if f.clock else "-",
               f.calibration.text if f.calibration else "-",
               f"FAILED ({', '.join(failed[f.name])})" if f.name in failed else "ok"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    title = (f"cluster {cluster.name}: {len(cluster.servers)} servers, head {cluster.head}, underlay MTU "
             f"{cluster.underlay_mtu}")
    body = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([title, *body])


def document(cluster: Cluster, findings: Sequence[ServerFindings], found: Sequence[Failure]) -> dict[str, Any]:
    """The check as one JSON document (``--json``)."""
    return {"cluster": cluster.name, "head": cluster.head, "underlay_mtu": cluster.underlay_mtu,
            "tunnel_mtu": tunnel_mtu(cluster), "ok": not found, "servers": [f.to_json() for f in findings],
            "failures": [x.to_json() for x in found]}

