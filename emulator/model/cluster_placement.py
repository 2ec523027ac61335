"""Which server of a cluster each node of a topology runs on: few links across servers, every server its share.

Pure. A node never runs alone where it belongs with others:

* a switch with hosts keeps them (a BiGraph switch, a leaf, a fat-tree edge
  switch, with its hosts): traffic between a host and its switch never
  crosses servers;
* a server of accelerators (its PCIe switch and accelerators) stays whole,
  with the fabric switch its first NIC is linked to;
* every other switch (spines, cores, aggregation) is a group of its own.

Groups go to servers so that each server's share of the nodes follows its
weight (by default all alike; a server may take one group more than its
share: groups do not split) and as few links as possible cross servers:
a greedy start (each group where most of its links already are, largest
groups first) refined by moves and swaps while one lowers the cut.
:func:`place` returns the :class:`Placement`; :func:`overridden` applies a
placement file (server -> the nodes it must run, read and checked by
:func:`read_overrides` before anything is built) on top of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.documents import read_document
from emulator.base.errors import FieldError, printable
from emulator.model.topology import Topology


@dataclass(frozen=True)
class Placement:
    """Every node's server, and the links between nodes on different servers (each one a tunnel)."""

    servers: tuple[str, ...]
    of: Mapping[str, str]  # node name -> server name
    cross_links: int

    def nodes_on(self, server: str) -> list[str]:
        return [node for node, s in self.of.items() if s == server]

    def to_json(self) -> dict[str, Any]:
        return {"servers": {s: sorted(self.nodes_on(s)) for s in self.servers}, "cross_links": self.cross_links}

    def describe(self, topo: Topology, head: str) -> str:
        """One line: the links that cross servers, and each server's share (the head marked)."""
        shares = []
        for server in self.servers:
            nodes = self.nodes_on(server)
            hosts = sum(1 for n in nodes if topo.is_host(n))
            shares.append(f"{server}{' (head)' if server == head else ''} {hosts} hosts + {len(nodes) - hosts} switches")
        return f"{self.cross_links} of {len(topo.links)} links cross servers (VXLAN); " + ", ".join(shares)


def groups(topo: Topology) -> list[list[str]]:
    """The nodes that must share a server (see the module docstring), each group led by its switch."""
    leader: dict[str, str] = {}
    for sw in topo.switches:
        leader[sw.name] = sw.name
    for host in topo.hosts:
        leader[host.name] = host.switch
    if topo.has_servers:
        for sw in topo.switches:
            if topo.is_pcie_switch(sw.name):
                fabric = next((n for n in topo.neighbors(sw.name) if topo.is_fabric_switch(n)), sw.name)
                for node, lead in list(leader.items()):
                    if lead == sw.name:
                        leader[node] = fabric
    members: dict[str, list[str]] = {}
    for node, lead in leader.items():
        members.setdefault(lead, []).append(node)
    return [sorted(nodes, key=lambda n: (n != lead, n)) for lead, nodes in members.items()]


def cut(topo: Topology, of: Mapping[str, str]) -> int:
    """How many links join nodes on different servers."""
    return sum(1 for lk in topo.links if of[lk.a] != of[lk.b])


def place(topo: Topology, servers: Sequence[str], weights: Mapping[str, float] | None = None) -> Placement:
    """Every node on one of ``servers`` (see the module docstring); ``weights`` their relative shares."""
    if not servers:
        raise ValueError("no servers to place on")
    parts = groups(topo)
    index = {node: i for i, nodes in enumerate(parts) for node in nodes}
    links: dict[tuple[int, int], int] = {}
    for lk in topo.links:
        a, b = index[lk.a], index[lk.b]
        if a != b:
            key = (min(a, b), max(a, b))
            links[key] = links.get(key, 0) + 1
    state = _Partition(parts, links, servers, weights)
    state.greedy()
    state.refine()
    of = {node: servers[state.server[i]] for i, nodes in enumerate(parts) for node in nodes}
    return Placement(tuple(servers), of, cut(topo, of))


#: A placement file as read: server -> the nodes it must run, in the file's order.
Overrides = Mapping[str, tuple[str, ...]]


def read_overrides(path: str, servers: Sequence[str]) -> Overrides:
    """A placement file (YAML: ``{server: [node, ...]}``), its shape and servers checked before anything is
    built or proved (its nodes are a topology's: :func:`overridden` checks them); one-line :class:`FieldError`."""
    where = f"placement file {printable(path)}"
    return parse_overrides(read_document(path, where, "yaml"), printable(path), servers)


