"""What ``emu nccl-tests --packets`` runs: one size of one NCCL collective as real packets, and how its time
compares with the NCCL model's.

The model (:func:`emulator.model.nccl.cost.predict`) says what NCCL runs at a
size (algorithm, protocol, channels) and what bounds its bytes. A
:class:`PacketCell` is that choice on the emulated fabric:

* **the network**: the cluster's nodes as servers, one accelerator (host) per
  GPU; with one GPU and one NIC per node, the hosts on one switch
  (``star``); otherwise ``railonly`` with one rail per NIC index (GPU ``i``
  beside NIC ``i * K / G``; traffic to another rail changes rails inside the
  sending server, as NCCL's PXN does) and, for NVLink GPUs, the servers'
  interconnect;
* **the schedule**: NCCL's ring, tree or NVLS tree over its channels (the
  ``nccl``, ``nccl-tree`` and ``nccl-nvls`` generators,
  :mod:`emulator.model.collectives.nccl_rings`), one lane per channel;
* **the rates**: a NIC carries what the model's bytes move at through it: the
  GPU-NIC path's rate (:meth:`~emulator.model.nccl.system.System.path_gbs`),
  times the protocol's efficiency (LL carries half of what it moves, LL128
  0.92), times NCCL's channel limit where the model's channels are slower than
  the hardware; where a small size runs on fewer channels than the model
  counted (:func:`emulator.model.nccl.tuning.channels_for_size`), and so on
  fewer NICs, those NICs carry what all did, up to the path's rate. The
  interconnect likewise from NVLink's rate. A tree's NICs run at what NCCL's
  tree bandwidth (half the bus: a NIC direction carrying twice a node's share)
  gives the load the double binary tree really puts on them
  (:func:`tree_nic_load`: on two nodes, half). Both are divided by TCP's
  goodput at the profile's MTU, so that the data, not the frames, moves at
  that rate;
* **the latencies**: per message NCCL's per-step latency by link type
  (:func:`emulator.model.nccl.tuning.hop_latencies`): the profile's ``alpha``
  is the step inside a server, and the switches between servers add the rest
  of a network step (with one GPU per node every message is a network step:
  all of it is ``alpha``, so that the agents' clear to send, which crosses the
  switches only, costs nothing NCCL's credits would not). NCCL's base latency
  per collective is not a message: it is added to the measured time, and the
  output says so.

NVLS tree runs as the ``nccl-nvls`` generator lays it out: NVSwitch's reduction
and multicast become messages to and from each channel's head, so the
interconnect runs at the rate that makes them take NVSwitch's time in the
model (:func:`_interconnect_gbs`), and NCCL's NVSwitch latency, once per
collective in its model, is split over the two crossings of a piece. Its
cells are flagged so far (docs/validation.md, 2026-12-08): two connections
leaving by one NIC share its queue unevenly under the kernel's congestion
control, and 4 x 8 loses packets where the trees fan in.

Only ring all-reduce, all-gather and reduce-scatter, and tree and NVLS tree
all-reduce, run as packets, on servers with NVLink or one GPU each. Elsewhere
:func:`packet_cell` says why not (:class:`NotRun`).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model import fabric
from emulator.model.collectives import nccl_rings
from emulator.model.collectives.blocks import double_binary_tree
from emulator.model.fabric import FabricProfile
from emulator.model.nccl import cost, tuning
from emulator.model.nccl.system import System
from emulator.model.topology import tcp_goodput_factor

#: NCCL's algorithms as the schedule generators name them.
GENERATORS = {"ring": "nccl", "tree": "nccl-tree", "nvlstree": "nccl-nvls"}
#: The pieces a tree channel pipelines its share in (a ring channel's chunks are its ranks).
PIECES = {"tree": nccl_rings.TREE_PIECES, "nvlstree": nccl_rings.NVLS_PIECES}
#: The model's collective names as the schedules name them.
SCHEDULE_COLLECTIVE = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter"}
#: Switches a message between two servers crosses: the sender's server switch, the rail's leaf, the receiver's.
RAIL_SWITCHES = 3
#: The frame size of the emulated fabric (InfiniBand's 4096-byte MTU, as ``h100-ndr400``).
MTU = 4096
#: The emulated NIC rate a cell's profile starts at (Mbit/s), before a rate is chosen for this machine.
LINK_MBPS = 20.0


@dataclass(frozen=True)
class PacketCell:
    """One size as packets: the topology (rates left to the profile), the fabric it stands for, the channels."""

    prediction: cost.Prediction
    collective: str  # the schedule's name
    topology: str
    profile: FabricProfile  # at :data:`LINK_MBPS`: :meth:`at_link_rate` maps it onto another emulated rate
    channels: int
    base_latency_us: float

    @property
    def generator(self) -> str:
        """The schedule generator of NCCL's algorithm (:mod:`emulator.model.collectives.nccl_rings`)."""
        return GENERATORS[self.prediction.algorithm]

    def chunks(self, ranks: int) -> int:
        """The generator's chunks for the cell's channels over ``ranks`` ranks."""
        return PIECES.get(self.prediction.algorithm, ranks) * self.channels

    def at_link_rate(self, link_mbps: float) -> FabricProfile:
        return fabric.at_link_rate(self.profile, link_mbps, where="nccl-tests --packets")


