"""Contention and completion time of a schedule on a topology.

Every send operation is a transfer; transfers with the same ``step`` are taken
to run at the same time. Each transfer is routed with the controller's own
pure routing logic, ``routing.route(topo, policy, routing.agent_flow(topo,
src_host, dst_host), seed=seed)``, so the path is the one the agent's TCP
connection takes. Per step this module counts the flows on every directed link
and predicts the step's duration with two models:

alpha-beta (no contention)
    ``alpha + bytes / rate`` for the slowest transfer of the step, where
    ``rate`` is the goodput of the slowest link on its path. Summed over steps,
    a ring on a star gives exactly ``2(p-1)·alpha + 2(p-1)/p·n·beta``
    (DOMAIN.md §2, see :func:`allreduce_formula`).
max-min fair (flow level)
    All transfers of the step start together; every directed link's goodput is
    shared max-min fairly (progressive filling, bottleneck by bottleneck);
    whenever a flow finishes the rates are recomputed. The step lasts
    ``alpha`` plus the time until the last flow finishes.

Rates: a link of ``bw_mbps`` carries ``bw_mbps·1e6/8·goodput`` bytes/s in each
direction, ``goodput`` = TCP payload per wire byte at the network's MTU
(:func:`emulator.topology.tcp_goodput_factor`: 0.998 at the default 32000,
1448/1514 at 1500).
Local reductions cost ``gamma`` seconds per byte (default 0: not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emulator import routing
from emulator.schedule.format import RECV_REDUCE, REDUCE, SEND, Schedule
from emulator.topology import DEFAULT_MTU, Topology, tcp_goodput_factor

TCP_GOODPUT = tcp_goodput_factor(DEFAULT_MTU)  # the emulated network's default MTU
#: Per-message latency of the alpha-beta and max-min models (seconds): a few
#: switch hops plus the agent's per-message work in Python.
DEFAULT_ALPHA_S = 100e-6

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
    alpha_s: float
    goodput: float
    steps: list[StepCost] = field(default_factory=list)

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


def analyze(schedule: Schedule, topo: Topology, policy: str, *, seed: int = 0, alpha: float = DEFAULT_ALPHA_S,
            gamma: float = 0.0, goodput: float = TCP_GOODPUT) -> CostReport:
    """Per-step flows on every directed link, and the alpha-beta and max-min fair step times.

    Steps run ``0..schedule.steps-1``; a step without transfers costs only its
    local reductions.
    """
    report = CostReport(routing=policy, seed=seed, alpha_s=alpha, goodput=goodput)
    by_step: dict[int, list[Transfer]] = {}
    for t in transfers(schedule, topo, policy, seed):
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
        for t in items:
            named = physical_links(topo, t.path, goodput)
            links = [name for name, _ in named]
            flows.append(links)
            for name, cap in named:
                counts[name] = counts.get(name, 0) + 1
                capacity[name] = cap
            ab = max(ab, alpha + t.bytes / min(capacity[link] for link in links))
        compute = gamma * max(reduced.get(step, {}).values(), default=0)
        mm = (alpha + maxmin_completion([t.bytes for t in items], flows, capacity)) if items else 0.0
        report.steps.append(StepCost(step=step, transfers=len(items), bytes=max((t.bytes for t in items), default=0),
                                     flows_per_link=counts, alpha_beta_s=ab + compute, maxmin_s=mm + compute))
    return report


def allreduce_formula(algo: str, p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Closed-form contention-free allreduce time (DOMAIN.md §2) for ``ring`` and ``hd``/``hdrm`` (p a power of 2)."""
    if algo == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma
    if algo in ("hd", "hdrm"):
        k = p.bit_length() - 1
        if 1 << k != p:
            raise ValueError("the halving-doubling formula needs p a power of two")
        return 2 * k * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma
    raise ValueError(f"no closed form for {algo}")


def bus_bandwidth_mbps(size: int, p: int, seconds: float) -> float:
    """nccl-tests busbw of an allreduce of ``size`` bytes per rank taking ``seconds``, in Mbit/s."""
    if seconds <= 0:
        return 0.0
    return size / seconds * 2 * (p - 1) / p * 8 / 1e6
