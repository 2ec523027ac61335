"""Contention and the step models of a schedule on a topology.

Every send operation is a transfer; transfers with the same ``step`` are taken
to run at the same time. Each transfer is routed with the controller's own
pure routing logic, ``routing.route(topo, policy, routing.agent_flow(topo,
src_host, dst_host, lane), seed=seed)``, so the path is the one the agent's TCP
connection on that lane takes (ECMP hashes every lane's 5-tuple on its own).
``compute`` operations move no data: they are no transfer and cost nothing
here (the timing model charges them). Per step this module counts the flows
on every directed link and charges the step by two lockstep models:

alpha-beta (no contention)
    the slowest transfer alone: its latency (rendezvous, message latency and
    store-and-forward tail, :mod:`emulator.model.latency`) plus ``bytes / rate``,
    ``rate`` the goodput of the slowest link on its path. With latency
    ``alpha`` per message only, a ring on a star sums to exactly
    ``2(p-1)·alpha + 2(p-1)/p·n·beta`` (``docs/domain.md`` §2; every
    generated algorithm's closed form is in its registration,
    :func:`emulator.model.collectives.registry.collective_formula`).
max-min fair (flow level)
    all transfers of the step start together; every directed link's goodput is
    shared max-min fairly (progressive filling, bottleneck by bottleneck);
    whenever a flow finishes the rates are recomputed. The step lasts the
    largest transfer latency plus the time until the last flow finishes.

The prediction itself is the timing model's (:mod:`emulator.model.prediction.timing`),
which follows the agents' dependencies instead of lockstep steps; it shares
:func:`maxmin_rates` and :func:`path_function` with this module.

Rates: a link of ``bw_mbps`` carries ``bw_mbps·1e6/8·goodput`` bytes/s in each
direction, ``goodput`` = TCP payload per wire byte at the network's MTU
(:func:`emulator.model.topology.tcp_goodput_factor`: 0.9923 at 9000, 1448/1514 at
1500). Local reductions cost ``gamma`` seconds per byte (default 0: not
modelled).

A server's accelerator interconnect (``domain_bw``, :meth:`Topology.over_domain`)
is two directed links per transfer: the sender's port into it and the
receiver's port out of it, named ``(host, "<switch>~domain")`` and
``("<switch>~domain", host)`` after the server's switch, each of
``domain_bw·1e6/8`` bytes/s (no frames, no TCP: the agents time these
transfers themselves, :mod:`emulator.emulation.agents.interconnect`). Such a path crosses
:data:`~emulator.model.fabric.DOMAIN` switches for its latency and none of
the datapath's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from emulator.model import routing
from emulator.model.fabric import DOMAIN
from emulator.model.latency import LatencyModel
from emulator.model.schedule.format import RECV_REDUCE, REDUCE, SEND, Schedule
from emulator.model.topology import DEFAULT_MTU, Topology, last_segment_bytes, tcp_goodput_factor, tcp_payload_bytes

TCP_GOODPUT = tcp_goodput_factor(DEFAULT_MTU)  # the emulated network's default MTU

Link = tuple[str, str]


@dataclass
class Transfer:
    step: int
    src: int
    dst: int
    src_host: str
    dst_host: str
    bytes: int
    path: list[str]
    lane: int = 0
    domain: bool = False  # over the server's accelerator interconnect, not the datapath

    @property
    def switches(self) -> int:
        """The switches its latency counts (:data:`~emulator.model.fabric.DOMAIN` over an interconnect)."""
        return DOMAIN if self.domain else len(self.path) - 2

    @property
    def datapath_switches(self) -> int:
        """The switches of the datapath its packets cross (none over an interconnect)."""
        return 0 if self.domain else len(self.path) - 2


@dataclass
class StepCost:
    step: int
    transfers: int
    bytes: int  # the largest transfer
    flows_per_link: dict[Link, int]
    alpha_beta_s: float
    maxmin_s: float

    @property
    def max_flows_per_link(self) -> int:
        return max(self.flows_per_link.values(), default=0)

    def busiest(self, n: int = 3) -> list[tuple[Link, int]]:
        return sorted(self.flows_per_link.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "transfers": self.transfers, "bytes": self.bytes,
                "max_flows_per_link": self.max_flows_per_link,
                "busiest_links": [{"link": list(link), "flows": n} for link, n in self.busiest() if n > 1],
                "alpha_beta_s": self.alpha_beta_s, "maxmin_s": self.maxmin_s}


@dataclass
class CostReport:
    routing: str
    seed: int
    latency: LatencyModel
    goodput: float
    mtu: int
    steps: list[StepCost] = field(default_factory=list)
    switch_counts: list[int] = field(default_factory=list)  # of every transfer's path
    transfers: list[Transfer] = field(default_factory=list)  # every send with its routed path

    @property
    def max_flows_per_link(self) -> list[int]:
        return [s.max_flows_per_link for s in self.steps]

    @property
    def alpha_beta_time_s(self) -> float:
        return sum(s.alpha_beta_s for s in self.steps)

    @property
    def maxmin_time_s(self) -> float:
        return sum(s.maxmin_s for s in self.steps)


#: The 5-tuple of the connection ``src`` host uses to send to ``dst`` host on a lane.
FlowOf = Callable[[str, str, int], routing.Flow]


def transfers(schedule: Schedule, topo: Topology, policy: str, seed: int = 0,
              flow_of: FlowOf | None = None) -> list[Transfer]:
    """Every send of the schedule with the routed path of its lane's connection (via :func:`emulator.model.routing.route`).

    ``flow_of`` gives each connection's 5-tuple (what ``ecmp`` hashes); None: the agents' own.
    """
    paths: dict[tuple[str, str, int], list[str]] = {}
    out = []
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind != SEND:
                continue
            src, dst = prog.host, schedule.ranks[op.partner].host
            key = (src, dst, op.lane)
            if key not in paths:
                flow = routing.agent_flow(topo, src, dst, op.lane) if flow_of is None else flow_of(src, dst, op.lane)
                paths[key] = routing.route(topo, policy, flow, seed=seed)
            out.append(Transfer(op.step, prog.rank, op.partner, src, dst, op.bytes, paths[key], op.lane,
                                topo.over_domain(src, dst)))
    return out


def link_capacity(topo: Topology, link: Link, goodput: float = TCP_GOODPUT) -> float:
    """Bytes per second one direction of ``link`` carries."""
    lk = topo.link_between(*link)
    if lk is None:
        raise KeyError(f"no link {link[0]} - {link[1]}")
    return lk.bw_mbps * 1e6 / 8 * goodput


def over_domain(topo: Topology, path: list[str]) -> bool:
    """Whether ``path`` (host, server switch, host) crosses its server's accelerator interconnect instead."""
    return len(path) == 3 and topo.over_domain(path[0], path[-1])


