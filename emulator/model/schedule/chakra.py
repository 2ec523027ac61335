"""Import Chakra execution traces (MLCommons, package ``mlc-chakra``) as recorded.

Files
    One per rank, ``<prefix>.<rank>.et`` for ranks ``0..p-1``: a sequence of
    protobuf messages (``schema/protobuf/et_def.proto``), each preceded by
    its length as a varint -- first a ``GlobalMetadata``, then ``Node``
    messages (``id, name, type, ctrl_deps, data_deps, duration_micros,
    attr[]``). Node ids are per file. Rank ``r`` runs on the host the
    placement gives it (``star:hosts=p`` unless a topology is given).

What each node becomes (attributes as ASTRA-sim's feeder reads them; any
integer kind is accepted for an integer attribute)
    ``COMP_NODE``
        A ``compute`` operation of ``duration_micros`` (real time; a replay
        dilates it). At most an hour. Compute nodes are ready as their
        dependencies allow, and a rank's one compute stream (the agents' and
        the timing model's) runs them one at a time in the order they become
        ready, as ASTRA-sim's GPU runs one kernel at a time.
    ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``
        One message (:meth:`Composer.message`, a ``p2p`` segment). A send's
        peer is ``comm_dst``, a receive's ``comm_src`` (the other end
        attribute, when present, must be the file's own rank, which is also
        ASTRA-sim's default); ``comm_size`` bytes; ``comm_tag`` (default 0).
        ``comm_type`` is ignored on them (the MSCCL converter stores the node
        type there). The k-th send of rank ``a`` to ``b`` with tag ``t`` (in
        ``a``'s dependency order) and the k-th receive of ``b`` from ``a``
        with tag ``t`` (in ``b``'s) are one message; a send or receive left
        over, or a pair of different sizes, is an error naming the nodes.
        Tags become lanes per ordered pair in order of first appearance
        (in the sender's dependency order): from lane 0 in a trace without
        collectives, from lane 1 in one with (lane 0 carries the
        collectives, so no message queues behind one on its connection), at
        most :data:`~emulator.model.schedule.format.MAX_LANES` lanes.
    ``COMM_COLL_NODE``
        The k-th collective node of every rank (in each rank's dependency
        order) together form collective ``k``: ``comm_type``, ``comm_size``
        and ``pg_name`` must agree on every rank. It is expanded with
        generator ``algo`` over all ranks (``pg_name`` and ``involved_dim``
        are not interpreted: a trace of several communicators is not
        replayed faithfully). ``is_cpu_op`` true is refused (ASTRA-sim
        refuses it too). ``comm_size`` is each rank's *input*, as ASTRA-sim
        reads it (``Ring.cc``: allgather's result is ``comm_size·p``,
        reduce_scatter's ``comm_size/p``) and as the PyTorch converter
        records it (the sum of the kernel's input tensors):

        ========================  ==============  =============================  ==========
        comm_type                 collective      generator size                 fallback
        ========================  ==============  =============================  ==========
        ALL_REDUCE                allreduce       comm_size                      ring
        REDUCE_SCATTER(_BLOCK)    reduce_scatter  comm_size (result: 1/p)        ring
        ALL_GATHER                allgather       comm_size·p (input: 1/p)       ring
        ALL_TO_ALL                alltoall        comm_size (p blocks)           direct
        BROADCAST                 broadcast       comm_size, root 0              ring
        REDUCE                    reduce          comm_size, root 0              ring
        BARRIER                   --              a dissemination barrier        --
        GATHER, SCATTER           refused         (no such collective here)      --
        ========================  ==============  =============================  ==========

        ``algo`` is used where the generators have it for that collective
        and rank count (:func:`~emulator.model.schedule.generators.algorithms`),
        else the fallback; ``meta.collectives`` says which ran. Chakra has
        no root attribute: broadcast and reduce are rooted at rank 0. A
        BARRIER is ``ceil(log2 p)`` rounds of one-chunk messages on lane 0,
        round ``s`` from rank ``r`` to ``r + 2^s`` (each after the rank's
        receive of the round before).
    ``METADATA_NODE``, ``INVALID_NODE``
        Zero-time nodes that only pass their dependencies on (ASTRA-sim skips
        them the same way).
    ``MEM_LOAD_NODE``, ``MEM_STORE_NODE``
        Refused: ASTRA-sim's remote memory has no counterpart here, and
        dropping its time silently would misreport the trace.
    Anything else (an unknown node type or collective) is refused.

Dependencies
    ``ctrl_deps`` and ``data_deps`` alike; each rank's nodes replay in its
    dependency order (a topological order, ties broken by file order). A
    duplicate node id, a dependency on an id the file lacks, or a cycle is
    an error naming the node. Sends are *posted*, not awaited: a node that
    depends on a send waits for what the send waited for. ASTRA-sim's sends
    are buffered (a send finishes once delivered, whether or not its
    receive is posted), the replay's are rendezvous (a send completes with
    its receive), so waiting for a send would deadlock traces ASTRA-sim
    runs, such as the MSCCL ring where every rank sends before it receives.

Replay order
    All ranks are composed together: every rank's nodes are added as soon as
    their dependencies are (compute and dependency-only nodes at once, a
    message once both its send and its receive are ready), until every rank
    waits at its next collective node; then that collective is added for
    all ranks, and so on. A trace for which this stops short (a receive
    whose send comes after its own rank's collective, two ranks each
    receiving before sending) is an error naming the rank, the node and
    what it waits for. Everything added waits only for things added before
    it, so an imported schedule never deadlocks.

Chunks
    One chunk size for the whole schedule: the gcd of what the parts need
    (each collective's chunk at its generator's own chunk count, each
    message's size). A collective needs float32 (a trace with one has chunk
    sizes that are multiples of 4; without, the schedule is ``uint8``), so a
    part that does not split into whole chunks is rounded up (at least one
    chunk). If the gcd would need more than
    :data:`~emulator.model.schedule.format.MAX_CHUNKS` chunks in a buffer, every
    part is rounded up to whole chunks of the smallest quantum (a multiple
    of 4 or 1 bytes) for which they fit; when even one chunk per part does
    not fit, the trace is refused. Whatever was rounded up is listed in
    ``meta.padded`` (part name: recorded and replayed bytes, in
    ``comm_size`` terms for collectives) with ``meta.quantum``.

meta
    ``imported_from: chakra``, ``trace`` (the files' prefix), ``version``
    (rank 0's ``GlobalMetadata`` version or schema), ``nodes`` (counts per
    node type over all ranks), ``collectives`` (per collective: its
    collective, ``comm_size``, algorithm, rank 0's node id and name),
    ``messages``, ``lanes`` (per ordered pair with messages, its tags in lane
    order), ``chunk_bytes``, and the padding above.

:func:`load` with ``index`` imports only the index-th collective node
instead (counted in dependency order, the same on every rank), as the
generator's schedule of it (its size rounded up as above when it does not
split into whole chunks, recorded in ``meta.padded``). :func:`write_trace`, :func:`coll_node`,
:func:`comm_node` and :func:`comp_node` write such files (for tests and
samples).
"""

