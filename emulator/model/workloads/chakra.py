"""Import Chakra execution traces (MLCommons, package ``mlc-chakra``) as recorded.

Files
    One per rank, ``<prefix>.<rank>.et`` for ranks ``0..p-1`` (or one file
    replicated, see "One-rank traces"): a sequence of protobuf messages
    (``schema/protobuf/et_def.proto``), each preceded by its length as a
    varint -- first a ``GlobalMetadata``, then ``Node`` messages (``id,
    name, type, ctrl_deps, data_deps, duration_micros, inputs, attr[]``).
    Node ids are per file. Rank ``r`` runs on the host the placement gives
    it (``star:hosts=p`` unless a topology is given).

What each node becomes (attributes as ASTRA-sim's feeder reads them; any
integer kind is accepted for an integer attribute)
    ``COMP_NODE``
        A ``compute`` operation of ``duration_micros`` (real time; a replay
        dilates it). At most an hour. Compute nodes are ready as their
        dependencies allow, and a rank's one compute stream (the agents' and
        the timing model's) runs them one at a time in the order they become
        ready, as ASTRA-sim's GPU runs one kernel at a time. With
        ``is_cpu_op`` true, see "CPU-side nodes".
    ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``
        One message (:meth:`Composer.message`, a ``p2p`` segment). A send's
        peer is ``comm_dst``, a receive's ``comm_src`` (the other end
        attribute, when present, must be the file's own rank, which is also
        ASTRA-sim's default); ``comm_size`` bytes; ``comm_tag`` (default 0).
        ``comm_type`` and ``pg_name`` are ignored on them (the MSCCL
        converter stores the node type in ``comm_type``; peers are global
        ranks, as ASTRA-sim reads them). The k-th send of rank ``a`` to
        ``b`` with tag ``t`` (in ``a``'s dependency order) and the k-th
        receive of ``b`` from ``a`` with tag ``t`` (in ``b``'s) are one
        message; a send or receive left over, or a pair of different sizes,
        is an error naming the nodes. Tags become lanes per ordered pair in
        order of first appearance (in the sender's dependency order): from
        lane 0 in a trace without collectives, from lane 1 in one with (lane
        0 carries the collectives, so no message queues behind one on its
        connection), at most :data:`~emulator.model.schedule.format.MAX_LANES`
        lanes.
    ``COMM_COLL_NODE``
        A collective of the process group ``pg_name`` names (none: every
        rank); :mod:`~emulator.model.workloads.chakra_groups` reads the groups
        from the trace's ``## process_group:init ##`` metadata and matches the
        nodes: the k-th node of a group on each of its ranks (in each rank's
        dependency order) are one collective, and must agree on
        ``comm_type`` and ``comm_size``. Alike collectives of disjoint groups
        (tensor-parallel pairs, data-parallel groups) share one segment, its
        ``groups`` the process groups (:meth:`Composer.group_collective`).
        A collective over every rank in rank order is expanded with
        generator ``algo`` over the topology and placement; one over a group
        with its ``len(group)`` ranks, as over ``star:hosts=len(group)``
        (``hdrm``, a placement of every rank, becomes ``hd``), its rank ``i``
        being the group's ``i``-th. A node on a one-rank group only passes
        its dependencies on. ``involved_dim`` is not interpreted. With
        ``is_cpu_op`` true, see "CPU-side nodes". ``comm_size`` is each
        rank's *input*, as ASTRA-sim reads it (``Ring.cc``: allgather's
        result is ``comm_size·p``, reduce_scatter's ``comm_size/p``, ``p``
        the group's ranks) and as the PyTorch converter records it (the sum
        of the kernel's input tensors):

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
        and rank count (:func:`~emulator.model.collectives.registry.algorithms`),
        else the fallback; ``meta.collectives`` says which ran. Chakra has
        no root attribute: broadcast and reduce are rooted at the group's
        first rank (rank 0 for every rank). A BARRIER is ``ceil(log2 p)``
        rounds of one-chunk messages on lane 0 within each group, round
        ``s`` from its ``j``-th rank to its ``j + 2^s``-th (each after the
        rank's receive of the round before).
    ``METADATA_NODE``, ``INVALID_NODE``
        Zero-time nodes that only pass their dependencies on (ASTRA-sim skips
        them the same way); a ``METADATA_NODE`` named ``## process_group:init
        ##`` gives the process groups.
    ``MEM_LOAD_NODE``, ``MEM_STORE_NODE``
        Refused: ASTRA-sim's remote memory has no counterpart here, and
        dropping its time silently would misreport the trace.
    Anything else (an unknown node type or collective) is refused.

CPU-side nodes
    A ``COMP_NODE`` or ``COMM_COLL_NODE`` with ``is_cpu_op`` true (the
    PyTorch converter's host operators: ``aten::`` ops, the ``c10d::`` calls
    that launch a collective kernel) only passes its dependencies on: a rank
    has one compute stream, the GPU's, and putting host time on it would
    serialize the host's work with the kernels it overlaps (ASTRA-sim runs
    CPU operators on a resource of their own, ``HardwareResource.cc``, which
    the schedule format lacks). The collective itself is its GPU kernel's
    node. ``meta.cpu_ops`` counts them and their recorded time. Nodes
    without ``is_cpu_op`` (ASTRA-sim's microbenchmarks, MSCCL) or with it
    false stay compute and collectives.

Dependencies
    ``ctrl_deps`` and ``data_deps`` alike; each rank's nodes replay in its
    dependency order (a topological order, ties broken by file order). A
    duplicate node id is an error naming it. Tolerated and counted in
    ``meta.dropped_dependencies`` (over the files read), as the PyTorch
    converter leaves them: a dependency on the node itself (``self``), on
    an id the file lacks (``dangling``), and -- when the dependencies form
    a cycle -- every ``ctrl_deps`` entry between two nodes of one strongly
    connected component (``cyclic_ctrl``: older converters record the
    caller-callee relation there, which can point both ways). A cycle of
    ``data_deps`` alone is an error naming it. Sends are *posted*, not
    awaited: a node that depends on a send waits for what the send waited
    for. ASTRA-sim's sends are buffered (a send finishes once delivered,
    whether or not its receive is posted), the replay's are rendezvous (a
    send completes with its receive), so waiting for a send would deadlock
    traces ASTRA-sim runs, such as the MSCCL ring where every rank sends
    before it receives.

One-rank traces
    :func:`load` with ``ranks`` (``emu schedule import FILE.et --ranks N``)
    replicates one file to ``N`` identical ranks: one rank of a symmetric
    data-parallel job. Its collectives span all ``N`` ranks (``pg_name``
    empty, ``"0"``, or a group the metadata gives as every rank of the
    recorded job, scaled to ``N``); one on a smaller group is refused, as
    are point-to-point nodes (their peers are ranks of the recorded job).

Replay order
    All ranks are composed together: every rank's nodes are added as soon as
    their dependencies are (compute and dependency-only nodes at once, a
    message once both its send and its receive are ready), until every rank
    waits at a collective node; then the first collective (by number) every
    rank of every group of it has reached is added, else the groups of the
    first that some group has reached (split off into a segment of their
    own; the others follow), a process group's collectives in their order;
    and so on. A trace for which this stops short (a receive whose send
    comes after its own rank's collective, two ranks each receiving before
    sending) is an error naming the rank, the node and what it waits for.
    Everything added waits only for things added before it, so an imported
    schedule never deadlocks.

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
    (rank 0's ``GlobalMetadata`` version or schema), ``replicated`` (the
    file and ``ranks``, with ``ranks``), ``process_groups`` (name: ranks,
    when the trace has the metadata), ``one_rank_collectives``,
    ``dropped_dependencies`` and ``cpu_ops`` (above; :func:`notes` words
    them), ``nodes`` (counts per node type over all ranks), ``collectives``
    (per collective: its collective, ``comm_size``, algorithm, its first
    rank's node id and name, and for groups ``groups`` and
    ``process_groups``), ``messages``, ``lanes`` (per ordered pair with
    messages, its tags in lane order), ``chunk_bytes``, and the padding
    above.

:func:`load` with ``index`` imports only the index-th collective (numbered
as above; one over every rank) instead, as the generator's schedule of it
(its size rounded up as above when it does not split into whole chunks,
recorded in ``meta.padded``). :func:`write_trace`, :func:`coll_node`,
:func:`comm_node`, :func:`comp_node` and :func:`pg_init_node` write such
files (for tests and samples).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from emulator.base.errors import MAX_LINE, MISSING, FieldError, UserError
from emulator.model import topology as topology_mod
from emulator.model.collectives import generators, registry
from emulator.model.collectives.placements import placement_hosts
from emulator.model.schedule.compose import Composer, Node
from emulator.model.schedule.format import (
    DTYPE_BYTES,
    MAX_CHUNKS,
    MAX_COMPUTE_S,
    MAX_LANES,
    MAX_RANKS,
    Schedule,
    is_power_of_two,
)
from emulator.model.schedule.semantics import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCE_SCATTER, REDUCE_TO_ROOT
from emulator.model.topology import Topology
from emulator.model.workloads.chakra_groups import (
    PG_INIT,
    CollNode,
    GroupTable,
    Instance,
    Matching,
    ProcessGroup,
    TraceCollective,
    group_table,
    match_collectives,
    parse_pg_config,
)
from emulator.model.workloads.training import check_scale, scaled_bytes

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


def pg_init_node(node_id: int, groups: Sequence[ProcessGroup], deps: Sequence[int] = (),
                 ctrl_deps: Sequence[int] = ()) -> Any:
    """A ``METADATA_NODE`` ``## process_group:init ##`` listing ``groups`` as PyTorch's ``pg_config`` (each
    group's ``size`` is its ``group_size``), its ``inputs.values`` as Chakra's PyTorch converter writes it: Python's
    ``str`` of the one-input list holding the JSON."""
    pb = _pb()
    node = _node(node_id, f"## {PG_INIT} ##", "METADATA_NODE", deps, ctrl_deps)
    config = [{"pg_name": g.name, "pg_desc": g.desc or "undefined", "backend_config": "cuda:nccl",
               "ranks": list(g.ranks), "group_size": g.size or len(g.ranks), "group_count": len(groups)}
              for g in groups]
    node.inputs.values = str([json.dumps(config)])
    node.inputs.shapes = str([[]])
    node.inputs.types = str(["String"])
    node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=True))
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
    #: a CPU-side node (``is_cpu_op`` true) kept as a dependency only; ``seconds`` is its recorded time
    cpu: bool = False

    @property
    def deps(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.ctrl_deps + self.data_deps))

    @property
    def label(self) -> str:
        return f"node {self.node_id} ({self.name or 'unnamed'})"


@dataclass(frozen=True)
class RankTrace:
    """One rank's file: its nodes in dependency order, the process groups its metadata lists, and how many
    dependencies were dropped: on the node itself, on ids the file lacks, and ``ctrl_deps`` closing a cycle."""

    rank: int
    path: str
    version: str
    nodes: tuple[TraceNode, ...]
    groups: tuple[ProcessGroup, ...] = ()
    self_deps: int = 0
    dangling_deps: int = 0
    cyclic_ctrl_deps: int = 0

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
    groups: list[ProcessGroup] = []
    for k, raw in enumerate(messages[1:], start=1):
        try:
            node = pb.Node.FromString(raw)
        except Exception:
            raise FieldError(where, f"message {k}", "a Chakra Node", "bytes that do not parse as one") from None
        nodes.append(_parse_node(pb, node, where, rank, p))
        if node.type == pb.METADATA_NODE and PG_INIT in node.name:
            groups += parse_pg_config(node.inputs.values, where, nodes[-1].label)
    order = _dependency_order(nodes, where)
    return RankTrace(rank, path, meta.version or schema, order.nodes, tuple(groups), order.self_deps,
                     order.dangling_deps, order.cyclic_ctrl_deps)


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
    if base.kind in (COMP, COLL) and attrs.get("is_cpu_op") is True:
        return replace(base, kind=DEP, cpu=True, seconds=node.duration_micros / 1e6)
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


def _without_bad_deps(nodes: Sequence[TraceNode], pos: Mapping[int, int]) -> tuple[list[TraceNode], int, int]:
    """``nodes`` without dependencies on themselves or on ids not in ``pos``, and how many of each were dropped
    (every entry of ``ctrl_deps`` and ``data_deps`` counted)."""
    out, self_deps, dangling = [], 0, 0
    for node in nodes:
        both = node.ctrl_deps + node.data_deps
        self_deps += sum(d == node.node_id for d in both)
        dangling += sum(d != node.node_id and d not in pos for d in both)
        ctrl, data = ([d for d in deps if d != node.node_id and d in pos] for deps in (node.ctrl_deps, node.data_deps))
        out.append(node if len(ctrl) + len(data) == len(both) else
                   replace(node, ctrl_deps=tuple(ctrl), data_deps=tuple(data)))
    return out, self_deps, dangling


@dataclass(frozen=True)
class _Order:
    """A file's nodes in dependency order, and how many dependencies were dropped: on the node itself, on ids not
    in the file, and ``ctrl_deps`` closing a cycle."""

    nodes: tuple[TraceNode, ...]
    self_deps: int
    dangling_deps: int
    cyclic_ctrl_deps: int


def _dependency_order(nodes: Sequence[TraceNode], where: str) -> _Order:
    """``nodes`` in a topological order of their dependencies, ties broken by file order (module docstring,
    "Dependencies"); :class:`FieldError` for a duplicate id or a cycle of ``data_deps``."""
    pos: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.node_id in pos:
            raise FieldError(where, f"node {node.node_id}", "a node id no other node of the file has",
                             f"the ids of messages {pos[node.node_id] + 1} and {i + 1}")
        pos[node.node_id] = i
    nodes, self_deps, dangling = _without_bad_deps(nodes, pos)
    order, waiting = _topological(nodes, pos)
    cyclic = 0
    if len(order) < len(nodes):
        nodes, cyclic = _without_cyclic_ctrl(nodes, pos)
        order, waiting = _topological(nodes, pos)
        if len(order) < len(nodes):
            raise _cycle_error(nodes, pos, waiting, where)
    return _Order(tuple(nodes[i] for i in order), self_deps, dangling, cyclic)


def _topological(nodes: Sequence[TraceNode], pos: Mapping[int, int]) -> tuple[list[int], list[int]]:
    """Positions of ``nodes`` in a topological order (ties by file order), and per node its dependencies left
    unreleased (non-zero for the nodes on or after a cycle, which the order lacks)."""
    children: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
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
    return order, waiting


def _without_cyclic_ctrl(nodes: Sequence[TraceNode], pos: Mapping[int, int]) -> tuple[list[TraceNode], int]:
    """``nodes`` without the ``ctrl_deps`` inside a cycle (between two nodes of one strongly connected component of
    all dependencies), and how many were dropped."""
    comp = _components([[pos[d] for d in node.deps] for node in nodes])
    out, dropped = [], 0
    for i, node in enumerate(nodes):
        ctrl = tuple(d for d in node.ctrl_deps if comp[pos[d]] != comp[i])
        dropped += len(node.ctrl_deps) - len(ctrl)
        out.append(node if len(ctrl) == len(node.ctrl_deps) else replace(node, ctrl_deps=ctrl))
    return out, dropped


def _components(deps: Sequence[Sequence[int]]) -> list[int]:
    """Per node of the graph ``i -> deps[i]`` its strongly connected component (Tarjan's algorithm, iterative)."""
    n = len(deps)
    index, low, comp, on = [-1] * n, [0] * n, [-1] * n, [False] * n
    stack: list[int] = []
    count = components = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = count
        count += 1
        stack.append(root)
        on[root] = True
        work = [(root, 0)]
        while work:
            v, k = work[-1]
            if k < len(deps[v]):
                work[-1] = (v, k + 1)
                w = deps[v][k]
                if index[w] < 0:
                    index[w] = low[w] = count
                    count += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = components
                    if w == v:
                        break
                components += 1
    return comp


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
        f"node {nodes[i].node_id}" for i in reversed(cycle)) + " (each waits for the one before)",
                      given_limit=MAX_LINE // 2)


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
        raise FieldError(WHERE, "FILE", f"trace files of 2 to {MAX_RANKS} ranks (or one file and --ranks N to "
                         "replicate it)", len(by_rank))
    return [by_rank[r] for r in range(len(by_rank))]


