"""NCCL's ring algorithm as NCCL lays it out: ``C`` channels, each a ring of its own order on a connection of its own.

NCCL cuts a collective's buffer across its channels and runs one ring per
channel, all at once (``src/device/all_reduce.h``: each channel owns a
contiguous part; ``src/graph/connect.cc`` links the rings). On servers of
several GPUs each channel's ring crosses every server once: it enters a server
on one GPU, visits the server's GPUs over NVLink, and leaves for the next
server. The channels rotate the order inside the servers, so that they leave
by different GPUs, and with one NIC per GPU by different NICs: channel ``c``
visits a server's GPUs ``c, c+1, ..., c-1`` (mod ``G``) and crosses to GPU
``c`` of the next server, so the hop between servers arrives by GPU ``c``'s
NIC (rail ``c`` where NICs are rails; with PXN the sender hands its data to
the NIC on that rail). Channels ``c`` and ``c + G`` share a rail, as NCCL's
doubled channels share a NIC.

A rank is one host (an accelerator); the servers are the topology's (one host
per node when it has none). With ``chunks = p * C`` every collective below
runs ``C`` channels, channel ``c`` on lane ``c``:

``allreduce``
    channel ``c`` owns chunks ``c*p .. c*p+p-1`` and runs a ring reduce-scatter
    then all-gather over its ring, ``2(p-1)`` steps;
``reducescatter`` / ``allgather``
    NCCL's layout (rank ``r``'s block is chunks ``r*C .. r*C+C-1``); channel
    ``c`` carries piece ``c`` of every block around its ring, ``p-1`` steps.

Broadcast and reduce (NCCL's pipelined chain along the ring) are not built
here yet.
"""

from __future__ import annotations

from emulator.model.collectives.algorithms import Plan
from emulator.model.collectives.blocks import ring_all_gather, ring_pieces, ring_reduce_scatter
from emulator.model.topology import Topology


def nodes_of(topo: Topology, hosts: list[str]) -> list[list[int]]:
    """The ranks of every node, nodes in server order and ranks in rank order: with servers a server's
    accelerators; without, every rank a node of its own."""
    if not topo.has_servers:
        return [[r] for r in range(len(hosts))]
    by_server: dict[int, list[int]] = {}
    for r, h in enumerate(hosts):
        by_server.setdefault(topo.server_of(h), []).append(r)
    return [by_server[s] for s in sorted(by_server)]


def channel_ring(nodes: list[list[int]], channel: int) -> list[int]:
    """Channel ``channel``'s ring: every node in order, each entered at its GPU ``channel`` (mod its GPUs)."""
    ring: list[int] = []
    for node in nodes:
        g = len(node)
        ring.extend(node[(channel + j) % g] for j in range(g))
    return ring


def channel_rings(pl: Plan) -> list[list[int]]:
    """One ring per channel (``pl.unit`` channels)."""
    nodes = nodes_of(pl.topo, pl.hosts)
    return [channel_ring(nodes, c) for c in range(pl.unit)]


def allreduce_nccl(pl: Plan) -> None:
    for c, ring in enumerate(channel_rings(pl)):
        steps = ring_reduce_scatter(pl.b, ring, c * pl.p, 1, 0, lane=c)
        ring_all_gather(pl.b, ring, c * pl.p, 1, steps, lane=c)


def _pieces(ring: list[int], channel: int, channels: int) -> list[list[int]]:
    """For :func:`~emulator.model.collectives.blocks.ring_pieces` over ``ring``: member ``i`` ends a
    reduce-scatter with (starts an all-gather from) block ``(i+1) % m``, which must be its own rank's piece."""
    m = len(ring)
    return [[ring[(k - 1) % m] * channels + channel] for k in range(m)]


def reduce_scatter_nccl(pl: Plan) -> None:
    for c, ring in enumerate(channel_rings(pl)):
        ring_pieces(pl.b, ring, _pieces(ring, c, pl.unit), 1, 0, reduce=True, lane=c)


def allgather_nccl(pl: Plan) -> None:
    for c, ring in enumerate(channel_rings(pl)):
        ring_pieces(pl.b, ring, _pieces(ring, c, pl.unit), 1, 0, reduce=False, lane=c)
