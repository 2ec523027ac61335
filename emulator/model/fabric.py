"""The fabric profile: the real training fabric an emulation stands for, and how the emulator maps it.

An emulated network is slow on purpose. Under time dilation by ``D`` (Gupta et
al., NSDI 2006) a link of ``R/D`` stands for one of ``R``, and every time
measured here stands for ``1/D`` of it there. That holds for bandwidth by
itself; it holds for latency only if the emulator adds ``D`` times the real
fabric's latencies and its own stay below that (``docs/domain.md`` §3). A
:class:`FabricProfile` names the real fabric by five numbers, and its servers'
accelerator interconnect by two more:

``link_gbps``          the host link rate (Gbit/s)
``mtu``                the frame size (bytes)
``switch_latency_us``  forwarding latency of one switch (microseconds)
``alpha_us``           per-message software latency of the communication library (microseconds)
``dilation``           ``D``
``domain_gbps``        each accelerator's rate into its server's interconnect (NVLink/NVSwitch-like), per
                       direction (Gbit/s); 0: servers have none (only their PCIe switch)
``domain_latency_us``  the interconnect's latency, in place of the switches' (microseconds)

Mapping onto the emulator (:meth:`FabricProfile.emulation`):

* emulated link rate = ``link_gbps · 1000 / D`` Mbit/s, for every link a
  topology spec leaves unset (a spec's own ``bw``, ``host_bw``, ``switch_bw``
  are kept and stand for ``D`` times their rate);
* emulated latencies = ``D`` × real ones;
* a server's interconnect runs at ``domain_gbps / link_gbps`` times its
  host links (:attr:`FabricProfile.domain_ratio`, the topology's
  ``domain_bw`` where the spec sets none);
* emulated MTU = the real MTU: a frame of ``F`` bytes at ``R/D`` takes ``D``
  times what it takes at ``R``, so keeping the frame size dilates its
  serialisation and every hop's store-and-forward exactly. Outside the range
  this emulator carries (:data:`MIN_MTU`..:data:`MAX_MTU`) the closest
  workable MTU is used and the frame-time error is stated.

Per message, the real fabric's latency (before dilation) is, for a transfer
whose path crosses ``s`` switches (:func:`message_latency_s`,
:func:`rendezvous_latency_s`):

* message: ``alpha + s · switch_latency`` before its first byte arrives
  (the library's software latency, then every switch's forwarding latency);
* rendezvous: ``s · switch_latency`` for the receiver's small "posted"
  message back to the sender (MPI's and NCCL's rendezvous for large messages);
* over a server's interconnect (``switches`` :data:`DOMAIN`): ``alpha +
  domain_latency`` and ``domain_latency``;
* serialisation and store-and-forward: the links' own, from the frame size.

Every switch on the path counts, a server's PCIe switch included.

Profiles are written ``PRESET`` or ``key=value,...`` (``preset=NAME`` picks
the base; keys not given take the base's values, by default
:data:`DEFAULT_PRESET`'s), or as a YAML mapping of the same keys. Bad values
raise :class:`~emulator.base.errors.FieldError` naming the key. A user's
text becomes a :class:`FabricChoice` (:func:`choose`: the profile, and
whether it names its dilation) at the two edges where it enters, the command
line (:func:`emulator.cli.arguments.fabric_choice`) and the experiment file
(:mod:`emulator.study.experiment.fabric_keys`); files this project wrote give
their profile back by :meth:`FabricProfile.from_spec`.

The fabric and a topology become one object at one place (:func:`resolve`),
by one rule for a topology's own link rate: **a topology whose host links
have a rate of their own maps the fabric onto it** (the dilation follows,
latencies with bandwidth), unless the user named the dilation (then the
topology's rates are kept and stand for the dilation times theirs); the links
it leaves unset run at the resolved profile's emulated rate, and its servers'
interconnect at :attr:`FabricProfile.domain_ratio` times its host links where
it sets none. ``emu replay``, ``emu mpirun``, ``emu schedule check`` and an
experiment's runs all resolve through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from emulator.base.errors import FieldError, exact_number, printable
from emulator.model import topology
from emulator.model.topology import Topology
from emulator.model.topology import spec as topology_spec

#: Emulated link rates outside this range (Mbit/s) cannot be shaped faithfully:
#: Mininet's HTB ignores rates above 1000 (the topology's own limit), and below 0.1 a frame takes seconds.
MIN_LINK_MBPS = 0.1
MAX_LINK_MBPS = topology_spec.MAX_LINK_MBPS
#: Frame sizes this emulator carries: IPv4's minimum datagram, and the largest
#: MTU measured to carry TCP through veth and the userspace datapath here.
MIN_MTU = 576
MAX_MTU = 32000

KEYS = ("preset", "link_gbps", "mtu", "switch_latency_us", "alpha_us", "dilation", "domain_gbps", "domain_latency_us")
#: The "switches crossed" of a path over a server's accelerator interconnect: no fabric switch, its own latency.
DOMAIN = -1


@dataclass(frozen=True)
class FabricProfile:
    """A real fabric and its time dilation; see the module docstring."""

    preset: str
    link_gbps: float
    mtu: int
    switch_latency_us: float
    alpha_us: float
    dilation: float
    domain_gbps: float = 0.0
    domain_latency_us: float = 0.0
    description: str = ""

    # ------------------------------------------------------------ mapping
    @property
    def emulated_link_mbps(self) -> float:
        """The emulated rate of its links: ``link_gbps · 1000 / dilation`` Mbit/s (to 12 significant digits, so
        that a dilation made from a rate gives that rate back: 100000 / (100000 / 5.9) is 5.8999999999999995)."""
        return float(f"{self.link_gbps * 1000.0 / self.dilation:.12g}")

    def dilation_for(self, emulated_mbps: float) -> float:
        """The dilation that maps this fabric's links onto ``emulated_mbps`` (the inverse of :attr:`emulated_link_mbps`)."""
        return self.link_gbps * 1000.0 / emulated_mbps

    @property
    def emulated_mtu(self) -> int:
        """The real MTU, or the closest one this emulator carries."""
        return min(max(self.mtu, MIN_MTU), MAX_MTU)

    @property
    def frame_time_error(self) -> float:
        """Relative error of an emulated frame's serialisation against the dilated real one (0 when exact)."""
        return self.emulated_mtu / self.mtu - 1.0

    @property
    def domain_ratio(self) -> float | None:
        """The servers' interconnect rate over the host links' (None: servers have no interconnect)."""
        return self.domain_gbps / self.link_gbps if self.domain_gbps else None

    @property
    def domain_latency_s(self) -> float:
        """Emulated (dilated) latency of the servers' interconnect, seconds."""
        return self.domain_latency_us * 1e-6 * self.dilation

    @property
    def alpha_s(self) -> float:
        """Emulated (dilated) per-message software latency, seconds."""
        return self.alpha_us * 1e-6 * self.dilation

    @property
    def switch_latency_s(self) -> float:
        """Emulated (dilated) latency of one switch, seconds."""
        return self.switch_latency_us * 1e-6 * self.dilation

    def real_seconds(self, emulated_s: float) -> float:
        """What an emulated duration stands for on the real fabric."""
        return emulated_s / self.dilation

    def real_mbps(self, emulated_mbps: float) -> float:
        """What an emulated rate stands for on the real fabric."""
        return emulated_mbps * self.dilation

    def changed(self, where: str = "fabric", **keys: float) -> FabricProfile:
        """The same profile with some of its :data:`KEYS` changed, checked as :func:`parse` checks them."""
        return parse({**{key: getattr(self, key) for key in KEYS}, **keys}, where=where)

    # ------------------------------------------------------------- output
    def spec(self) -> str:
        """The canonical ``key=value,...`` text, which :func:`parse` reads back to the same profile."""
        text = (f"preset={self.preset},link_gbps={exact_number(self.link_gbps)},mtu={self.mtu},"
                f"switch_latency_us={exact_number(self.switch_latency_us)},alpha_us={exact_number(self.alpha_us)},"
                f"dilation={exact_number(self.dilation)}")
        base = PRESETS[self.preset]
        if self.domain_gbps or self.domain_latency_us or base.domain_gbps or base.domain_latency_us:
            text += (f",domain_gbps={exact_number(self.domain_gbps)},"
                     f"domain_latency_us={exact_number(self.domain_latency_us)}")
        return text

    def short_spec(self) -> str:
        """The shortest ``key=value,...`` text :func:`parse` reads back to this profile: the keys that differ from
        its preset's (``dilation=4195`` for the default preset, ``preset=bandwidth-only,dilation=4195``)."""
        base = PRESETS[self.preset]
        parts = [] if self.preset == DEFAULT_PRESET else [f"preset={self.preset}"]
        for key in KEYS[1:]:
            value = getattr(self, key)
            if value != getattr(base, key):
                parts.append(f"{key}={value}" if key == "mtu" else f"{key}={exact_number(value)}")
        return ",".join(parts) or self.preset

    @classmethod
    def from_spec(cls, recorded: object) -> FabricProfile:
        """The profile of the canonical text :meth:`spec` wrote (a results or experiment file's record);
        :class:`FieldError` for a record that is not one."""
        if not isinstance(recorded, str | Mapping):
            raise FieldError("recorded fabric", "(spec)", "the canonical key=value text of a profile", recorded)
        return parse(recorded)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(spec=self.spec(), emulated_link_mbps=self.emulated_link_mbps, emulated_mtu=self.emulated_mtu,
                    frame_time_error=self.frame_time_error, emulated_alpha_s=self.alpha_s,
                    emulated_switch_latency_s=self.switch_latency_s, emulated_domain_latency_s=self.domain_latency_s)
        return data

    def describe(self) -> str:
        """One sentence: what the emulated figures stand for."""
        mtu = f"MTU {self.emulated_mtu}"
        if self.emulated_mtu != self.mtu:
            mtu += f" (the real {self.mtu} is outside {MIN_MTU}-{MAX_MTU}: frame times {self.frame_time_error:+.0%})"
        text = (f"{self.emulated_link_mbps:g} Mbit/s emulated links stand for {self.link_gbps:g} Gbit/s ones "
                f"(time dilation {self.dilation:g}: every emulated time is {self.dilation:g} times the real one); "
                f"{mtu}; per message alpha {self.alpha_us:g} us -> {self.alpha_s * 1e3:g} ms, per switch "
                f"{self.switch_latency_us:g} us -> {self.switch_latency_s * 1e3:g} ms")
        if self.domain_gbps:
            text += (f"; servers' interconnect {self.domain_gbps:g} Gbit/s per accelerator and direction "
                     f"({self.domain_ratio:g} x the links), {self.domain_latency_us:g} us -> "
                     f"{self.domain_latency_s * 1e3:g} ms")
        return text


