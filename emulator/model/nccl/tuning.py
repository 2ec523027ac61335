"""NCCL's tuning model: the algorithm, protocol and channels NCCL chooses, and the time it expects.

NCCL predicts, for each collective, algorithm and protocol, ``latency +
bytes / bandwidth`` from a few tables and its topology search, and runs the
fastest (``src/enqueue.cc``, ``topoGetAlgoInfo``). This module is that model
for the ring, tree and NVLS tree algorithms and the LL, LL128 and Simple protocols, as
NCCL 2.30 (``src/graph/tuning.cc`` at NVIDIA/nccl 5067397c) writes it:

* **the topology search** (``search.cc``, ``connect.cc``), reduced to what the
  tables need: the per-channel speed is the first entry of NCCL's speed array
  at most the GPU-NIC path's bandwidth (multi-node) or the GPUs' (one node); a
  channel takes that speed from every NIC, PCIe and NVLink budget it crosses,
  so channels are the budgets' quotient; lower speeds are tried while they are
  above half the first, and the largest total wins; channels then double
  where NCCL doubles them (``ncclTopoDupChannels``; ``ncclTopoPostset`` for the
  channels that run);
* **latencies**: a base latency per algorithm and protocol, and per step a
  latency by link type (NVLink, PCIe, network), with the network's overhead
  per ring step;
* **bandwidths**: channels x per-channel speed, with each protocol's
  efficiency and caps (LL half, LL128 0.92, tree 0.92 and its per-channel
  caps by GPU generation), converted to algorithm bandwidth;
* **the time**: with the tree's correction by size and the ring's "plateau"
  latency factor, ``latency + bytes / (1000 * bandwidth)`` microseconds.

NVLS tree (NVSwitch multicast inside each node, a tree between nodes: NCCL's
default for large all-reduces across 8-GPU Hopper nodes) takes its heads (one
per GPU with a NIC) at the ring search's speed; NCCL searches its graph apart.
The channels a size then runs on follow NCCL's reduction for small messages
(:func:`channels_for_size`); it changes no predicted time (NCCL's model does
not see it), only what runs. Not modelled (``docs/validation.md`` says where it
matters): single-node NVLS, CollNet (SHARP), PAT and tuner plugins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from emulator.base.errors import FieldError
from emulator.model.nccl.system import System

ALGORITHMS = ("tree", "ring", "nvlstree")
PROTOCOLS = ("ll", "ll128", "simple")
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")

#: Base latency (us) by algorithm and protocol (LL, LL128, Simple): ``baseLatencies``.
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvlstree": (0.0, 0.0, 0.0)}
#: Per-step latency (us) by link type, algorithm and protocol: ``hwLatencies``.
HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvlstree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvlstree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvlstree": (0.0, 0.0, 20.9)},
}
#: Index of a compute capability in NCCL's per-generation tables (Volta, Ampere, Hopper, Blackwell).
def cc_index(cc: int) -> int:
    return 3 if cc >= 100 else 2 if cc >= 90 else 1 if cc >= 80 else 0


#: ``llMaxBws``: [GPU generation on one node / Intel, AMD CPUs between nodes][1 node, 2 nodes, more].
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
#: ``nvlsEfficiency`` by generation (NVLS needs Hopper or later).
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
#: ``treeCorrectionFactor`` by protocol, for sizes 64 B << i (i = 0..23).
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
#: Per-channel speeds the search tries (GB/s), by generation (before Hopper, Hopper, Blackwell) and scope.
SPEEDS_INTRA = {80: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
                90: (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
                100: (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18)}
SPEEDS_INTER = {80: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
                90: (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
                100: (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)}
MAX_SEARCH_CHANNELS = 32
MAX_CHANNELS = 64
#: ``getNetOverhead``: the network's per-step posting overhead (us) by CPU vendor (x3 for Simple).
NET_OVERHEAD_US = {"amd": 2.0}
DEFAULT_NET_OVERHEAD_US = 1.0


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search leaves for its tuning: channels and their speed, and the path types."""

    channels: float  # search channels (the tables multiply by these; fractional when channels are forced)
    speed_gbs: float  # per search channel
    runtime_channels: int  # what runs (ncclTopoPostset)
    intra_hw: str  # "nvlink" or "pci"
    ll128_allowed: bool
    nvls_channels: int = 0  # NVLS tree's channels (its heads: one per GPU with a NIC); 0 where NVLS cannot run
    nvls_speed_gbs: float = 0.0


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) of one collective and size, and what NCCL's model says of it."""

    algorithm: str
    protocol: str
    latency_us: float
    bandwidth_gbs: float  # algorithm bandwidth NCCL's model uses for this size (bytes / (1000 * bw) us)
    channels: int  # what runs
    model_channels: int = 0  # what NCCL's model counted (0: the same)

    def time_us(self, nbytes: int) -> float:
        return self.latency_us + nbytes / (1000.0 * self.bandwidth_gbs)


