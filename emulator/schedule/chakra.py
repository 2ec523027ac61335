"""Import the allreduce nodes of Chakra execution traces (MLCommons, package ``mlc-chakra``).

A trace is one file per rank, ``<prefix>.<rank>.et``: a sequence of
protobuf messages, each preceded by its length as a varint -- first a
``GlobalMetadata``, then ``Node`` messages (``id, name, type, ctrl_deps,
data_deps, attr[]``). A collective is a ``COMM_COLL_NODE`` whose attributes
include ``comm_type`` (``ALL_REDUCE`` = 0) and ``comm_size`` (bytes).

A trace says *that* an allreduce of ``comm_size`` bytes happens over its ranks,
not how; :func:`load` takes the ``index``-th ``ALL_REDUCE`` node (the same on
every rank: the sizes must agree) and expands it with one of our generators
(``ring`` by default) over as many ranks as there are files, on ``star:hosts=p``
unless a topology is given. Point-to-point ``COMM_SEND``/``COMM_RECV`` nodes
carry no chunk information and are not imported.

:func:`write_trace` writes such files (for tests and samples).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from emulator import topology as topology_mod
from emulator.errors import FieldError, UserError
from emulator.schedule.format import Schedule
from emulator.schedule.generators import generate
from emulator.topology import Topology

FILE_RE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>[0-9]+)\.et$")


def _pb():
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
    """Split ``data`` into its length-prefixed messages."""
    out = []
    pos = 0
    while pos < len(data):
        length = shift = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise UserError(f"{where}: truncated length prefix at byte {pos}")
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + length > len(data):
            raise UserError(f"{where}: message at byte {pos} claims {length} bytes but the file ends first")
        out.append(data[pos:pos + length])
        pos += length
    return out


def write_trace(path: str, nodes: Iterable[object], version: str = "0.0.4") -> None:
    """Write a ``.et`` file: ``GlobalMetadata(version)`` then ``nodes`` (``et_def_pb2.Node`` messages)."""
    pb = _pb()
    chunks = [pb.GlobalMetadata(version=version).SerializeToString()]
    chunks += [node.SerializeToString() for node in nodes]  # type: ignore[attr-defined]
    with open(path, "wb") as fh:
        for raw in chunks:
            fh.write(encode_varint(len(raw)) + raw)


def coll_node(node_id: int, name: str, comm_type: int, comm_size: int, pg_name: str = "0",
              deps: Sequence[int] = ()) -> object:
    """A ``COMM_COLL_NODE`` with ``comm_type``, ``comm_size`` and ``pg_name`` attributes."""
    pb = _pb()
    node = pb.Node(id=node_id, name=name, type=pb.COMM_COLL_NODE, data_deps=list(deps))
    node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
    node.attr.append(pb.AttributeProto(name="comm_type", int64_val=comm_type))
    node.attr.append(pb.AttributeProto(name="comm_size", int64_val=comm_size))
    node.attr.append(pb.AttributeProto(name="pg_name", string_val=pg_name))
    return node


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Collective:
    node_id: int
    name: str
    comm_type: int
    comm_size: int


def _attr_value(attr: object) -> object:
    which = attr.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(attr, which) if which else None


def read_collectives(path: str) -> list[Collective]:
    """The ``COMM_COLL_NODE`` nodes of one trace file, in file order."""
    pb = _pb()
    where = f"Chakra trace {path!r}"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    messages = decode_stream(data, where)
    if not messages:
        raise UserError(f"{where}: empty (expected a GlobalMetadata message, then nodes)")
    try:
        pb.GlobalMetadata.FromString(messages[0])
    except Exception:
        raise UserError(f"{where}: the first message is not a Chakra GlobalMetadata") from None
    out = []
    for k, raw in enumerate(messages[1:]):
        try:
            node = pb.Node.FromString(raw)
        except Exception:
            raise UserError(f"{where}: message {k + 1} is not a Chakra Node") from None
        if node.type != pb.COMM_COLL_NODE:
            continue
        attrs = {a.name: _attr_value(a) for a in node.attr}
        npath = f"node {node.id} ({node.name or 'unnamed'})"
        values = []
        for key in ("comm_type", "comm_size"):
            value = attrs.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FieldError(where, f"{npath}.attr.{key}", "a non-negative integer", attrs.get(key, "nothing"))
            values.append(value)
        out.append(Collective(node.id, node.name, values[0], values[1]))
    return out


def rank_files(paths: Sequence[str]) -> list[str]:
    """``paths`` ordered by rank; they must be ``<prefix>.<rank>.et`` for ranks ``0..p-1``, one prefix."""
    by_rank: dict[int, str] = {}
    prefixes = set()
    for path in paths:
        match = FILE_RE.match(os.path.basename(path))
        if not match:
            raise FieldError("chakra import", "FILE", "trace files named <prefix>.<rank>.et", path)
        prefixes.add(os.path.join(os.path.dirname(path), match.group("prefix")))
        rank = int(match.group("rank"))
        if rank in by_rank:
            raise FieldError("chakra import", "FILE", "one file per rank", f"rank {rank} twice")
        by_rank[rank] = path
    if len(prefixes) > 1:
        raise FieldError("chakra import", "FILE", "files of one trace (one prefix)", sorted(prefixes))
    if sorted(by_rank) != list(range(len(by_rank))):
        raise FieldError("chakra import", "FILE", f"ranks 0..{len(by_rank) - 1}, one file each", sorted(by_rank))
    if len(by_rank) < 2:
        raise FieldError("chakra import", "FILE", "trace files of at least 2 ranks", len(by_rank))
    return [by_rank[r] for r in range(len(by_rank))]


def load(paths: Sequence[str], algo: str = "ring", index: int = 0, topology: Topology | str | None = None,
         placement: str | None = None, seed: int = 0) -> Schedule:
    """The ``index``-th ALL_REDUCE of a trace, expanded with generator ``algo`` (see the module docstring)."""
    pb = _pb()
    files = rank_files(paths)
    p = len(files)
    per_rank = []
    for path in files:
        allreduces = [c for c in read_collectives(path) if c.comm_type == pb.ALL_REDUCE]
        per_rank.append(allreduces)
    counts = {len(a) for a in per_rank}
    if len(counts) != 1:
        raise FieldError("chakra import", "ALL_REDUCE nodes", "the same number on every rank",
                         {files[r]: len(a) for r, a in enumerate(per_rank)})
    n = counts.pop()
    if not 0 <= index < n:
        raise FieldError("chakra import", "index", f"an ALL_REDUCE index in 0..{n - 1}" if n else
                         "a trace with an ALL_REDUCE collective node", index)
    chosen = [a[index] for a in per_rank]
    sizes = {c.comm_size for c in chosen}
    if len(sizes) != 1:
        raise FieldError("chakra import", f"ALL_REDUCE #{index} comm_size", "the same size on every rank",
                         sorted(sizes))
    size = sizes.pop()
    if size <= 0:
        raise FieldError("chakra import", f"ALL_REDUCE #{index} comm_size", "a positive size", size)
    topo = topology_mod.load(topology) if isinstance(topology, str) else topology
    if topo is None:
        topo = topology_mod.build(f"star:hosts={p}")
    if len(topo.hosts) != p:
        raise FieldError("chakra import", "topology", f"a topology with {p} hosts (one per trace file)", topo.spec)
    sched = generate(algo, topo, size, placement=placement, seed=seed)
    meta = dict(sched.meta)
    meta.update(imported_from="chakra", trace=os.path.commonprefix([os.path.basename(f) for f in files]),
                node_id=chosen[0].node_id, node_name=chosen[0].name, allreduce_index=index)
    return replace(sched, meta=meta)
