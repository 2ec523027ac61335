"""Paper-scale allreduce times: the timing model's answer without spelling out every operation of every rank.

This module owns :func:`project`, a fast stand-in for
``check.predict(generate(algo, topo, size), topo, policy, ...).predicted_time_s``
for ``ring``, ``hd``, ``hdrm`` and ``hier`` (placements as :func:`~emulator.model.collectives.generators.generate`
chooses them: identity but for :func:`~emulator.model.collectives.placements.hdrm_placement` for ``hdrm``),
and :func:`paper_scale_topologies`, the equal-radix fabrics of
``docs/domain.md`` §5 at 8..1024 hosts. Any other algorithm (``dbtree``,
``rd``, imported schedules) raises :class:`~emulator.base.errors.FieldError`
naming it: use ``emu schedule check`` for those. Every topology
:func:`emulator.model.topology.build` makes works, servers included (their ranks
are the accelerators, routed through the PCIe switch and the pinned NIC like
any other path).

The physics is the timing model's (:mod:`emulator.model.prediction.timing`), applied to
what repeats instead of to every operation:

* Paths: every distinct ``(src rank, dst rank)`` pair of the algorithm is
  routed once (:func:`emulator.model.routing.routes`: :func:`~emulator.model.routing.route`
  with one router for all pairs) under the policy and ECMP seed, its directed links and capacities from
  :func:`~emulator.model.prediction.cost.physical_links`, its latency terms from
  :meth:`LatencyModel.path` by switches crossed, its last-frame
  store-and-forward tail one frame time per link after the first.
* Ring: all ``2(p-1)`` steps move the same flows (``i -> i+1``, one chunk
  each), so there is one distinct step. Its flows' rates come from one
  max-min fair progressive filling over the whole step
  (:func:`~emulator.model.prediction.cost.maxmin_rates`). The pipeline is then the
  timing model's recurrence, evaluated for all ranks at once per step
  (numpy): a send is ready when the previous step's data arrived, its
  transfer starts at ``max(ready, posted + L_cts)``, its first byte arrives
  ``message`` later (not before ``posted + cts_path``), its bytes follow the
  previous message on the connection, and its data has arrived one tail after
  it drained. Reduce-scatter receives are posted at 0 (they depend on
  nothing); an all-gather receive of step ``j`` is posted when the receiver's
  reduce-scatter send of step ``j`` drained (its data hazard). Ranks drift
  out of lockstep here exactly as in the simulation (e.g. a ring with
  intra- and inter-leaf hops).
* Halving-doubling (``hd``, ``hdrm``): ``log2(p)`` distinct steps (the
  all-gather mirrors the reduce-scatter: the same pairs and sizes), plus the
  two fold-in/out steps when ``p`` is not a power of two. Their pairs are
  routed once; then the rounds run as the timing model runs them, per rank
  (the ``MPI_Sendrecv`` round rules: a round's send waits for the previous
  round's send to be acknowledged and its receive to arrive, its receive
  is posted once the previous send is written and the previous receive
  arrived), on a fluid max-min model whose rates are recomputed only for
  the flows that share links with a flow that started or drained (max-min
  rates of link-disjoint groups of flows are independent, so this is the
  global recomputation's answer). Flows of different rounds overlap where
  ranks drift apart, as in the simulation.
* Hierarchical (``hier``): its three phases are rings, each phase every
  group's (or every rail's) ring at once: the ring recurrence above over
  a grid of rings x members, the flows of all rings sharing links in one
  progressive filling. Inside every server a reduce-scatter of blocks of
  ``S`` pieces, then across servers one allreduce ring per local rank (on
  rail fabrics, one per rail), then inside every server an all-gather. A
  rank enters a phase when it is done with the one before (its last
  receive arrived, its last send drained); its receives are posted then,
  but the all-gather's inside the server, which are posted once the
  reduce-scatter is done (they write the blocks it last sent). Over a
  server's accelerator interconnect the paths are its ports
  (:func:`~emulator.model.prediction.cost.physical_links`), without frames.

Approximation. Halving-doubling is exact up to floating-point rounding: its
rounds are simulated rank by rank because the ranks do drift apart under
contention (every round waiting for the slowest pair of the round instead
was up to 5% slow against the timing model on 16- and 32-host ECMP
fabrics, and per-round drift without flows of neighbouring rounds
overlapping up to 4% fast). The ring is exact whenever no directed link
carries two of its flows: every leaf-spine, fat-tree and star under every
policy (each leaf, edge switch and pod has one ring flow out and one in),
and so with servers whose NICs are ``packed``. Where ring flows do share a
link (a BiGraph ring, whose same-group hops cross the other group; servers
with ``spread`` NICs, several of whose ring flows leave one leaf)
their rates are those of every flow of the step being active together,
whereas in the pipeline they overlap only part of each step: the projection
then overestimates, measured +3.3% at worst (``bigraph:upper=4,lower=4,
hosts_per_switch=2``, 64 KiB, no latency), +0.35% at 128 hosts (1 MiB) and
0 at 16 MiB, where the flows overlap all the time. Measured exactly against
:func:`check.predict` on every other case of the unit tests (relative
difference below 1e-9).

``hier`` is the three phases one after another per rank, where the
timing model posts the allreduce's first receives across servers before
their phase's clear to send is due: with the fabric's latency up to 1.9%
slow against :func:`check.predict` on the unit tests' rail, dual-plane,
rail-only, BiGraph and shared-NIC servers and a plain leaf-spine, with and
without an interconnect, at 64 KiB and 4 MiB; with bandwidth alone exact
but where its rings share links, as above (BiGraph: +1.4%).

Local reductions are not modelled (``gamma = 0``, as :func:`check.predict`).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from emulator.base.errors import FieldError
from emulator.model import routing
from emulator.model.collectives import registry
from emulator.model.collectives.algorithms import hier_groups
from emulator.model.collectives.placements import placement_hosts
from emulator.model.fabric import DOMAIN
from emulator.model.latency import LatencyModel, PathLatency
from emulator.model.prediction.cost import Link, maxmin_rates, over_domain, physical_links
from emulator.model.prediction.timing import ack_departure, is_reverse
from emulator.model.schedule.format import check_chunking
from emulator.model.schedule.semantics import ALLREDUCE, bus_bandwidth_mbps
from emulator.model.topology import (
    DEFAULT_MTU,
    KINDS,
    MAX_HOSTS,
    Topology,
    equal_radix,
    format_spec,
    last_segment_bytes,
    tcp_goodput_factor,
    tcp_payload_bytes,
)

WHERE = "projection"
_EPS = 1e-12  # as the timing model: a flow within this many seconds of draining has drained


@dataclass(frozen=True)
class Projection:
    """One projected allreduce: :func:`project`'s answer."""

    algorithm: str
    topology: str
    policy: str
    seed: int
    hosts: int
    size: int
    time_s: float  # emulated seconds, comparable to predict().predicted_time_s
    real_time_s: float | None  # latency.profile.real_seconds(time_s) when the LatencyModel has a profile
    busbw_mbps: float  # emulator.model.schedule.semantics.bus_bandwidth_mbps(size, hosts, time_s)
    distinct_steps: int  # distinct step patterns routed and solved (ring 1; hd log2 p, +2 when p is no power of 2)


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Path:
    """One routed rank pair: directed links, their capacities (bytes/s) and latency terms."""

    links: tuple[Link, ...]
    caps: tuple[float, ...]
    latency: PathLatency

    def tail_s(self, nbytes: int, mss: int) -> float:
        """The last frame's store-and-forward over every link after the first (none over a server's
        interconnect: no frames)."""
        if self.latency.over_domain:
            return 0.0
        last = last_segment_bytes(nbytes, mss)
        return sum(last / cap for cap in self.caps[1:])