def replicate(paths: Sequence[str], ranks: int) -> list[RankTrace]:
    """The one trace file of ``paths`` as ``ranks`` identical ranks (module docstring, "One-rank traces")."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 2 <= ranks <= MAX_RANKS:
        raise FieldError(WHERE, "ranks", f"an integer in 2..{MAX_RANKS}", ranks)
    if len(paths) != 1:
        raise FieldError(WHERE, "ranks", "one trace file to replicate (a trace of several files gives each rank "
                         "its own)", f"{ranks} ranks for {len(paths)} files")
    if not paths[0].lower().endswith(".et"):
        raise FieldError(WHERE, "FILE", "a Chakra trace file (.et)", paths[0])
    trace = read_trace(paths[0], 0, ranks)
    p2p = next((n for n in trace.nodes if n.kind in (SEND, RECV)), None)
    if p2p is not None:
        raise FieldError(trace.where, p2p.label, "no point-to-point node in a one-rank trace to replicate (its peer "
                         "is a rank of the recorded job)", p2p.type_name)
    return [replace(trace, rank=r) for r in range(ranks)]


# ---------------------------------------------------------------------------
# Matching: collectives across ranks, sends with receives
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceMessage:
    """A send and its receive: ``(rank, position)`` of each end."""

    send: tuple[int, int]
    recv: tuple[int, int]
    lane: int
    size: int
    name: str


def groups_of(traces: Sequence[RankTrace], replicated: bool = False) -> GroupTable:
    """The process groups the traces' metadata list (:func:`~emulator.model.workloads.chakra_groups.group_table`)."""
    return group_table([(t.where, t.groups) for t in traces[:1 if replicated else len(traces)]], len(traces),
                       replicated)