@dataclass(frozen=True)
class NotRun:
    """A size the emulator does not run as packets, and why."""

    prediction: cost.Prediction
    why: str


@dataclass(frozen=True)
class Measured:
    """One size as packets: its time on the real fabric's clock, and whether it is trusted."""

    prediction: cost.Prediction
    time_us: float | None  # None: the replay failed
    verdict: str
    folder: str
    link_mbps: float  # the emulated NIC rate it ran at

    @property
    def over_model(self) -> float | None:
        return None if self.time_us is None else self.time_us / self.prediction.time_us

    def to_json(self) -> dict[str, object]:
        return {"size": self.prediction.nbytes, "time_us": self.time_us, "verdict": self.verdict,
                "over_model": self.over_model, "folder": self.folder, "link_mbps": self.link_mbps}


def topology_spec(system: System) -> str:
    """The emulated network of ``system`` (see the module docstring); rates unset."""
    n, g, k = system.nodes, system.gpus_per_node, min(system.nics_per_node, system.gpus_per_node)
    if g == 1:
        return f"star:hosts={n}"
    return (f"railonly:rails={k},hosts_per_rail={n},servers={n},accels_per_server={g},"
            f"nics_per_server={k}")


def _rate_scale(prediction: cost.Prediction) -> float:
    """NCCL's channel limit: the model's bandwidth over the hardware's (1 where the hardware bounds the bytes)."""
    if prediction.hardware_algbw_gbs <= 0:
        return 1.0
    return min(1.0, prediction.algbw_gbs / prediction.hardware_algbw_gbs)


def tree_nic_load(nodes: int) -> float:
    """The most a NIC direction carries in NCCL's double binary tree between ``nodes`` nodes, in a tree's share of
    a node's bytes (half on each tree): its children's and its parent's, summed over both trees. 2 from 4 nodes on
    (an interior node of one tree is a leaf of the other), which NCCL's tree bandwidth (half the bus) assumes; 1 on
    two nodes, where each node's bytes cross once each way."""
    if nodes < 2:
        return 0.0
    load = [0.0] * nodes
    for _, parent in double_binary_tree(nodes):
        for v, up in enumerate(parent):
            if up >= 0:  # the edge v-up carries a tree's share each way: up in one direction, down in the other
                load[v] += 0.5
                load[up] += 0.5
    return max(load)


def _nics_in_use(system: System, channels: int) -> int:
    return min(channels, system.nics_per_node, system.gpus_per_node)