@dataclass
class _Paths:
    """Every rank pair an algorithm uses, routed once (one router for all of them)."""

    topo: Topology
    policy: str
    seed: int
    hosts: list[str]
    latency: LatencyModel
    goodput: float
    cache: dict[tuple[int, int], _Path] = field(default_factory=dict)

    def route(self, pairs: Iterable[tuple[int, int]]) -> list[_Path]:
        """The paths of ``pairs`` (rank to rank), routing the ones not seen before."""
        pairs = list(pairs)
        new = list(dict.fromkeys(pair for pair in pairs if pair not in self.cache))
        flows = [routing.agent_flow(self.topo, self.hosts[a], self.hosts[b]) for a, b in new]
        for pair, nodes in zip(new, routing.routes(self.topo, self.policy, flows, seed=self.seed), strict=True):
            named = physical_links(self.topo, nodes, self.goodput)
            self.cache[pair] = _Path(tuple(n for n, _ in named), tuple(c for _, c in named),
                                     self.latency.path(DOMAIN if over_domain(self.topo, nodes) else len(nodes) - 2))
        return [self.cache[pair] for pair in pairs]

    def capacity(self) -> dict[Link, float]:
        """Every routed link's capacity."""
        return {link: cap for p in self.cache.values() for link, cap in zip(p.links, p.caps, strict=True)}


