"""Topology kinds: one registration per kind, and the one place to add a kind.

This module owns what makes a kind a kind: a :class:`TopologyKind` per kind
in :data:`KINDS` carries its spec keys, its host slots and switch count (to
check the limits before building), its builder, its bisection in closed
form, its stages where it is a multi-stage Clos fabric, and whether it is
the non-blocking ideal. Everything else reads this registration: the spec parser
(:mod:`emulator.model.topology.spec`) its keys and counts, the builders
(:mod:`emulator.model.topology.builders`) its builder, the model's
bisection (:mod:`emulator.model.topology.bisection`) its closed form,
:mod:`emulator.model.routing.policies` whether a policy is made for it, and the report
(:mod:`emulator.study.report`) its title and whether it is the ideal.

A builder adds the fabric's switches, reserves its host slots and connects
its switches through a :class:`FabricBuilder`, which numbers every switch's
ports as it goes; the order of its calls *is* the naming and numbering
scheme of the package docstring (:mod:`emulator.model.topology`): host slots
before switch links on every switch.

A bisection form takes the parsed keys, the host-link and the switch-link
rate and returns the fabric's bisection in Mbit/s (one direction). A cut
assigns every switch to a side; hosts whose switch is on the wrong side for
the balance cost their host link. BiGraph and leaf-spine are symmetric
within each switch group, so only how many switches of each group sit on
one side matters: enumerating those counts is exact. The unit tests compare
every form with a search over all switch assignments.

It imports nothing of the package, so every other module can read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: The role of a dual-plane NIC's switch: its host's slot, and its two ports' links to the planes. It forwards
#: between its host and the planes only, never from one plane to the other.
NIC_ROLE = "nic"


class FabricBuilder(Protocol):
    """What a kind's builder calls: switches, host slots and switch links, ports numbered in call order."""

    def add_switch(self, role: str, pod: int | None = None) -> str:
        """Add switch ``s<N>`` (the next number) with ``role``; return its name."""
        ...

    def add_slot(self, switch: str) -> None:
        """Reserve a host slot on ``switch``'s next port."""
        ...

    def connect(self, a: str, b: str, share: float | None = None) -> None:
        """Link ``a`` and ``b`` on their next ports, at the switch-link rate (``share``: that fraction of the
        host-link rate instead, for a NIC's ports)."""
        ...


@dataclass(frozen=True)
class ClosStages:
    """A multi-stage Clos fabric's shape, as destination-mod-k routing reads it: the stage of each switch role
    (0 at the hosts' switches) and the up-radix (uplinks of a switch towards the next stage) from parsed keys."""

    stages: Mapping[str, int]
    up_radix: Callable[[Mapping[str, Any]], int]


@dataclass(frozen=True)
class TopologyKind:
    """One topology kind: everything the package, routing and the report need to know of it."""

    name: str                      # the spec's KIND
    title: str                     # in the report's words ("leaf-spine")
    keys: Mapping[str, int]        # its required integer keys, each with its lower bound, in spec order
    counts: Callable[[Mapping[str, Any]], tuple[int, int]]            # (host slots, switches) from parsed keys
    build: Callable[[FabricBuilder, Mapping[str, Any]], None]         # switches, slots and links
    bisection: Callable[[Mapping[str, Any], float, float], float]     # (keys, host_bw, switch_bw) -> Mbit/s
    clos: ClosStages | None = None  # its stages, where it is a multi-stage Clos fabric
    even_keys: tuple[str, ...] = ()  # keys that must be even
    min_hosts: int = 2             # the fewest hosts (or host slots) a topology of this kind may have
    ideal: bool = False            # the non-blocking ideal: one switch, no routing choice, never a baseline
    rails: bool = False            # slots reserved rail by rail, ``hosts_per_rail`` per rail (``rails`` of them)
    rail_only: bool = False        # no spines: traffic between rails crosses the sender's server (needs servers)
    default_placement: str = "packed"  # the NIC placement when a spec with servers names none
    #: the fabric keys of the same design with ``slots`` host slots (its shape kept, see :func:`grown`), or None
    #: where the design has no such size
    grow: Callable[[Mapping[str, Any], int], dict[str, int] | None] | None = None