def collectives_of(traces: Sequence[RankTrace], table: GroupTable) -> Matching:
    """Every rank's collective nodes matched into collectives
    (:func:`~emulator.model.workloads.chakra_groups.match_collectives`)."""
    per_rank = [[CollNode(t.rank, i, n.pg_name, n.collective, n.size, n.node_id, n.name)
                 for i, n in enumerate(t.nodes) if n.kind == COLL] for t in traces]
    return match_collectives(per_rank, [t.where for t in traces], table)


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
    return list(dict.fromkeys(a for c in registry.GENERATED for a in registry.algorithms(c)))


def algorithm_for(collective: str, algo: str, p: int) -> str:
    """``algo`` where the generators have it for ``collective`` over ``p`` ranks, else the collective's fallback
    (:func:`~emulator.model.collectives.registry.fallback`)."""
    if algo in registry.algorithms(collective):
        if not registry.algorithm(collective, algo).power_of_two or is_power_of_two(p):
            return algo
    return registry.fallback(collective)


def algorithm_of(coll: TraceCollective, algo: str, p: int) -> str:
    """The algorithm of ``coll``'s part: :func:`algorithm_for` over its group (a variant on a placement of every
    rank, ``hdrm``, is the algorithm it varies within groups: ``hd``)."""
    if coll.world:
        return algorithm_for(coll.collective, algo, p)
    known = registry.REGISTRY.get((coll.collective, algo))
    inside = known.variant_of if known is not None and known.variant_of else algo
    return algorithm_for(coll.collective, inside, coll.group_size)