#: Routed pairs of the last few (topology, policy, seed, hosts, latency) asked for: projecting one fabric at
#: several sizes routes it once (routing is a third of a 1024-host projection's time).
_ROUTED: dict[tuple[object, ...], _Paths] = {}
_ROUTED_KEEP = 16


def _routed(topo: Topology, policy: str, seed: int, hosts: list[str], latency: LatencyModel,
            goodput: float) -> _Paths:
    try:
        key: tuple[object, ...] = (topo.spec, policy, seed, tuple(hosts), latency, goodput)
        hash(key)
    except TypeError:  # a latency model holding unhashable parts: route afresh
        return _Paths(topo, policy, seed, hosts, latency, goodput)
    if key not in _ROUTED:
        while len(_ROUTED) >= _ROUTED_KEEP:
            _ROUTED.pop(next(iter(_ROUTED)))
        _ROUTED[key] = _Paths(topo, policy, seed, hosts, latency, goodput)
    return _ROUTED[key]


# ---------------------------------------------------------------------------
# Ring: one distinct step, pipelined
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _RingEdges:
    """Per ring (row) and sender (column ``i``, flow ``i -> i+1`` of its ring): the latency terms and the step's
    own times, as arrays of rings x members."""

    cts: np.ndarray  # rendezvous target: posted -> clear to send
    cts_path: np.ndarray  # posted -> first byte, when the clear to send is what waits
    message: np.ndarray  # start -> first byte
    transmit: np.ndarray  # bytes / max-min rate
    tail: np.ndarray  # drained -> arrived


def _ring_edges(paths: _Paths, rings: np.ndarray, nbytes: int, mss: int) -> _RingEdges:
    """The flows of one step of every ring of ``rings`` (rows of ranks) at once, sharing links max-min."""
    n, m = rings.shape
    edges = paths.route((int(rings[g, i]), int(rings[g, (i + 1) % m])) for g in range(n) for i in range(m))
    rates = maxmin_rates([list(e.links) for e in edges], paths.capacity())

    def grid(values: Iterable[float]) -> np.ndarray:
        return np.array(list(values)).reshape(n, m)

    return _RingEdges(
        cts=grid(e.latency.rendezvous_target_s for e in edges),
        cts_path=grid(e.latency.cts_path_s for e in edges),
        message=grid(e.latency.message_s for e in edges),
        transmit=grid(nbytes / r for r in rates),
        tail=grid(e.tail_s(nbytes, mss) for e in edges),
    )