from __future__ import annotations

import heapq
import math
import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from emulator.base.errors import MISSING, FieldError, UserError
from emulator.model import topology as topology_mod
from emulator.model.schedule import generators
from emulator.model.schedule.collectives import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE_SCATTER,
    REDUCE_TO_ROOT,
)
from emulator.model.schedule.compose import Composer, Node
from emulator.model.schedule.format import MAX_CHUNKS, MAX_COMPUTE_S, MAX_LANES, MAX_RANKS, Schedule, is_power_of_two
from emulator.model.topology import Topology

FILE_RE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>[0-9]+)\.et$")
WHERE = "chakra import"

#: What a node is replayed as.
COMP, SEND, RECV, COLL, DEP = "compute", "send", "recv", "collective", "dependency"
#: Not a collective of the schedule format: a dissemination barrier of messages.
BARRIER = "barrier"

_KINDS = {"COMP_NODE": COMP, "COMM_SEND_NODE": SEND, "COMM_RECV_NODE": RECV, "COMM_COLL_NODE": COLL,
          "METADATA_NODE": DEP, "INVALID_NODE": DEP}
_REFUSED_TYPES = {"MEM_LOAD_NODE": "remote memory access has no counterpart in the emulator",
                  "MEM_STORE_NODE": "remote memory access has no counterpart in the emulator"}
_COLLECTIVES = {"ALL_REDUCE": ALLREDUCE, "REDUCE_SCATTER": REDUCE_SCATTER, "REDUCE_SCATTER_BLOCK": REDUCE_SCATTER,
                "ALL_GATHER": ALLGATHER, "ALL_TO_ALL": ALLTOALL, "BROADCAST": BROADCAST, "REDUCE": REDUCE_TO_ROOT,
                "BARRIER": BARRIER}
_FALLBACK = {ALLTOALL: "direct"}


def _pb() -> Any:
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError(f"chakra import: the package mlc-chakra is not installed ({exc})") from None
    return et_def_pb2


# ---------------------------------------------------------------------------
# Varint length-prefixed streams
# ---------------------------------------------------------------------------

def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_stream(data: bytes, where: str) -> list[bytes]:
    """Split ``data`` into its length-prefixed messages; :class:`FieldError` if it is cut short."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        start = pos
        length = shift = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise FieldError(where, f"message {len(out)}", "a varint length prefix",
                                 f"a prefix cut short at byte {start}")
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + length > len(data):
            raise FieldError(where, f"message {len(out)}", f"at most the {len(data) - pos} bytes left in the file",
                             f"a length prefix at byte {start} that claims {length} bytes")
        out.append(data[pos:pos + length])
        pos += length
    return out


# ---------------------------------------------------------------------------
# Writing (tests and samples)
# ---------------------------------------------------------------------------

def write_trace(path: str, nodes: Iterable[object], version: str = "0.0.4") -> None:
    """Write a ``.et`` file: ``GlobalMetadata(version)`` then ``nodes`` (``et_def_pb2.Node`` messages)."""
    pb = _pb()
    chunks = [pb.GlobalMetadata(version=version).SerializeToString()]
    chunks += [node.SerializeToString() for node in nodes]  # type: ignore[attr-defined]
    with open(path, "wb") as fh:
        for raw in chunks:
            fh.write(encode_varint(len(raw)) + raw)


def _node(node_id: int, name: str, type_name: str, deps: Sequence[int], ctrl_deps: Sequence[int]) -> Any:
    pb = _pb()
    return pb.Node(id=node_id, name=name, type=pb.NodeType.Value(type_name), data_deps=list(deps),
                   ctrl_deps=list(ctrl_deps))


def coll_node(node_id: int, name: str, comm_type: int, comm_size: int, pg_name: str = "0",
              deps: Sequence[int] = (), ctrl_deps: Sequence[int] = ()) -> Any:
    """A ``COMM_COLL_NODE`` with ``comm_type``, ``comm_size`` and ``pg_name`` attributes (as ASTRA-sim's
    microbenchmarks have them)."""
    pb = _pb()
    node = _node(node_id, name, "COMM_COLL_NODE", deps, ctrl_deps)
    node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
    node.attr.append(pb.AttributeProto(name="comm_type", int64_val=comm_type))
    node.attr.append(pb.AttributeProto(name="comm_size", int64_val=comm_size))
    node.attr.append(pb.AttributeProto(name="pg_name", string_val=pg_name))
    return node


def comm_node(node_id: int, name: str, send: bool, peer: int, comm_size: int, tag: int = 0,
              deps: Sequence[int] = (), ctrl_deps: Sequence[int] = ()) -> Any:
    """A ``COMM_SEND_NODE`` to ``peer`` (``comm_dst``) or a ``COMM_RECV_NODE`` from it (``comm_src``), as
    ASTRA-sim's MSCCL converter writes them."""
    pb = _pb()
    node = _node(node_id, name, "COMM_SEND_NODE" if send else "COMM_RECV_NODE", deps, ctrl_deps)
    node.attr.append(pb.AttributeProto(name="comm_size", int64_val=comm_size))
    node.attr.append(pb.AttributeProto(name="comm_dst" if send else "comm_src", int32_val=peer))
    node.attr.append(pb.AttributeProto(name="comm_tag", int32_val=tag))
    return node