@dataclass
class _Generator:
    """Generates every collective part over one topology and placement (and caches their chunk counts); the parts
    of collectives in groups over a star of the group's size (:meth:`of`)."""

    topo: Topology
    placement: str
    seed: int
    shapes: dict[tuple[str, str], Schedule] = field(default_factory=dict)
    by_size: dict[int, _Generator] = field(default_factory=dict)

    def of(self, coll: TraceCollective) -> _Generator:
        """This generator for a collective over every rank in rank order, else one over ``star:hosts=<group
        size>`` with the identity placement (a group's part: its rank ``i`` runs on the group's ``i``-th rank)."""
        if coll.world:
            return self
        g = coll.group_size
        if g not in self.by_size:
            self.by_size[g] = _Generator(topology_mod.build(f"star:hosts={g}"), "identity", self.seed)
        return self.by_size[g]

    def chunks(self, collective: str, algo: str) -> int:
        how = registry.algorithm(collective, algo)
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
        gen = self.of(coll)
        shape = gen.shape(coll.collective, algo)
        scale = len(gen.topo.hosts) if coll.collective == ALLGATHER else 1
        return Need(coll.name, coll.comm_size * scale, shape.chunks, shape.output_chunks, shape.scratch_chunks, scale)

    def part(self, coll: TraceCollective, algo: str, size: int) -> Schedule:
        return self.of(coll).generate(coll.collective, algo, size)