def _ring_time(e: _RingEdges, begin: np.ndarray, reduce_scatter: bool = True, all_gather: bool = True,
               posted: np.ndarray | None = None) -> np.ndarray:
    """The timing model's ring recurrence, every rank of every ring at once (column = sender): the
    ``m-1`` reduce-scatter steps and/or the ``m-1`` all-gather steps of rings of ``m`` members, each rank
    entering at ``begin`` (its data ready) with its receives posted at ``posted`` (default ``begin``; by the
    receiving rank's position). Returns when each rank is done (its last receive arrived and its last send
    drained), by rank's position."""
    m = begin.shape[1]
    arrived, drained = begin, np.full(begin.shape, -math.inf)
    started = np.full(begin.shape, -math.inf)
    # the receive of sender i's flow is at i+1: its posting, by sender
    posted = np.roll(begin if posted is None else posted, -1, axis=1)
    rs_drained: list[np.ndarray] = []
    steps = (m - 1) * (reduce_scatter + all_gather)
    for step in range(steps):
        ready = begin if step == 0 else np.roll(arrived, 1, axis=1)  # data from i-1 of the previous step
        gather = step - (m - 1) if reduce_scatter else step
        if reduce_scatter and gather >= 0:  # all-gather receive at i+1: once i+1's reduce-scatter send drained
            posted = np.maximum(posted, np.roll(rs_drained[gather], -1, axis=1))
        started = np.maximum(np.maximum(ready, posted + e.cts), started)
        first = np.maximum(started + e.message, posted + e.cts_path)
        drained = np.maximum(first, drained) + e.transmit
        arrived = drained + e.tail
        if reduce_scatter and step < m - 1:
            rs_drained.append(drained)
    if not steps:
        return begin
    return np.maximum(np.roll(arrived, 1, axis=1), drained)


def _project_ring(paths: _Paths, hosts: list[str], size: int, mss: int) -> tuple[float, int]:
    p = len(hosts)
    chunk = check_chunking(size, p, WHERE)
    rings = np.arange(p).reshape(1, p)
    return float(_ring_time(_ring_edges(paths, rings, chunk, mss), np.zeros((1, p))).max()), 1


def _project_hier(paths: _Paths, hosts: list[str], size: int, mss: int) -> tuple[float, int]:
    """``hier``'s three phases, each rank entering a phase when it is done with the one before: rings inside
    every group (a server) reduce-scatter blocks of ``S`` pieces, rings across the groups (the ``j``-th ranks,
    one rail each on rail fabrics) allreduce the pieces, rings inside every group all-gather the blocks."""
    groups = np.array(hier_groups(paths.topo, hosts))
    n_groups, g = groups.shape
    unit = check_chunking(size, len(hosts), WHERE)
    done = np.zeros(groups.shape)
    phases = 0
    if g > 1:
        done = _ring_time(_ring_edges(paths, groups, n_groups * unit, mss), done, all_gather=False)
        phases += 1
    first = done
    if n_groups > 1:  # the rails' rings: rows are local ranks, columns groups
        done = _ring_time(_ring_edges(paths, groups.T, unit, mss), done.T).T
        phases += 1
    if g > 1:
        # the all-gather's receives write blocks the rank last touched in the reduce-scatter: posted then
        done = _ring_time(_ring_edges(paths, groups, n_groups * unit, mss), done, reduce_scatter=False,
                          posted=first)
        phases += 1
    return float(done.max()), phases


# ---------------------------------------------------------------------------
# Halving-doubling: distinct rounds, per-rank drift, fluid max-min
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Transfer:
    step: int
    src: int
    dst: int
    bytes: int