def comp_node(node_id: int, name: str, micros: int, deps: Sequence[int] = (), ctrl_deps: Sequence[int] = ()) -> Any:
    """A ``COMP_NODE`` of ``micros`` microseconds."""
    node = _node(node_id, name, "COMP_NODE", deps, ctrl_deps)
    node.duration_micros = micros
    return node


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceNode:
    """One node of one rank's trace, as it is replayed (see the module docstring)."""

    node_id: int
    name: str
    type_name: str
    kind: str
    ctrl_deps: tuple[int, ...] = ()
    data_deps: tuple[int, ...] = ()
    seconds: float = 0.0
    peer: int = -1
    tag: int = 0
    size: int = 0
    collective: str = ""
    pg_name: str = ""

    @property
    def deps(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.ctrl_deps + self.data_deps))

    @property
    def label(self) -> str:
        return f"node {self.node_id} ({self.name or 'unnamed'})"


@dataclass(frozen=True)
class RankTrace:
    """One rank's file: its nodes in dependency order."""

    rank: int
    path: str
    version: str
    nodes: tuple[TraceNode, ...]

    @property
    def where(self) -> str:
        return f"Chakra trace {self.path!r}"


def read_trace(path: str, rank: int, p: int) -> RankTrace:
    """Rank ``rank``'s file of a ``p``-rank trace, parsed and in dependency order; :class:`FieldError` if bad."""
    pb = _pb()
    where = f"Chakra trace {path!r}"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise FieldError(where, "file", "a readable trace file", exc.strerror) from None
    messages = decode_stream(data, where)
    if not messages:
        raise FieldError(where, "message 0", "a GlobalMetadata message, then nodes", "an empty file")
    try:
        meta = pb.GlobalMetadata.FromString(messages[0])
    except Exception:
        raise FieldError(where, "message 0", "a Chakra GlobalMetadata", "bytes that do not parse as one") from None
    schema = next((a.string_val for a in meta.attr if a.name == "schema"), "")
    nodes = []
    for k, raw in enumerate(messages[1:], start=1):
        try:
            node = pb.Node.FromString(raw)
        except Exception:
            raise FieldError(where, f"message {k}", "a Chakra Node", "bytes that do not parse as one") from None
        nodes.append(_parse_node(pb, node, where, rank, p))
    return RankTrace(rank, path, meta.version or schema, _dependency_order(nodes, where))


def _attr_value(attr: Any) -> object:
    which = attr.WhichOneof("value")
    return getattr(attr, which) if which else None


def _int_attr(attrs: Mapping[str, object], key: str, where: str, label: str, lo: int | None = 0,
              hi: int | None = None, default: int | None = None) -> int:
    """Attribute ``key`` as an integer in ``lo..hi`` (None: unbounded); ``default`` when absent (None: required)."""
    if key not in attrs and default is not None:
        return default
    value = attrs.get(key, MISSING)
    bounded = "" if lo is None else f" >= {lo}" if hi is None else f" in {lo}..{hi}"
    if (not isinstance(value, int) or isinstance(value, bool) or (lo is not None and value < lo)
            or (hi is not None and value > hi)):
        raise FieldError(where, f"{label}.attr.{key}", f"an integer{bounded}", value)
    return value


def _parse_node(pb: Any, node: Any, where: str, rank: int, p: int) -> TraceNode:
    """One ``Node`` message as a :class:`TraceNode`; :class:`FieldError` naming the node and field if bad."""
    label = f"node {node.id} ({node.name or 'unnamed'})"
    type_name = pb.NodeType.Name(node.type) if node.type in pb.NodeType.values() else None
    if type_name in _REFUSED_TYPES:
        raise FieldError(where, f"{label}.type", f"a node type other than {type_name} "
                         f"({_REFUSED_TYPES[type_name]})", type_name)
    if type_name not in _KINDS:
        raise FieldError(where, f"{label}.type", f"one of {', '.join(_KINDS)}", node.type)
    base = TraceNode(node.id, node.name, type_name, _KINDS[type_name], tuple(node.ctrl_deps), tuple(node.data_deps))
    attrs = {a.name: _attr_value(a) for a in node.attr}
    if base.kind == COMP:
        if node.duration_micros > MAX_COMPUTE_S * 1e6:
            raise FieldError(where, f"{label}.duration_micros", f"at most {MAX_COMPUTE_S * 1e6:.0f} "
                             f"({MAX_COMPUTE_S:g} s)", node.duration_micros)
        return replace(base, seconds=node.duration_micros / 1e6)
    if base.kind in (SEND, RECV):
        return _parse_message_end(base, attrs, where, rank, p)
    if base.kind == COLL:
        return _parse_collective(pb, base, attrs, where)
    return base


