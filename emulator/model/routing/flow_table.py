"""The flow entries that make every packet take its :func:`~emulator.model.routing.paths.route`.

Pure logic, no os-ken import: the controller app (``controllers/``) and the
static installer in :mod:`emulator.emulation.network.emulated_network` both
turn :func:`flow_table` into OpenFlow messages. Whatever :func:`flow_table`
installs forwards every packet exactly along
:func:`~emulator.model.routing.paths.route` (checked by the unit tests with a
fake flow table): under a policy that hashes 5-tuples its reactive table
together with the :func:`learned_entries` the controller adds on a miss; the
static table leaves TCP flows other than the agents' on their pair's path
(see below). What a policy needs of the table it declares in its
registration (:mod:`emulator.model.routing.policies`): per-pair entries
(:attr:`~emulator.model.routing.policies.RoutingPolicy.per_pair`), exact
5-tuple entries and learning (:attr:`~emulator.model.routing.policies.RoutingPolicy.hashes_five_tuples`).

Entries (see :func:`flow_table`)
    ``PRIORITY_ARP`` forwards ARP by target address along the destination's
    path, so ARP never floods; ``PRIORITY_DEST`` matches the IPv4
    destination; ``PRIORITY_PAIR`` matches source and destination where a
    pair's path leaves the destination's default; ``PRIORITY_FLOW`` matches
    the whole 5-tuple of an agent connection where it leaves its pair's
    path. Pairs cut off by failed links get no entries. A PCIe switch holds
    ARP and destination entries for its own accelerators only, and per
    accelerator one ``PRIORITY_UPLINK`` entry matching nothing but its
    ``in_port``: every other packet from that accelerator (any protocol, ARP
    included) goes out of its pinned NIC. Packets arriving from a NIC for
    anything but the server's own accelerators match nothing and are
    dropped.

Reactive entries (a policy that hashes 5-tuples, under the controller:
``flow_table(..., reactive=True)``)
    Connections other than the agents' have 5-tuples nobody knows in
    advance, so the controller learns them. A *choice point* is a (fabric
    switch, destination) where the switch has more than one candidate
    towards the destination's slot switch. At every choice point one
    ``PRIORITY_TCP_MISS`` entry (between ``PRIORITY_FLOW`` and
    ``PRIORITY_PAIR``) sends IPv4 TCP packets to that destination to the
    controller (``out_port`` :data:`CONTROLLER_PORT`), and the agents' exact
    entries are installed at every choice point of their paths (not only
    where they leave the pair's path), so agent packets never miss. On a
    miss the controller installs :func:`learned_entries` of both directions
    of the connection (``PRIORITY_FLOW``, 5-tuple match, at every choice
    point of each direction's path, idle timeout :data:`LEARNED_IDLE_TIMEOUT`,
    cookie :data:`LEARNED_COOKIE`) and sends the packet on by
    :meth:`Learner.out_port`. ICMP, UDP and ARP never miss: they keep the
    pair path. The static installer
    (:mod:`emulator.emulation.network.emulated_network` without a
    controller) uses the proactive table, ``reactive=False``: there every
    TCP flow but the agents' takes the pair's fallback path, which
    :func:`~emulator.model.routing.paths.route` does not predict for flows
    with both ports nonzero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from emulator.model.routing.flows import IPPROTO_TCP, Flow, exact_flows
from emulator.model.routing.paths import Router, hop_port, server_sender
from emulator.model.topology import Topology

ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806

#: Priorities of installed entries (higher wins).
PRIORITY_ARP = 300
PRIORITY_FLOW = 200
PRIORITY_TCP_MISS = 175
PRIORITY_PAIR = 150
PRIORITY_DEST = 100
PRIORITY_UPLINK = 50

#: ``out_port`` of an entry that sends the packet to the controller (OpenFlow's ``OFPP_CONTROLLER``).
CONTROLLER_PORT = 0xFFFFFFFD
#: Seconds without a packet after which a switch drops a learned connection's entry (the next packet re-learns it).
LEARNED_IDLE_TIMEOUT = 120
#: The cookie of every learned entry: a reroute deletes them all by it.
LEARNED_COOKIE = 0xEF10_0000_0000_0001


@dataclass(frozen=True)
class FlowEntry:
    """One OpenFlow 1.3 entry: ``match`` uses os-ken OXM field names.

    ``out_port`` :data:`CONTROLLER_PORT` sends the packet to the controller;
    ``idle_timeout`` (seconds, 0: none) and ``cookie`` are set on learned
    entries only.
    """

    switch: str
    priority: int
    match: tuple[tuple[str, object], ...]
    out_port: int
    idle_timeout: int = 0
    cookie: int = 0

    def match_dict(self) -> dict[str, object]:
        return dict(self.match)

    def ofctl(self) -> str:
        """The entry in ``ovs-ofctl add-flow`` syntax."""
        names = {"eth_type": "dl_type", "ipv4_src": "nw_src", "ipv4_dst": "nw_dst", "ip_proto": "nw_proto",
                 "tcp_src": "tp_src", "tcp_dst": "tp_dst", "arp_tpa": "arp_tpa", "in_port": "in_port"}
        parts = [f"cookie={hex(self.cookie)}"] if self.cookie else []
        parts += [f"idle_timeout={self.idle_timeout}"] if self.idle_timeout else []
        parts.append(f"priority={self.priority}")
        for key, value in self.match:
            shown = hex(int(value)) if key == "eth_type" else value  # type: ignore[call-overload]
            parts.append(f"{names[key]}={shown}")
        action = "controller" if self.out_port == CONTROLLER_PORT else f"output:{self.out_port}"
        return ",".join(parts) + f",actions={action}"

    def key(self) -> tuple[str, int, tuple[tuple[str, object], ...]]:
        """What identifies the entry in its switch: switch, priority and match."""
        return (self.switch, self.priority, self.match)


def learned(router: Router, flow: Flow) -> list[FlowEntry]:
    """The learned 5-tuple entries of ``flow`` under ``router`` (see :func:`learned_entries`)."""
    topo = router.topo
    if not router.is_exact(flow) or flow.src == flow.dst or not router.reachable(flow.src, flow.dst):
        return []
    match = _ip_match(topo, flow, True)
    return [FlowEntry(here, PRIORITY_FLOW, match, hop_port(topo, here, nxt, flow.src, flow.dst),
                      LEARNED_IDLE_TIMEOUT, LEARNED_COOKIE)
            for here, nxt in router.fabric_hops(router.walk(flow)) if router.is_choice(here, flow.dst)]


class Learner:
    """What the controller learns about TCP connections under one policy and one set of failed links.

    One router for every question, so fabric distances are computed once per
    reroute, not once per packet-in.
    """

    def __init__(self, topo: Topology, policy: str, *, seed: int = 0, failed: Iterable[frozenset[str]] = ()):
        self.topo = topo
        self._router = Router(topo, policy, seed, failed)

    def entries(self, flow: Flow) -> list[FlowEntry]:
        """:func:`learned_entries` of ``flow``."""
        return learned(self._router, flow)

    def out_port(self, switch: str, flow: Flow) -> int | None:
        """The port a packet of ``flow`` leaves ``switch`` by (None: drop, e.g. the pair is cut off)."""
        nxt = self._router.flow_next(switch, flow)
        return None if nxt is None else hop_port(self.topo, switch, nxt, flow.src, flow.dst)


def learned_entries(topo: Topology, policy: str, flow: Flow, *, seed: int = 0,
                    failed: Iterable[frozenset[str]] = ()) -> list[FlowEntry]:
    """The entries that make one direction of a TCP connection take its :func:`~emulator.model.routing.paths.route`.

    One ``PRIORITY_FLOW`` entry matching ``flow``'s 5-tuple at every choice
    point of its path (where the switch has several candidates), in path
    order, with :data:`LEARNED_IDLE_TIMEOUT` and :data:`LEARNED_COOKIE`.
    Empty unless ``policy`` hashes ``flow`` exactly (a policy that hashes
    5-tuples, TCP, both ports nonzero) and the pair has a path.
    """
    return Learner(topo, policy, seed=seed, failed=failed).entries(flow)


def _ip_match(topo: Topology, flow: Flow, exact: bool) -> tuple[tuple[str, object], ...]:
    src, dst = topo.host(flow.src).ip, topo.host(flow.dst).ip
    if not exact:
        return (("eth_type", ETH_TYPE_IP), ("ipv4_src", src), ("ipv4_dst", dst))
    ports = (("tcp_src", flow.sport), ("tcp_dst", flow.dport)) if flow.proto == IPPROTO_TCP else ()
    return (("eth_type", ETH_TYPE_IP), ("ip_proto", flow.proto), ("ipv4_src", src), ("ipv4_dst", dst), *ports)


def flow_table(topo: Topology, policy: str, *, seed: int = 0, failed: Iterable[frozenset[str]] = (),
               lanes: int = 1, reactive: bool = False) -> dict[str, list[FlowEntry]]:
    """Every switch's entries for all host pairs under ``policy`` (see the module docstring).

    Per (switch, destination): an ARP entry and an IPv4-destination entry
    along the destination's default next hop. Per pair, where its path leaves
    that default: a source+destination entry (a policy that chooses per
    pair). Per agent connection (``lanes`` per ordered pair), where it leaves
    its pair's path: a 5-tuple entry (a policy that hashes 5-tuples). With
    servers, per accelerator an ``in_port`` entry on its PCIe switch towards
    its pinned NIC. Pairs cut off by ``failed`` links get no entry. Entries
    are in a deterministic order.

    ``reactive`` (a policy that hashes 5-tuples, for a controller that learns
    connections):
    per choice point a ``PRIORITY_TCP_MISS`` entry sending TCP to the
    destination to the controller, and the agent connections' 5-tuple
    entries at every choice point of their paths. Without it (the static
    installer) TCP flows other than the agents' take their pair's path.
    """
    router = Router(topo, policy, seed, failed)
    reactive = reactive and router.policy.hashes_five_tuples
    table: dict[str, list[FlowEntry]] = {s.name: [] for s in topo.switches}
    if topo.has_servers:
        for h in topo.hosts:
            access = router.access(h.name)
            if access is not None:
                table[h.switch].append(FlowEntry(h.switch, PRIORITY_UPLINK, (("in_port", h.switch_port),),
                                                 topo.pinned_nic(h.name).a_port))
    for dst_host in topo.hosts:
        dst = dst_host.name
        default: dict[str, str] = {}
        for sw in topo.switches:
            nxt = router.dest_next(sw.name, dst)
            if nxt is None:
                continue
            default[sw.name] = nxt
            sender = server_sender(topo, sw.name) if topo.is_pcie_switch(sw.name) else dst
            port = hop_port(topo, sw.name, nxt, sender, dst)
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_ARP,
                                            (("eth_type", ETH_TYPE_ARP), ("arp_tpa", dst_host.ip)), port))
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_DEST,
                                            (("eth_type", ETH_TYPE_IP), ("ipv4_dst", dst_host.ip)), port))
            if reactive and router.is_choice(sw.name, dst):
                table[sw.name].append(FlowEntry(sw.name, PRIORITY_TCP_MISS,
                                                (("eth_type", ETH_TYPE_IP), ("ip_proto", IPPROTO_TCP),
                                                 ("ipv4_dst", dst_host.ip)), CONTROLLER_PORT))
        if not router.policy.per_pair:
            continue
        for src_host in topo.hosts:
            src = src_host.name
            if src == dst or not router.reachable(src, dst):
                continue
            pair = Flow(src, dst, 0)
            hops = router.fabric_hops(router.walk(pair))
            pair_next = dict(hops)
            for here, nxt in hops:
                if nxt != default[here]:
                    table[here].append(FlowEntry(here, PRIORITY_PAIR, _ip_match(topo, pair, False),
                                                 hop_port(topo, here, nxt, src, dst)))
            if not router.policy.hashes_five_tuples:
                continue
            for flow in exact_flows(topo, src, dst, lanes):
                for here, nxt in router.fabric_hops(router.walk(flow)):
                    if nxt != pair_next.get(here, default[here]) or (reactive and router.is_choice(here, dst)):
                        table[here].append(FlowEntry(here, PRIORITY_FLOW, _ip_match(topo, flow, True),
                                                     hop_port(topo, here, nxt, src, dst)))
    return table