def _hd_steps(p: int, size: int) -> list[list[tuple[int, int, int]]]:
    """``(src, dst, bytes)`` of every step, as :func:`~emulator.model.collectives.generators.generate` builds ``hd``
    with its default chunks."""
    big = 1 << (p.bit_length() - 1)
    extra = p - big
    chunk = check_chunking(size, big, WHERE)
    members = list(range(p)) if not extra else [2 * i + 1 for i in range(extra)] + list(range(2 * extra, p))
    k = big.bit_length() - 1
    rs = [[(members[i], members[i ^ (1 << s)], (big >> (s + 1)) * chunk) for i in range(big)] for s in range(k)]
    steps = rs + rs[::-1]
    if extra:
        steps = ([[(2 * i, 2 * i + 1, size) for i in range(extra)]] + steps
                 + [[(2 * i + 1, 2 * i, size) for i in range(extra)]])
    return steps


@dataclass
class _Round:
    """One rank's operations of one step: the indices of its send and receive transfers."""

    send: int | None = None
    recv: int | None = None


class _Fluid:
    """Flows on links, max-min fair; rates recomputed per group of flows that share links."""

    def __init__(self, capacity: dict[Link, float]):
        self.capacity = capacity
        self.on_link: dict[Link, set[int]] = defaultdict(set)
        self.links: dict[int, tuple[Link, ...]] = {}
        self.left: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.since: dict[int, float] = {}
        self.version: dict[int, int] = {}
        self.drains: list[tuple[float, int, int]] = []

    def add(self, fid: int, links: tuple[Link, ...], nbytes: float, now: float) -> None:
        self.links[fid], self.left[fid], self.since[fid], self.rate[fid] = links, nbytes, now, 0.0
        self.version[fid] = 0
        for link in links:
            self.on_link[link].add(fid)
        self._reshare(self._group([fid]), now)

    def next_drain(self) -> float:
        while self.drains and self.drains[0][1] != self.version.get(self.drains[0][2]):
            heapq.heappop(self.drains)
        return self.drains[0][0] if self.drains else math.inf

    def pop_drained(self, now: float) -> list[int]:
        """Flows drained by ``now`` (within the timing model's tolerance), removed; the others resharing."""
        done = []
        while self.next_drain() <= now + _EPS:
            _, _, fid = heapq.heappop(self.drains)
            done.append(fid)
            del self.version[fid]
        neighbours: set[int] = set()
        for fid in done:
            for link in self.links.pop(fid):
                self.on_link[link].discard(fid)
                neighbours |= self.on_link[link]
            del self.left[fid], self.rate[fid], self.since[fid]
        neighbours.difference_update(done)
        if neighbours:
            self._reshare(self._group(neighbours), now)
        return done

    def _group(self, seeds: Iterable[int]) -> list[int]:
        """Every active flow linked to ``seeds`` through shared links."""
        seen: set[int] = set()
        stack = list(seeds)
        while stack:
            fid = stack.pop()
            if fid in seen:
                continue
            seen.add(fid)
            for link in self.links[fid]:
                stack.extend(g for g in self.on_link[link] if g not in seen)
        return sorted(seen)

    def _reshare(self, group: list[int], now: float) -> None:
        flows = [list(self.links[f]) for f in group]
        if len(group) == 1:
            rates = [min(self.capacity[link] for link in flows[0])]
        else:
            rates = maxmin_rates(flows, {link: self.capacity[link] for f in flows for link in f})
        for fid, rate in zip(group, rates, strict=True):
            left = max(0.0, self.left[fid] - self.rate[fid] * (now - self.since[fid]))
            self.left[fid], self.since[fid], self.rate[fid] = left, now, rate
            self.version[fid] += 1
            heapq.heappush(self.drains, (now + left / rate, self.version[fid], fid))


@dataclass
class _TransferState:
    """What the simulation knows of one transfer so far (seconds)."""

    queued: float | None = None  # the send was queued
    posted: float | None = None  # the receive was posted
    drained: float | None = None
    arrived: float | None = None