def domain_capacity(topo: Topology) -> float:
    """Bytes per second of one accelerator's port into (or out of) its server's interconnect."""
    return float(topo.params["domain_bw"]) * 1e6 / 8


def domain_links(topo: Topology, src: str, dst: str) -> list[Link]:
    """The two directed links of a transfer over the interconnect of the server of ``src`` and ``dst``."""
    port = f"{topo.host(src).switch}~domain"
    return [(src, port), (port, dst)]


def physical_links(topo: Topology, path: list[str], goodput: float = TCP_GOODPUT) -> list[tuple[Link, float]]:
    """The directed physical links of ``path`` with their capacities (bytes/s).

    A link is named ``(from, to)``; where a server has several NICs on one
    fabric switch the parallel links are told apart by the sending port,
    ``("s17-eth6", "s1")``, so each NIC counts its own flows. A path over a
    server's interconnect has its two ports (:func:`domain_links`).
    """
    if over_domain(topo, path):
        return [(link, domain_capacity(topo)) for link in domain_links(topo, path[0], path[-1])]
    out = []
    for (node, port), nxt in zip(routing.directed_links(topo, path), path[1:], strict=True):
        lk = topo.link_at(node, port) if port else topo.link_between(node, nxt)
        if lk is None:
            raise KeyError(f"no link {node} - {nxt}")
        name = (f"{node}-eth{port}", nxt) if len(topo.links_between(node, nxt)) > 1 else (node, nxt)
        out.append((name, lk.bw_mbps * 1e6 / 8 * goodput))
    return out


def path_byte_s(topo: Topology, path: list[str], goodput: float = TCP_GOODPUT) -> float:
    """Seconds per payload byte summed over ``path``'s links: a frame's serialisation on every one of them."""
    return sum(1 / capacity for _, capacity in physical_links(topo, path, goodput))


def maxmin_rates(flows: list[list[Link]], capacity: dict[Link, float]) -> list[float]:
    """Max-min fair rates by progressive filling; ``flows`` are lists of directed links."""
    rates = [0.0] * len(flows)
    left = dict(capacity)
    on_link: dict[Link, set[int]] = {}
    for f, links in enumerate(flows):
        for link in links:
            on_link.setdefault(link, set()).add(f)
    unfixed = set(range(len(flows)))
    while unfixed:
        share = {link: left[link] / len(fs) for link, fs in on_link.items() if fs}
        bottleneck = min(share.values())
        tight = [link for link, s in share.items() if s <= bottleneck * (1 + 1e-12)]
        fixed = set().union(*(on_link[link] for link in tight))
        for f in fixed:
            rates[f] = bottleneck
            unfixed.discard(f)
            for link in flows[f]:
                left[link] -= bottleneck
                on_link[link].discard(f)
    return rates