# ---------------------------------------------------------------------------
# Replay: composing every rank's nodes in an order all ranks can follow
# ---------------------------------------------------------------------------

class _Replay:
    """Adds a trace's nodes to ``composer`` (module docstring, "Replay order").

    ``frontier[r][i]``, set once node ``i`` of rank ``r`` is *released*:
    what a node depending on it waits for (its own composed node, or for a
    send or a dependency-only node what it waited for).
    """

    def __init__(self, traces: Sequence[RankTrace], matching: Matching, messages: Sequence[TraceMessage],
                 parts: Mapping[int, Schedule], nchunks: Mapping[str, int], composer: Composer):
        self.traces, self.parts, self.nchunks, self.c = traces, parts, nchunks, composer
        self.collectives, self.solo = matching.collectives, matching.solo
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
        # instances not yet added, per collective (in index order); per process group how many were added
        self.pending = {c.index: list(c.instances) for c in self.collectives}
        self.added: Counter[str] = Counter()
        self.per_pg = Counter(inst.pg for c in self.collectives for inst in c.instances)
        self.home = {(inst.pg, inst.k): c.index for c in self.collectives for inst in c.instances}
        self.collective_of = {m: c.index for c in self.collectives for m in c.members}
        self.preds: dict[Node, tuple[Node, ...]] = {}  # per part added, what it was added after on its rank

    def run(self) -> None:
        while True:
            while self.queue:
                self._visit(*self.queue.popleft())
            if not self.pending:
                if any(len(f) < len(t.nodes) for f, t in zip(self.frontier, self.traces, strict=True)):
                    raise self._stuck()
                return
            step = self._next()
            if step is None:
                raise self._stuck()
            self._collective(*step)

    def _heads(self) -> list[Instance]:
        """Per process group its next instance (a group's collectives are added in their order), by collective."""
        indices = sorted({self.home[(pg, self.added[pg])] for pg, n in self.per_pg.items() if self.added[pg] < n})
        return [inst for index in indices for inst in self.pending[index] if self.added[inst.pg] == inst.k]

    def _next(self) -> tuple[TraceCollective, list[Instance]] | None:
        """The first collective whose every pending instance every rank of it has reached, else the first with some
        (those are split off: its other groups come later); None if none."""
        heads = [inst for inst in self._heads() if all(m in self.ready for m in inst.members)]
        for index in dict.fromkeys(self.home[(inst.pg, inst.k)] for inst in heads):
            ready = [inst for inst in heads if self.home[(inst.pg, inst.k)] == index]
            if len(ready) == len(self.pending[index]):
                return self.collectives[index], ready
        if heads:
            index = self.home[(heads[0].pg, heads[0].k)]
            return self.collectives[index], [i for i in heads if self.home[(i.pg, i.k)] == index]
        return None

    def _after(self, r: int, i: int) -> tuple[Node, ...]:
        """What node ``i`` of rank ``r`` waits for: its dependencies' frontiers, less what another part in them was
        itself added after (waiting for that part waits for it too; this keeps long chains of dependency-only nodes
        from gathering every part before them)."""
        nodes = dict.fromkeys(node for d in self.deps[r][i] for node in self.frontier[r][d])
        if len(nodes) < 2:
            return tuple(nodes)
        covered = {before for node in nodes for before in self.preds.get(node, ())}
        return tuple(node for node in nodes if node not in covered)

    def _added(self, node: Node, after: tuple[Node, ...]) -> tuple[Node, ...]:
        """Record that ``node`` was added after ``after``; ``(node,)``, the frontier of what it ends."""
        self.preds[node] = after
        return (node,)

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
            after = self._after(r, i)
            self._release(r, i, self._added(self.c.compute(r, node.seconds, after), after))
        elif node.kind == DEP or (r, i) in self.solo:
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
            after = self._after(b, i)
            _, recv = self.c.message(a, b, self.nchunks[m.name], m.lane, m.name, after_src=self.frontier[a][s],
                                     after_dst=after)
            self._release(b, i, self._added(recv, after))

    def _collective(self, coll: TraceCollective, insts: Sequence[Instance]) -> None:
        """Add ``insts`` of ``coll`` (all its groups, or those split off) after what each member waits for."""
        left = [inst for inst in self.pending[coll.index] if inst not in insts]
        if left:
            self.pending[coll.index] = left
        else:
            del self.pending[coll.index]
        name = coll.name
        if len(insts) < len(coll.instances):
            name += ", groups " + " ".join(str(list(inst.group)) for inst in insts)
        after = {r: self._after(r, i) for inst in insts for r, i in inst.members}
        if coll.collective == BARRIER:
            ends = self._barrier(name, insts, after)
        elif coll.world:
            ends = {r: self._added(node, after[r]) for r, node in
                    enumerate(self.c.collective(self.parts[coll.index], name, after))}
        else:
            nodes = self.c.group_collective(self.parts[coll.index], name, [inst.group for inst in insts], after)
            ends = {r: self._added(node, after[r]) for r, node in nodes.items()}
        for inst in insts:
            self.added[inst.pg] += 1
            for r, i in inst.members:
                self._release(r, i, ends[r])

    def _barrier(self, name: str, insts: Sequence[Instance],
                 after: dict[int, tuple[Node, ...]]) -> dict[int, tuple[Node, ...]]:
        """A dissemination barrier in each group: round ``s`` sends one chunk from its ``j``-th rank to its
        ``j + 2^s``-th."""
        ends = dict(after)
        for inst in insts:
            g, n = inst.group, len(inst.group)
            for s in range((n - 1).bit_length()):
                now = dict(ends)
                for j, r in enumerate(g):
                    dst = g[(j + (1 << s)) % n]
                    _, recv = self.c.message(r, dst, 1, 0, f"{name} round {s} rank {r}", after_src=ends[r],
                                             after_dst=ends[dst])
                    now[dst] = self._added(recv, ends[dst])
                ends = now
        return ends

    # ----------------------------------------------------------- diagnosis
    def _stuck(self) -> FieldError:
        """The error for a trace that cannot go on: where it stopped and the chain of what waits for what."""
        start = next((m for inst in self._heads() for m in inst.members if m not in self.ready), None)
        if start is None:
            start = next((r, i) for r, t in enumerate(self.traces) for i in range(len(t.nodes))
                         if i not in self.frontier[r])
        r, i = start
        node = self.traces[r].nodes[i]
        return FieldError(self.traces[r].where, node.label, "a trace every rank can replay (each receive reached by "
                          "its send, each collective node by every rank)", self._chain(start),
                          given_limit=MAX_LINE // 2)

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
                if (r, b) in self.ready:
                    coll = self.collectives[self.collective_of[(r, b)]]
                    parts[-1] += f", which waits for every rank{'' if coll.world else ' of its group'} to reach it"
                return " waits for ".join(parts)
            r, i = self.message_of[(r, b)].send
            parts.append(f"its send {self._describe(r, i)}")
        return " waits for ".join(parts) + " ..."

    def _describe(self, r: int, i: int) -> str:
        node = self.traces[r].nodes[i]
        what = {SEND: f"send to rank {node.peer}, tag {node.tag}", RECV: f"receive from rank {node.peer}, tag "
                f"{node.tag}", COLL: f"collective {self.collective_of.get((r, i), '?')}"}
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
         placement: str | None = None, seed: int = 0, ranks: int | None = None, scale: float = 1.0) -> Schedule:
    """The trace of ``paths`` (one ``<prefix>.<rank>.et`` per rank) as one schedule, as recorded.

    Collective nodes are expanded with generator ``algo`` (or their
    collective's fallback), over ``topology`` (default ``star:hosts=p``) with
    ``placement`` (default ``hdrm`` for ``hdrm``, else ``identity``) and
    ``seed``; those of process groups within their groups. With ``ranks``,
    the one file of ``paths`` is replicated to that many ranks. With
    ``index``, only the index-th collective, as its generator's schedule.
    ``scale`` (>= 1) divides every size and compute time, as a training
    iteration's does (:func:`scaled`). See the module docstring for the rules;
    every bad input raises one :class:`FieldError`.
    """
    if algo not in _algorithms():
        raise FieldError(WHERE, "algo", f"one of {', '.join(_algorithms())}", algo)
    check_scale(scale, WHERE)
    replicated = ranks is not None
    if ranks is not None:
        traces = replicate(paths, ranks)
    else:
        files = rank_files(paths)
        traces = [read_trace(path, r, len(files)) for r, path in enumerate(files)]
    traces = [scaled(t, scale) for t in traces]
    p = len(traces)
    table = groups_of(traces, replicated)
    matching = collectives_of(traces, table)
    topo = _topology(topology, p)
    registry.check_topology_groups(ALLREDUCE, algo, topo, WHERE, "algo")
    gen = _Generator(topo, placement or registry.own_placement(ALLREDUCE, algo), seed)
    placement_hosts(topo, gen.placement, seed)  # a bad placement is named before anything else
    meta = _meta(traces, table, matching, replicated)
    if scale != 1:
        meta["scale"] = float(scale)
    if index is not None:
        return _load_one(matching.collectives, index, algo, gen, meta)
    return _load_all(traces, matching, algo, gen, meta)