def parse_overrides(data: object, where: str, servers: Sequence[str]) -> Overrides:
    """``data`` as a placement file's :data:`Overrides`: a mapping of the cluster's servers to lists of node
    names, each listed once; :class:`FieldError` naming the server or entry."""
    if not isinstance(data, Mapping):
        raise FieldError(where, "placement", "a mapping of server name to the nodes it runs", data)
    listed: set[str] = set()
    out: dict[str, tuple[str, ...]] = {}
    for server, names in data.items():
        if not isinstance(server, str) or server not in servers:
            raise FieldError(where, str(server), f"a server of the cluster ({', '.join(servers)})", server)
        if not isinstance(names, list | tuple):  # a tuple: overrides read already
            raise FieldError(where, server, "a list of node names", names)
        for i, name in enumerate(names):
            if not isinstance(name, str):
                raise FieldError(where, f"{server}[{i}]", "a node name (a host or switch, such as h1 or s2)", name)
            if name in listed:
                raise FieldError(where, f"{server}[{i}]", "a node listed once", name)
            listed.add(name)
        out[server] = tuple(names)
    return out


def overridden(placement: Placement, topo: Topology, data: object, where: str = "placement file") -> Placement:
    """``placement`` with a placement file's choices on top (:func:`parse_overrides`); every other node stays.
    :class:`FieldError` for an unknown server or node, or a node listed twice."""
    overrides = parse_overrides(data, where, placement.servers)
    nodes = {h.name for h in topo.hosts} | {s.name for s in topo.switches}
    of = dict(placement.of)
    for server, names in overrides.items():
        for i, name in enumerate(names):
            if name not in nodes:
                raise FieldError(where, f"{server}[{i}]", f"a host or switch of {topo.spec}", name)
            of[name] = server
    return Placement(placement.servers, of, cut(topo, of))


class _Partition:
    """Groups on servers: their sizes against each server's limit, and the links between groups."""

    def __init__(self, parts: list[list[str]], links: Mapping[tuple[int, int], int], servers: Sequence[str],
                 weights: Mapping[str, float] | None):
        self.size = [len(p) for p in parts]
        self.neighbours: list[dict[int, int]] = [{} for _ in parts]
        for (a, b), n in links.items():
            self.neighbours[a][b] = n
            self.neighbours[b][a] = n
        w = [max(0.0, (weights or {}).get(s, 1.0)) for s in servers]
        if not sum(w):
            w = [1.0] * len(servers)
        total = sum(self.size)
        biggest = max(self.size)
        # a server's share of the nodes, and a group more than that at most (groups do not split)
        self.limit = [math.ceil(total * x / sum(w)) + biggest - 1 for x in w]
        self.load = [0] * len(servers)
        self.server = [-1] * len(parts)

    def greedy(self) -> None:
        order = sorted(range(len(self.size)), key=lambda g: (-self.size[g], -sum(self.neighbours[g].values()), g))
        for g in order:
            fits = [s for s in range(len(self.load)) if self.load[s] + self.size[g] <= self.limit[s]]
            choices = fits or range(len(self.load))
            best = max(choices, key=lambda s: (self._links_to(g, s), -self.load[s] / max(self.limit[s], 1), -s))
            self._put(g, best)

    def refine(self) -> None:
        """Moves and swaps of groups between servers, the best first, while one lowers the cut."""
        while True:
            best_gain = 0
            best_step: tuple[int, int, int | None] | None = None
            for g in range(len(self.size)):
                here = self.server[g]
                for s in range(len(self.load)):
                    if s == here:
                        continue
                    if self.load[s] + self.size[g] <= self.limit[s]:
                        gain = self._links_to(g, s) - self._links_to(g, here)
                        if gain > best_gain:
                            best_gain, best_step = gain, (g, s, None)
                    for h in range(g + 1, len(self.size)):
                        if self.server[h] != s or not self._swap_fits(g, h):
                            continue
                        gain = self._swap_gain(g, h)
                        if gain > best_gain:
                            best_gain, best_step = gain, (g, s, h)
            if best_step is None:
                return
            group, to, partner = best_step
            if partner is not None:  # a swap: the partner goes where the group was
                self._move(partner, self.server[group])
            self._move(group, to)

    def _links_to(self, g: int, s: int) -> int:
        return sum(n for other, n in self.neighbours[g].items() if self.server[other] == s)

    def _swap_gain(self, g: int, h: int) -> int:
        a, b = self.server[g], self.server[h]
        between = self.neighbours[g].get(h, 0)  # stays cut either way
        return (self._links_to(g, b) - between - self._links_to(g, a)
                + self._links_to(h, a) - between - self._links_to(h, b))

    def _swap_fits(self, g: int, h: int) -> bool:
        a, b = self.server[g], self.server[h]
        diff = self.size[h] - self.size[g]
        return self.load[a] + diff <= self.limit[a] and self.load[b] - diff <= self.limit[b]

    def _put(self, g: int, s: int) -> None:
        self.server[g] = s
        self.load[s] += self.size[g]

    def _move(self, g: int, s: int) -> None:
        self.load[self.server[g]] -= self.size[g]
        self._put(g, s)