class _RoundSimulation:
    """Halving-doubling rounds by the timing model's rules (module docstring), transfer by transfer."""

    def __init__(self, transfers: list[_Transfer], paths: list[_Path], p: int, mss: int):
        self.transfers = transfers
        self.paths = paths
        self.mss = mss
        self.tails = [path.tail_s(t.bytes, mss) for t, path in zip(transfers, paths, strict=True)]
        self.state = [_TransferState() for _ in transfers]
        self.rounds: list[list[_Round]] = [[] for _ in range(p)]
        for i, t in enumerate(transfers):  # transfers come step by step
            for rank, side in ((t.src, "send"), (t.dst, "recv")):
                rounds = self.rounds[rank]
                if not rounds or self._step_of(rounds[-1]) != t.step:
                    rounds.append(_Round())
                setattr(rounds[-1], side, i)
        self.current = [0] * p  # per rank: the round it is in
        capacity = {link: cap for path in paths for link, cap in zip(path.links, path.caps, strict=True)}
        self.fluid = _Fluid(capacity)
        self.starts: list[tuple[float, int]] = []
        self.busy: set[tuple[int, int]] = set()
        self.backlog: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.end = 0.0

    def _step_of(self, rnd: _Round) -> int:
        i = rnd.send if rnd.send is not None else rnd.recv
        assert i is not None
        return self.transfers[i].step

    def run(self) -> float:
        for rank in range(len(self.rounds)):
            self._enter(rank, 0.0, 0.0)
        while self.starts or self.fluid.drains:
            drain_at = self.fluid.next_drain()
            start_at = self.starts[0][0] if self.starts else math.inf
            if drain_at == math.inf and start_at == math.inf:
                break
            if drain_at <= start_at:
                for i in self.fluid.pop_drained(drain_at):
                    self._drained(i, drain_at)
            else:
                _, i = heapq.heappop(self.starts)
                self._flow(i, start_at)
        assert all(st.arrived is not None for st in self.state), "a round never completed"
        return self.end

    # ------------------------------------------------------------ ranks
    def _enter(self, rank: int, send_ready: float, recv_posted: float) -> None:
        """``rank`` enters its current round: queue its send and post its receive."""
        rnd = self.rounds[rank][self.current[rank]]
        if rnd.send is not None:
            self.state[rnd.send].queued = send_ready
            self._try_start(rnd.send)
        if rnd.recv is not None:
            self.state[rnd.recv].posted = recv_posted
            self._try_start(rnd.recv)

    def _round_done(self, rank: int) -> None:
        """If ``rank``'s current round is over, enter the next one (``MPI_Sendrecv`` round rules)."""
        rounds, j = self.rounds[rank], self.current[rank]
        nxt = rounds[j + 1] if j + 1 < len(rounds) else None
        awaited = nxt is not None and nxt.send is not None  # the next send depends on this one
        times = self._round_times(rounds[j], awaited)
        if times is None:
            return
        send_done, send_written, recv_done = times
        self.end = max(self.end, send_done, recv_done)
        if nxt is not None:
            self.current[rank] = j + 1
            self._enter(rank, max(send_done, recv_done), max(send_written, recv_done))

    def _round_times(self, rnd: _Round, awaited: bool) -> tuple[float, float, float] | None:
        """``(send done, send written, receive done)`` of a round (``-inf`` for an op it lacks); None if unfinished.

        An awaited send is done once its data arrived and was acknowledged,
        any other once written (drained), as :class:`~emulator.model.schedule.dispatch.Dispatcher` has it.
        """
        send_done = send_written = recv_done = -math.inf
        if rnd.send is not None:
            st = self.state[rnd.send]
            if st.arrived is None or st.drained is None:
                return None
            send_written = st.drained
            send_done = self._acknowledged(rnd, st) if awaited else st.drained
        if rnd.recv is not None:
            arrived = self.state[rnd.recv].arrived
            if arrived is None:
                return None
            recv_done = arrived
        return send_done, send_written, recv_done

    def _acknowledged(self, rnd: _Round, st: _TransferState) -> float:
        """When the round's (awaited) send is acknowledged: the ACK leaves behind the partner's own send of the
        round where that takes the ACK's link (timing model rule 6)."""
        assert rnd.send is not None and st.arrived is not None and st.drained is not None
        path = self.paths[rnd.send]
        leaves = st.arrived
        if rnd.recv is not None and self.transfers[rnd.recv].src == self.transfers[rnd.send].dst:
            back, back_state = self.paths[rnd.recv], self.state[rnd.recv]
            if back_state.drained is not None and is_reverse(path.links[-1], back.links[0]):
                last_frame_s = last_segment_bytes(self.transfers[rnd.recv].bytes, self.mss) / back.caps[0]
                leaves = ack_departure(st.arrived, st.drained, [(back_state.drained, last_frame_s)],
                                       self.mss / back.caps[0])
        return leaves + path.latency.ack_s

    # -------------------------------------------------------- transfers
    def _try_start(self, i: int) -> None:
        """Once both sides are in: the transfer's start and its first byte (timing model rule 3)."""
        st = self.state[i]
        if st.queued is None or st.posted is None:
            return
        lat = self.paths[i].latency
        start = max(st.queued, st.posted + lat.rendezvous_target_s)
        first = max(start + lat.message_s, st.posted + lat.cts_path_s)
        heapq.heappush(self.starts, (first, i))

    def _flow(self, i: int, now: float) -> None:
        t = self.transfers[i]
        channel = (t.src, t.dst)
        if channel in self.busy:  # behind the previous message of the same connection
            self.backlog[channel].append(i)
            return
        self.busy.add(channel)
        self.fluid.add(i, self.paths[i].links, float(t.bytes), now)

    def _drained(self, i: int, now: float) -> None:
        t, st = self.transfers[i], self.state[i]
        st.drained, st.arrived = now, now + self.tails[i]
        channel = (t.src, t.dst)
        self.busy.discard(channel)
        if self.backlog[channel]:
            self._flow(self.backlog[channel].pop(0), now)
        self._round_done(t.src)
        self._round_done(t.dst)