def scaled(trace: RankTrace, scale: float) -> RankTrace:
    """``trace`` with every message's and collective's size divided by ``scale`` (rounded up, a collective's to
    whole float32 elements) and every node's recorded time divided by it: the rule of a training iteration's
    ``scale`` (:mod:`emulator.model.workloads.training`), so a replay's fabric latencies are divided alike."""
    if scale == 1:
        return trace

    def one(node: TraceNode) -> TraceNode:
        size = node.size
        if node.kind == COLL and size:
            size = scaled_bytes(size, scale, DTYPE_BYTES["float32"])
        elif node.kind in (SEND, RECV) and size:
            size = scaled_bytes(size, scale, DTYPE_BYTES["uint8"])
        return replace(node, size=size, seconds=node.seconds / scale)

    return replace(trace, nodes=tuple(one(n) for n in trace.nodes))


@dataclass(frozen=True)
class TraceNotes:
    """What an import dropped or kept as dependencies only, counted over the files read (a replicated trace's one
    file once): dependencies on the node itself, on ids not in the file and ``ctrl_deps`` closing a cycle, and
    CPU-side nodes with their recorded time."""

    self_deps: int = 0
    dangling_deps: int = 0
    cyclic_ctrl_deps: int = 0
    cpu_nodes: int = 0
    cpu_micros: int = 0

    @classmethod
    def of(cls, traces: Sequence[RankTrace]) -> TraceNotes:
        cpu = [n for t in traces for n in t.nodes if n.cpu]
        return cls(sum(t.self_deps for t in traces), sum(t.dangling_deps for t in traces),
                   sum(t.cyclic_ctrl_deps for t in traces), len(cpu), round(sum(n.seconds for n in cpu) * 1e6))

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.self_deps or self.dangling_deps or self.cyclic_ctrl_deps:
            out["dropped_dependencies"] = {"self": self.self_deps, "dangling": self.dangling_deps,
                                           "cyclic_ctrl": self.cyclic_ctrl_deps}
        if self.cpu_nodes:
            out["cpu_ops"] = {"nodes": self.cpu_nodes, "micros": self.cpu_micros}
        return out


