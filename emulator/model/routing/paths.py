"""Paths: which way every flow goes, hop by hop, under a routing policy and a set of failed links.

Pure logic. The schedule checker calls :func:`route` to predict which links
every transfer uses; the flow table (:mod:`emulator.model.routing.flow_table`)
installs entries that forward every packet exactly along it.

How a path is built
    A host enters the fabric at its *slot*: its own switch, or with servers
    (:mod:`emulator.model.topology`) the fabric switch of its pinned NIC, reached
    through its server's PCIe switch (:meth:`~emulator.model.topology.Topology.access_path`).
    Inside the fabric the path goes hop by hop, from the source's slot switch
    towards the destination's over fabric links that are not ``failed``: at
    every switch the *candidates* are the fabric neighbours one hop closer to
    the destination's slot switch (shortest paths only; hosts and PCIe
    switches are never transit). With one candidate there is no choice; with
    several, the policy chooses. Candidates are sorted by name (``s2`` before
    ``s10``). From the destination's slot switch the path leaves the fabric the
    way the destination's traffic enters it. So between servers a path is
    ``src, its PCIe switch, slot switch of src's NIC, ..., slot switch of
    dst's NIC, dst's PCIe switch, dst``; two accelerators of one server talk
    through their PCIe switch only. An accelerator uses its pinned NIC and no
    other, in both directions: when that NIC's link fails it is cut off from
    every other server. The exception is ``railonly``, which has no spines:
    there an accelerator's traffic to another server leaves by its server's
    NIC on the receiver's rail (:meth:`~emulator.model.topology.Topology.egress_nic`;
    the server's switch holds one destination entry per such receiver) and
    arrives by the receiver's pinned NIC. On ``dualplane`` a host's slot is
    its NIC's own switch: paths start and end there and never cross another
    (a NIC does not forward between planes; :meth:`_Reach.transit`).
    ``failed`` links are node pairs, so when a server has several NICs on
    one fabric switch their parallel links fail together.

At a switch with several candidates the path's policy chooses
(:mod:`emulator.model.routing.policies`).
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from emulator.base.errors import UserError
from emulator.model.routing.flows import IPPROTO_TCP, Flow
from emulator.model.routing.policies import RoutingPolicy, check_policy
from emulator.model.topology import NIC_ROLE, Topology, all_host_pairs, node_sort_key


class NoPath(UserError):
    """The flow's endpoints are cut off from each other (e.g. after link failures)."""




def _failed_set(failed: Iterable[Iterable[str]]) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(x) for x in failed)


