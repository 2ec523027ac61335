"""Topology spec strings: the kinds and their keys, parsing, validation and the canonical form.

This module owns what a spec may say: the kinds' integer keys and lower
bounds (each kind's registration in :mod:`emulator.model.topology.kinds`),
the link rates (within ``(0, MAX_LINK_MBPS]``), the limits on hosts and
switches, and the server keys with their NIC placements, including when the
HDRM placement exists and which slots it uses. The grammar itself is in the
package docstring (:mod:`emulator.model.topology`).

It works on plain ``(kind, params)`` pairs and imports nothing else of the
package but the kinds, so the model (:mod:`emulator.model.topology.model`)
can print its own spec and the builders
(:mod:`emulator.model.topology.builders`) parse before they build.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from emulator.base.errors import MISSING, FieldError, exact_number, int_field, shown
from emulator.model.topology.kinds import KINDS

MAX_LINK_MBPS = 1000.0
DEFAULT_LINK_MBPS = 10.0
MAX_HOSTS = 1024
MAX_SWITCHES = 512
NIC_PLACEMENTS = ("packed", "spread", "hdrm", "rail")

_RATE_KEYS = ("bw", "host_bw", "switch_bw")
_SERVER_KEYS = ("servers", "accels_per_server", "nics_per_server", "pcie_bw", "nic_placement", "domain_bw")
#: A server's accelerator interconnect is not shaped by HTB (its transfers are timed by the agents, see
#: emulator.emulation.agents.interconnect), so its rate may exceed MAX_LINK_MBPS; beyond this the agents cannot move
#: the bytes.
MAX_DOMAIN_MBPS = 20000.0


def _where(spec: object) -> str:
    """The ``where`` of a spec's errors: the spec string itself, or just "topology spec" for a mapping."""
    return f"topology spec {shown(spec)}" if isinstance(spec, str) else "topology spec"