def notes(meta: Mapping[str, Any]) -> list[str]:
    """The lines ``emu schedule import`` prints about what an import dropped (a warning) or kept as dependencies
    only; none when nothing was."""
    out = []
    dropped = meta.get("dropped_dependencies")
    if dropped:
        out.append(f"warning: dropped {dropped['self']} self-dependencies, {dropped['dangling']} dependencies on "
                   f"node ids not in their file and {dropped['cyclic_ctrl']} ctrl_deps closing a cycle (counted over "
                   "the files read)")
    cpu = meta.get("cpu_ops")
    if cpu:
        out.append(f"note: {cpu['nodes']} CPU-side nodes (is_cpu_op) kept as dependencies only, "
                   f"{cpu['micros'] / 1000:.1f} ms of recorded host time not replayed")
    return out


def _meta(traces: Sequence[RankTrace], table: GroupTable, matching: Matching, replicated: bool) -> dict[str, Any]:
    """What every import records: the trace, its process groups, and :class:`TraceNotes`."""
    base = os.path.basename(traces[0].path)
    prefix = FILE_RE.match(base)
    meta: dict[str, Any] = {"imported_from": "chakra", "trace": prefix.group("prefix") if prefix else
                            base.removesuffix(".et"), "version": traces[0].version}
    if replicated:
        meta["replicated"] = {"file": base, "ranks": len(traces)}
    if table.has_metadata:
        meta["process_groups"] = {name: list(ranks) for name, ranks in sorted(table.groups.items())}
    if matching.solo:
        meta["one_rank_collectives"] = len(matching.solo)
    meta.update(TraceNotes.of(traces[:1] if replicated else traces).meta())
    return meta


