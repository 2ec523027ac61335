"""Routing policies: one registration per policy, and the one place to add a policy.

A policy is a subclass of :class:`RoutingPolicy`, registered with
:func:`register`. It declares once what every other module needs to know of
it (its name and title, the topology kinds it is made for, whether it hashes
5-tuples, whether it chooses per host pair) and makes the choices: at a
fabric switch with several candidate next hops (the fabric neighbours one hop
closer to the destination's slot switch, sorted by name,
:mod:`emulator.model.routing.paths`), which one a destination's entries
(:meth:`RoutingPolicy.by_destination`) and a flow (:meth:`RoutingPolicy.by_flow`)
take. Everything else asks the registry (:func:`policy`): the router and the
flow table (:mod:`~emulator.model.routing.paths`,
:mod:`~emulator.model.routing.flow_table`), the controller, the experiment
files, the report; no other module compares a policy's name.

The policies read a host's *slot* where they read its switch, port or
number: for a host without servers that is its own switch, ``switch_port - 1``
and ``index - 1``; with servers the same of its pinned NIC's slot
(:meth:`~emulator.model.topology.Topology.nic_slot`).

* ``shortest`` -- one deterministic shortest path per destination (the naive
  baseline): the first candidate, i.e. the lowest-numbered switch. Applies to
  every topology.
* ``dmodk`` -- destination-mod-k static routing for the multi-stage Clos
  fabrics (the kinds whose registration has :attr:`~emulator.model.topology.TopologyKind.clos`:
  fat-tree, leaf-spine, rail-optimized; the classic deterministic baseline).
  With ``d`` the destination's 0-based host number and ``r`` the fabric's
  up-radix (``k/2`` for a fat-tree, the number of spines for a leaf-spine), a
  switch at stage ``t`` (edge/leaf 0, aggregation/spine 1, core 2) takes
  candidate ``(d // r**t) mod n`` of its ``n`` candidates (``d``: the global
  slot index): edge switches spread destinations over aggregation switches
  by ``d mod k/2``, aggregation switches over cores by ``(d // (k/2)) mod k/2``.
* ``bigraph`` -- topology-aware routing for ``bigraph`` only. Hosts in
  different groups take the unique direct path (their two switches and the
  upper-lower link between them). Hosts on different switches of the same
  group cross one switch of the other group: with ``a``, ``b`` the 0-based
  positions of the source's and destination's switch in their group, ``i``,
  ``j`` the 0-based positions of the two hosts on their switches, ``M``
  hosts per switch and ``n`` candidates, the source switch takes candidate
  ``(i + M*j + a + b) mod n``. For one pair of switches the ``M*M`` host
  pairs take consecutive values of ``i + M*j``, so they spread evenly over
  the other group (each middle switch carries ``floor`` or ``ceil`` of
  ``M*M/n`` of them), and ``a + b`` rotates the remainder between switch
  pairs. The same rule chooses at any other switch with several candidates
  (only after link failures).
* ``ecmp`` -- per-flow hashing as a datacenter switch does: a switch takes
  candidate ``H mod n`` where ``H`` is the first 8 bytes of BLAKE2b over
  ``"<seed>|<switch>|<src ip>|<dst ip>|<proto>|<sport>|<dport>"`` (the
  switch name is in the key so that consecutive switches do not polarise).
  Stable across processes and reproducible for a given ``--ecmp-seed``.
  Every TCP flow with both ports nonzero hashes its full 5-tuple (each
  direction of a connection on its own, as a real fabric does): agent
  connections (:func:`~emulator.model.routing.flows.agent_flow`), MPI,
  iperf3, any client. Everything else of a host pair (ICMP, UDP, ARP,
  ``Flow(src, dst, 0)``) hashes only ``<src ip>|<dst ip>`` (the fields with
  ``proto``, ``sport`` and ``dport`` empty) and so takes the pair's one
  fallback path. :func:`~emulator.model.routing.paths.route` predicts both:
  ``route(topo, "ecmp", Flow(src, dst, 6, sport, dport), seed=s)`` is the path
  of any TCP connection under the controller started with seed ``s``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import ClassVar

from emulator.base.errors import FieldError
from emulator.model.routing.flows import Flow
from emulator.model.topology import KINDS, Topology, TopologyKind


class RoutingPolicy:
    """One routing policy, bound to one topology and seed: its registration and its choices.

    To add a policy, subclass this: set :attr:`name` and :attr:`title` (and
    the properties below that hold for it), override :meth:`applies_to` if it
    is made for some kinds only, override the choices it makes differently
    from ``shortest`` (the first candidate), and :func:`register` the class.
    The router calls the choices only where there are two or more candidates.
    """

    #: The policy's name in specs, files and on the command line.
    name: ClassVar[str]
    #: The policy in the report's words ("ECMP").
    title: ClassVar[str]
    #: Whether its choices hash each TCP connection's 5-tuple with a seed. Then the seed changes the paths (runs
    #: are repeated over seeds, and named with theirs), every agent connection gets an exact 5-tuple entry of its
    #: own, and the controller learns every other TCP connection on its first packet.
    hashes_five_tuples: ClassVar[bool] = False
    #: Whether it chooses per host pair: where a pair's path leaves its destination's default, the pair gets a
    #: source+destination entry.
    per_pair: ClassVar[bool] = False

    def __init__(self, topo: Topology, seed: int = 0):
        self.topo = topo
        self.seed = int(seed)

    @classmethod
    def applies_to(cls, kind: TopologyKind) -> bool:
        """Whether the policy is made for topologies of ``kind`` (by default: every kind)."""
        return True

    def by_destination(self, node: str, cands: Sequence[str], dst: str) -> str:
        """The next hop at fabric switch ``node`` of anything to host ``dst``: what its destination entries say."""
        return cands[0]

    def by_flow(self, node: str, cands: Sequence[str], flow: Flow, exact: bool) -> str:
        """The next hop of ``flow`` at fabric switch ``node``; ``exact``: the policy hashes the flow's whole
        5-tuple (:attr:`hashes_five_tuples`, a TCP flow with both ports set)."""
        return self.by_destination(node, cands, flow.dst)


#: Every policy by name, in the order error messages list them (the order of registration).
POLICIES: dict[str, type[RoutingPolicy]] = {}


def register(cls: type[RoutingPolicy]) -> type[RoutingPolicy]:
    """Add a policy to :data:`POLICIES` (a class decorator); :class:`ValueError` for a name taken."""
    if cls.name in POLICIES and POLICIES[cls.name] is not cls:
        raise ValueError(f"a routing policy named {cls.name} is registered already")
    POLICIES[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Take a policy out of :data:`POLICIES` (for tests that register one of their own)."""
    POLICIES.pop(name, None)


