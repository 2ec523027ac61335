"""The predicted time of one NCCL collective on a :class:`~emulator.model.nccl.system.System`.

NCCL chooses by its own model (:mod:`emulator.model.nccl.tuning`); the time it
then takes is that choice's latency (NCCL's latency structure: a base latency
per algorithm and protocol, a latency per step by link type) plus the bytes
over the slower of two bandwidths:

* the bandwidth NCCL's model gives the choice (its channels, their speed and
  the protocol's efficiency and caps), which is what the channels NCCL runs can
  move at most;
* the hardware's: the slowest stage every channel's data crosses, in NCCL's
  bus-bandwidth terms (a node's NICs at their path's rate between nodes,
  NVLink or PCIe inside one), with the protocol's efficiency (LL carries 8 of
  every 16 bytes, LL128 120 of 128: NCCL's 0.5 and 0.92) and the algorithm's
  conversion to algorithm bandwidth (a ring's ``n / steps``, a tree's one half).

Send/receive and all-to-all are not in NCCL's tuning model: NCCL runs them
with the Simple protocol over the network; their time is the ring's Simple
latency plus each rank's bytes over its own path, all peers at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.base.errors import FieldError
from emulator.model.nccl import tuning
from emulator.model.nccl.system import System

#: What each protocol carries of the bytes it moves, as NCCL's tuning counts it.
PROTOCOL_EFFICIENCY = {"ll": 0.5, "ll128": 0.92, "simple": 1.0}
P2P = ("sendrecv", "alltoall")


@dataclass(frozen=True)
class Prediction:
    """One size of one collective: what NCCL runs and how long it takes."""

    collective: str
    nbytes: int
    algorithm: str
    protocol: str
    channels: int
    time_us: float
    nccl_time_us: float  # what NCCL's own model expects
    bottleneck: str  # "nccl channels" or the hardware stage that limits the bytes
    algbw_gbs: float = 0.0  # the algorithm bandwidth the bytes move at (the slower of NCCL's and the hardware's)
    hardware_algbw_gbs: float = 0.0  # the hardware's alone
    model_channels: int = 0  # the channels NCCL's model counted (``channels`` run: fewer for small sizes)


def hardware_bus_gbs(system: System, algorithm: str = "ring") -> tuple[float, str]:
    """The slowest stage in bus-bandwidth terms (GB/s) and its name, for ``algorithm``'s traffic.

    A ring or tree passes every byte through the node's NICs between nodes, and
    over NVLink through all but the GPU whose NIC it leaves by (one node: all).
    NVLS tree reduces inside NVSwitch (each GPU sends and receives its data
    once, at NCCL's NVLS efficiency: twice a ring's bus bandwidth over the same
    NVLink) and, between two nodes, sends each node's reduced data once (half a
    ring's bytes over the network).
    """
    intra_name = _intra_name(system)
    intra = system.intra_gbs()
    network = system.node_network_gbs()
    if algorithm == "nvlstree":
        intra = nvswitch_bus_gbs(system)
        if system.nodes == 2:
            network *= 2
    if system.nodes == 1:
        return intra, intra_name
    if algorithm != "nvlstree" and system.gpu.nvlink_gbs:
        # across nodes each channel's ring (or chain) enters a node on one GPU and leaves from another: of a
        # node's G GPUs, G - 1 forward the channel's bytes over NVLink, the last over its NIC (a GPU without
        # NVLink sends both over its one PCIe link, so it has no such share)
        intra *= system.gpus_per_node / max(system.gpus_per_node - 1, 1)
    if system.gpus_per_node > 1 and intra < network:
        return intra, intra_name
    return network, _path_name(system)


def nvswitch_bus_gbs(system: System) -> float:
    """NVSwitch's reduction in bus-bandwidth terms (GB/s): each GPU sends and receives its data once, at NCCL's
    NVLS efficiency, so twice a ring's bus bandwidth over the same NVLink."""
    return system.intra_gbs() * 2 * tuning.NVLS_EFFICIENCY[tuning.cc_index(system.gpu.compute_capability)]