def _load_one(collectives: Sequence[TraceCollective], index: int, algo: str, gen: _Generator,
              meta: dict[str, Any]) -> Schedule:
    n = len(collectives)
    if not 0 <= index < n:
        raise FieldError(WHERE, "index", f"a collective index in 0..{n - 1}" if n else
                         "a trace with a COMM_COLL_NODE", index)
    coll = collectives[index]
    if coll.collective == BARRIER:
        raise FieldError(WHERE, "index", "a collective other than a BARRIER (it has no generator)", index)
    if not coll.world:
        raise FieldError(WHERE, "index", "a collective over every rank (this one runs in process groups of "
                         f"{coll.group_size}: import the whole trace)", index)
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


def _coll_meta(coll: TraceCollective, algorithm: str) -> dict[str, Any]:
    out: dict[str, Any] = {"collective": coll.collective, "comm_size": coll.comm_size, "algorithm": algorithm,
                           "node": coll.node_id, "name": coll.node_name}
    if not coll.world:
        out.update(groups=[list(g) for g in coll.groups], process_groups=[inst.pg for inst in coll.instances])
    return out


def _load_all(traces: Sequence[RankTrace], matching: Matching, algo: str, gen: _Generator,
              meta: dict[str, Any]) -> Schedule:
    p = len(traces)
    collectives = matching.collectives
    messages, lanes = match_messages(traces, 1 if collectives else 0)
    if not messages and not collectives:
        raise FieldError(WHERE, "trace", "communication (COMM_SEND_NODE, COMM_RECV_NODE or COMM_COLL_NODE nodes)",
                         "none in any rank's file")
    algos = {c.index: algorithm_of(c, algo, p) for c in collectives if c.collective != BARRIER}
    needs = [gen.need(c, algos[c.index]) for c in collectives if c.index in algos]
    needs += [Need(m.name, m.size) for m in messages]
    barrier_messages = sum(len(inst.group) * (len(inst.group) - 1).bit_length() for c in collectives
                           if c.collective == BARRIER for inst in c.instances)
    elem = 4 if algos else 1
    chunking = choose_chunks(needs, elem, barrier_messages)
    parts = {c.index: gen.part(c, algos[c.index], chunking.replayed[c.name]) for c in collectives if c.index in algos}
    hosts = placement_hosts(gen.topo, gen.placement, gen.seed)
    composer = Composer(hosts, chunking.chunk_bytes, dtype="float32" if elem == 4 else "uint8")
    nchunks = {m.name: chunking.replayed[m.name] // chunking.chunk_bytes for m in messages}
    _Replay(traces, matching, messages, parts, nchunks, composer).run()
    meta.update(nodes=dict(sorted(Counter(n.type_name for t in traces for n in t.nodes).items())),
                collectives=[_coll_meta(c, algos.get(c.index, "dissemination")) for c in collectives],
                messages=len(messages), lanes=lanes, chunk_bytes=chunking.chunk_bytes)
    padded = chunking.padded(needs)
    if padded:
        meta.update(quantum=chunking.quantum, padded=padded)
    return composer.build("chakra", meta, topology=gen.topo.spec, placement=gen.placement)
