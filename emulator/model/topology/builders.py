"""Building topologies: switches, host slots, ports and addresses from a parsed spec, and reading them back.

This module owns how a spec becomes a :class:`~emulator.model.topology.model.Topology`:
the kind's builder (:data:`emulator.model.topology.kinds.KINDS`) adds the fabric's
switches, reserves its host slots and connects its switches through a
:class:`_Builder`, which numbers every switch's ports as it goes; then the
slots get hosts, or the servers' NICs under their placement. The order of
those steps *is* the naming and numbering scheme of the package docstring
(:mod:`emulator.model.topology`). It also reads topologies back: :func:`from_json`
rebuilds one from a JSON export and checks the file against it, and
:func:`load` takes a spec or the path of such a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from emulator.base.documents import read_document
from emulator.base.errors import FieldError
from emulator.model.topology.kinds import KINDS
from emulator.model.topology.model import JSON_FORMAT_VERSION, PCIE, Host, Link, Switch, Topology
from emulator.model.topology.spec import hdrm_slot_order, parse_spec


class _Builder:
    """Accumulates switches, host slots and links, numbering ports as it goes.

    The fabric builders reserve host slots (:meth:`add_slot`); :meth:`build`
    then puts a host on every slot, or the servers' NICs on some of them.
    """

    def __init__(self, host_bw: float, switch_bw: float):
        self.host_bw = host_bw
        self.switch_bw = switch_bw
        self.switches: list[Switch] = []
        self.slots: list[tuple[str, int]] = []
        self.hosts: list[Host] = []
        self.host_links: list[Link] = []
        self.switch_links: list[Link] = []
        self._next_port: dict[str, int] = {}

    def add_switch(self, role: str, pod: int | None = None) -> str:
        index = len(self.switches) + 1
        name = f"s{index}"
        self.switches.append(Switch(name=name, index=index, dpid=index, role=role, pod=pod))
        self._next_port[name] = 1
        return name

    def _port(self, switch: str) -> int:
        port = self._next_port[switch]
        self._next_port[switch] = port + 1
        return port

    def add_slot(self, switch: str) -> None:
        self.slots.append((switch, self._port(switch)))

    def _add_host(self, switch: str, port: int, bw: float) -> None:
        index = len(self.hosts) + 1
        name = f"h{index}"
        self.hosts.append(Host(name=name, index=index, switch=switch, switch_port=port,
                               ip=host_ip(index), mac=host_mac(index)))
        self.host_links.append(Link(name, 0, switch, port, bw, "host"))

    def connect(self, a: str, b: str, share: float | None = None) -> None:
        bw = self.switch_bw if share is None else self.host_bw * share
        self.switch_links.append(Link(a, self._port(a), b, self._port(b), bw, "switch"))

    def build(self, kind: str, params: Mapping[str, Any]) -> Topology:
        nic_links: list[Link] = []
        if "servers" not in params:
            for switch, port in self.slots:
                self._add_host(switch, port, self.host_bw)
        else:
            accels, nics = params["accels_per_server"], params["nics_per_server"]
            taken = _nic_slots(kind, params, self.slots)
            for s in range(params["servers"]):
                pcie = self.add_switch(PCIE)
                for _ in range(accels):
                    self._add_host(pcie, self._port(pcie), params["pcie_bw"])
                for switch, port in taken[s * nics:(s + 1) * nics]:
                    nic_links.append(Link(pcie, self._port(pcie), switch, port, self.host_bw, "nic"))
        return Topology(kind=kind, params=dict(params), hosts=tuple(self.hosts), switches=tuple(self.switches),
                        links=(*self.host_links, *nic_links, *self.switch_links), slots=tuple(self.slots))


def _nic_slots(kind: str, params: Mapping[str, Any], slots: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The slots of NICs ``0..S·N-1`` (NIC ``k`` of server ``s`` is ``s·N + k``) under ``nic_placement``."""
    count = params["servers"] * params["nics_per_server"]
    placement = params["nic_placement"]
    if placement == "packed":
        return slots[:count]
    if placement == "hdrm":
        return [slots[i] for i in hdrm_slot_order(params["upper"], params["hosts_per_switch"])[:count]]
    if placement == "rail":  # NIC k of server s: slot s of rail k (slots are reserved rail by rail)
        per_rail, nics = params["hosts_per_rail"], params["nics_per_server"]
        return [slots[(g % nics) * per_rail + g // nics] for g in range(count)]
    per_switch: dict[str, list[tuple[str, int]]] = {}
    for slot in slots:
        per_switch.setdefault(slot[0], []).append(slot)
    # Every kind has the same number of slots on every host-bearing switch, so none runs out first.
    columns = list(per_switch.values())
    return [columns[g % len(columns)][g // len(columns)] for g in range(count)]


def host_ip(index: int) -> str:
    """The IP of host ``h<index>``: ``10.a.b.c`` with ``index = a*65536 + b*256 + c`` (so up to 2**24 - 1 hosts)."""
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"


def host_mac(index: int) -> str:
    """The MAC of host ``h<index>``: locally administered ``02:00:00:xx:xx:xx`` holding ``index``."""
    return f"02:00:00:{(index >> 16) & 255:02x}:{(index >> 8) & 255:02x}:{index & 255:02x}"


def build(spec: str | Mapping[str, Any], default_mbps: float | None = None,
          domain_ratio: float | None = None) -> Topology:
    """Build the topology a spec describes (see the package docstring; ``default_mbps`` and ``domain_ratio`` as
    for :func:`parse_spec`)."""
    kind, params = parse_spec(spec, default_mbps, domain_ratio)
    builder = _Builder(params["host_bw"], params["switch_bw"])
    KINDS[kind].build(builder, params)
    return builder.build(kind, params)


def from_json(data: object, where: str = "topology file") -> Topology:
    """Rebuild a :class:`Topology` from :meth:`Topology.to_json` output.

    The model is rebuilt from its spec and then compared with the file, so a
    file that was edited by hand into something inconsistent is rejected.
    """
    if not isinstance(data, Mapping):
        raise FieldError(where, "topology", "a JSON object (networkx node-link data)", type(data).__name__)
    graph = data.get("graph")
    if not isinstance(graph, Mapping) or graph.get("format") != "eflops-emulator-topology":
        raise FieldError(where, "graph.format", "'eflops-emulator-topology'",
                         graph.get("format") if isinstance(graph, Mapping) else graph)
    if graph.get("version") != JSON_FORMAT_VERSION:
        raise FieldError(where, "graph.version", str(JSON_FORMAT_VERSION), graph.get("version"))
    kind, params = graph.get("kind"), graph.get("params")
    if not isinstance(params, Mapping):
        raise FieldError(where, "graph.params", "a mapping of spec keys", params)
    topo = build({"kind": kind, **params})
    expected = topo.to_json()
    for key in ("nodes", "links"):
        mine = sorted(json.dumps(x, sort_keys=True) for x in expected[key])
        theirs = data.get(key)
        if not isinstance(theirs, list) or sorted(json.dumps(x, sort_keys=True) for x in theirs) != mine:
            raise FieldError(where, key, f"the {key} of {topo.spec}", "a different list")
    return topo


def load(source: str | Mapping[str, Any], default_mbps: float | None = None,
         domain_ratio: float | None = None) -> Topology:
    """A topology from a spec string, a spec mapping (links of ``default_mbps`` where it sets no rate, servers'
    interconnect at ``domain_ratio`` times the host links where it sets none, see :func:`parse_spec`), or the
    path of a JSON export (its own rates)."""
    if isinstance(source, str) and (source.endswith(".json") or os.sep in source) and ":" not in source:
        where = f"topology file {source!r}"
        return from_json(read_document(source, where, "json"), where=where)
    return build(source, default_mbps, domain_ratio)
