"""Per-message latency: what a fabric profile asks for, what this machine adds by itself, and what the agents do.

Pure data and arithmetic, shared by the timing model
(:mod:`emulator.model.prediction.timing`) and the host agents (:mod:`emulator.emulation.agents.agent`),
so that the model predicts exactly the rules the agents follow.

For a transfer whose path crosses ``s`` switches, in emulated seconds:

``L_msg``  the profile's message latency, ``D · (alpha + s · switch_latency)``
           (:func:`emulator.model.fabric.message_latency_s`);
``L_cts``  the profile's rendezvous latency, ``D · s · switch_latency``;
``link``   the part of the switch latency that netem puts on the links, where
           the kernel has netem (``s · D · switch_latency``), else 0;
``data``   this machine's own latency from a sender's ``sendall`` to the
           receiver's completion, beyond serialisation (:class:`Intrinsic`);
``rend``   this machine's own latency from a receive being posted to its
           clear to send in the sender's hand;
``ack``    this machine's own latency from a receive's completion to its
           sender seeing the last byte acknowledged.

The agents' rule (virtual time on the shared monotonic clock): a transfer's
*start* is ``t_v = max(send ready, receive posted + L_cts)``, times taken from
when the operations became ready, not from when an agent got round to them.
The sender calls ``sendall`` at ``t_v + sleep + unshaped`` with ``sleep =
max(0, L_msg - link - data)`` and ``unshaped`` the serialisation the emulated
links do not charge (:meth:`PathLatency.unshaped_s`), or as soon as it can
after that. Its first byte then arrives
at ``t_v + message`` with ``message = max(L_msg, link + data)``, unless the
clear to send itself came too late: the first byte never arrives before
``posted + cts_path`` with ``cts_path = 2·link + rend + data``. A path whose
intrinsic latency exceeds its target is a *latency floor*
(:attr:`PathLatency.floor`): this machine cannot go that fast, and the result
is flagged ``latency_floor``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from emulator.model.fabric import DOMAIN, FabricProfile, message_latency_s, rendezvous_latency_s
from emulator.model.topology import last_segment_bytes

#: The burst of every shaping class (bytes). HTB lets a packet leave when the
#: class has any tokens left, so after an idle moment a link releases its
#: first packet at once and ``burst`` bytes more; a real link holds every
#: frame for its serialisation. A small burst keeps the difference to the one
#: packet, which the agents then add themselves (:attr:`emulator.model.latency.PathLatency.unshaped_s`).
#: Mininet's default burst (15 kB) let whole jumbo frames through unshaped;
#: docs/fidelity.md has the measurement. The tc commands (:mod:`emulator.emulation.network.tc_commands`) set it. The
#: rate is kept either way.
SHAPER_BURST_BYTES = 100


@dataclass(frozen=True)
class Curve:
    """A latency measured at a few path lengths (switches crossed), read in between and beyond by straight lines.

    Between two measured lengths it interpolates linearly; beyond the last
    (or before the first) it continues the nearest segment's slope (flat
    with one point); never below zero.
    """

    points: tuple[tuple[int, float], ...] = ()

    def at(self, switches: int) -> float:
        pts = sorted(self.points)
        if not pts:
            return 0.0
        if len(pts) == 1:
            return max(0.0, pts[0][1])
        # the first segment whose right end reaches ``switches``, else the last one
        i = next((k for k in range(1, len(pts)) if switches <= pts[k][0]), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return max(0.0, y0 + (y1 - y0) * (switches - x0) / (x1 - x0))

    def to_json(self) -> list[list[float]]:
        return [[x, y] for x, y in sorted(self.points)]

    @classmethod
    def from_json(cls, data: Sequence[Sequence[float]]) -> Curve:
        return cls(tuple((int(x), float(y)) for x, y in data))


@dataclass(frozen=True)
class Intrinsic:
    """This machine's own per-message latencies, measured by ``emu calibrate`` (see the module docstring)."""

    data: Curve = field(default_factory=Curve)
    rendezvous: Curve = field(default_factory=Curve)
    ack: Curve = field(default_factory=Curve)
    source: str = "none (not calibrated: the model assumes this machine adds no latency)"

    @property
    def calibrated(self) -> bool:
        return not self.source.startswith("none")

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data.to_json(), "rendezvous": self.rendezvous.to_json(), "ack": self.ack.to_json(),
                "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intrinsic:
        return cls(Curve.from_json(data["data"]), Curve.from_json(data["rendezvous"]), Curve.from_json(data["ack"]),
                   str(data.get("source", "calibration")))