def _project_hd(paths: _Paths, hosts: list[str], size: int, mss: int) -> tuple[float, int]:
    p = len(hosts)
    steps = _hd_steps(p, size)
    transfers = [_Transfer(s, a, b, n) for s, items in enumerate(steps) for a, b, n in items]
    routed = paths.route((t.src, t.dst) for t in transfers)
    distinct = len({frozenset(items) for items in steps})
    return _RoundSimulation(transfers, routed, p, mss).run(), distinct


# ---------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------

Projector = Callable[[_Paths, list[str], int, int], tuple[float, int]]
#: How each allreduce algorithm it models is projected, by the algorithm it runs (a variant on a placement of its
#: own, hdrm, runs hd): ``(paths, rank hosts, size, MSS) -> (time, distinct steps)``.
_PROJECTORS: dict[str, Projector] = {"ring": _project_ring, "hier": _project_hier, "hd": _project_hd}


def _projector(algorithm: str) -> Projector | None:
    known = registry.REGISTRY.get((ALLREDUCE, algorithm))
    return None if known is None else _PROJECTORS.get(known.variant_of or known.name)


#: The allreduce algorithms the projection models, in the registry's order.
ALGORITHMS = tuple(a for a in registry.algorithms(ALLREDUCE) if _projector(a) is not None)


def _rank_hosts(algorithm: str, topo: Topology) -> list[str]:
    """Hosts of ranks ``0..p-1``, as :func:`~emulator.model.collectives.generators.generate` places them."""
    if algorithm not in ALGORITHMS:
        raise FieldError(WHERE, "algorithm", f"one of {', '.join(ALGORITHMS)} (the projection does not model "
                         f"{algorithm}; `emu schedule check` simulates any schedule)", algorithm)
    if len(topo.hosts) < 2:
        raise FieldError(WHERE, "topology", "a topology with at least 2 hosts", topo.spec)
    return placement_hosts(topo, registry.algorithm(ALLREDUCE, algorithm).default_placement)