def policy(name: str) -> type[RoutingPolicy]:
    """The registered policy of that name; :class:`FieldError` naming the policies there are."""
    if name not in POLICIES:
        raise FieldError("routing", "policy", f"one of {', '.join(POLICIES)}", name)
    return POLICIES[name]


def policy_kinds(name: str) -> tuple[str, ...] | None:
    """The topology kinds policy ``name`` is made for, in the kinds' order (None: every kind)."""
    kinds = tuple(k.name for k in KINDS.values() if policy(name).applies_to(k))
    return None if len(kinds) == len(KINDS) else kinds


def check_policy(topo: Topology, name: str) -> type[RoutingPolicy]:
    """The policy ``name`` if it is registered and applies to ``topo``; else :class:`FieldError`, naming those that
    do."""
    cls = policy(name)
    if not cls.applies_to(KINDS[topo.kind]):
        kinds = policy_kinds(name) or ()
        usable = ", ".join(p for p, c in POLICIES.items() if c.applies_to(KINDS[topo.kind]))
        raise FieldError(f"routing for {topo.kind}", "policy",
                         f"one of {usable} ({name} applies to {' and '.join(kinds)} only)", name)
    return cls


def hashes_five_tuples(name: str) -> bool:
    """Whether policy ``name`` hashes 5-tuples, so that its seed matters (False for a name not registered: a
    results folder may name a policy this version does not have)."""
    return name in POLICIES and POLICIES[name].hashes_five_tuples


