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

``nccl-tree`` (allreduce): NCCL's tree. Channel ``c`` runs one of the two
complementary binary trees over the nodes (the double binary tree of
:func:`~emulator.model.collectives.blocks.double_binary_tree`) and, inside
every node, a chain through its GPUs starting at GPU ``c mod G`` (the node's
head, whose NIC the tree's hops between nodes use); a head's parent is its
parent node's head. The tree is ``(c div G) mod 2`` (:func:`node_tree`): NCCL
doubles its graph's channels, the first copy on tree 0 and the second on tree
1, so the two channels of a NIC take different trees and every NIC carries
both, as it does in NCCL. Each channel's share is cut into :data:`TREE_PIECES`
pieces, reduced up the tree and broadcast down, pipelined: a piece leaves a
rank as soon as it has it. ``chunks = TREE_PIECES * C`` runs ``C`` channels.

``nccl-nvls`` (allreduce): NCCL's NVLS tree, as packets can carry it. Channel
``c``'s head in every node is GPU ``c mod G``; every other GPU of the node
sends the head its share of each piece (NVSwitch's reduction, which packets
cannot do inside the switch, done by the head), the heads reduce and broadcast
over the channel's tree between the nodes (:func:`node_tree`: NCCL alternates
its NVLS channels between the two trees, each over all heads), and each head sends the result back to its node's GPUs (NVSwitch's
multicast). Pipelined as ``nccl-tree``; ``chunks = NVLS_PIECES * C``. A GPU's
link carries ``2(G-1)/G`` times the bytes NVLS moves on it: the packets'
interconnect runs that much faster (:mod:`emulator.runs.nccl_packets`).

Broadcast and reduce (NCCL's pipelined chain along the ring) are not built
here yet.
"""

from __future__ import annotations

from collections.abc import Callable

from emulator.model.collectives.algorithms import Plan
from emulator.model.collectives.blocks import (
    Builder,
    double_binary_tree,
    ring_all_gather,
    ring_pieces,
    ring_reduce_scatter,
    tree_shape,
)
from emulator.model.topology import Topology

#: The pieces a tree channel pipelines its share in. NCCL cuts through at finer grain; every piece here is stored
#: and forwarded at each hop (22 on a 4 x 8 tree's path up and down), so fewer pieces cost more: with 4, 4 x 8 at 1
#: MiB came to 1.11 of NCCL's model in the timing model, with 8 to 1.06 (2026-12-07).
TREE_PIECES = 8
#: The pieces an NVLS channel pipelines its share in: its path is shorter (6 hops on 4 x 8) but it runs NCCL's
#: largest sizes, where NCCL's pipeline is fine (128 KiB NVLS chunks: 32 a channel at 64 MiB). In the timing model 4 x
#: 8 at 64 MiB came to 1.16 of NCCL's model with 8 pieces, to 1.09 with 16 (2026-12-07).
NVLS_PIECES = 16


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


def node_tree(nodes: list[list[int]], channel: int) -> tuple[int, list[int]]:
    """Channel ``channel``'s tree between the nodes, ``(root, parent)`` over node indices: tree ``(channel div G)
    mod 2`` of the double binary tree, ``G`` the GPUs of a node (see the module docstring)."""
    if len(nodes) < 2:
        return 0, [-1]
    return double_binary_tree(len(nodes))[(channel // len(nodes[0])) % 2]


def channel_tree(nodes: list[list[int]], channel: int) -> tuple[int, list[int]]:
    """Channel ``channel``'s tree over ranks: ``(root, parent)`` with ``parent[root] = -1`` (see the module
    docstring)."""
    node_root, node_parent = node_tree(nodes, channel)
    chains = [[node[(channel + j) % len(node)] for j in range(len(node))] for node in nodes]
    parent = [-1] * sum(len(node) for node in nodes)
    for n, chain in enumerate(chains):
        if node_parent[n] >= 0:
            parent[chain[0]] = chains[node_parent[n]][0]
        for j in range(1, len(chain)):
            parent[chain[j]] = chain[j - 1]
    return chains[node_root][0], parent


def nvls_tree(nodes: list[list[int]], channel: int) -> tuple[int, list[int]]:
    """Channel ``channel``'s NVLS tree over ranks: every GPU of a node below the node's head (GPU ``channel mod
    G``), the heads on :func:`node_tree`'s tree between the nodes; ``(root, parent)``."""
    node_root, node_parent = node_tree(nodes, channel)
    heads = [node[channel % len(node)] for node in nodes]
    parent = [-1] * sum(len(node) for node in nodes)
    for n, node in enumerate(nodes):
        if node_parent[n] >= 0:
            parent[heads[n]] = heads[node_parent[n]]
        for r in node:
            if r != heads[n]:
                parent[r] = heads[n]
    return heads[node_root], parent