def project(algorithm: str, topo: Topology, policy: str, size: int, *, seed: int = 0,
            latency: LatencyModel | None = None, mtu: int = DEFAULT_MTU) -> Projection:
    """The timing model's time for ``algorithm`` over every host of ``topo`` under ``policy`` (module docstring).

    ``size`` is bytes per rank, split as :func:`~emulator.model.collectives.generators.generate` splits
    it; ``seed`` is the ECMP seed; ``latency`` the fabric profile and this
    machine's latency (default: none, bandwidth alone); ``mtu`` the emulated
    network's. Raises :class:`~emulator.base.errors.FieldError` for an algorithm
    other than ``ring``, ``hd`` and ``hdrm``, a size that does not split, or
    a topology without an HDRM placement (``hdrm``), and
    :class:`~emulator.base.errors.UserError` for a policy that does not apply.
    """
    hosts = _rank_hosts(algorithm, topo)
    routing.check_policy(topo, policy)
    model = latency or LatencyModel()
    p = len(hosts)
    paths = _routed(topo, policy, seed, hosts, model, tcp_goodput_factor(mtu))
    mss = tcp_payload_bytes(mtu)
    projector = _projector(algorithm)
    assert projector is not None  # _rank_hosts refuses the others
    time_s, distinct = projector(paths, hosts, size, mss)
    profile = model.profile
    return Projection(algorithm=algorithm, topology=topo.spec, policy=policy, seed=seed, hosts=p, size=size,
                      time_s=time_s, real_time_s=profile.real_seconds(time_s) if profile is not None else None,
                      busbw_mbps=bus_bandwidth_mbps(size, p, time_s), distinct_steps=distinct)


# ---------------------------------------------------------------------------
# Paper-scale fabrics
# ---------------------------------------------------------------------------

def paper_scale_radix(hosts: int) -> int:
    """The switch radix of :func:`paper_scale_topologies`: the smallest power of two ``k`` with ``k²/2 >= hosts``."""
    radix = equal_radix(hosts) if hosts <= MAX_HOSTS else None
    if radix is None:
        raise FieldError(WHERE, "hosts", f"a power of two from 8 to {MAX_HOSTS}", hosts)
    return radix


def paper_scale_topologies(hosts: int) -> list[tuple[str, str]]:
    """``[(role, spec), ...]``: equal-radix, non-blocking fabrics of ``hosts`` hosts (``docs/domain.md`` §5).

    Radix ``k`` = :func:`paper_scale_radix` (16 for 128 hosts, 32 for 256 and
    512, 64 for 1024). ``bigraph``: ``U = L = k/2`` switches per group with
    ``M = hosts/k`` hosts each; where ``hosts = k²/2`` (128, 512) that is the
    paper's ``k/2`` host ports per switch, otherwise (256, 1024) the switches
    leave host ports free, and ``M <= U`` keeps HDRM's placement
    contention-free. ``leafspine``: leaves of ``k/2`` hosts and ``k/2`` uplinks,
    ``k/2`` spines, ``hosts/(k/2)`` leaves. ``fattree``: only where
    ``k'³/4 = hosts`` for an even ``k'`` (``k' = 8`` for 128, 16 for 1024).
    """
    paper_scale_radix(hosts)  # refuses a host count without one
    out = []
    for role in ("bigraph", "leafspine", "fattree"):  # each kind's own growth rule (kinds.py)
        grow = KINDS[role].grow
        assert grow is not None
        keys = grow({}, hosts)
        if keys is not None:
            out.append((role, format_spec(role, keys)))
    return out