def seeds_of(name: str, seeds: Sequence[int]) -> tuple[int, ...]:
    """The seeds a run of policy ``name`` repeats over: ``seeds`` for a policy that hashes 5-tuples, else 0 alone."""
    return tuple(seeds) if hashes_five_tuples(name) else (0,)


def label(name: str, seed: int) -> str:
    """How results name a policy with its seed: ``ecmp-s1`` for one that hashes 5-tuples, else the name."""
    return f"{name}-s{seed}" if hashes_five_tuples(name) else name


def seed_words(name: str, seed: int) -> str:
    """`` seed 1`` where the seed matters to the policy, else nothing (for console lines)."""
    return f" seed {seed}" if hashes_five_tuples(name) else ""


def title(name: str) -> str:
    """The policy in the report's words; a name not registered as it is."""
    return POLICIES[name].title if name in POLICIES else name


def own_routing(kind: str, name: str) -> bool:
    """Whether policy ``name`` is made for topology kind ``kind`` alone (BiGraph's routing on a BiGraph): the
    report names such a design by its kind only."""
    return name in POLICIES and kind in KINDS and policy_kinds(name) == (kind,)


# ------------------------------------------------------------------ the policies
@register
class BiGraphRouting(RoutingPolicy):
    name = "bigraph"
    title = "BiGraph routing"
    per_pair = True

    @classmethod
    def applies_to(cls, kind: TopologyKind) -> bool:
        return kind.name == "bigraph"

    def __init__(self, topo: Topology, seed: int = 0):
        super().__init__(topo, seed)
        self._group_pos: dict[str, int] = {}
        for role in ("upper", "lower"):
            for pos, sw in enumerate(s for s in topo.switches if s.role == role):
                self._group_pos[sw.name] = pos

    def by_flow(self, node: str, cands: Sequence[str], flow: Flow, exact: bool) -> str:
        src_switch, i, _ = self.topo.nic_slot(flow.src)
        dst_switch, j, _ = self.topo.nic_slot(flow.dst)
        m = self.topo.params["hosts_per_switch"]
        a, b = self._group_pos[src_switch], self._group_pos[dst_switch]
        return cands[(i + m * j + a + b) % len(cands)]


@register
class DestinationModK(RoutingPolicy):
    name = "dmodk"
    title = "d-mod-k"

    @classmethod
    def applies_to(cls, kind: TopologyKind) -> bool:
        return kind.clos is not None

    def __init__(self, topo: Topology, seed: int = 0):
        super().__init__(topo, seed)
        clos = KINDS[topo.kind].clos
        assert clos is not None  # check_policy refuses every other kind
        self._stages = clos.stages
        self._radix = clos.up_radix(topo.params)

    def by_destination(self, node: str, cands: Sequence[str], dst: str) -> str:
        stage = self._stages.get(self.topo.switch(node).role, 0)
        d = self.topo.nic_slot(dst)[2]
        return cands[(d // self._radix**stage) % len(cands)]


@register
class Ecmp(RoutingPolicy):
    name = "ecmp"
    title = "ECMP"
    hashes_five_tuples = True
    per_pair = True

    def by_flow(self, node: str, cands: Sequence[str], flow: Flow, exact: bool) -> str:
        return cands[ecmp_hash(self.topo, self.seed, node, flow, exact) % len(cands)]


@register
class ShortestPath(RoutingPolicy):
    name = "shortest"
    title = "shortest-path"


def ecmp_hash(topo: Topology, seed: int, switch: str, flow: Flow, exact: bool) -> int:
    """The ``ecmp`` hash of ``flow`` at ``switch`` (see the module docstring)."""
    src, dst = topo.host(flow.src).ip, topo.host(flow.dst).ip
    tail = f"{flow.proto}|{flow.sport}|{flow.dport}" if exact else "||"
    key = f"{int(seed)}|{switch}|{src}|{dst}|{tail}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