def _parse_message_end(base: TraceNode, attrs: Mapping[str, object], where: str, rank: int, p: int) -> TraceNode:
    peer_key, own_key = ("comm_dst", "comm_src") if base.kind == SEND else ("comm_src", "comm_dst")
    peer = _int_attr(attrs, peer_key, where, base.label, 0, p - 1)
    if peer == rank:
        raise FieldError(where, f"{base.label}.attr.{peer_key}", f"a rank other than the file's own ({rank})", peer)
    own = _int_attr(attrs, own_key, where, base.label, 0, p - 1, default=rank)
    if own != rank:
        raise FieldError(where, f"{base.label}.attr.{own_key}", f"{rank} (the file's rank) or nothing", own)
    size = _int_attr(attrs, "comm_size", where, base.label)
    tag = _int_attr(attrs, "comm_tag", where, base.label, None, default=0)
    return replace(base, peer=peer, size=size, tag=tag)


def _parse_collective(pb: Any, base: TraceNode, attrs: Mapping[str, object], where: str) -> TraceNode:
    if attrs.get("is_cpu_op") is True:
        raise FieldError(where, f"{base.label}.attr.is_cpu_op", "false (a collective runs on the GPU; ASTRA-sim "
                         "refuses collectives on the CPU too)", True)
    comm_type = _int_attr(attrs, "comm_type", where, base.label)
    name = pb.CollectiveCommType.Name(comm_type) if comm_type in pb.CollectiveCommType.values() else None
    if name not in _COLLECTIVES:
        known = ", ".join(f"{n} ({pb.CollectiveCommType.Value(n)})" for n in _COLLECTIVES)
        raise FieldError(where, f"{base.label}.attr.comm_type", f"one of {known} (GATHER and SCATTER have no "
                         "collective in the schedule format)", name or comm_type)
    size = _int_attr(attrs, "comm_size", where, base.label)
    pg_name = attrs.get("pg_name", "")
    return replace(base, collective=_COLLECTIVES[name], size=size, pg_name=pg_name if isinstance(pg_name, str)
                   else repr(pg_name))


def _dependency_order(nodes: Sequence[TraceNode], where: str) -> tuple[TraceNode, ...]:
    """``nodes`` in a topological order of their dependencies, ties broken by file order."""
    pos: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.node_id in pos:
            raise FieldError(where, f"node {node.node_id}", "a node id no other node of the file has",
                             f"the ids of messages {pos[node.node_id] + 1} and {i + 1}")
        pos[node.node_id] = i
    children: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for key, deps in (("ctrl_deps", node.ctrl_deps), ("data_deps", node.data_deps)):
            unknown = next((d for d in deps if d not in pos), None)
            if unknown is not None:
                raise FieldError(where, f"{node.label}.{key}", "ids of nodes of this file", unknown)
        for dep in node.deps:
            children[pos[dep]].append(i)
            waiting[i] += 1
    heap = [i for i, n in enumerate(waiting) if not n]
    order = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for child in children[i]:
            waiting[child] -= 1
            if not waiting[child]:
                heapq.heappush(heap, child)
    if len(order) < len(nodes):
        raise _cycle_error(nodes, pos, waiting, where)
    return tuple(nodes[i] for i in order)


def _cycle_error(nodes: Sequence[TraceNode], pos: Mapping[int, int], waiting: Sequence[int],
                 where: str) -> FieldError:
    """The error naming one dependency cycle among the nodes that never became ready."""
    cur = next(i for i, n in enumerate(waiting) if n)
    path: list[int] = []
    while cur not in path:
        path.append(cur)
        cur = next(pos[d] for d in nodes[cur].deps if waiting[pos[d]])
    cycle = path[path.index(cur):] + [cur]
    first = nodes[cycle[0]]
    return FieldError(where, f"{first.label}.deps", "dependencies without a cycle", " -> ".join(
        f"node {nodes[i].node_id}" for i in reversed(cycle)) + " (each waits for the one before)")


def rank_files(paths: Sequence[str]) -> list[str]:
    """``paths`` ordered by rank; they must be ``<prefix>.<rank>.et`` for ranks ``0..p-1``, one prefix."""
    by_rank: dict[int, str] = {}
    prefixes = set()
    for path in paths:
        match = FILE_RE.match(os.path.basename(path))
        if not match:
            raise FieldError(WHERE, "FILE", "trace files named <prefix>.<rank>.et", path)
        prefixes.add(os.path.join(os.path.dirname(path), match.group("prefix")))
        rank = int(match.group("rank"))
        if rank in by_rank:
            raise FieldError(WHERE, "FILE", "one file per rank", f"rank {rank} twice")
        by_rank[rank] = path
    if len(prefixes) > 1:
        raise FieldError(WHERE, "FILE", "files of one trace (one prefix)", sorted(prefixes))
    if sorted(by_rank) != list(range(len(by_rank))):
        raise FieldError(WHERE, "FILE", f"ranks 0..{len(by_rank) - 1}, one file each", sorted(by_rank))
    if not 2 <= len(by_rank) <= MAX_RANKS:
        raise FieldError(WHERE, "FILE", f"trace files of 2 to {MAX_RANKS} ranks", len(by_rank))
    return [by_rank[r] for r in range(len(by_rank))]


