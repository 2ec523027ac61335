"""The cluster an NCCL run stands for, and the rates its hardware's published figures give it.

A :class:`System` is what a published nccl-tests table states about its
setup, and no more: nodes, GPUs and NICs per node, the NIC's line rate, the
GPU's generation and PCIe generation, whether GPUDirect RDMA is on, and where
the NIC sits relative to the GPU. Everything else is derived here by rules
that hold for every system (``docs/validation.md`` names each figure's source):

* **NIC goodput**: 96 % of the line rate (NVIDIA's maintainers: "24 GB/s per
  200G NIC", "48-49 GB/s" per 400G ConnectX-7);
* **PCIe**: NCCL's own figure per x16 link (``topo.cc``: Gen3 12, Gen4 24, Gen5
  48 GB/s per direction);
* **host staging** (GPUDirect RDMA off): the GPU's kernels read the received
  data from pinned host memory, at two thirds of the PCIe copy rate (nvbandwidth
  on H100: 35.2 GB/s by SM reads against 52.8 GB/s by the copy engine);
* **the socket link** a GPU-NIC path crosses when they sit on different
  sockets: NCCL's figure (``topo.h``: AMD 16, Intel Skylake 10, Sapphire Rapids
  22, Emerald Rapids 40 GB/s);
* **NVLink**: NCCL's figure per GPU and direction (``topo.h``: 40.1 GB/s per
  B200 link and 20.6 per H100 or H200 link, 18 links; 20 per A100 link, 12 links);
* **GPUs without NVLink** reach each other as NCCL's default allows
  (``paths.cc``, ``p2pLevel``): peer-to-peer over PCIe when they share a PCIe
  switch (a GPU-NIC path within a PCIe switch says the node is built so), else
  through host memory (NCCL's SHM transport) at the host-staging rate; AMD
  hosts with two GPUs or fewer keep peer-to-peer at any distance. Either way a
  GPU's one PCIe link carries all it sends, to a peer or to its NIC.

Rates are GB/s (10^9 bytes per second), as NCCL and nccl-tests count them.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.base.errors import FieldError, int_field
from emulator.model.fabric import FabricProfile


@dataclass(frozen=True)
class Gpu:
    """A GPU generation as NCCL sees it."""

    name: str
    compute_capability: int  # 80, 90, 100: picks NCCL's speed arrays and per-channel caps
    nvlink_gbs: float  # per GPU and direction, NCCL's model (0: no NVLink, peers over PCIe)
    pcie_gen: int


#: ``unknown`` is what a table that does not name its GPU gets: an Ampere-generation PCIe card (Gen4, no NVLink),
#: the commonest GPU without NVLink in the tables' era; the validation report says where it is assumed.
GPUS = {
    "h100-sxm": Gpu("h100-sxm", 90, 18 * 20.6, 5),
    "h100-pcie": Gpu("h100-pcie", 90, 0.0, 5),
    "h200-sxm": Gpu("h200-sxm", 90, 18 * 20.6, 5),
    "b200-sxm": Gpu("b200-sxm", 100, 18 * 40.1, 5),
    "a100-sxm": Gpu("a100-sxm", 80, 12 * 20.0, 4),
    "a100-pcie": Gpu("a100-pcie", 80, 0.0, 4),
    "unknown": Gpu("unknown", 80, 0.0, 4),
}

#: NCCL's PCIe bandwidth per x16 link and direction (``topo.cc``, ``kvDictPciGen``: width x speed / 80).
PCIE_GBS = {3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
#: NCCL's inter-socket link bandwidth (``topo.h``).
SOCKET_GBS = {"amd": 16.0, "intel-skylake": 10.0, "intel-sapphire-rapids": 22.0, "intel-emerald-rapids": 40.0,
              "intel": 22.0, "unknown": 16.0}
#: What a NIC carries of its line rate (see the module docstring).
NIC_EFFICIENCY = 0.96
#: GPU kernels reading pinned host memory, against the PCIe copy rate (see the module docstring).
HOST_READ_FRACTION = 35.2 / 52.8

NETWORKS = ("infiniband", "roce", "tcp")
PATHS = ("same-pcie-switch", "same-socket", "cross-socket")
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 16


@dataclass(frozen=True)
class System:
    """A cluster of identical nodes; see the module docstring for what is derived from it."""

    nodes: int
    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float
    gpu: Gpu
    network: str = "infiniband"
    cpu: str = "unknown"
    gdr: bool = True
    gpu_nic_path: str = "same-pcie-switch"

    def __post_init__(self) -> None:
        where = "system"
        int_field(where, "nodes", self.nodes, 1, MAX_NODES)
        int_field(where, "gpus-per-node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE)
        int_field(where, "nics-per-node", self.nics_per_node, 1, MAX_GPUS_PER_NODE)
        if not isinstance(self.nic_gbps, int | float) or isinstance(self.nic_gbps, bool) or \
                not 1 <= self.nic_gbps <= 3200:
            raise FieldError(where, "nic_gbps", "a NIC line rate in Gbit/s from 1 to 3200", self.nic_gbps)
        if self.network not in NETWORKS:
            raise FieldError(where, "network", " or ".join(NETWORKS), self.network)
        if self.cpu not in SOCKET_GBS:
            raise FieldError(where, "cpu", " or ".join(SOCKET_GBS), self.cpu)
        if self.gpu_nic_path not in PATHS:
            raise FieldError(where, "gpu_nic_path", " or ".join(PATHS), self.gpu_nic_path)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    # ------------------------------------------------------------ the rates
    @property
    def pcie_gbs(self) -> float:
        return PCIE_GBS[self.gpu.pcie_gen]

    @property
    def socket_gbs(self) -> float:
        return SOCKET_GBS[self.cpu]

    @property
    def nic_line_gbs(self) -> float:
        """The NIC's line rate in GB/s, as NCCL reads it from the port speed (Mbit/s / 8000)."""
        return self.nic_gbps / 8.0

    @property
    def nic_goodput_gbs(self) -> float:
        return NIC_EFFICIENCY * self.nic_line_gbs

    @property
    def cross_socket(self) -> bool:
        return self.gpu_nic_path == "cross-socket"

    def nccl_path_gbs(self) -> float:
        """The GPU-NIC path's bandwidth as NCCL's topology computes it: the slowest link on it, with no charge for
        staging through host memory (``paths.cc``)."""
        rate = min(self.pcie_gbs, self.nic_line_gbs)
        return min(rate, self.socket_gbs) if self.cross_socket else rate

    def path_gbs(self) -> float:
        """What one GPU's data really moves at between its memory and its NIC, one direction: the NIC's goodput,
        PCIe, the host-staging read when GPUDirect RDMA is off, and the socket link when the path crosses it."""
        rate = min(self.nic_goodput_gbs, self.pcie_gbs)
        if not self.gdr:
            rate = min(rate, HOST_READ_FRACTION * self.pcie_gbs)
        if self.cross_socket:
            rate = min(rate, self.socket_gbs)
        return rate

    def node_network_gbs(self) -> float:
        """What a node's NICs move together, one direction: each NIC at its path's rate (GPUs beyond the NICs
        share them)."""
        return min(self.nics_per_node, self.gpus_per_node) * self.path_gbs()

    def peer_path(self) -> str:
        """How one GPU reaches another in its node: ``nvlink``, ``p2p`` (over PCIe) or ``shm`` (host memory)."""
        if self.gpu.nvlink_gbs:
            return "nvlink"
        if self.gpu_nic_path == "same-pcie-switch" or (self.cpu == "amd" and self.gpus_per_node <= 2):
            return "p2p"
        return "shm"

    def intra_gbs(self) -> float:
        """One GPU's rate to its peers in the node, one direction: NVLink, PCIe, or the host-staging read."""
        path = self.peer_path()
        if path == "nvlink":
            return self.gpu.nvlink_gbs
        return self.pcie_gbs if path == "p2p" else HOST_READ_FRACTION * self.pcie_gbs

    def describe(self) -> str:
        gdr = "GPUDirect RDMA" if self.gdr else "host-staged (no GPUDirect RDMA)"
        return (f"{self.nodes} x {self.gpus_per_node} {self.gpu.name}, {self.nics_per_node} x {self.nic_gbps:g}G "
                f"{self.network} per node, {gdr}, GPU-NIC {self.gpu_nic_path}")


def network_of(profile: FabricProfile) -> str:
    """The NICs' kind a fabric profile stands for: RoCE for its RoCE presets, else InfiniBand."""
    return "roce" if profile.preset.startswith("roce") else "infiniband"


def system_on(profile: FabricProfile, nodes: int, gpus_per_node: int, gpu: str, *, nics_per_node: int | None = None,
              cpu: str = "unknown", gdr: bool = True, cross_socket: bool = False) -> System:
    """``nodes`` servers of ``gpus_per_node`` ``gpu``s on ``profile``'s NICs (its line rate and kind), one NIC per
    GPU unless ``nics_per_node`` says otherwise."""
    return System(nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node or gpus_per_node,
                  nic_gbps=profile.link_gbps, gpu=GPUS[gpu], network=network_of(profile), cpu=cpu, gdr=gdr,
                  gpu_nic_path="cross-socket" if cross_socket else "same-pcie-switch")
