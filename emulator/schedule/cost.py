"""Contention and the step models of a schedule on a topology.

Every send operation is a transfer; transfers with the same ``step`` are taken
to run at the same time. Each transfer is routed with the controller's own
pure routing logic, ``routing.route(topo, policy, routing.agent_flow(topo,
src_host, dst_host), seed=seed)``, so the path is the one the agent's TCP
connection takes. Per step this module counts the flows on every directed link
and charges the step by two lockstep models:

alpha-beta (no contention)
    the slowest transfer alone: its latency (rendezvous, message latency and
    store-and-forward tail, :mod:`emulator.latency`) plus ``bytes / rate``,
    ``rate`` the goodput of the slowest link on its path. With latency
    ``alpha`` per message only, a ring on a star sums to exactly
    ``2(p-1)·alpha + 2(p-1)/p·n·beta`` (DOMAIN.md §2, :func:`allreduce_formula`).
max-min fair (flow level)
    all transfers of the step start together; every directed link's goodput is
    shared max-min fairly (progressive filling, bottleneck by bottleneck);
    whenever a flow finishes the rates are recomputed. The step lasts the
    largest transfer latency plus the time until the last flow finishes.

The prediction itself is the timing model's (:mod:`emulator.schedule.timing`),
which follows the agents' dependencies instead of lockstep steps; it shares
:func:`maxmin_rates` and :func:`path_function` with this module.

Rates: a link of ``bw_mbps`` carries ``bw_mbps·1e6/8·goodput`` bytes/s in each
direction, ``goodput`` = TCP payload per wire byte at the network's MTU
(:func:`emulator.topology.tcp_goodput_factor`: 0.9923 at 9000, 1448/1514 at
1500). Local reductions cost ``gamma`` seconds per byte (default 0: not
modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulator import routing
from emulator.latency import LatencyModel
from emulator.schedule.format import RECV_REDUCE, REDUCE, SEND, Schedule
from emulator.topology import DEFAULT_MTU, Topology, last_segment_bytes, tcp_goodput_factor, tcp_payload_bytes

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


def transfers(schedule: Schedule, topo: Topology, policy: str, seed: int = 0) -> list[Transfer]:
    """Every send of the schedule with its routed path (via :func:`emulator.routing.route`)."""
    paths: dict[tuple[str, str], list[str]] = {}
    out = []
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind != SEND:
                continue
            src, dst = prog.host, schedule.ranks[op.peer].host  # type: ignore[index]
            if (src, dst) not in paths:
                paths[(src, dst)] = routing.route(topo, policy, routing.agent_flow(topo, src, dst), seed=seed)
            out.append(Transfer(op.step, prog.rank, op.peer, src, dst, op.bytes, paths[(src, dst)]))  # type: ignore[arg-type]
    return out


def link_capacity(topo: Topology, link: Link, goodput: float = TCP_GOODPUT) -> float:
    """Bytes per second one direction of ``link`` carries."""
    lk = topo.link_between(*link)
    if lk is None:
        raise KeyError(f"no link {link[0]} - {link[1]}")
    return lk.bw_mbps * 1e6 / 8 * goodput


def physical_links(topo: Topology, path: list[str], goodput: float = TCP_GOODPUT) -> list[tuple[Link, float]]:
    """The directed physical links of ``path`` with their capacities (bytes/s).

    A link is named ``(from, to)``; where a server has several NICs on one
    fabric switch the parallel links are told apart by the sending port,
    ``("s17-eth6", "s1")``, so each NIC counts its own flows.
    """
    out = []
    for (node, port), nxt in zip(routing.directed_links(topo, path), path[1:], strict=True):
        lk = topo.link_at(node, port) if port else topo.link_between(node, nxt)
        if lk is None:
            raise KeyError(f"no link {node} - {nxt}")
        name = (f"{node}-eth{port}", nxt) if len(topo.links_between(node, nxt)) > 1 else (node, nxt)
        out.append((name, lk.bw_mbps * 1e6 / 8 * goodput))
    return out


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


def path_function(topo: Topology, planned: list[Transfer],
                  goodput: float = TCP_GOODPUT) -> Callable[[int, int], tuple[list[Link], list[float], int]]:
    """``(src_rank, dst_rank) -> (directed links, their capacities, switches crossed)`` for the timing model,
    from the routed transfers of :func:`transfers`."""
    paths = {(t.src, t.dst): t.path for t in planned}
    cache: dict[tuple[int, int], tuple[list[Link], list[float], int]] = {}

    def path_of(src: int, dst: int) -> tuple[list[Link], list[float], int]:
        if (src, dst) not in cache:
            path = paths[(src, dst)]
            named = physical_links(topo, path, goodput)
            cache[(src, dst)] = ([n for n, _ in named], [c for _, c in named], len(path) - 2)
        return cache[(src, dst)]

    return path_of


def analyze(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, latency: LatencyModel | None = None,
            gamma: float = 0.0, mtu: int = DEFAULT_MTU) -> CostReport:
    """Per-step flows on every directed link, the step models, and the timing model's execution.

    Steps run ``0..schedule.steps-1``; a step without transfers costs only its
    local reductions. ``latency`` (default: none at all) gives every
    transfer's latency terms by the switches its path crosses; the step
    models charge each transfer its rendezvous, message latency and
    store-and-forward tail, the timing model (:mod:`emulator.schedule.timing`)
    applies the agents' rules.
    """
    model = latency or LatencyModel()
    goodput = tcp_goodput_factor(mtu)
    mss = tcp_payload_bytes(mtu)
    report = CostReport(routing=policy, seed=seed, latency=model, goodput=goodput, mtu=mtu)
    report.transfers = transfers(schedule, topo, policy, seed)
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
            lat = model.path(len(t.path) - 2)
            tail = sum(last_segment_bytes(t.bytes, mss) / cap for _, cap in named[1:])
            own = lat.rendezvous_target_s + lat.message_s + tail
            fixed = max(fixed, own)
            ab = max(ab, own + t.bytes / min(capacity[link] for link in links))
        compute = gamma * max(reduced.get(step, {}).values(), default=0)
        mm = (fixed + maxmin_completion([t.bytes for t in items], flows, capacity)) if items else 0.0
        report.steps.append(StepCost(step=step, transfers=len(items), bytes=max((t.bytes for t in items), default=0),
                                     flows_per_link=counts, alpha_beta_s=ab + compute, maxmin_s=mm + compute))
    report.switch_counts = sorted({len(t.path) - 2 for items in by_step.values() for t in items})
    return report


def allreduce_formula(algo: str, p: int, n: float, alpha: float, beta: float, gamma: float = 0.0, *,
                      switches: int = 0, switch_latency: float = 0.0, frame: float = 0.0) -> float:
    """Closed-form contention-free allreduce time (DOMAIN.md §2, §8) for ``ring`` and ``hd``/``hdrm``.

    Every message of ``b`` bytes over a path of ``switches`` switches costs
    ``alpha + switches·switch_latency + b·beta + switches·last·beta``
    (software latency, switch latency, serialisation, and the store-and-forward
    of its last frame of ``last`` bytes on each further link: ``b`` cut into
    frames of ``frame`` bytes, see :func:`~emulator.topology.last_segment_bytes`). A ring pipelines: its receives
    are posted before its messages come, so it pays one rendezvous
    (``switches·switch_latency``) in all; halving-doubling's lockstep rounds
    pay one per round. With ``switches = 0`` these are the textbook
    ``2(p-1)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma`` and
    ``2·log2(p)·alpha + ...`` (``p`` a power of two).
    """
    def message(b: float) -> float:
        last = last_segment_bytes(b, int(frame)) if frame else 0.0
        return alpha + switches * switch_latency + b * beta + switches * last * beta

    reduce = (p - 1) / p * n * gamma
    rendezvous = switches * switch_latency
    if algo == "ring":
        return rendezvous + 2 * (p - 1) * message(n / p) + reduce
    if algo in ("hd", "hdrm"):
        k = p.bit_length() - 1
        if 1 << k != p:
            raise ValueError("the halving-doubling formula needs p a power of two")
        rounds = [n / 2 ** (s + 1) for s in range(k)]
        return 2 * sum(rendezvous + message(b) for b in rounds) + reduce
    raise ValueError(f"no closed form for {algo}")


def bus_bandwidth_mbps(size: int, p: int, seconds: float) -> float:
    """nccl-tests busbw of an allreduce of ``size`` bytes per rank taking ``seconds``, in Mbit/s."""
    if seconds <= 0:
        return 0.0
    return size / seconds * 2 * (p - 1) / p * 8 / 1e6