@dataclass(frozen=True)
class PathLatency:
    """The latency terms of one path (emulated seconds); see the module docstring."""

    switches: int
    message_target_s: float
    rendezvous_target_s: float
    link_s: float
    data_s: float
    rendezvous_s: float
    ack_intrinsic_s: float
    #: Seconds per byte summed over the path's links, frame payload and shaper burst: what
    #: :attr:`unshaped_s` needs (set per pair of ranks by the replay; 0 in the model's own paths)
    byte_s: float = 0.0
    mss: int = 0
    burst_bytes: int = 0
    #: None: the agents' protocol, every transfer waits for its clear to send (``L_cts``). A number: Open MPI's
    #: (:attr:`LatencyModel.eager_bytes`)
    eager_bytes: int | None = None

    def unshaped_s(self, nbytes: int) -> float:
        """The serialisation the emulated links do not charge a message: every link releases a packet at the
        start of its time slot, not at its end, so the last packet (and the shaper's burst) reaches the
        receiver this much before it would on a real link of the same rate (:data:`SHAPER_BURST_BYTES`)."""
        if not self.mss:
            return 0.0
        return (last_segment_bytes(nbytes, self.mss) + self.burst_bytes) * self.byte_s

    @property
    def message_s(self) -> float:
        """From a transfer's start to its first byte arriving."""
        return max(self.message_target_s, self.link_s + self.data_s)

    @property
    def over_domain(self) -> bool:
        """A path over a server's accelerator interconnect: a timed transfer, no frames, no ACK."""
        return self.switches == DOMAIN

    @property
    def sends_wait_for_ack(self) -> bool:
        """An awaited send completes when its receiver acknowledged it (the agents'); Open MPI's sends complete
        once their bytes are written, whatever the protocol; a send over an interconnect when its bytes are
        through (:mod:`emulator.emulation.agents.interconnect`)."""
        return self.eager_bytes is None and not self.over_domain

    def eager(self, nbytes: int) -> bool:
        """The transfer goes without waiting for a clear to send (Open MPI's eager messages)."""
        return self.eager_bytes is not None and nbytes <= self.eager_bytes

    def handshake_s(self, nbytes: int) -> float:
        """What a transfer waits before its bytes may go, beyond its message latency, when its receive was posted
        in time: ``L_cts`` for the agents; for Open MPI none for an eager message, and for a rendezvous the
        request to send out and the reply back, each a message of its own."""
        if self.eager_bytes is None:
            return self.rendezvous_target_s
        return 0.0 if self.eager(nbytes) else 2 * self.message_target_s

    def needs_request(self, nbytes: int) -> bool:
        """The transfer starts with a request to send from the sender (an Open MPI rendezvous)."""
        return self.eager_bytes is not None and not self.eager(nbytes)

    def clear_to_send_at(self, nbytes: int, posted: float | None, requested: float | None) -> float | None:
        """When the sender holds its clear to send, from when the receive was posted and (an Open MPI
        rendezvous) when its request to send left; None while that is not known yet. The agents' receiver sends
        it once posted (``L_cts`` later); an Open MPI eager message needs none (the receive being posted is all);
        an Open MPI rendezvous starts at the sender: its request reaches the receiver a message latency after it
        left, is matched once the receive is posted, and the reply takes a message latency back."""
        if posted is None:
            return None
        if self.eager_bytes is None:
            return posted + self.rendezvous_target_s
        if self.eager(nbytes):
            return posted
        if requested is None:
            return None
        return max(requested + self.message_target_s, posted) + self.message_target_s

    def first_byte_after_post_s(self, nbytes: int) -> float:
        """The least time from a receive being posted to the transfer's first byte arriving: :attr:`cts_path_s`
        when a clear to send goes back first, else 0."""
        return 0.0 if self.eager(nbytes) else self.cts_path_s

    @property
    def cts_path_s(self) -> float:
        """From a receive being posted to the first byte arriving, when the clear to send is what waits."""
        return 2 * self.link_s + self.rendezvous_s + self.data_s

    @property
    def ack_s(self) -> float:
        """From a receive's completion to its sender knowing (the ACK crosses the links too)."""
        return self.link_s + self.ack_intrinsic_s

    @property
    def sleep_s(self) -> float:
        """How long after a transfer's start the sender calls ``sendall``."""
        return max(0.0, self.message_target_s - self.link_s - self.data_s)

    @property
    def floor(self) -> bool:
        """This machine's own latency exceeds what the profile asks for on this path."""
        return (self.link_s + self.data_s > self.message_target_s * (1 + 1e-9)
                or self.cts_path_s > (self.rendezvous_target_s + self.message_s) * (1 + 1e-9))

    def to_json(self) -> dict[str, Any]:
        return {"switches": self.switches, "message_target_s": self.message_target_s,
                "rendezvous_target_s": self.rendezvous_target_s, "link_s": self.link_s, "data_s": self.data_s,
                "rendezvous_s": self.rendezvous_s, "ack_intrinsic_s": self.ack_intrinsic_s,
                "byte_s": self.byte_s, "mss": self.mss, "burst_bytes": self.burst_bytes,
                "message_s": self.message_s, "sleep_s": self.sleep_s, "floor": self.floor,
                **({} if self.eager_bytes is None else {"eager_bytes": self.eager_bytes})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PathLatency:
        return cls(int(data["switches"]), float(data["message_target_s"]), float(data["rendezvous_target_s"]),
                   float(data["link_s"]), float(data["data_s"]), float(data["rendezvous_s"]),
                   float(data["ack_intrinsic_s"]), float(data.get("byte_s", 0.0)), int(data.get("mss", 0)),
                   int(data.get("burst_bytes", 0)), data.get("eager_bytes"))


#: No latency anywhere: the model of bandwidth alone.
ZERO = PathLatency(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class LatencyModel:
    """A fabric profile with this machine's intrinsic latency; ``netem`` when the links carry the switch latency.

    ``eager_bytes`` None is the agents' protocol: every transfer waits for its clear to send. A number is Open
    MPI's: messages up to it are sent eagerly, without one; a larger one waits for a rendezvous reply, which is
    a message of its own. The timing model follows it; the projection (:mod:`emulator.model.prediction.projection`)
    knows the agents' protocol only.
    """

    profile: FabricProfile | None = None
    intrinsic: Intrinsic = field(default_factory=Intrinsic)
    netem: bool = False
    eager_bytes: int | None = None

    def path(self, switches: int) -> PathLatency:
        return _path(self, switches)

    def floors(self, switch_counts: Sequence[int]) -> list[int]:
        """The path lengths among ``switch_counts`` where this machine cannot reach the profile's latency."""
        return sorted({s for s in switch_counts if self.path(s).floor})

    @property
    def link_delay_per_switch_s(self) -> float:
        """What netem adds on every switch's egress ports (0 without netem)."""
        return self.profile.switch_latency_s if self.netem and self.profile is not None else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile.to_json() if self.profile else None, "intrinsic": self.intrinsic.to_json(),
                "netem": self.netem, **({} if self.eager_bytes is None else {"eager_bytes": self.eager_bytes})}


@cache
def _path(model: LatencyModel, switches: int) -> PathLatency:
    p = model.profile
    msg = message_latency_s(p, switches) if p is not None else 0.0
    cts = rendezvous_latency_s(p, switches) if p is not None else 0.0
    # over an interconnect no link, no TCP: what the agents add is their lateness
    # (emulator.emulation.agents.interconnect)
    if switches == DOMAIN:
        return PathLatency(DOMAIN, msg, cts, 0.0, 0.0, 0.0, 0.0, eager_bytes=model.eager_bytes)
    i = model.intrinsic
    return PathLatency(switches, msg, cts, switches * model.link_delay_per_switch_s, i.data.at(switches),
                       i.rendezvous.at(switches), i.ack.at(switches), eager_bytes=model.eager_bytes)