class _Reach:
    """Who reaches whom under one set of failed links: pinned access paths and fabric distances."""

    def __init__(self, topo: Topology, failed: Iterable[Iterable[str]]):
        self.topo = topo
        self.failed = _failed_set(failed)
        hidden = [tuple(link) for link in self.failed if len(link) == 2]
        self.fabric = nx.restricted_view(topo.fabric_graph, [], hidden) if hidden else topo.fabric_graph
        self._dist: dict[str, dict[str, int]] = {}
        self._access: dict[str, list[str] | None] = {}
        self.nic_switches = frozenset(s.name for s in topo.switches if s.role == NIC_ROLE)

    def up(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.failed

    def access(self, host: str) -> list[str] | None:
        """``host`` up to the fabric switch of its slot, or None when a link of that is down."""
        if host not in self._access:
            path = self.topo.access_path(host)
            self._access[host] = path if all(self.up(a, b) for a, b in path_links(path)) else None
        return self._access[host]

    def egress(self, src: str, dst: str) -> list[str] | None:
        """``src`` up to the fabric switch its traffic to ``dst`` enters by, or None when a link of that is down
        (the access path but on a rail-only fabric, :meth:`~emulator.model.topology.Topology.egress_path`)."""
        if not self.topo.rail_only:
            return self.access(src)
        path = self.topo.egress_path(src, dst)
        return path if all(self.up(a, b) for a, b in path_links(path)) else None

    def transit(self, node: str, target: str) -> bool:
        """Whether a path towards ``target`` may cross fabric switch ``node``: not a dual-plane NIC's switch
        (a NIC does not forward from one plane to the other)."""
        return node == target or node not in self.nic_switches

    def dist(self, target: str) -> dict[str, int]:
        """Fabric hops from every fabric switch that still reaches fabric switch ``target`` (crossing only
        switches that may be :meth:`transit`)."""
        if target not in self._dist:
            dist = {target: 0}
            frontier = [target]
            while frontier:
                ahead = []
                for node in frontier:
                    if not self.transit(node, target):
                        continue
                    for nxt in self.fabric.neighbors(node):
                        if nxt not in dist:
                            dist[nxt] = dist[node] + 1
                            ahead.append(nxt)
                frontier = ahead
            self._dist[target] = dist
        return self._dist[target]

    def reachable(self, src: str, dst: str) -> bool:
        if self.topo.same_server(src, dst):
            switch = self.topo.host(src).switch
            return self.up(src, switch) and self.up(dst, switch)
        a, b = self.egress(src, dst), self.access(dst)
        return a is not None and b is not None and a[-1] in self.dist(b[-1])



class Router(_Reach):
    """Paths and next hops of one policy under one set of failed links."""

    def __init__(self, topo: Topology, policy: str, seed: int, failed: Iterable[Iterable[str]]):
        super().__init__(topo, failed)
        self.policy: RoutingPolicy = check_policy(topo, policy)(topo, seed)
        self._cands: dict[tuple[str, str], list[str]] = {}

    def candidates(self, node: str, target: str) -> list[str]:
        """Fabric neighbours of fabric switch ``node`` one hop closer to fabric switch ``target``."""
        key = (node, target)
        cands = self._cands.get(key)
        if cands is None:
            dist = self.dist(target)
            here = dist.get(node)
            cands = [] if here is None else sorted(
                (n for n in self.fabric.neighbors(node) if dist.get(n) == here - 1 and self.transit(n, target)),
                key=node_sort_key)
            self._cands[key] = cands
        return cands

    def fabric_hops(self, path: list[str]) -> list[tuple[str, str]]:
        """The directed links of ``path`` leaving a fabric switch: where the policy's entries act."""
        return [(a, b) for a, b in path_links(path) if self.topo.is_fabric_switch(a)]

    # ------------------------------------------------------------- choices
    def dest_next(self, switch: str, dst: str) -> str | None:
        """The next hop of the destination entries (``PRIORITY_DEST``) at ``switch``; None: no entry."""
        host = self.topo.host(dst)
        if switch == host.switch:
            return dst if self.up(dst, switch) else None
        if self.topo.rail_only and self.topo.is_pcie_switch(switch):  # towards the NIC on dst's rail
            up = self.egress(server_sender(self.topo, switch), dst) if self.access(dst) is not None else None
            return None if up is None else up[-1]
        access = self.access(dst)
        if access is None or not self.topo.is_fabric_switch(switch):
            return None
        if switch == access[-1]:
            return access[-2]
        cands = self.candidates(switch, access[-1])
        if not cands:
            return None
        return cands[0] if len(cands) == 1 else self.policy.by_destination(switch, cands, dst)

    def choice(self, node: str, cands: list[str], flow: Flow, exact: bool) -> str:
        """The next hop ``flow`` takes at ``node``; ``exact``: hash the whole 5-tuple."""
        return cands[0] if len(cands) == 1 else self.policy.by_flow(node, cands, flow, exact)

    def is_exact(self, flow: Flow) -> bool:
        """True when the policy hashes ``flow``'s whole 5-tuple: it hashes 5-tuples, and ``flow`` is TCP with both
        ports nonzero."""
        return (self.policy.hashes_five_tuples and flow.proto == IPPROTO_TCP and flow.sport != 0
                and flow.dport != 0)

    def is_choice(self, switch: str, dst: str) -> bool:
        """True at a choice point: fabric ``switch`` has several candidates towards ``dst``'s slot switch."""
        access = self.access(dst)
        return (access is not None and self.topo.is_fabric_switch(switch)
                and len(self.candidates(switch, access[-1])) > 1)

    def flow_next(self, switch: str, flow: Flow) -> str | None:
        """The node a packet of ``flow`` at ``switch`` goes to next (None: no way on).

        On ``flow``'s path that is the next node of :meth:`walk`; off it (a
        packet in flight across a reroute) the switch's own choice for the flow.
        """
        if not self.reachable(flow.src, flow.dst):
            return None
        if switch == self.topo.host(flow.dst).switch:
            return flow.dst
        access = self.access(flow.dst)
        if access is None or not self.topo.is_fabric_switch(switch):
            return None
        if switch == access[-1]:
            return access[-2]
        cands = self.candidates(switch, access[-1])
        return self.choice(switch, cands, flow, self.is_exact(flow)) if cands else None

    def walk(self, flow: Flow) -> list[str]:
        """The node path of ``flow``; raises :class:`NoPath`."""
        self.topo.host(flow.src)
        self.topo.host(flow.dst)
        if flow.src == flow.dst:
            return [flow.src]
        if not self.reachable(flow.src, flow.dst):
            raise NoPath(f"routing: {flow.src} -> {flow.dst}: no path (cut off by failed links)")
        if self.topo.same_server(flow.src, flow.dst):
            return [flow.src, self.topo.host(flow.src).switch, flow.dst]
        up, down = self.egress(flow.src, flow.dst), self.access(flow.dst)
        assert up is not None and down is not None
        exact = self.is_exact(flow)
        path = list(up)
        node = up[-1]
        while node != down[-1]:
            node = self.choice(node, self.candidates(node, down[-1]), flow, exact)
            path.append(node)
        return path + down[-2::-1]


def route(topo: Topology, policy: str, flow: Flow, *, seed: int = 0,
          failed: Iterable[frozenset[str]] = ()) -> list[str]:
    """The node path ``[src, switch..., dst]`` that ``flow`` takes under ``policy``.

    ``failed`` holds links (as frozensets of their two node names) that are down;
    ``seed`` matters for a policy that hashes 5-tuples only. Raises :class:`NoPath` when no path
    remains and :class:`UserError` for an unknown or inapplicable policy.
    """
    return Router(topo, policy, seed, failed).walk(flow)


def routes(topo: Topology, policy: str, flows: Iterable[Flow], *, seed: int = 0,
           failed: Iterable[frozenset[str]] = ()) -> list[list[str]]:
    """:func:`route` of every flow, in order, with one router: its fabric distances and candidates are
    computed once instead of once per flow (what makes routing thousands of flows fast)."""
    router = Router(topo, policy, seed, failed)
    return [router.walk(flow) for flow in flows]


def path_links(path: list[str]) -> list[tuple[str, str]]:
    """The directed links ``(from, to)`` a path crosses."""
    return list(zip(path, path[1:], strict=False))


def hop_port(topo: Topology, node: str, nxt: str, src: str, dst: str) -> int:
    """The port ``node`` sends on towards ``nxt`` on a path from host ``src`` to host ``dst``.

    Tells parallel NIC links apart: leaving a PCIe switch a packet takes
    ``src``'s egress NIC towards ``dst`` (its pinned NIC but on a rail-only
    fabric), entering one ``dst``'s pinned NIC. A host sends on port 0.
    """
    if topo.is_host(node):
        return 0
    if topo.is_pcie_switch(node) and topo.is_switch(nxt):
        return topo.egress_nic(src, dst).a_port
    if topo.is_pcie_switch(nxt) and topo.is_switch(node):
        return topo.pinned_nic(dst).b_port
    return topo.port_to(node, nxt)


def server_sender(topo: Topology, pcie: str) -> str:
    """An accelerator of the server whose switch is ``pcie``: its traffic to any other server's accelerator
    leaves by the same NIC as that of every accelerator of the server (on a rail-only fabric)."""
    return topo.hosts_of(pcie)[0].name


def directed_links(topo: Topology, path: list[str]) -> list[tuple[str, int]]:
    """Each hop of ``path`` as ``(node, port it sends on)``: one directed physical link.

    Unlike :func:`path_links` this tells apart the parallel links of a
    server whose NICs share a fabric switch; ``topo.link_at(node, port)``
    gives the :class:`~emulator.model.topology.Link`.
    """
    return [(a, hop_port(topo, a, b, path[0], path[-1])) for a, b in path_links(path)]


def switch_links_of(path: list[str]) -> list[tuple[str, str]]:
    """The directed switch-to-switch links of a path (host links left out)."""
    return path_links(path)[1:-1]


def cut_pairs(topo: Topology, failed: Iterable[frozenset[str]]) -> list[tuple[str, str]]:
    """Ordered host pairs with no path left when ``failed`` links are down (pinned NICs only, with servers)."""
    reach = _Reach(topo, failed)
    if topo.rail_only or reach.nic_switches:  # the way out depends on the receiver, or some switches are no transit
        return [(s, d) for s, d in all_host_pairs(topo) if not reach.reachable(s, d)]
    component = {node: i for i, part in enumerate(nx.connected_components(reach.fabric)) for node in part}
    where = {}
    for h in topo.hosts:
        access = reach.access(h.name)
        where[h.name] = None if access is None else component[access[-1]]
    out: list[tuple[str, str]] = []
    for src in topo.hosts:
        for dst in topo.hosts:
            if src.name == dst.name:
                continue
            if topo.same_server(src.name, dst.name):
                ok = reach.up(src.name, src.switch) and reach.up(dst.name, dst.switch)
            else:
                ok = where[src.name] is not None and where[src.name] == where[dst.name]
            if not ok:
                out.append((src.name, dst.name))
    return out


def link_sharing(topo: Topology, policy: str, flows: Iterable[Flow], *, seed: int = 0,
                 failed: Iterable[frozenset[str]] = ()) -> dict[tuple[str, str], list[Flow]]:
    """Directed switch-to-switch links that two or more of ``flows`` cross, with those flows.

    Flows that are cut off are left out.
    """
    router = Router(topo, policy, seed, failed)
    users: dict[tuple[str, str], list[Flow]] = {}
    for flow in flows:
        try:
            path = router.walk(flow)
        except NoPath:
            continue
        for link in switch_links_of(path):
            users.setdefault(link, []).append(flow)
    return {link: fl for link, fl in sorted(users.items(), key=lambda kv: (node_sort_key(kv[0][0]),
                                                                          node_sort_key(kv[0][1])))
            if len(fl) > 1}