def names_dilation(raw: object) -> bool:
    """Whether a fabric value as a user wrote it (``key=value,...`` or a mapping) sets ``dilation`` itself (a
    preset name alone does not)."""
    if isinstance(raw, Mapping):
        return "dilation" in raw
    return isinstance(raw, str) and any(part.split("=", 1)[0].strip() == "dilation" for part in raw.split(","))


def at_link_rate(profile: FabricProfile, emulated_mbps: float, where: str = "fabric") -> FabricProfile:
    """The same real fabric with the dilation that maps its links onto ``emulated_mbps`` (checked as :func:`parse` checks)."""
    return profile.changed(where, dilation=profile.dilation_for(emulated_mbps))


def dilation_of(profile: FabricProfile | None) -> float:
    """The profile's dilation, else 1 (no profile: emulated times are the real ones)."""
    return profile.dilation if profile is not None else 1.0


def for_workload_scale(profile: FabricProfile, scale: float, where: str = "fabric") -> FabricProfile:
    """The fabric a workload shrunk by ``scale`` replays on: the same, with its latencies divided by ``scale``.

    A training iteration whose gradients and compute times are divided by
    ``scale`` (:mod:`emulator.model.workloads.training`) takes ``1/scale`` of the
    real iteration's time; dividing the per-message and per-switch latencies
    by the same factor keeps every term of that time in proportion, so the
    replay still stands for the full iteration (the emulator's own
    latencies, flagged ``latency_floor`` where they exceed the target, and
    frame serialisation, whose frames do not shrink, are what stays
    unscaled).
    """
    if scale == 1:
        return profile
    return profile.changed(where, alpha_us=profile.alpha_us / scale, switch_latency_us=profile.switch_latency_us / scale,
                           domain_latency_us=profile.domain_latency_us / scale)