def _speeds(cc: int, inter: bool) -> tuple[float, ...]:
    table = SPEEDS_INTER if inter else SPEEDS_INTRA
    return table[100 if cc >= 100 else 90 if cc >= 90 else 80]


def search(system: System) -> Graph:
    """The ring graph NCCL's search finds for ``system`` (the tree graph takes the same channels and speed)."""
    inter = system.nodes > 1
    gpus = system.gpus_per_node
    link_total = max(system.pcie_gbs, system.gpu.nvlink_gbs)  # one GPU's budget, NVLink or PCIe
    if inter:
        max_bw = system.nccl_path_gbs()
        nics = min(system.nics_per_node, gpus)

        def channels_at(speed: float) -> int:
            per_nic = min(int(system.nic_line_gbs // speed), int(system.nccl_path_gbs() // speed))
            through_gpus = int(link_total // speed) if gpus > 1 else per_nic
            return min(nics * per_nic, through_gpus, MAX_SEARCH_CHANNELS)
    else:
        max_bw = link_total

        def channels_at(speed: float) -> int:
            return min(int(link_total // speed), MAX_SEARCH_CHANNELS)

    candidates = [s for s in _speeds(system.gpu.compute_capability, inter) if s <= max_bw]
    best_channels, best_speed = 1, 0.1
    first = None
    for speed in candidates:
        n = channels_at(speed)
        if n < 1:
            continue
        if first is None:
            first = speed
        elif speed <= 0.49 * first:
            break
        if n * speed > best_channels * best_speed:
            best_channels, best_speed = n, speed
    channels, speed = best_channels, best_speed
    cc = system.gpu.compute_capability
    if speed >= 25 and not (cc > 80 and speed < 50 and channels > 4):  # ncclTopoDupChannels
        channels, speed = min(2 * channels, MAX_SEARCH_CHANNELS), speed / 2
    runtime = min(2 * channels, MAX_CHANNELS)
    if cc >= 90 and inter and speed > 45 and runtime < 16:
        runtime = min(2 * runtime, MAX_CHANNELS)
    intra_hw = "nvlink" if gpus > 1 and system.gpu.nvlink_gbs else "pci"
    # LL128 needs the intra-node path NVLink (or one GPU) and the GPU-NIC path within a PCIe switch (PXN on Hopper):
    # host staging (PHB) and the other socket (SYS) are beyond it.
    ll128 = (gpus == 1 or intra_hw == "nvlink") and cc >= 70 and \
        (not inter or (system.gdr and not system.cross_socket))
    # NVLS (NVSwitch multicast) needs Hopper or later with NVSwitch (every NVLink GPU here is an HGX part); its
    # tree runs between nodes, a head per GPU with a NIC, at the search's speed before doubling.
    heads = min(gpus, system.nics_per_node)
    nvls = heads if inter and cc >= 90 and system.gpu.nvlink_gbs and heads >= 2 else 0
    return Graph(channels, speed, runtime, intra_hw, ll128, nvls, best_speed if nvls else 0.0)


def ring_steps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "allreduce" else n - 1 if collective in ("allgather", "reducescatter") else n


def _bandwidth(system: System, graph: Graph, collective: str, algorithm: str, protocol: str) -> float:
    """NCCL's algorithm bandwidth (GB/s) for one (collective, algorithm, protocol), before the size corrections."""
    if algorithm == "nvlstree":
        return _nvls_tree_bandwidth(system, graph, collective, protocol)
    nodes, ranks = system.nodes, system.ranks
    cc = cc_index(system.gpu.compute_capability)
    index2 = nodes - 1 if nodes <= 2 else 2
    index1 = cc if nodes == 1 else (1 if system.cpu == "amd" else 0)
    ll_max = LL_MAX_BW[index1][index2]
    bus = graph.channels * graph.speed_gbs  # bwIntra for <= 2 nodes, bwInter beyond: the same speed here
    if algorithm == "ring" and protocol == "ll":
        bus = min(ll_max, bus * 0.5)
    if algorithm == "ring" and protocol == "ll128":
        bus = min(bus * 0.92, graph.channels * PER_CH_MAX_RING_LL128_BW[cc][index2])
    if algorithm == "tree" and collective == "allreduce":
        bus = min(bus * 0.92, graph.channels * PER_CH_MAX_TREE_BW[cc][index2])
    if algorithm == "tree" and protocol == "ll":
        bus = min(bus / 3.8, ll_max)
    if algorithm == "tree" and protocol == "ll128":
        bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), graph.channels * PER_CH_MAX_TREE_LL128_BW[cc][index2])
    if algorithm == "tree" and system.gpus_per_node == 1:  # one GPU per node: the plain TREE pattern
        bus *= 0.85
    ratio = ranks / ring_steps(collective, ranks) if algorithm == "ring" else 0.5
    return bus * ratio


def _nvls_tree_bandwidth(system: System, graph: Graph, collective: str, protocol: str,
                         nvswitch: bool = True) -> float:
    """NVLS tree (Simple only): NVSwitch's reduction inside the node, a tree between nodes (two nodes: each sends
    its reduced data once, so the network counts twice), capped per channel. ``nvswitch=False`` leaves out NCCL's
    NVSwitch term (:func:`nvls_tree_channel_bandwidth`)."""
    if protocol != "simple" or graph.nvls_channels < 2 or collective != "allreduce":
        return 0.0
    cc = cc_index(system.gpu.compute_capability)
    index2 = system.nodes - 1 if system.nodes <= 2 else 2
    n, speed = graph.nvls_channels, graph.nvls_speed_gbs
    intra = speed * NVLS_EFFICIENCY[cc] * (n - 1) / n * 2.0 if nvswitch else math.inf  # two operations pipelined
    inter = speed * (2 if system.nodes <= 2 else 1)
    bus = n * min(intra, inter, PER_CH_MAX_NVLS_TREE_BW[cc][index2])
    return bus * system.ranks / ring_steps(collective, system.ranks)


def nvls_tree_channel_bandwidth(system: System, collective: str) -> float:
    """What NVLS tree's channels carry at most, for its time rather than NCCL's choice: NCCL's model without its
    NVSwitch term. NCCL's NVLS search only pairs heads with NICs (``search.cc``), so that term is the NIC's speed
    times NVLS's efficiency, which is not NVSwitch's rate; the hardware's NVSwitch stage
    (:func:`emulator.model.nccl.cost.hardware_bus_gbs`) bounds the time instead. On Hopper NCCL's per-channel cap
    binds first either way; on Blackwell (efficiency 0.74) the NVSwitch term bound 2 x 8 B200 at 497 GB/s where
    683 was measured (docs/validation.md)."""
    return _nvls_tree_bandwidth(system, search(system), collective, "simple", nvswitch=False)


@dataclass(frozen=True)
class HopLatencies:
    """NCCL's latencies (us) for one algorithm and protocol: once per collective, and per step by link type."""

    base_us: float
    intra_us: float  # a step inside a node (NVLink or PCIe)
    inter_us: float  # a step between nodes


def hop_latencies(system: System, graph: Graph, algorithm: str, protocol: str) -> HopLatencies:
    """The latencies NCCL's model charges ``algorithm`` with ``protocol`` on ``system``: ``baseLatencies``, and per
    step ``hwLatencies`` by link type (between nodes with one GPU per node, the tree's), a step inside a node at
    least the network's posting overhead when the ring also crosses nodes."""
    p = PROTOCOLS.index(protocol)
    intra = HW_LATENCY_US[graph.intra_hw][algorithm][p]
    inter = HW_LATENCY_US["net"]["tree" if system.gpus_per_node == 1 else algorithm][p]
    if algorithm == "ring" and system.nodes > 1:
        overhead = NET_OVERHEAD_US.get(system.cpu, DEFAULT_NET_OVERHEAD_US) * (3 if protocol == "simple" else 1)
        intra = max(intra, overhead)
    return HopLatencies(BASE_LATENCY_US[algorithm][p], intra, inter)


def _latency(system: System, graph: Graph, collective: str, algorithm: str, protocol: str) -> float:
    """NCCL's latency (us) for one (collective, algorithm, protocol)."""
    p = PROTOCOLS.index(protocol)
    nodes, ranks = system.nodes, system.ranks
    ppn = system.gpus_per_node
    hops = hop_latencies(system, graph, algorithm, protocol)
    lat, intra, inter = hops.base_us, hops.intra_us, hops.inter_us
    if algorithm == "ring":
        hw = graph.intra_hw if nodes == 1 else "net"
        steps = ring_steps(collective, ranks)
        if collective in ("reduce", "broadcast"):
            return lat + HW_LATENCY_US[hw]["ring"][p]  # one chain, pipelined (sameChannels)
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if collective == "allreduce" else nodes - 1
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algorithm == "nvlstree":
        return lat + HW_LATENCY_US["nvlink"]["nvlstree"][p] + 2 * int(math.log2(nodes)) * inter
    return lat + 2 * ((ppn - 1) * intra + int(math.log2(nodes)) * inter)


def supports(collective: str, algorithm: str) -> bool:
    """Tree and NVLS tree run only allreduce; every collective has a ring (NVLS tree also needs the system to have
    NVLS: :attr:`Graph.nvls_channels`)."""
    return algorithm == "ring" or collective == "allreduce"


def with_channels(graph: Graph, channels: int | None) -> Graph:
    """The graph with ``channels`` running (``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS``): the tables' channels
    scale with them, each at the search's speed."""
    if channels is None:
        return graph
    if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
        raise FieldError("nccl", "channels", f"an integer in 1..{MAX_CHANNELS}", channels)
    return replace(graph, channels=graph.channels * channels / graph.runtime_channels, runtime_channels=channels)


def check_forced(system: System, collective: str, algorithm: str, protocol: str, graph: Graph | None = None) -> None:
    """:class:`FieldError` for a forced algorithm or protocol NCCL cannot run ``collective`` with on ``system``."""
    if collective not in COLLECTIVES:
        raise FieldError("nccl", "collective", " or ".join(COLLECTIVES), collective)
    if algorithm != "auto" and (algorithm not in ALGORITHMS or not supports(collective, algorithm)):
        raise FieldError("nccl", "algo", f"auto or an algorithm NCCL runs {collective} with "
                         f"({', '.join(a for a in ALGORITHMS if supports(collective, a))})", algorithm)
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise FieldError("nccl", "protocol", "auto, " + ", ".join(PROTOCOLS), protocol)
    if algorithm == "nvlstree" and (graph or search(system)).nvls_channels < 2:
        raise FieldError("nccl", "algo", "ring or tree: NVLS tree needs NVSwitch nodes of Hopper or later GPUs, two "
                         "or more GPUs with NICs, and more than one node", algorithm)


def options(system: System, collective: str, nbytes: int, algorithm: str = "auto",
            protocol: str = "auto", channels: int | None = None) -> list[Choice]:
    """Every (algorithm, protocol) NCCL would consider for ``nbytes`` of ``collective`` (the ones forced, when
    forced), with NCCL's latency and size-corrected bandwidth; ``channels`` forces the channels that run."""
    graph = with_channels(search(system), channels)
    check_forced(system, collective, algorithm, protocol, graph)
    out = []
    for a in ALGORITHMS:
        if (algorithm != "auto" and a != algorithm) or not supports(collective, a):
            continue
        for p in PROTOCOLS:
            # a forced LL128 runs where NCCL would not enable it by default (NCCL_PROTO=LL128 does the same)
            if (protocol != "auto" and p != protocol) or (p == "ll128" and not graph.ll128_allowed and protocol == "auto"):
                continue
            bw = _bandwidth(system, graph, collective, a, p)
            lat = _latency(system, graph, collective, a, p)
            log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
            if a == "tree" and collective == "allreduce" and 0 <= log_size < 23:
                bw *= TREE_CORRECTION[p][log_size]
            if a == "ring" and p == "simple" and system.nodes > 1 and collective == "allreduce" and \
                    nbytes / (graph.runtime_channels * system.ranks) >= 64:
                lat *= 1.4 if system.gpu.compute_capability >= 80 else 1.9  # NCCL: the ring's "plateau effect"
            if bw > 0:
                out.append(Choice(a, p, lat, bw, graph.runtime_channels))
    return out


def choose(system: System, collective: str, nbytes: int, algorithm: str = "auto", protocol: str = "auto",
           channels: int | None = None) -> Choice:
    """What NCCL runs: the option of least predicted time (``topoGetAlgoInfo``), on the channels it then gives
    that size (:func:`channels_for_size`)."""
    found = options(system, collective, nbytes, algorithm, protocol, channels)
    if not found:
        raise FieldError("nccl", "protocol", f"a protocol NCCL enables for {collective} on {system.describe()}",
                         protocol)
    best = min(found, key=lambda c: c.time_us(nbytes))
    return replace(best, channels=channels_for_size(system, best, nbytes), model_channels=best.channels)


#: ``NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD`` (``comm.h``): bytes per thread below which NCCL takes a channel away.
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}
#: NCCL's threads per channel by protocol (``device.h``: ``NCCL_LL_MAX_NTHREADS``, ``NCCL_LL128_MAX_NTHREADS``,
#: ``NCCL_SIMPLE_MAX_NTHREADS``), and PCIe Gen3's bandwidth under which a Simple ring takes half (``topo.h``).
MAX_THREADS = {"ll": 512, "ll128": 640, "simple": 512}
PCI_BW = 12.0


def channels_for_size(system: System, choice: Choice, nbytes: int) -> int:
    """The channels NCCL runs ``nbytes`` on (``topoGetAlgoInfo`` after the choice): a ring or tree gives up channels
    while the bytes are fewer than channels x threads x the protocol's threshold per thread (a ring's LL
    threshold times the ranks); NVLS tree keeps its own. It changes no predicted time (NCCL's model chose
    before it), only what runs: small sizes on a channel or two."""
    if choice.algorithm == "nvlstree":
        return choice.channels
    threads = MAX_THREADS[choice.protocol]
    if choice.algorithm == "ring" and choice.protocol == "simple":
        graph = search(system)
        threads = 256 if graph.speed_gbs * graph.channels <= PCI_BW else 512
    threshold = THREAD_THRESHOLD[choice.protocol]
    if choice.algorithm == "ring" and choice.protocol == "ll":
        threshold *= system.ranks
    nc = choice.channels
    while nbytes < nc * threads * threshold and nc >= 2:
        nc -= 1
    return nc