def _intra_name(system: System) -> str:
    return {"nvlink": "nvlink", "p2p": "pcie", "shm": "host memory"}[system.peer_path()]


def _path_name(system: System) -> str:
    rate = system.path_gbs()
    if rate == system.nic_goodput_gbs:
        return "nic"
    if system.cross_socket and rate == system.socket_gbs:
        return "socket link"
    return "host staging" if not system.gdr and rate < system.pcie_gbs else "pcie"


def _hardware_algbw(system: System, collective: str, algorithm: str, protocol: str) -> tuple[float, str]:
    bus, name = hardware_bus_gbs(system, algorithm)
    ratio = system.ranks / tuning.ring_steps(collective, system.ranks) if algorithm in ("ring", "nvlstree") else 0.5
    return bus * PROTOCOL_EFFICIENCY[protocol] * ratio, name


def check_forced(system: System, collective: str, algorithm: str, protocol: str) -> None:
    """:class:`FieldError` for a forced algorithm or protocol NCCL cannot run ``collective`` with (send/receive and
    all-to-all run as Simple send/receive); what :func:`predict` refuses, checked before any size."""
    if collective not in P2P:
        tuning.check_forced(system, collective, algorithm, protocol)
    elif algorithm != "auto" or protocol not in ("auto", "simple"):
        raise FieldError("nccl", "algo", f"auto with protocol auto or simple: NCCL runs {collective} as "
                         "send/receive with Simple", f"{algorithm}/{protocol}")


def predict(system: System, collective: str, nbytes: int, algorithm: str = "auto",
            protocol: str = "auto", channels: int | None = None) -> Prediction:
    """The predicted time of ``nbytes`` (NCCL's count times the type's size, all ranks' for all-gather and
    reduce-scatter) of ``collective``; ``algorithm``, ``protocol`` and ``channels`` force NCCL's choice."""
    if collective in P2P:
        check_forced(system, collective, algorithm, protocol)
        return _predict_p2p(system, collective, nbytes)
    choice = tuning.choose(system, collective, nbytes, algorithm, protocol, channels)
    hardware, name = _hardware_algbw(system, collective, choice.algorithm, choice.protocol)
    channels_bw = choice.bandwidth_gbs
    if choice.algorithm == "nvlstree":  # NCCL's NVSwitch term is its NIC speed; the hardware's stage bounds it
        channels_bw = tuning.nvls_tree_channel_bandwidth(system, collective)
    bw, limit = (channels_bw, "nccl channels") if channels_bw <= hardware else (hardware, name)
    time = choice.latency_us + nbytes / (1000.0 * bw)
    return Prediction(collective, nbytes, choice.algorithm, choice.protocol, choice.channels, time,
                      choice.time_us(nbytes), limit, bw, hardware, choice.model_channels or choice.channels)


def _predict_p2p(system: System, collective: str, nbytes: int) -> Prediction:
    graph = tuning.search(system)
    p = tuning.PROTOCOLS.index("simple")
    remote = system.nodes > 1
    hw = "net" if remote else graph.intra_hw
    latency = tuning.BASE_LATENCY_US["ring"][p] + tuning.HW_LATENCY_US[hw]["ring"][p]
    per_gpu_net = system.path_gbs() * min(1.0, system.nics_per_node / system.gpus_per_node)
    n, g = system.ranks, system.gpus_per_node
    # bytes over GB/s: nanoseconds
    if collective == "sendrecv":  # nccl-tests: every rank sends its buffer to the next rank
        if remote:
            transfer_ns, name = nbytes / per_gpu_net, _path_name(system)
        else:
            transfer_ns, name = nbytes / system.intra_gbs(), _intra_name(system)
    else:  # alltoall: nbytes is one rank's whole send buffer, 1/n to every rank
        over_net = nbytes * (n - g) / n / per_gpu_net if remote else 0.0
        inside = nbytes * (g - 1) / n / system.intra_gbs()
        transfer_ns, name = max((over_net, _path_name(system)), (inside, _intra_name(system)))
    time = latency + transfer_ns / 1000.0
    return Prediction(collective, nbytes, "p2p", "simple", graph.runtime_channels, time, time, name)