def message_latency_s(profile: FabricProfile, switches: int) -> float:
    """Emulated latency before a message's first byte arrives, over a path crossing ``switches`` switches (or a
    server's interconnect, :data:`DOMAIN`)."""
    return profile.alpha_s + rendezvous_latency_s(profile, switches)


def rendezvous_latency_s(profile: FabricProfile, switches: int) -> float:
    """Emulated latency of a receiver's clear to send back to its sender, over ``switches`` switches (or a
    server's interconnect, :data:`DOMAIN`)."""
    if switches == DOMAIN:
        return profile.domain_latency_s
    return switches * profile.switch_latency_s


# ------------------------------------------------------------------ presets
#: Named fabrics. Latencies: NCCL's tuning model gives 6.6-8.4 us of base
#: latency per ring or tree step for its Simple protocol (NVIDIA/nccl
#: src/graph/tuning.cc); datacenter switches forward in about 0.5-1 us (RoCE)
#: and 0.1-0.2 us (InfiniBand HDR).
PRESETS: dict[str, FabricProfile] = {
    "roce100": FabricProfile("roce100", link_gbps=100.0, mtu=9000, switch_latency_us=1.0, alpha_us=8.0,
                             dilation=5000.0, description="100 Gbit/s RoCE-like Ethernet, jumbo frames, NCCL-like "
                             "software latency"),
    "ib200": FabricProfile("ib200", link_gbps=200.0, mtu=4096, switch_latency_us=0.2, alpha_us=6.0,
                           dilation=8000.0, description="200 Gbit/s InfiniBand HDR-like, 4096-byte MTU"),
    "eth25": FabricProfile("eth25", link_gbps=25.0, mtu=1500, switch_latency_us=1.0, alpha_us=25.0,
                           dilation=1000.0, description="25 Gbit/s Ethernet with kernel TCP (MPI over sockets)"),
    "bandwidth-only": FabricProfile("bandwidth-only", link_gbps=100.0, mtu=9000, switch_latency_us=0.0,
                                    alpha_us=0.0, dilation=4000.0,
                                    description="only bandwidth dilated: the emulator adds no latency, so "
                                    "times carry this machine's own (flagged latency_floor)"),
}
#: Today's hardware: NVIDIA DGX H100-like servers (docs/topologies-and-fabrics.md, "Fabric profiles", has the
#: sources): 400 Gbit/s NICs (ConnectX-7, InfiniBand NDR, 4096-byte MTU), NVLink 4 at 900 GB/s per GPU in both
#: directions together (450 GB/s = 3600 Gbit/s each way); NCCL's ring/Simple latencies: 8.4 us base, 3.4 us
#: per NVLink hop (src/graph/tuning.cc); InfiniBand switches forward in 0.1-0.2 us.
PRESETS["h100-ndr400"] = FabricProfile(
    "h100-ndr400", link_gbps=400.0, mtu=4096, switch_latency_us=0.2, alpha_us=8.4, dilation=20000.0,
    domain_gbps=3600.0, domain_latency_us=3.4,
    description="DGX H100-like servers: 400 Gbit/s InfiniBand NDR NICs, NVLink/NVSwitch at 450 GB/s per "
    "accelerator and direction")