class Scratch:
    """Where each receive of a pipelined tree lands in its rank's ``scratch``: a chunk of its own, so that no
    receive waits for another's addition. Where every chunk is the same size, a rank's receives take its scratch
    chunks in turn, and its scratch holds only what it receives (an NVLS head on 2 x 8: under twice the buffer,
    where a range per sender slot took ten); otherwise the ``i``-th receive of chunk ``k`` at a rank takes chunk ``i *
    chunks + k``, the same size as ``k``."""

    def __init__(self, ranks: int, chunks: int, equal: bool):
        self.chunks = chunks
        self.equal = equal
        self._next = [0] * ranks
        self._of_chunk: list[dict[int, int]] = [{} for _ in range(ranks)]

    def take(self, rank: int, chunk: int) -> int:
        if self.equal:
            self._next[rank] += 1
            return self._next[rank] - 1
        i = self._of_chunk[rank].get(chunk, 0)
        self._of_chunk[rank][chunk] = i + 1
        return i * self.chunks + chunk


def pipelined_tree_allreduce(b: Builder, root: int, parent: list[int], chunks: range, lane: int,
                             scratch: Scratch) -> None:
    """Every chunk of ``chunks`` reduced up the tree and broadcast back down, pipelined: chunk ``k`` leaves rank
    ``v`` upwards in step ``k + height(v)`` and reaches it downwards in step ``k + height(root) + depth(v) - 1``.
    Every receive lands in scratch (:class:`Scratch`) and is then added into (copied to) ``data``, as NCCL
    receives into buffers of the connection's own: a child's send need not wait for its siblings', nor the result
    for the rank's own send of the same range."""
    depth, height = tree_shape(root, parent)
    top = height[root]

    def through_scratch(src: int, dst: int, chunk: int, step: int, reduce: bool) -> None:
        b.xfer_through_scratch(src, dst, chunk, 1, step, reduce, scratch.take(dst, chunk), lane=lane)

    for k, chunk in enumerate(chunks):
        for v, up in enumerate(parent):
            if up >= 0:
                through_scratch(v, up, chunk, k + height[v], True)
        for v, up in enumerate(parent):
            if up >= 0:
                through_scratch(up, v, chunk, k + top + depth[v] - 1, False)


def allreduce_nccl_tree(pl: Plan) -> None:
    _pipelined_channels(pl, channel_tree, TREE_PIECES)


def allreduce_nccl_nvls(pl: Plan) -> None:
    _pipelined_channels(pl, nvls_tree, NVLS_PIECES)


def _pipelined_channels(pl: Plan, tree_of: Callable[[list[list[int]], int], tuple[int, list[int]]],
                        pieces: int) -> None:
    """Channel ``c`` of ``chunks / pieces`` on lane ``c``: its pieces pipelined over ``tree_of(nodes, c)``."""
    nodes = nodes_of(pl.topo, pl.hosts)
    scratch = Scratch(len(pl.hosts), pl.chunks, pl.b.layout.equal)
    for c in range(pl.chunks // pieces):
        root, parent = tree_of(nodes, c)
        pipelined_tree_allreduce(pl.b, root, parent, range(c * pieces, (c + 1) * pieces), c, scratch)