# ---------------------------------------------------------------------------
# Matching: collectives across ranks, sends with receives
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceCollective:
    """Collective ``index``: the ``index``-th collective node of every rank (``members[r]``: its position)."""

    index: int
    collective: str
    comm_size: int
    members: tuple[int, ...]
    node_id: int
    node_name: str

    @property
    def name(self) -> str:
        return f"collective {self.index} ({self.collective}, node {self.node_id} {self.node_name or 'unnamed'})"


@dataclass(frozen=True)
class TraceMessage:
    """A send and its receive: ``(rank, position)`` of each end."""

    send: tuple[int, int]
    recv: tuple[int, int]
    lane: int
    size: int
    name: str


def match_collectives(traces: Sequence[RankTrace]) -> list[TraceCollective]:
    """Collective ``k`` of every rank grouped; :class:`FieldError` unless ranks agree on each."""
    per_rank = [[i for i, n in enumerate(t.nodes) if n.kind == COLL] for t in traces]
    counts = [len(c) for c in per_rank]
    if len(set(counts)) > 1:
        r = next(r for r, n in enumerate(counts) if n != counts[0])
        raise FieldError(traces[r].where, "COMM_COLL_NODE nodes", f"{counts[0]}, as many as rank 0 has", counts[r])
    out = []
    for k in range(counts[0]):
        first = traces[0].nodes[per_rank[0][k]]
        for r in range(1, len(traces)):
            node = traces[r].nodes[per_rank[r][k]]
            for key, mine, theirs in (("comm_type", node.collective, first.collective),
                                      ("comm_size", node.size, first.size), ("pg_name", node.pg_name, first.pg_name)):
                if mine != theirs:
                    raise FieldError(traces[r].where, f"{node.label}.attr.{key}", f"{theirs!r}, as rank 0's "
                                     f"collective {k} ({first.label}) has", mine)
        out.append(TraceCollective(k, first.collective, first.size, tuple(c[k] for c in per_rank), first.node_id,
                                   first.name))
    return out


def match_messages(traces: Sequence[RankTrace], lane_base: int) -> tuple[list[TraceMessage], dict[str, list[int]]]:
    """Every send with its receive, and per ordered pair (``"a->b"``) its tags in lane order (from ``lane_base``)."""
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    tags: dict[tuple[int, int], list[int]] = {}
    for t in traces:
        for i, node in enumerate(t.nodes):
            if node.kind == SEND:
                sends.setdefault((t.rank, node.peer, node.tag), []).append(i)
                pair = tags.setdefault((t.rank, node.peer), [])
                if node.tag not in pair:
                    pair.append(node.tag)
            elif node.kind == RECV:
                recvs.setdefault((node.peer, t.rank, node.tag), []).append(i)
    for (a, b), pair in tags.items():
        if len(pair) > MAX_LANES - lane_base:
            raise FieldError(traces[a].where, f"comm_tag of the sends to rank {b}", f"at most {MAX_LANES - lane_base} "
                             f"tags per pair of ranks (one lane each, {MAX_LANES} lanes)", len(pair))
    out = []
    for key in sorted(set(sends) | set(recvs)):
        a, b, tag = key
        mine, theirs = sends.get(key, []), recvs.get(key, [])
        _check_pairs(traces, key, mine, theirs)
        for s, r in zip(mine, theirs, strict=True):
            send, recv = traces[a].nodes[s], traces[b].nodes[r]
            if send.size != recv.size:
                raise FieldError(traces[a].where, f"{send.label}.attr.comm_size", f"{recv.size} bytes, as its receive "
                                 f"(rank {b} {recv.label}) has", send.size)
            out.append(TraceMessage((a, s), (b, r), lane_base + tags[(a, b)].index(tag), send.size,
                                    f"message rank {a} node {send.node_id} -> rank {b} node {recv.node_id}"))
    return out, {f"{a}->{b}": pair for (a, b), pair in sorted(tags.items())}


def _check_pairs(traces: Sequence[RankTrace], key: tuple[int, int, int], sends: list[int], recvs: list[int]) -> None:
    a, b, tag = key
    if len(sends) > len(recvs):
        node = traces[a].nodes[sends[len(recvs)]]
        raise FieldError(traces[a].where, node.label, f"a COMM_RECV_NODE on rank {b} from rank {a} with tag {tag} "
                         "for every such send", f"send {len(recvs) + 1} of {len(sends)}, {len(recvs)} receives")
    if len(recvs) > len(sends):
        node = traces[b].nodes[recvs[len(sends)]]
        raise FieldError(traces[b].where, node.label, f"a COMM_SEND_NODE on rank {a} to rank {b} with tag {tag} "
                         "for every such receive", f"receive {len(sends) + 1} of {len(recvs)}, {len(sends)} sends")