DEFAULT_PRESET = "roce100"


def default() -> FabricProfile:
    return PRESETS[DEFAULT_PRESET]


# ------------------------------------------------------------------ parsing
def _number(where: str, key: str, raw: object, *, positive: bool) -> float:
    expected = "a number > 0" if positive else "a number >= 0"
    if isinstance(raw, bool):
        raise FieldError(where, key, expected, raw)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise FieldError(where, key, expected, raw) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise FieldError(where, key, expected, raw)
    return value


def _mtu(where: str, raw: object) -> int:
    expected = "an MTU in bytes, an integer from 68 to 65535"
    if isinstance(raw, bool):
        raise FieldError(where, "mtu", expected, raw)
    if isinstance(raw, str):
        try:
            raw = int(raw.strip())
        except ValueError:
            raise FieldError(where, "mtu", expected, raw) from None
    if not isinstance(raw, int) or not 68 <= raw <= 65535:
        raise FieldError(where, "mtu", expected, raw)
    return raw


def _split(text: str, where: str) -> dict[str, str]:
    if "=" not in text:
        return {"preset": text.strip()}
    items: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise FieldError(where, "(spec)", "PRESET or key=value pairs separated by commas", text)
        if key in items:
            raise FieldError(where, key, "each key once", text)
        items[key] = value.strip()
    return items