def profile_for(system: System, prediction: cost.Prediction) -> FabricProfile:
    """The fabric the cell stands for, its NICs at :data:`LINK_MBPS`: rates and latencies as the module docstring
    says."""
    efficiency = cost.PROTOCOL_EFFICIENCY[prediction.protocol] * _rate_scale(prediction)
    goodput = tcp_goodput_factor(MTU)
    # NCCL's model counts all its channels; fewer run a small size, on fewer NICs, which then carry what all did
    spread = _nics_in_use(system, prediction.model_channels or prediction.channels) / \
        _nics_in_use(system, prediction.channels)
    # NCCL's tree bandwidth assumes a NIC direction carries twice a node's share; where the tree loads it less (two
    # nodes), the NIC runs that much slower, so that the bytes take the model's time
    shape = tree_nic_load(system.nodes) / 2.0 if prediction.algorithm == "tree" and system.nodes >= 2 else 1.0
    link_gbps = 8.0 * min(system.path_gbs(), system.path_gbs() * efficiency * spread * shape) / goodput
    graph = tuning.search(system)
    hops = tuning.hop_latencies(system, graph, prediction.algorithm, prediction.protocol)
    # NVLS tree's NVSwitch step is once per collective in NCCL's model; a piece crosses the interconnect twice (to
    # its head and back), half of it each time
    intra = hops.intra_us / 2.0 if prediction.algorithm == "nvlstree" else hops.intra_us
    if system.gpus_per_node == 1:  # every message crosses the one switch: all of it per message, none per switch
        alpha, per_switch = hops.inter_us, 0.0
    else:
        alpha, per_switch = intra, max(0.0, hops.inter_us - intra) / RAIL_SWITCHES
    keys = dict(link_gbps=link_gbps, mtu=MTU, switch_latency_us=per_switch, alpha_us=alpha,
                dilation=link_gbps * 1000.0 / LINK_MBPS, domain_gbps=0.0, domain_latency_us=0.0)
    if system.gpus_per_node > 1:
        keys["domain_gbps"] = 8.0 * _interconnect_gbs(system, prediction) * efficiency / goodput
    return fabric.parse({"preset": "bandwidth-only", **keys}, where="nccl-tests --packets")


def _interconnect_gbs(system: System, prediction: cost.Prediction) -> float:
    """What a GPU's interconnect port carries for the cell (GB/s, before the protocol's efficiency and NCCL's channel
    limit): NVLink's rate; for NVLS tree, whose packets carry NVSwitch's reduction and multicast as messages to and
    from the heads (``2(G-1)/G`` times a GPU's bytes each way), the rate at which they take as long as NVSwitch
    takes in the model (its hardware stage, twice NVLink at NVLS's efficiency, in algorithm bandwidth)."""
    if prediction.algorithm != "nvlstree":
        return system.gpu.nvlink_gbs
    g, n = system.gpus_per_node, system.ranks
    return 2 * (g - 1) / g * cost.nvswitch_bus_gbs(system) * n / tuning.ring_steps("allreduce", n)


def packet_cell(system: System, op: str, prediction: cost.Prediction) -> PacketCell | NotRun:
    """What runs as packets for ``prediction`` (one size of model collective ``op``), or why nothing does."""
    if op not in SCHEDULE_COLLECTIVE:
        return NotRun(prediction, f"{op} has no packet schedule yet (ring all-reduce, all-gather and reduce-scatter "
                      "do)")
    if prediction.algorithm not in GENERATORS or (prediction.algorithm != "ring" and op != "allreduce"):
        return NotRun(prediction, f"NCCL runs {prediction.algorithm} here; only its ring, tree and NVLS tree run as "
                      "packets so far (--algo ring or tree forces them)")
    if system.gpus_per_node > 1 and not system.gpu.nvlink_gbs:
        return NotRun(prediction, "servers of GPUs without NVLink (peers over PCIe) do not run as packets yet")
    if system.ranks < 2:
        return NotRun(prediction, "one rank sends nothing")
    graph = tuning.search(system)
    base = tuning.hop_latencies(system, graph, prediction.algorithm, prediction.protocol).base_us
    return PacketCell(prediction, SCHEDULE_COLLECTIVE[op], topology_spec(system), profile_for(system, prediction),
                      prediction.channels, base)