# ---------------------------------------------------------------------------
# Chunks
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Need:
    """What one part needs of the chunk size: ``raw`` bytes of ``data`` in ``blocks`` equal chunks (its
    generator's own count; 1 for a message), and ``out_blocks``/``scratch_blocks`` of the same size."""

    name: str
    raw: int
    blocks: int = 1
    out_blocks: int = 0
    scratch_blocks: int = 0
    #: recorded bytes = raw / scale (allgather's generator size is p·comm_size)
    scale: int = 1

    def units(self, q: int) -> int:
        """Chunks of ``q`` bytes per block, rounded up (at least one)."""
        return max(1, -(-self.raw // (self.blocks * q)))


@dataclass(frozen=True)
class Chunking:
    chunk_bytes: int
    quantum: int
    #: bytes of every part's ``data`` as replayed
    replayed: Mapping[str, int]

    def padded(self, needs: Iterable[Need]) -> dict[str, list[int]]:
        """Per part rounded up: ``[recorded, replayed]`` bytes (comm_size terms)."""
        return {n.name: [n.raw // n.scale, self.replayed[n.name] // n.scale] for n in needs
                if self.replayed[n.name] != n.raw}


def _chunk_counts(needs: Sequence[Need], q: int, c: int, extra: int) -> int:
    """The largest buffer's chunks of size ``c`` when every part is rounded up to whole ``q``-byte chunks."""
    data = extra + sum(n.blocks * n.units(q) * q // c for n in needs)
    out = sum(n.out_blocks * n.units(q) * q // c for n in needs)
    scratch = sum(n.scratch_blocks * n.units(q) * q // c for n in needs)
    return max(data, out, scratch)


def choose_chunks(needs: Sequence[Need], elem: int, extra: int = 0) -> Chunking:
    """The chunk size for ``needs`` (and ``extra`` one-chunk messages) of ``elem``-byte elements; see the module
    docstring. :class:`FieldError` if even one chunk per part exceeds ``MAX_CHUNKS``."""
    q = elem
    c = math.gcd(*(n.units(q) * q for n in needs)) or elem
    if _chunk_counts(needs, q, c, extra) > MAX_CHUNKS:
        lo, hi = 1, max((n.units(elem) for n in needs), default=1)
        if _chunk_counts(needs, hi * elem, hi * elem, extra) > MAX_CHUNKS:
            raise FieldError(WHERE, "trace", f"at most {MAX_CHUNKS} chunks in a buffer (one per message and per "
                             "block of a collective at the least)", _chunk_counts(needs, hi * elem, hi * elem, extra))
        while lo < hi:
            mid = (lo + hi) // 2
            if _chunk_counts(needs, mid * elem, mid * elem, extra) <= MAX_CHUNKS:
                hi = mid
            else:
                lo = mid + 1
        q = lo * elem
        c = math.gcd(*(n.units(q) * q for n in needs)) or q
    return Chunking(c, q, {n.name: n.blocks * n.units(q) * q for n in needs})


# ---------------------------------------------------------------------------
# Collectives: algorithms and parts
# ---------------------------------------------------------------------------

def _algorithms() -> list[str]:
    return list(dict.fromkeys(a for c in generators.GENERATED for a in generators.algorithms(c)))


def algorithm_for(collective: str, algo: str, p: int) -> str:
    """``algo`` where the generators have it for ``collective`` over ``p`` ranks, else the fallback."""
    if algo in generators.algorithms(collective):
        if not generators.recipe(collective, algo).power_of_two or is_power_of_two(p):
            return algo
    return _FALLBACK.get(collective, "ring")


@dataclass
class _Generator:
    """Generates every collective part over one topology and placement (and caches their chunk counts)."""

    topo: Topology
    placement: str
    seed: int
    shapes: dict[tuple[str, str], Schedule] = field(default_factory=dict)

    def chunks(self, collective: str, algo: str) -> int:
        how = generators.recipe(collective, algo)
        return how.default or how.base(len(self.topo.hosts))

    def shape(self, collective: str, algo: str) -> Schedule:
        """The part at its smallest size: its chunk counts."""
        key = (collective, algo)
        if key not in self.shapes:
            self.shapes[key] = self.generate(collective, algo, 4 * self.chunks(collective, algo))
        return self.shapes[key]

    def generate(self, collective: str, algo: str, size: int) -> Schedule:
        return generators.generate(algo, self.topo, size, placement=self.placement, seed=self.seed,
                                   chunks=self.chunks(collective, algo), collective=collective, root=0)

    def need(self, coll: TraceCollective, algo: str) -> Need:
        shape = self.shape(coll.collective, algo)
        scale = len(self.topo.hosts) if coll.collective == ALLGATHER else 1
        return Need(coll.name, coll.comm_size * scale, shape.chunks, shape.output_chunks, shape.scratch_chunks, scale)


# ---------------------------------------------------------------------------
# Replay: composing every rank's nodes in an order all ranks can follow
# ---------------------------------------------------------------------------

class _Replay:
    """Adds a trace's nodes to ``composer`` (module docstring, "Replay order").

    ``frontier[r][i]``, set once node ``i`` of rank ``r`` is *released*:
    what a node depending on it waits for (its own composed node, or for a
    send or a dependency-only node what it waited for).
    """

    def __init__(self, traces: Sequence[RankTrace], collectives: Sequence[TraceCollective],
                 messages: Sequence[TraceMessage], parts: Mapping[int, Schedule], nchunks: Mapping[str, int],
                 composer: Composer):
        self.traces, self.collectives, self.parts, self.nchunks, self.c = traces, collectives, parts, nchunks, composer
        self.message_of = {end: m for m in messages for end in (m.send, m.recv)}
        self.pos = [{n.node_id: i for i, n in enumerate(t.nodes)} for t in traces]
        self.deps = [[tuple(pos[d] for d in n.deps) for n in t.nodes] for t, pos in zip(traces, self.pos, strict=True)]
        self.children: list[list[list[int]]] = [[[] for _ in t.nodes] for t in traces]
        for r, deps in enumerate(self.deps):
            for i, ds in enumerate(deps):
                for d in ds:
                    self.children[r][d].append(i)
        self.waiting = [[len(ds) for ds in deps] for deps in self.deps]
        self.frontier: list[dict[int, tuple[Node, ...]]] = [{} for _ in traces]
        self.ready: set[tuple[int, int]] = set()  # receives and collectives whose dependencies are released
        self.queue = deque((r, i) for r, w in enumerate(self.waiting) for i, n in enumerate(w) if not n)
        self.next = 0  # the next collective

    def run(self) -> None:
        while True:
            while self.queue:
                self._visit(*self.queue.popleft())
            if self.next == len(self.collectives):
                if any(len(f) < len(t.nodes) for f, t in zip(self.frontier, self.traces, strict=True)):
                    raise self._stuck()
                return
            coll = self.collectives[self.next]
            if not all((r, i) in self.ready for r, i in enumerate(coll.members)):
                raise self._stuck()
            self._collective(coll)
            self.next += 1

    def _after(self, r: int, i: int) -> tuple[Node, ...]:
        return tuple(dict.fromkeys(node for d in self.deps[r][i] for node in self.frontier[r][d]))

    def _release(self, r: int, i: int, frontier: tuple[Node, ...]) -> None:
        self.frontier[r][i] = frontier
        self.ready.discard((r, i))
        for child in self.children[r][i]:
            self.waiting[r][child] -= 1
            if not self.waiting[r][child]:
                self.queue.append((r, child))

    def _visit(self, r: int, i: int) -> None:
        node = self.traces[r].nodes[i]
        if node.kind == COMP:
            self._release(r, i, (self.c.compute(r, node.seconds, self._after(r, i)),))
        elif node.kind == DEP:
            self._release(r, i, self._after(r, i))
        elif node.kind == SEND:
            self._release(r, i, self._after(r, i))  # posted: what depends on it need not wait for the receive
            self._match(self.message_of[(r, i)])
        else:
            self.ready.add((r, i))
            if node.kind == RECV:
                self._match(self.message_of[(r, i)])

    def _match(self, m: TraceMessage) -> None:
        (a, s), (b, i) = m.send, m.recv
        if s in self.frontier[a] and (b, i) in self.ready:
            _, recv = self.c.message(a, b, self.nchunks[m.name], m.lane, m.name, after_src=self.frontier[a][s],
                                     after_dst=self._after(b, i))
            self._release(b, i, (recv,))

    def _collective(self, coll: TraceCollective) -> None:
        after = {r: self._after(r, i) for r, i in enumerate(coll.members)}
        if coll.collective == BARRIER:
            ends = self._barrier(coll, after)
        else:
            ends = {r: (node,) for r, node in enumerate(self.c.collective(self.parts[coll.index], coll.name, after))}
        for r, i in enumerate(coll.members):
            self._release(r, i, ends[r])

    def _barrier(self, coll: TraceCollective, after: dict[int, tuple[Node, ...]]) -> dict[int, tuple[Node, ...]]:
        """A dissemination barrier: round ``s`` sends one chunk from rank ``r`` to ``r + 2^s``."""
        p = len(self.traces)
        for s in range((p - 1).bit_length()):
            now = dict(after)
            for r in range(p):
                dst = (r + (1 << s)) % p
                _, recv = self.c.message(r, dst, 1, 0, f"{coll.name} round {s} rank {r}", after_src=after[r],
                                         after_dst=after[dst])
                now[dst] = (recv,)
            after = now
        return after

    # ----------------------------------------------------------- diagnosis
    def _stuck(self) -> FieldError:
        """The error for a trace that cannot go on: where it stopped and the chain of what waits for what."""
        start = None
        if self.next < len(self.collectives):
            members = enumerate(self.collectives[self.next].members)
            start = next(((r, i) for r, i in members if (r, i) not in self.ready), None)
        if start is None:
            start = next((r, i) for r, t in enumerate(self.traces) for i in range(len(t.nodes))
                         if i not in self.frontier[r])
        r, i = start
        node = self.traces[r].nodes[i]
        return FieldError(self.traces[r].where, node.label, "a trace every rank can replay (each receive reached by "
                          "its send, each collective node by every rank)", self._chain(start))

    def _blocker(self, r: int, i: int) -> int:
        """Following unreleased dependencies from node ``i`` of rank ``r`` to one that is ready but waits."""
        while True:
            dep = next((d for d in self.deps[r][i] if d not in self.frontier[r]), None)
            if dep is None:
                return i
            i = dep

    def _chain(self, start: tuple[int, int]) -> str:
        """What ``start`` waits for, and what that waits for, up to a collective node or round a cycle."""
        parts = [self._describe(*start)]
        seen: set[tuple[int, int]] = set()
        r, i = start
        while len(parts) < 16:
            b = self._blocker(r, i)
            if (r, b) in seen:
                parts.append(f"{self._describe(r, b)} again (a cycle)")
                return " waits for ".join(parts)
            seen.add((r, b))
            if b != i:
                parts.append(self._describe(r, b))
            if self.traces[r].nodes[b].kind != RECV:
                parts[-1] += ", which waits for every rank to reach it" if (r, b) in self.ready else ""
                return " waits for ".join(parts)
            r, i = self.message_of[(r, b)].send
            parts.append(f"its send {self._describe(r, i)}")
        return " waits for ".join(parts) + " ..."

    def _describe(self, r: int, i: int) -> str:
        node = self.traces[r].nodes[i]
        what = {SEND: f"send to rank {node.peer}, tag {node.tag}", RECV: f"receive from rank {node.peer}, tag "
                f"{node.tag}", COLL: "collective " + str(next((c.index for c in self.collectives
                                                                 if c.members[r] == i), "?"))}
        return f"rank {r} node {node.node_id} ({what.get(node.kind, node.type_name)})"


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

def _topology(topology: Topology | str | None, p: int) -> Topology:
    topo = topology_mod.load(topology) if isinstance(topology, str) else topology
    if topo is None:
        topo = topology_mod.build(f"star:hosts={p}")
    if len(topo.hosts) != p:
        raise FieldError(WHERE, "topology", f"a topology with {p} hosts (one per trace file)", topo.spec)
    return topo


def load(paths: Sequence[str], algo: str = "ring", index: int | None = None, topology: Topology | str | None = None,
         placement: str | None = None, seed: int = 0) -> Schedule:
    """The trace of ``paths`` (one ``<prefix>.<rank>.et`` per rank) as one schedule, as recorded.

    Collective nodes are expanded with generator ``algo`` (or their
    collective's fallback), over ``topology`` (default ``star:hosts=p``) with
    ``placement`` (default ``hdrm`` for ``hdrm``, else ``identity``) and
    ``seed``. With ``index``, only the index-th collective node, as its
    generator's schedule. See the module docstring for the rules; every bad
    input raises one :class:`FieldError`.
    """
    if algo not in _algorithms():
        raise FieldError(WHERE, "algo", f"one of {', '.join(_algorithms())}", algo)
    files = rank_files(paths)
    p = len(files)
    traces = [read_trace(path, r, p) for r, path in enumerate(files)]
    collectives = match_collectives(traces)
    topo = _topology(topology, p)
    gen = _Generator(topo, placement or ("hdrm" if algo == "hdrm" else "identity"), seed)
    generators.placement_hosts(topo, gen.placement, seed)  # a bad placement is named before anything else
    prefix = FILE_RE.match(os.path.basename(files[0]))
    meta: dict[str, Any] = {"imported_from": "chakra", "trace": prefix.group("prefix") if prefix else files[0],
                            "version": traces[0].version}
    if index is not None:
        return _load_one(collectives, index, algo, gen, meta)
    return _load_all(traces, collectives, algo, gen, meta)


def _load_one(collectives: Sequence[TraceCollective], index: int, algo: str, gen: _Generator,
              meta: dict[str, Any]) -> Schedule:
    n = len(collectives)
    if not 0 <= index < n:
        raise FieldError(WHERE, "index", f"a collective index in 0..{n - 1}" if n else
                         "a trace with a COMM_COLL_NODE", index)
    coll = collectives[index]
    if coll.collective == BARRIER:
        raise FieldError(WHERE, "index", "a collective other than a BARRIER (it has no generator)", index)
    p = len(gen.topo.hosts)
    chosen = algorithm_for(coll.collective, algo, p)
    need = gen.need(coll, chosen)
    chunking = choose_chunks([need], 4)
    sched = gen.generate(coll.collective, chosen, chunking.replayed[need.name])
    meta.update(sched.meta, node_id=coll.node_id, node_name=coll.node_name, collective_index=index,
                comm_size=coll.comm_size)
    if chunking.padded([need]):
        meta["padded"] = chunking.padded([need])
    return replace(sched, meta=meta)


def _load_all(traces: Sequence[RankTrace], collectives: Sequence[TraceCollective], algo: str, gen: _Generator,
              meta: dict[str, Any]) -> Schedule:
    p = len(traces)
    messages, lanes = match_messages(traces, 1 if collectives else 0)
    if not messages and not collectives:
        raise FieldError(WHERE, "trace", "communication (COMM_SEND_NODE, COMM_RECV_NODE or COMM_COLL_NODE nodes)",
                         "none in any rank's file")
    algos = {c.index: algorithm_for(c.collective, algo, p) for c in collectives if c.collective != BARRIER}
    needs = [gen.need(c, algos[c.index]) for c in collectives if c.index in algos]
    needs += [Need(m.name, m.size) for m in messages]
    barriers = sum(c.collective == BARRIER for c in collectives)
    elem = 4 if algos else 1
    chunking = choose_chunks(needs, elem, barriers * p * (p - 1).bit_length())
    parts = {c.index: gen.generate(c.collective, algos[c.index], chunking.replayed[c.name]) for c in collectives
             if c.index in algos}
    hosts = generators.placement_hosts(gen.topo, gen.placement, gen.seed)
    composer = Composer(hosts, chunking.chunk_bytes, dtype="float32" if elem == 4 else "uint8")
    nchunks = {m.name: chunking.replayed[m.name] // chunking.chunk_bytes for m in messages}
    _Replay(traces, collectives, messages, parts, nchunks, composer).run()
    meta.update(nodes=dict(sorted(Counter(n.type_name for t in traces for n in t.nodes).items())),
                collectives=[{"collective": c.collective, "comm_size": c.comm_size,
                              "algorithm": algos.get(c.index, "dissemination"), "node": c.node_id,
                              "name": c.node_name} for c in collectives],
                messages=len(messages), lanes=lanes, chunk_bytes=chunking.chunk_bytes)
    padded = chunking.padded(needs)
    if padded:
        meta.update(quantum=chunking.quantum, padded=padded)
    return composer.build("chakra", meta, topology=gen.topo.spec, placement=gen.placement)