def _parse_rate(where: str, key: str, raw: object, maximum: float = MAX_LINK_MBPS,
                why: str = "Mininet ignores more") -> float:
    """A link rate in Mbit/s, from a number or its text, within ``(0, maximum]``; a boolean is no rate."""
    expected = f"a rate in Mbit/s in (0, {maximum:g}] ({why})"
    if isinstance(raw, bool):
        raise FieldError(where, key, expected, raw)
    try:
        value = float(raw) if isinstance(raw, (int, float)) else float(str(raw).strip())
    except (ValueError, OverflowError):  # an integer past a float's range, in a JSON export
        raise FieldError(where, key, expected, raw) from None
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise FieldError(where, key, expected, raw)
    return value


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``KIND:k=v,...`` into its kind and raw key/value strings."""
    where = _where(spec)
    text = spec.strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not kind:
        raise FieldError(where, "kind", f"one of {', '.join(KINDS)} before ':'", spec)
    raw: dict[str, str] = {}
    if sep and rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise FieldError(where, "parameters", "key=value pairs separated by ','", item.strip())
            if key in raw:
                raise FieldError(where, key, "each key once", f"{key} given twice")
            raw[key] = value.strip()
    return kind, raw


def sets_link_rate(spec: str | Mapping[str, Any]) -> bool:
    """Whether a spec string or mapping sets a link rate of its own (``bw``, ``host_bw`` or ``switch_bw``)."""
    keys = split_spec(spec)[1] if isinstance(spec, str) else spec
    return any(key in keys for key in _RATE_KEYS)


def fabric_keys(kind: str) -> tuple[str, ...]:
    """The integer keys that shape a fabric of ``kind`` (no rates, no server keys)."""
    return tuple(KINDS[kind].keys)


def parse_spec(spec: str | Mapping[str, Any], default_mbps: float | None = None,
               domain_ratio: float | None = None) -> tuple[str, dict[str, Any]]:
    """Validate a spec string or mapping; return ``(kind, params)``.

    ``params`` holds every key of the kind, plus ``host_bw`` and ``switch_bw``
    resolved from ``bw``; with servers also every server key, defaults
    resolved. ``bw`` defaults to ``default_mbps`` (a fabric profile's
    emulated rate), else :data:`DEFAULT_LINK_MBPS`. ``domain_ratio`` (a
    fabric profile's accelerator interconnect over its host links) gives
    servers a ``domain_bw`` of that many times ``host_bw`` where the spec
    sets none. Raises :class:`FieldError` naming the first bad field.
    """
    where = _where(spec)
    if isinstance(spec, str):
        kind, raw = split_spec(spec)
        items: dict[str, Any] = dict(raw)
    elif isinstance(spec, Mapping):
        items = dict(spec)
        kind = items.pop("kind", None)
        if not isinstance(kind, str):
            raise FieldError(where, "kind", f"one of {', '.join(KINDS)}", kind)
    else:
        raise FieldError(where, "topology", "a string KIND:key=value,... or a mapping", spec)
    if kind not in KINDS:
        raise FieldError(where, "kind", f"one of {', '.join(KINDS)}", kind)
    keys = KINDS[kind].keys
    for key in items:
        if key not in keys and key not in _RATE_KEYS and key not in _SERVER_KEYS:
            allowed = ", ".join([*keys, *_RATE_KEYS, *_SERVER_KEYS])
            raise FieldError(where, key, f"a key of {kind} ({allowed})", f"unknown key {key}")
    params: dict[str, Any] = {}
    for key, minimum in keys.items():
        if key not in items:
            raise FieldError(where, key, f"an integer >= {minimum} (required for {kind})", MISSING)
        params[key] = int_field(where, key, items[key], minimum, text=True)
    for key in KINDS[kind].even_keys:
        if params[key] % 2:
            raise FieldError(where, key, f"an even integer >= {keys[key]}", items[key])
    # a rate is a float wherever it came from: the JSON export and its rebuild must write it alike
    bw = _parse_rate(where, "bw", items["bw"]) if "bw" in items else float(default_mbps or DEFAULT_LINK_MBPS)
    params["bw"] = bw
    params["host_bw"] = _parse_rate(where, "host_bw", items["host_bw"]) if "host_bw" in items else bw
    params["switch_bw"] = _parse_rate(where, "switch_bw", items["switch_bw"]) if "switch_bw" in items else bw
    hosts, switches = KINDS[kind].counts(params)
    what = "host slots in the fabric" if "servers" in items else "hosts in all"
    if hosts > MAX_HOSTS:
        raise FieldError(where, "hosts", f"at most {MAX_HOSTS} {what}", hosts)
    if switches > MAX_SWITCHES:
        raise FieldError(where, "switches", f"at most {MAX_SWITCHES} switches in all", switches)
    if hosts < KINDS[kind].min_hosts:
        raise FieldError(where, "hosts", f"at least {KINDS[kind].min_hosts} {what}", hosts)
    if "servers" in items:
        params.update(_parse_servers(where, kind, params, items, hosts, switches))
        params.update(_parse_domain(where, params, items, domain_ratio))
        if "domain_bw" in params and "pcie_bw" not in items:
            # an accelerator reaches another's NIC over the interconnect (rail-only's forwarding): its link into
            # the server's switch runs at the interconnect's rate, as far as HTB shapes
            params["pcie_bw"] = max(params["pcie_bw"], min(params["domain_bw"], MAX_LINK_MBPS))
    elif KINDS[kind].rail_only:
        raise FieldError(where, "servers", f"servers=S with nics_per_server={params['rails']} (a rail-only "
                         "fabric has no spines: its rails meet only inside the servers)", MISSING)
    else:
        for key in _SERVER_KEYS:
            if key in items:
                raise FieldError(where, key, "servers=S alongside it (server keys describe servers)",
                                 f"{key} without servers")
    return kind, params


def _parse_servers(where: str, kind: str, params: Mapping[str, Any], items: Mapping[str, Any], slots: int,
                   fabric_switches: int) -> dict[str, Any]:
    """The server keys of a spec (see the package docstring), checked against the fabric's ``slots``."""
    servers = int_field(where, "servers", items["servers"], 1, text=True)
    counts = {}
    for key in ("accels_per_server", "nics_per_server"):
        if key not in items:
            raise FieldError(where, key, "an integer >= 1 (required with servers)", MISSING)
        counts[key] = int_field(where, key, items[key], 1, text=True)
    accels, nics = counts["accels_per_server"], counts["nics_per_server"]
    if nics > accels:
        raise FieldError(where, "nics_per_server", f"an integer in 1..{accels} (at most one NIC per accelerator)",
                         items["nics_per_server"])
    pcie = _parse_rate(where, "pcie_bw", items["pcie_bw"]) if "pcie_bw" in items else params["host_bw"]
    raw = items.get("nic_placement", KINDS[kind].default_placement)
    placement = raw.strip() if isinstance(raw, str) else raw
    if placement not in NIC_PLACEMENTS:
        raise FieldError(where, "nic_placement", f"one of {', '.join(NIC_PLACEMENTS)}", raw)
    _check_rails(where, kind, params, placement, raw, servers, nics)
    if placement == "hdrm":
        problem = ("a bigraph" if kind != "bigraph" else
                   hdrm_problem(params["upper"], params["lower"], params["hosts_per_switch"]))
        if problem:
            raise FieldError(where, "nic_placement", f"packed or spread (hdrm needs {problem})", raw)
    if servers * nics > slots:
        raise FieldError(where, "servers", f"at most {slots // nics} servers of {nics} NICs "
                         f"(the fabric has {slots} host slots)", items["servers"])
    if servers * accels > MAX_HOSTS:
        raise FieldError(where, "servers", f"at most {MAX_HOSTS} accelerators in all (servers x accels_per_server)",
                         items["servers"])
    if fabric_switches + servers > MAX_SWITCHES:
        raise FieldError(where, "servers", f"at most {MAX_SWITCHES} switches in all, one PCIe switch per server "
                         f"included ({fabric_switches} in the fabric)", items["servers"])
    if servers * accels < KINDS[kind].min_hosts:
        raise FieldError(where, "servers", f"at least {KINDS[kind].min_hosts} accelerators in all "
                         "(servers x accels_per_server)", items["servers"])
    return {"servers": servers, "accels_per_server": accels, "nics_per_server": nics, "pcie_bw": pcie,
            "nic_placement": placement}


def _parse_domain(where: str, params: Mapping[str, Any], items: Mapping[str, Any],
                  ratio: float | None) -> dict[str, Any]:
    """``domain_bw``: the spec's own, else ``ratio`` times the host links (a profile's), else none (no key)."""
    if "domain_bw" in items:
        rate = _parse_rate(where, "domain_bw", items["domain_bw"], MAX_DOMAIN_MBPS,
                           "the agents move a domain's bytes themselves")
    elif ratio:
        rate = float(f"{ratio * params['host_bw']:.12g}")
        if rate > MAX_DOMAIN_MBPS:
            raise FieldError(where, "domain_bw", f"at most {MAX_DOMAIN_MBPS:g} Mbit/s (the fabric profile's "
                             f"interconnect is {ratio:g} times host_bw {params['host_bw']:g}): lower the link rate",
                             rate)
    else:
        return {}
    return {"domain_bw": rate}


def _check_rails(where: str, kind: str, params: Mapping[str, Any], placement: str, raw: object, servers: int,
                 nics: int) -> None:
    """The ``rail`` placement's conditions: a kind with rails, one NIC per rail, a slot per server on every
    rail; a rail-only fabric takes no other placement."""
    if KINDS[kind].rail_only and placement != "rail":
        raise FieldError(where, "nic_placement", "rail (a rail-only fabric's servers have one NIC on every rail)",
                         raw)
    if placement != "rail":
        return
    if not KINDS[kind].rails:
        with_rails = ", ".join(k.name for k in KINDS.values() if k.rails)
        raise FieldError(where, "nic_placement", f"packed, spread or hdrm (rail needs a fabric with rails: "
                         f"{with_rails})", raw)
    if nics != params["rails"]:
        raise FieldError(where, "nics_per_server", f"{params['rails']}, one NIC per rail (nic_placement rail)",
                         nics)
    if servers > params["hosts_per_rail"]:
        raise FieldError(where, "servers", f"at most {params['hosts_per_rail']} servers (hosts_per_rail: every "
                         "server has a NIC on every rail)", servers)


def hdrm_problem(upper: int, lower: int, hosts_per_switch: int) -> str | None:
    """Why a BiGraph has no contention-free HDRM placement (what it would need), or None if it has one."""
    m = hosts_per_switch
    if upper != lower:
        return ("a bigraph with upper = lower (halving-doubling partners alternate groups, so each group must hold "
                "half the ranks)")
    if m > upper:
        return (f"at most {upper} hosts per switch for a contention-free hdrm (a step has {2 * upper * m} flows "
                f"but only {2 * upper * lower} directed upper-lower links)")
    p = 2 * upper * m
    if p & (p - 1):
        return f"a bigraph whose (upper+lower)*hosts_per_switch is a power of two for hdrm (here {p})"
    return None


def hdrm_slot_order(upper: int, hosts_per_switch: int) -> list[int]:
    """The 0-based BiGraph host slots of HDRM ranks ``0..p-1`` (``p = 2·U·M``); see :func:`hdrm_problem`.

    Requirements: ``U = L``, ``M <= U`` (M hosts per switch), ``p`` a power of
    two (so ``U = 2^u``, ``M = 2^m``, ``p = 2^k`` with ``k = u + m + 1``).
    Slot ``i·M + q`` is port ``q + 1`` of switch ``s(i+1)`` (upper switches
    first, then lower).

    Construction (a linear code over GF(2)): write rank ``r`` in bits
    ``r_0..r_{k-1}``. Rank ``r`` goes to the upper group iff ``popcount(r)`` is
    even; partners ``r, r ^ 2^s`` differ in one bit, so every pair spans both
    groups and takes the single direct upper-lower link. For an even rank the
    upper switch is ``A(r) = bits 1..u`` and the port ``bits u+1..u+m``; for an
    odd rank the lower switch is ``B(r) = bits m+1..m+u`` and the port ``bits
    1..m``. On even ranks, bits ``1..k-1`` determine ``r`` (bit 0 is their
    parity) and ``A`` and ``B`` together cover all of them because ``m <= u``,
    so ``r -> (A(r), B(r))`` is injective there. In step ``s`` the pair of even
    ``r`` uses the link ``(A(r), B(r ^ 2^s)) = (A(r), B(r) ^ B(2^s))``: also
    injective in ``r``. Hence no two pairs share an upper-lower switch pair,
    in either direction, in any step. Each switch receives exactly ``M`` ranks.
    """
    m = hosts_per_switch
    u, mb = upper.bit_length() - 1, m.bit_length() - 1
    out = []
    for r in range(2 * upper * m):
        if bin(r).count("1") % 2 == 0:
            switch, port = (r >> 1) & (upper - 1), (r >> (u + 1)) & (m - 1)
        else:
            switch, port = upper + ((r >> (mb + 1)) & (upper - 1)), (r >> 1) & (m - 1)
        out.append(switch * m + port)
    return out


def format_spec(kind: str, params: Mapping[str, Any]) -> str:
    """The canonical spec string; rates and the NIC placement are shown only where they differ from the default."""
    parts = [f"{key}={params[key]}" for key in KINDS[kind].keys]
    bw = params.get("bw", DEFAULT_LINK_MBPS)
    if bw != DEFAULT_LINK_MBPS:
        parts.append(f"bw={exact_number(bw)}")
    for key in ("host_bw", "switch_bw"):
        if params.get(key, bw) != bw:
            parts.append(f"{key}={exact_number(params[key])}")
    if "servers" in params:
        parts += [f"{key}={params[key]}" for key in ("servers", "accels_per_server", "nics_per_server")]
        if params["pcie_bw"] != params.get("host_bw", bw):
            parts.append(f"pcie_bw={exact_number(params['pcie_bw'])}")
        if params["nic_placement"] != KINDS[kind].default_placement:
            parts.append(f"nic_placement={params['nic_placement']}")
        if "domain_bw" in params:
            parts.append(f"domain_bw={exact_number(params['domain_bw'])}")
    return f"{kind}:{','.join(parts)}"


def grown_spec(spec: str, hosts: int) -> str | None:
    """The same design with ``hosts`` hosts (with servers: accelerators, in servers of the same shape), as its
    kind grows (:attr:`~emulator.model.topology.kinds.TopologyKind.grow`: BiGraph and leaf-spine by the
    equal-radix rule, rails longer with spines in proportion); None where the design has no such size. Rates,
    server shape and NIC placement are kept; whether it fits the limits is for the build to say."""
    kind, params = parse_spec(spec)
    grow = KINDS[kind].grow
    if grow is None:
        return None
    slots = hosts
    if "servers" in params:
        accels, nics = params["accels_per_server"], params["nics_per_server"]
        if hosts % accels:
            return None
        params["servers"] = hosts // accels
        slots = params["servers"] * nics
    keys = grow(params, slots)
    if keys is None:
        return None
    params.update(keys)
    return format_spec(kind, params)


def at_link_rate(spec: str, mbps: float) -> str:
    """The same topology with every link at ``mbps``: for a spec whose rates all came from a fabric profile (a
    server's PCIe links and accelerator interconnect keep their ratio to the host links)."""
    kind, params = parse_spec(spec)
    old = params["host_bw"]
    params.update(bw=mbps, host_bw=mbps, switch_bw=mbps)
    if "servers" in params:
        params["pcie_bw"] = params["pcie_bw"] * mbps / old
        if "domain_bw" in params:
            params["domain_bw"] = params["domain_bw"] * mbps / old
    return format_spec(kind, params)