def maxmin_completion(sizes: list[float], flows: list[list[Link]], capacity: dict[Link, float]) -> float:
    """Seconds until the last flow of a batch (all starting at 0) finishes under max-min fair sharing."""
    remaining = list(map(float, sizes))
    active = [f for f in range(len(flows)) if remaining[f] > 0]
    now = 0.0
    while active:
        rates = maxmin_rates([flows[f] for f in active], capacity)
        dt = min(remaining[f] / r for f, r in zip(active, rates, strict=True))
        now += dt
        still = []
        for f, r in zip(active, rates, strict=True):
            remaining[f] -= r * dt
            if remaining[f] > sizes[f] * 1e-9:
                still.append(f)
        active = still
    return now


class PathOf(Protocol):
    """What :func:`path_function` returns: the route of the connection from ``src`` to ``dst`` on ``lane``."""

    def __call__(self, src: int, dst: int, lane: int = 0) -> tuple[list[Link], list[float], int]: ...


def path_function(topo: Topology, planned: list[Transfer], goodput: float = TCP_GOODPUT) -> PathOf:
    """``path_of(src_rank, dst_rank, lane=0) -> (directed links, their capacities, switches crossed)`` for the
    timing model, from the routed transfers of :func:`transfers`.

    Each lane of a pair of ranks is its own connection with its own route;
    ``lane`` defaults to 0, the only lane of a schedule without lanes.
    Raises :class:`KeyError` for a (src, dst, lane) that carries no transfer.
    """
    paths = {(t.src, t.dst, t.lane): t.path for t in planned}
    cache: dict[tuple[int, int, int], tuple[list[Link], list[float], int]] = {}

    def path_of(src: int, dst: int, lane: int = 0) -> tuple[list[Link], list[float], int]:
        key = (src, dst, lane)
        if key not in cache:
            path = paths[key]
            named = physical_links(topo, path, goodput)
            cache[key] = ([n for n, _ in named], [c for _, c in named], DOMAIN if over_domain(topo, path)
                          else len(path) - 2)
        return cache[key]

    return path_of


def analyze(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
            gamma: float = 0.0, mtu: int = DEFAULT_MTU, flow_of: FlowOf | None = None) -> CostReport:
    """Per-step flows on every directed link, the step models, and the timing model's execution.

    Steps run ``0..schedule.steps-1``; a step without transfers costs only its
    local reductions. ``latency`` (default: none at all) gives every
    transfer's latency terms by the switches its path crosses; the step
    models charge each transfer its rendezvous, message latency and
    store-and-forward tail, the timing model (:mod:`emulator.model.prediction.timing`)
    applies the agents' rules.
    """
    model = latency or LatencyModel()
    goodput = tcp_goodput_factor(mtu)
    mss = tcp_payload_bytes(mtu)
    report = CostReport(routing=policy, seed=seed, latency=model, goodput=goodput, mtu=mtu)
    report.transfers = transfers(schedule, topo, policy, seed, flow_of)
    by_step: dict[int, list[Transfer]] = {}
    for t in report.transfers:
        by_step.setdefault(t.step, []).append(t)
    reduced: dict[int, dict[int, int]] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind in (RECV_REDUCE, REDUCE):
                per_rank = reduced.setdefault(op.step, {})
                per_rank[prog.rank] = per_rank.get(prog.rank, 0) + op.bytes
    capacity: dict[Link, float] = {}
    for step in range(schedule.steps):
        items = by_step.get(step, [])
        counts: dict[Link, int] = {}
        flows = []
        ab = 0.0
        fixed = 0.0
        for t in items:
            named = physical_links(topo, t.path, goodput)
            links = [name for name, _ in named]
            flows.append(links)
            for name, cap in named:
                counts[name] = counts.get(name, 0) + 1
                capacity[name] = cap
            lat = model.path(t.switches)
            tail = 0.0 if t.domain else sum(last_segment_bytes(t.bytes, mss) / cap for _, cap in named[1:])
            own = lat.handshake_s(t.bytes) + lat.message_s + tail
            fixed = max(fixed, own)
            ab = max(ab, own + t.bytes / min(capacity[link] for link in links))
        compute = gamma * max(reduced.get(step, {}).values(), default=0)
        mm = (fixed + maxmin_completion([t.bytes for t in items], flows, capacity)) if items else 0.0
        report.steps.append(StepCost(step=step, transfers=len(items), bytes=max((t.bytes for t in items), default=0),
                                     flows_per_link=counts, alpha_beta_s=ab + compute, maxmin_s=mm + compute))
    report.switch_counts = sorted({t.switches for items in by_step.values() for t in items})
    return report