# ------------------------------------------------------------------ growing a design
def equal_radix(slots: int) -> int | None:
    """The radix of the equal-radix fabrics at ``slots`` hosts: the smallest power of two ``k`` with
    ``k²/2 >= slots`` (``docs/domain.md`` §5), where ``slots`` is a power of two of at least 8; else None. The
    paper-scale fabrics (:func:`emulator.model.prediction.projection.paper_scale_topologies`) are these kinds
    grown by it."""
    if slots < 8 or slots & (slots - 1):
        return None
    k = 4
    while k * k // 2 < slots:
        k *= 2
    return k


def _grow_bigraph(p: Mapping[str, Any], slots: int) -> dict[str, int] | None:
    k = equal_radix(slots)
    return None if k is None else {"upper": k // 2, "lower": k // 2, "hosts_per_switch": slots // k}


def _grow_leafspine(p: Mapping[str, Any], slots: int) -> dict[str, int] | None:
    k = equal_radix(slots)
    return None if k is None else {"leaves": slots // (k // 2), "spines": k // 2, "hosts_per_leaf": k // 2}


def _grow_fattree(p: Mapping[str, Any], slots: int) -> dict[str, int] | None:
    k = round((4 * slots) ** (1 / 3))
    return {"k": k} if k % 2 == 0 and k**3 // 4 == slots else None


def _grow_rails(p: Mapping[str, Any], slots: int) -> dict[str, int] | None:
    """The same rails, longer: ``slots / rails`` hosts per rail, spines in proportion (the leaves'
    oversubscription kept)."""
    rails = p["rails"]
    if slots % rails:
        return None
    h = slots // rails
    out = {"rails": rails, "hosts_per_rail": h}
    if "spines" in p:
        spines = p["spines"] * h / p["hosts_per_rail"]
        if spines != int(spines):
            return None
        out["spines"] = int(spines)
    return out


# ------------------------------------------------------------------ bisection helpers
def _balance_cost(side_hosts: int, n: int, hbw: float) -> float:
    """Host links cut to move hosts until one side holds floor(N/2) or ceil(N/2)."""
    return min(abs(side_hosts - n // 2), abs(side_hosts - (n + 1) // 2)) * hbw


def _bisect_two_groups(g1: int, g2: int, hosts1: int, hosts2: int, hbw: float, sbw: float) -> float:
    """Complete bipartite switch graph g1 x g2 with hosts1/hosts2 hosts per switch."""
    n = g1 * hosts1 + g2 * hosts2
    return min((a * (g2 - c) + (g1 - a) * c) * sbw + _balance_cost(a * hosts1 + c * hosts2, n, hbw)
               for a in range(g1 + 1) for c in range(g2 + 1))


# ------------------------------------------------------------------ bigraph
def _build_bigraph(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    upper = [b.add_switch("upper") for _ in range(p["upper"])]
    lower = [b.add_switch("lower") for _ in range(p["lower"])]
    # Hosts first on every switch so that ports 1..M are host ports.
    for sw in upper + lower:
        for _ in range(p["hosts_per_switch"]):
            b.add_slot(sw)
    for u in upper:
        for lo in lower:
            b.connect(u, lo)


def _bisect_bigraph(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    m = p["hosts_per_switch"]
    return _bisect_two_groups(p["upper"], p["lower"], m, m, hbw, sbw)


_BIGRAPH = TopologyKind(
    name="bigraph", title="BiGraph", keys={"upper": 1, "lower": 1, "hosts_per_switch": 1},
    counts=lambda p: ((p["upper"] + p["lower"]) * p["hosts_per_switch"], p["upper"] + p["lower"]),
    build=_build_bigraph, bisection=_bisect_bigraph, grow=_grow_bigraph)


# ------------------------------------------------------------------ fat-tree
def _build_fattree(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    k = p["k"]
    half = k // 2
    edges = [[b.add_switch("edge", pod) for _ in range(half)] for pod in range(k)]
    aggs = [[b.add_switch("agg", pod) for _ in range(half)] for pod in range(k)]
    cores = [b.add_switch("core") for _ in range(half * half)]
    for pod in range(k):
        for edge in edges[pod]:
            for _ in range(half):
                b.add_slot(edge)
    for pod in range(k):
        for edge in edges[pod]:
            for agg in aggs[pod]:
                b.connect(edge, agg)
    # Core switch i*half + j links to aggregation switch i of every pod.
    for pod in range(k):
        for i, agg in enumerate(aggs[pod]):
            for j in range(half):
                b.connect(agg, cores[i * half + j])


def _bisect_fattree(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    # Full bisection: cut the hosts' links, or half the pods' k/2 * (k/2)^2
    # aggregation-core links (k**3 / 8 in all).
    k = p["k"]
    return min((k**3 // 4 // 2) * hbw, (k**3 // 8) * sbw)


_FATTREE = TopologyKind(
    name="fattree", title="fat-tree", keys={"k": 2}, even_keys=("k",),
    counts=lambda p: (p["k"] ** 3 // 4, 5 * p["k"] * p["k"] // 4),
    build=_build_fattree, bisection=_bisect_fattree, grow=_grow_fattree,
    clos=ClosStages({"edge": 0, "agg": 1, "core": 2}, lambda p: p["k"] // 2))


# ------------------------------------------------------------------ leaf-spine
def _leaf_spine(b: FabricBuilder, leaves: int, spines: int, hosts_per_leaf: int) -> None:
    """``leaves`` leaves, then ``spines`` spines; ``hosts_per_leaf`` slots on every leaf, leaf by leaf; every
    leaf linked to every spine. Leaf-spine, and the rail fabrics (a rail is a leaf; rail-only has no spines)."""
    leaf_names = [b.add_switch("leaf") for _ in range(leaves)]
    spine_names = [b.add_switch("spine") for _ in range(spines)]
    for leaf in leaf_names:
        for _ in range(hosts_per_leaf):
            b.add_slot(leaf)
    for leaf in leaf_names:
        for spine in spine_names:
            b.connect(leaf, spine)


def _build_leafspine(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    _leaf_spine(b, p["leaves"], p["spines"], p["hosts_per_leaf"])


def _bisect_leafspine(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return _bisect_two_groups(p["leaves"], p["spines"], p["hosts_per_leaf"], 0, hbw, sbw)


_LEAFSPINE = TopologyKind(
    name="leafspine", title="leaf-spine", keys={"leaves": 1, "spines": 1, "hosts_per_leaf": 1},
    counts=lambda p: (p["leaves"] * p["hosts_per_leaf"], p["leaves"] + p["spines"]),
    build=_build_leafspine, bisection=_bisect_leafspine, grow=_grow_leafspine,
    clos=ClosStages({"leaf": 0, "spine": 1}, lambda p: p["spines"]))


# ------------------------------------------------------------------ rail-optimized
def _build_rail(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    _leaf_spine(b, p["rails"], p["spines"], p["hosts_per_rail"])


def _bisect_rail(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return _bisect_two_groups(p["rails"], p["spines"], p["hosts_per_rail"], 0, hbw, sbw)


_RAIL = TopologyKind(
    name="rail", title="rail-optimized", keys={"rails": 1, "hosts_per_rail": 1, "spines": 1},
    counts=lambda p: (p["rails"] * p["hosts_per_rail"], p["rails"] + p["spines"]),
    build=_build_rail, bisection=_bisect_rail, rails=True, default_placement="rail", grow=_grow_rails,
    clos=ClosStages({"leaf": 0, "spine": 1}, lambda p: p["spines"]))


# ------------------------------------------------------------------ dual-plane
def _build_dualplane(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    # Host slots on the NICs' own switches, rail by rail; each NIC's two ports (half the host rate each) go to
    # its rail's leaf in plane 0 and in plane 1; each plane is a leaf-spine of its own.
    nics = [b.add_switch(NIC_ROLE) for _ in range(p["rails"] * p["hosts_per_rail"])]
    leaves = [[b.add_switch("leaf", plane) for _ in range(p["rails"])] for plane in (0, 1)]
    spines = [[b.add_switch("spine", plane) for _ in range(p["spines"])] for plane in (0, 1)]
    for nic in nics:
        b.add_slot(nic)
    for i, nic in enumerate(nics):
        for plane in (0, 1):
            b.connect(nic, leaves[plane][i // p["hosts_per_rail"]], share=0.5)
    for plane in (0, 1):
        for leaf in leaves[plane]:
            for spine in spines[plane]:
                b.connect(leaf, spine)


def _bisect_dualplane(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    """Per rail, its two leaves on one side (``k0`` rails on side 0, ``k1`` on side 1) or on opposite sides
    (``j`` of the split rails with the plane-0 leaf on side 0); per plane, how many spines on side 0. A host of
    a rail whose leaves agree costs nothing on their side and its host link (or its NIC's two ports, as much)
    on the other; a host of a split rail costs one port (half the host rate) on either side."""
    r, h, sp = p["rails"], p["hosts_per_rail"], p["spines"]
    n = r * h
    best = float("inf")
    for k0 in range(r + 1):
        for k1 in range(r - k0 + 1):
            split = r - k0 - k1
            fixed0, flexible = k0 * h, split * h
            target_lo, target_hi = n // 2, (n + 1) // 2
            balance = min(max(0, t - fixed0 - flexible, fixed0 - t) for t in (target_lo, target_hi))
            hosts = flexible * hbw / 2 + balance * hbw
            for j in range(split + 1):
                planes = 0.0
                for side0 in (k0 + j, k0 + split - j):
                    planes += min((side0 * (sp - c) + (r - side0) * c) for c in range(sp + 1)) * sbw
                best = min(best, hosts + planes)
    return best


_DUALPLANE = TopologyKind(
    name="dualplane", title="dual-plane", keys={"rails": 1, "hosts_per_rail": 1, "spines": 1},
    counts=lambda p: (p["rails"] * p["hosts_per_rail"], p["rails"] * p["hosts_per_rail"] + 2 * (p["rails"] + p["spines"])),
    build=_build_dualplane, bisection=_bisect_dualplane, rails=True, default_placement="rail", grow=_grow_rails)


# ------------------------------------------------------------------ rail-only
def _build_railonly(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    _leaf_spine(b, p["rails"], 0, p["hosts_per_rail"])


_RAILONLY = TopologyKind(
    name="railonly", title="rail-only", keys={"rails": 1, "hosts_per_rail": 1},
    counts=lambda p: (p["rails"] * p["hosts_per_rail"], p["rails"]),
    build=_build_railonly, bisection=lambda p, hbw, sbw: p["rails"] * (p["hosts_per_rail"] // 2) * hbw,
    rails=True, rail_only=True, default_placement="rail", grow=_grow_rails)


# ------------------------------------------------------------------ star
def _build_star(b: FabricBuilder, p: Mapping[str, Any]) -> None:
    sw = b.add_switch("star")
    for _ in range(p["hosts"]):
        b.add_slot(sw)


_STAR = TopologyKind(
    name="star", title="star", keys={"hosts": 1}, counts=lambda p: (p["hosts"], 1),
    build=_build_star, bisection=lambda p, hbw, sbw: (p["hosts"] // 2) * hbw, min_hosts=1, ideal=True,
    grow=lambda p, slots: {"hosts": slots})


#: Every kind by name, in the order error messages list them.
KINDS: dict[str, TopologyKind] = {k.name: k for k in (_BIGRAPH, _FATTREE, _LEAFSPINE, _RAIL, _DUALPLANE, _RAILONLY,
                                                       _STAR)}


def is_ideal(kind: str) -> bool:
    """Whether ``kind`` names the non-blocking ideal (a single switch), which the report never counts a baseline."""
    return kind in KINDS and KINDS[kind].ideal