def parse(source: str | Mapping[str, Any] | None, where: str = "fabric") -> FabricProfile:
    """A profile from ``PRESET``, ``key=value,...`` or a mapping; None gives the default preset.

    Raises :class:`FieldError` naming the key for an unknown preset or key, a
    negative or non-numeric latency, a bad MTU, or a dilation that puts the
    emulated link rate outside :data:`MIN_LINK_MBPS`..:data:`MAX_LINK_MBPS`.
    """
    if source is None:
        return default()
    if isinstance(source, str):
        items: Mapping[str, Any] = _split(source, where)
    elif isinstance(source, Mapping):
        items = source
    else:
        raise FieldError(where, "(spec)", "a preset name, key=value pairs or a mapping of them", source)
    for key in items:
        if key not in KEYS:
            raise FieldError(where, printable(key), f"one of the keys {', '.join(KEYS)}", f"unknown key {key}")
    name = items.get("preset", DEFAULT_PRESET)
    if not isinstance(name, str) or name not in PRESETS:
        raise FieldError(where, "preset", f"one of {', '.join(PRESETS)}", name)
    base = PRESETS[name]
    changes: dict[str, Any] = {}
    for key in ("link_gbps", "dilation"):
        if key in items:
            changes[key] = _number(where, key, items[key], positive=True)
    for key in ("switch_latency_us", "alpha_us", "domain_gbps", "domain_latency_us"):
        if key in items:
            changes[key] = _number(where, key, items[key], positive=False)
    if "mtu" in items:
        changes["mtu"] = _mtu(where, items["mtu"])
    profile = replace(base, **changes)
    rate = profile.emulated_link_mbps
    if not MIN_LINK_MBPS <= rate <= MAX_LINK_MBPS:
        low, high = profile.dilation_for(MAX_LINK_MBPS), profile.dilation_for(MIN_LINK_MBPS)
        raise FieldError(where, "dilation", f"a dilation from {low:g} to {high:g}, so that {profile.link_gbps:g} "
                         f"Gbit/s links emulate at {MIN_LINK_MBPS:g}-{MAX_LINK_MBPS:g} Mbit/s (this one gives "
                         f"{rate:g} Mbit/s)", items.get("dilation", profile.dilation))
    return profile


# ------------------------------------------------------------------ a user's choice, resolved with a topology
@dataclass(frozen=True)
class FabricChoice:
    """A fabric profile as the user chose it: the profile, and whether they named its dilation themselves (a
    ``dilation`` key; in an experiment file also ``link_mbps`` or a numeric ``dilation``; a preset alone does
    not), which :func:`resolve`'s rule reads."""

    profile: FabricProfile
    names_dilation: bool = False


def choose(raw: str | Mapping[str, Any] | None, where: str = "fabric") -> FabricChoice:
    """The user's text (or mapping) as a :class:`FabricChoice`; None: the default preset, dilation not named."""
    return FabricChoice(parse(raw, where), names_dilation(raw))


@dataclass(frozen=True)
class Resolved:
    """A topology and a fabric profile resolved together (:func:`resolve`): the topology at its emulated link
    rates, the profile those rates stand for, and the topology spec as it was written (results record it)."""

    spec: str | Mapping[str, Any]
    topology: Topology
    profile: FabricProfile


class OnNetwork:
    """A run's input that carries its resolved :attr:`network` (``emu replay``'s, ``emu mpirun``'s): the topology
    spec as it was given and the real fabric it stands for, read from it."""

    network: Resolved

    @property
    def topology(self) -> str | Mapping[str, Any]:
        """The topology spec as it was given."""
        return self.network.spec

    @property
    def fabric(self) -> FabricProfile:
        """The real fabric it stands for."""
        return self.network.profile


def resolve(spec: str | Mapping[str, Any], choice: FabricChoice | None = None, *, interconnect: bool = True,
            where: str = "topology") -> Resolved:
    """``spec`` (a spec string, a mapping, or a topology JSON file) on the fabric ``choice`` (default: the default
    preset), by the rule of the module docstring. ``interconnect`` False: servers get no accelerator interconnect
    from the profile (an MPI program's ranks of one server talk through its switch). Raises
    :class:`~emulator.base.errors.UserError` for a bad spec, and :class:`FieldError` under ``where`` for a
    topology rate no dilation maps the fabric onto."""
    choice = choice or FabricChoice(default())
    profile = choice.profile
    topo = topology.load(spec, profile.emulated_link_mbps, profile.domain_ratio if interconnect else None)
    own = topo.host_bw
    if not choice.names_dilation and abs(own - profile.emulated_link_mbps) > 1e-9 * own:
        profile = at_link_rate(profile, own, where=where)
        topo = topology.load(spec, profile.emulated_link_mbps, profile.domain_ratio if interconnect else None)
    return Resolved(spec, topo, profile)


def rebuild(spec: str | Mapping[str, Any], profile: FabricProfile | None = None, *,
            interconnect: bool = True) -> Resolved:
    """A pair :func:`resolve` made before (an experiment's cell, a file's record), or one a program sets itself:
    the topology at ``profile``'s rates (default: the default preset's), the rule not applied."""
    return resolve(spec, FabricChoice(profile or default(), names_dilation=True), interconnect=interconnect)
