"""The schedule format: dataclasses, field validation, YAML/JSON load and save.

This module owns what a schedule *is* (see ``docs/schedule-format.md``): a
collective (:mod:`emulator.model.schedule.semantics`) over ``p`` ranks, each rank
placed on one host, on a buffer of ``size`` bytes split into ``chunks`` chunks
(:class:`ChunkLayout`: equal, or differing by at most one element as NCCL and
MPI split a count); per rank an ordered list of operations with explicit
dependencies. A schedule of several collectives names them in *segments*, each
over every rank or over *groups* of ranks (process groups). It
checks every field and raises :class:`~emulator.base.errors.FieldError` naming the
field path (e.g. ``ranks[3].ops[5].peer``). Whether the operations really
compute the collective is the job of :mod:`emulator.model.schedule.executor`.

Operation kinds
    ``send``         send ``buffer[chunk:chunk+nchunks]`` to ``peer`` on ``lane``
    ``recv``         receive from ``peer`` on ``lane`` into ``buffer[chunk:...]`` (overwrite)
    ``recv_reduce``  receive from ``peer`` on ``lane`` and add into ``buffer[chunk:...]``
    ``reduce``       ``buffer[chunk:...] += src[src_chunk:...]`` (local)
    ``copy``         ``buffer[chunk:...] = src[src_chunk:...]`` (local)
    ``compute``      local work of ``seconds`` (of the real system: replays dilate it), touching no buffer

Buffers are ``data`` (the rank's input, and its result when the collective is
in place, ``chunks`` chunks), ``output`` (``output_chunks`` chunks, the result
of an out-of-place collective) and ``scratch`` (``scratch_chunks`` chunks,
initially empty). A *lane* is one of several connections between the same two
ranks (an MSCCL channel, a Chakra tag): messages are matched in order per
sender, receiver and lane.

Version 1 files (allreduce only, no lanes, no compute) and version 2 files (no groups, equal chunks) read
unchanged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from emulator.base.documents import format_of, parse_text, read_document
from emulator.base.errors import FieldError, int_field
from emulator.base.files import write_atomic
from emulator.model.schedule.semantics import ALLREDUCE, COLLECTIVES, MIXED, P2P, ROOTED, Shape

FORMAT_NAME = "eflops-emulator-schedule"
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
#: ``uint8`` carries point-to-point traffic of any byte count; collectives add numbers, so they need ``float32``.
DTYPE_BYTES = {"float32": 4, "uint8": 1}

SEND, RECV, RECV_REDUCE, REDUCE, COPY, COMPUTE = "send", "recv", "recv_reduce", "reduce", "copy", "compute"
KINDS = (SEND, RECV, RECV_REDUCE, REDUCE, COPY, COMPUTE)
COMM_KINDS = (SEND, RECV, RECV_REDUCE)
LOCAL_KINDS = (REDUCE, COPY)
BUFFERS = ("data", "output", "scratch")
HOST_RE = re.compile(r"^h[1-9][0-9]*$")

MAX_RANKS = 1024
MAX_CHUNKS = 1 << 18
#: Step numbers: the models keep one record per step (an op at step 2**31 once made them allocate 24 GiB).
MAX_STEPS = 1 << 17
#: Connections between one pair of ranks (each is a TCP connection in a replay).
MAX_LANES = 64
#: The longest compute operation, in seconds of the real system (a replay dilates it).
MAX_COMPUTE_S = 3600.0
#: The largest message size a user may ask for (an experiment's ``sizes``, ``emu schedule gen --size``, an MSCCL
#: import's ``--size``): a rank's buffers hold at least its size, and no server gives one rank a tebibyte.
MAX_MESSAGE_BYTES = 1 << 40


# ---------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------

#: Units are case-sensitive: ``Kb``/``Mb`` would read as bits, so they are refused.
_UNITS = {"": 1, "B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE_RE = re.compile(r"^\s*([0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: object, where: str = "schedule", field_name: str = "size", maximum: int | None = None) -> int:
    """Bytes from ``65536``, ``64KiB``, ``16MiB``, ``1GiB``, ``1MB`` (decimal) or ``100B``.

    Raises :class:`FieldError` for anything else, for zero, for negative numbers and above ``maximum`` (a message
    a user asks for: :data:`MAX_MESSAGE_BYTES`).
    """
    size = _size_value(text, where, field_name, "a positive size such as 65536, 64KiB, 16MiB, 1GiB or 1MB")
    if maximum is not None and size > maximum:
        raise FieldError(where, field_name, f"a size of at most {format_size(maximum)} (a rank's buffers hold at "
                         "least its size)", text)
    return size


def _size_value(text: object, where: str, field_name: str, expected: str) -> int:
    if isinstance(text, bool):
        raise FieldError(where, field_name, expected, text)
    if isinstance(text, int):
        if text <= 0:
            raise FieldError(where, field_name, expected, text)
        return text
    if not isinstance(text, str):
        raise FieldError(where, field_name, expected, text)
    match = _SIZE_RE.match(text)
    if not match or match.group(2) not in _UNITS:
        raise FieldError(where, field_name, expected, text)
    value = int(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise FieldError(where, field_name, expected, text)
    return value


def format_size(n: int) -> str:
    """``65536`` -> ``64KiB``; sizes that are no whole binary unit stay in bytes."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def check_chunking(size: int, chunks: int, where: str = "schedule", dtype: str = "float32") -> int:
    """The bytes of one chunk; raises :class:`FieldError` unless ``size`` splits into ``chunks`` whole-element chunks
    of one size (what a schedule of several segments needs)."""
    elem = DTYPE_BYTES[dtype]
    if size % (elem * chunks):
        lcm = elem * chunks
        raise FieldError(where, "size", f"a multiple of {lcm} bytes ({chunks} equal chunks of whole {dtype} "
                         f"elements, {elem} bytes each)", size)
    return size // chunks


@dataclass(frozen=True)
class ChunkLayout:
    """Where every chunk of a buffer lies: blocks of ``block`` chunks, each block ``block_elements`` elements.

    A block's elements split as NCCL and Open MPI split a count: the first
    ``block_elements % block`` chunks one element larger than the others. Chunk
    ``k`` of any buffer (``data``, ``output``, ``scratch``) is the size of
    chunk ``k % block`` of a block, so a chunk moved to the same place in
    another block (an all-gather's output, a reduce-scatter's result) keeps its
    size. With ``block_elements`` a multiple of ``block`` every chunk is equal.
    """

    element_bytes: int
    block: int
    block_elements: int

    @property
    def equal(self) -> bool:
        return self.block_elements % self.block == 0

    @property
    def largest_bytes(self) -> int:
        """The bytes of the largest chunk (every chunk's when they are equal)."""
        return -(-self.block_elements // self.block) * self.element_bytes

    def offset(self, chunk: int) -> int:
        """The element where chunk ``chunk`` starts."""
        blocks, k = divmod(chunk, self.block)
        base, extra = divmod(self.block_elements, self.block)
        return blocks * self.block_elements + k * base + min(k, extra)

    def elements(self, chunk: int, nchunks: int = 1) -> int:
        """The elements of chunks ``chunk .. chunk + nchunks - 1``."""
        return self.offset(chunk + nchunks) - self.offset(chunk)

    def range_bytes(self, chunk: int, nchunks: int = 1) -> int:
        return self.elements(chunk, nchunks) * self.element_bytes


def chunk_layout(size: int, chunks: int, block: int, where: str = "schedule", dtype: str = "float32") -> ChunkLayout:
    """The layout of ``size`` bytes in ``chunks`` chunks, blocks of ``block``; :class:`FieldError` unless the size
    is whole elements, one equal block per rank's block and at least one element per chunk."""
    elem = DTYPE_BYTES[dtype]
    blocks = chunks // block
    if size % (elem * blocks):
        what = f"{blocks} equal blocks of whole {dtype} elements" if blocks > 1 else f"whole {dtype} elements"
        raise FieldError(where, "size", f"a multiple of {elem * blocks} bytes ({what}, {elem} bytes each)", size)
    block_elements = size // elem // blocks
    if block_elements < block:
        raise FieldError(where, "size", f"at least {block * blocks * elem} bytes (one {dtype} element for each of "
                         f"the {chunks} chunks)", size)
    return ChunkLayout(elem, block, block_elements)


# ---------------------------------------------------------------------------
# Dataclasses
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One operation of one rank; see the module docstring for the kinds.

    ``id`` is unique within the rank; ``deps`` are ids of earlier operations of
    the same rank that must complete before this one starts. ``step`` is the
    communication step the operation belongs to (matched send and receive share
    it; an operation's step is never below its dependencies').
    """

    id: int
    kind: str
    chunk: int
    nchunks: int
    bytes: int
    step: int
    peer: int | None = None
    buffer: str = "data"
    src: str | None = None
    src_chunk: int | None = None
    deps: tuple[int, ...] = ()
    lane: int = 0
    seconds: float = 0.0

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def partner(self) -> int:
        """The peer rank of a send or receive (validation guarantees it is set)."""
        if self.peer is None:
            raise ValueError(f"{self.kind} op {self.id} has no peer")
        return self.peer

    @property
    def source(self) -> tuple[str, int]:
        """``(src buffer, src_chunk)`` of a reduce or copy (validation guarantees both are set)."""
        if self.src is None or self.src_chunk is None:
            raise ValueError(f"{self.kind} op {self.id} has no source")
        return self.src, self.src_chunk

    def describe(self) -> str:
        if self.kind == COMPUTE:
            return f"op {self.id} (compute {self.seconds:g} s, step {self.step})"
        rng = f"chunk {self.chunk}" if self.nchunks == 1 else f"chunks {self.chunk}..{self.chunk + self.nchunks - 1}"
        buf = "" if self.buffer == "data" else f" of {self.buffer}"
        lane = f", lane {self.lane}" if self.lane else ""
        if self.kind == SEND:
            return f"op {self.id} (send {rng}{buf} to rank {self.peer}{lane}, step {self.step})"
        if self.kind in (RECV, RECV_REDUCE):
            return f"op {self.id} ({self.kind} {rng}{buf} from rank {self.peer}{lane}, step {self.step})"
        return f"op {self.id} ({self.kind} {rng}{buf} from {self.src} {self.src_chunk}, step {self.step})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind}
        if self.kind == COMPUTE:
            out.update(seconds=self.seconds, step=self.step, deps=list(self.deps))
            return out
        if self.peer is not None:
            out["peer"] = self.peer
        if self.lane:
            out["lane"] = self.lane
        out.update(chunk=self.chunk, nchunks=self.nchunks, bytes=self.bytes, step=self.step)
        if self.buffer != "data":
            out["buffer"] = self.buffer
        if self.src is not None:
            out["src"] = self.src
            out["src_chunk"] = self.src_chunk
        out["deps"] = list(self.deps)
        return out


@dataclass(frozen=True)
class RankProgram:
    """The host a rank runs on and its operations, in a valid execution order."""

    rank: int
    host: str
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Segment:
    """One collective among several in a schedule: its chunks of ``data`` (from ``chunk``) and of ``output``.

    ``groups`` are its process groups, each a list of ranks in the group's own
    rank order: the collective runs within each group on the same chunks, as a
    communicator split does (``root`` is a rank of the group's order). No
    groups: one group of every rank.
    """

    name: str
    collective: str
    chunk: int
    chunks: int
    output_chunk: int = 0
    output_chunks: int = 0
    root: int = 0
    groups: tuple[tuple[int, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "collective": self.collective, "chunk": self.chunk,
                               "chunks": self.chunks}
        if self.output_chunks:
            out.update(output_chunk=self.output_chunk, output_chunks=self.output_chunks)
        if self.collective in ROOTED:
            out["root"] = self.root
        if self.groups:
            out["groups"] = [list(g) for g in self.groups]
        return out


@dataclass(frozen=True)
class Schedule:
    """A whole schedule: one collective (or point-to-point traffic) over its ranks."""

    algorithm: str
    size: int
    chunks: int
    ranks: tuple[RankProgram, ...]
    scratch_chunks: int = 0
    dtype: str = "float32"
    collective: str = ALLREDUCE
    topology: str | None = None
    placement: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    output_chunks: int = 0
    root: int = 0
    segments: tuple[Segment, ...] = ()

    @property
    def shape(self) -> Shape:
        """The whole schedule's collective on these buffers (:mod:`emulator.model.schedule.semantics`)."""
        return Shape(self.collective, self.p, self.chunks, self.output_chunks, self.root)

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """Every segment's collective in place on the buffers, one per group (one, the whole schedule, without
        segments). The groups of one segment share its chunks and labels."""
        if not self.segments:
            return (self.shape,)
        out = []
        base = 0
        for seg in self.segments:
            groups = seg.groups or (tuple(range(self.p)),)
            shapes = [Shape(seg.collective, len(g), seg.chunks, seg.output_chunks, seg.root, seg.chunk,
                            seg.output_chunk, base, g if seg.groups else ()) for g in groups]
            base += max(shape.labels for shape in shapes)
            out += shapes
        return tuple(out)

    @property
    def layout(self) -> ChunkLayout:
        """Where each chunk lies (:class:`ChunkLayout`); equal chunks in a schedule of segments."""
        block = self.chunks if self.segments or self.collective == MIXED else self.shape.block
        return ChunkLayout(DTYPE_BYTES[self.dtype], block, self.size // DTYPE_BYTES[self.dtype] // (self.chunks // block))

    @property
    def collective_bytes(self) -> int:
        """nccl-tests' size of the collective: the larger of its input and output, in bytes."""
        return max(self.size, self.layout.range_bytes(0, self.output_chunks))

    @property
    def compute_ops(self) -> int:
        return sum(op.kind == COMPUTE for r in self.ranks for op in r.ops)

    @property
    def p(self) -> int:
        return len(self.ranks)

    @property
    def chunk_bytes(self) -> int:
        """The bytes of the largest chunk (of every chunk, when they are equal: :attr:`layout`)."""
        return self.layout.largest_bytes

    @property
    def hosts(self) -> list[str]:
        return [r.host for r in self.ranks]

    @property
    def steps(self) -> int:
        """One more than the largest step number of any operation (0 if there are none)."""
        return max((op.step + 1 for r in self.ranks for op in r.ops), default=0)

    def buffer_chunks(self, buffer: str) -> int:
        return {"data": self.chunks, "output": self.output_chunks}.get(buffer, self.scratch_chunks)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME, "version": self.version, "collective": self.collective,
            "algorithm": self.algorithm, "dtype": self.dtype, "size": self.size, "chunks": self.chunks,
        }
        if self.layout.equal:
            out["chunk_bytes"] = self.chunk_bytes
        out["scratch_chunks"] = self.scratch_chunks
        if self.output_chunks:
            out["output_chunks"] = self.output_chunks
        if self.collective in ROOTED:
            out["root"] = self.root
        if self.segments:
            out["segments"] = [seg.to_dict() for seg in self.segments]
        if self.topology is not None:
            out["topology"] = self.topology
        if self.placement is not None:
            out["placement"] = self.placement
        if self.meta:
            out["meta"] = dict(self.meta)
        out["ranks"] = [{"rank": r.rank, "host": r.host, "ops": [op.to_dict() for op in r.ops]}
                        for r in self.ranks]
        return out


def match_transfers(schedule: Schedule) -> list[tuple[int, int, int, int]]:
    """Pair the k-th send from rank a to rank b on a lane with the k-th receive at b from a on that lane
    (execution model, rule 2).

    Returns ``(src_rank, send_op_id, dst_rank, recv_op_id)`` tuples, by sender
    and receiver rank and lane, then in program order.
    """
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind == SEND:
                sends.setdefault((prog.rank, op.partner, op.lane), []).append(op.id)
            elif op.kind in (RECV, RECV_REDUCE):
                recvs.setdefault((op.partner, prog.rank, op.lane), []).append(op.id)
    out = []
    for (a, b, lane), ids in sorted(sends.items()):
        for send_id, recv_id in zip(ids, recvs.get((a, b, lane), []), strict=False):  # validated schedules pair up
            out.append((a, send_id, b, recv_id))
    return out


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

_TOP_KEYS = {"format", "version", "collective", "algorithm", "dtype", "size", "chunks", "chunk_bytes",
             "scratch_chunks", "output_chunks", "root", "segments", "topology", "placement", "meta", "ranks"}
_SEGMENT_KEYS = {"name", "collective", "chunk", "chunks", "output_chunk", "output_chunks", "root", "groups"}
_RANK_KEYS = {"rank", "host", "ops"}
_OP_KEYS = {"id", "kind", "peer", "lane", "chunk", "nchunks", "bytes", "step", "buffer", "src", "src_chunk", "deps",
            "seconds"}
_COMPUTE_KEYS = {"id", "kind", "seconds", "step", "deps"}


def _reject_unknown(where: str, prefix: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            raise FieldError(where, f"{prefix}{key}", f"one of the keys {', '.join(sorted(allowed))}",
                             f"unknown key {key}")


def from_dict(data: object, where: str = "schedule") -> Schedule:
    """Parse and validate a schedule mapping (as loaded from YAML or JSON).

    Checks every field's type and range, chunk ranges against the buffers,
    byte counts, peers, unique ids, dependencies (earlier ops of the same rank,
    step never decreasing along them) and distinct hosts. Raises
    :class:`FieldError` naming the first bad field.
    """
    if not isinstance(data, Mapping):
        raise FieldError(where, "schedule", "a mapping (YAML or JSON object)", type(data).__name__)
    _reject_unknown(where, "", data, _TOP_KEYS)
    if "format" in data and data["format"] != FORMAT_NAME:
        raise FieldError(where, "format", repr(FORMAT_NAME), data["format"])
    version, collective, raw_segments, root = _parse_collective(where, data)
    bufs = _parse_buffers(where, data, collective, raw_segments)
    for key in ("topology", "placement"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise FieldError(where, key, "a string", data[key])
    meta = data.get("meta", {})
    if not isinstance(meta, Mapping):
        raise FieldError(where, "meta", "a mapping", meta)
    raw_ranks = data.get("ranks")
    if not isinstance(raw_ranks, list) or not raw_ranks:
        raise FieldError(where, "ranks", "a non-empty list of ranks", raw_ranks)
    if len(raw_ranks) > MAX_RANKS:
        raise FieldError(where, "ranks", f"at most {MAX_RANKS} ranks", len(raw_ranks))
    p = len(raw_ranks)
    segments = _parse_segments(where, raw_segments, collective, p, bufs.chunks, bufs.output, version)
    whole = Shape(collective, p, bufs.chunks, bufs.output, root)
    problem = None if segments or collective == MIXED else whole.problem()
    if problem is not None:
        raise FieldError(where, *problem)
    several = bool(segments) or collective == MIXED
    bufs = _with_layout(where, data, bufs, bufs.chunks if several else whole.block, version < 3 or several)
    ranks = _parse_ranks(where, raw_ranks, bufs)
    return Schedule(algorithm=bufs.algorithm, size=bufs.size, chunks=bufs.chunks, ranks=ranks,
                    scratch_chunks=bufs.scratch, dtype=bufs.dtype, collective=collective,
                    topology=data.get("topology"), placement=data.get("placement"), meta=dict(meta),
                    output_chunks=bufs.output, root=root, segments=segments)


def _parse_collective(where: str, data: Mapping[str, Any]) -> tuple[int, str, list[Any], int]:
    """``version``, ``collective``, ``segments`` (still raw) and ``root``."""
    version = data.get("version", "nothing")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise FieldError(where, "version", " or ".join(map(str, READ_VERSIONS)), version)
    collective = data.get("collective", ALLREDUCE)
    allowed = (*COLLECTIVES, MIXED) if version >= 2 else (ALLREDUCE,)
    if collective not in allowed:
        raise FieldError(where, "collective", "one of " + ", ".join(allowed), collective)
    raw_segments = data.get("segments", [])
    if not isinstance(raw_segments, list):
        raise FieldError(where, "segments", "a list of segments", raw_segments)
    root = int_field(where, "root", data.get("root", 0), 0)
    if root and collective not in ROOTED:
        raise FieldError(where, "root", f"nothing for {collective} (only {' and '.join(ROOTED)} have a root)", root)
    return version, collective, raw_segments, root


@dataclass(frozen=True)
class _Buffers:
    """The top-level fields every operation is checked against."""

    algorithm: str
    dtype: str
    size: int
    chunks: int
    scratch: int
    output: int
    layout: ChunkLayout | None = None

    @property
    def chunks_of(self) -> ChunkLayout:
        assert self.layout is not None, "the layout is set before operations are parsed"
        return self.layout

    def limits(self) -> dict[str, int]:
        return {"data": self.chunks, "output": self.output, "scratch": self.scratch}


def _parse_buffers(where: str, data: Mapping[str, Any], collective: str, raw_segments: list[Any]) -> _Buffers:
    """``algorithm``, ``dtype``, ``size``, ``chunks``, ``chunk_bytes``, ``scratch_chunks``, ``output_chunks``."""
    algorithm = data.get("algorithm", "custom")
    if not isinstance(algorithm, str) or not algorithm:
        raise FieldError(where, "algorithm", "a non-empty string", algorithm)
    dtype = data.get("dtype", "float32")
    only_p2p = collective == P2P or (collective == MIXED and bool(raw_segments) and all(
        isinstance(seg, Mapping) and seg.get("collective") == P2P for seg in raw_segments))
    dtypes = tuple(DTYPE_BYTES) if only_p2p else ("float32",)
    if not isinstance(dtype, str) or dtype not in dtypes:
        raise FieldError(where, "dtype", " or ".join(repr(d) for d in dtypes) + f" for {collective}", dtype)
    if "size" not in data:
        raise FieldError(where, "size", "a positive size in bytes", "nothing")
    size = parse_size(data["size"], where)
    chunks = int_field(where, "chunks", data.get("chunks", "nothing"), 1, MAX_CHUNKS)
    scratch = int_field(where, "scratch_chunks", data.get("scratch_chunks", 0), 0, MAX_CHUNKS)
    output = int_field(where, "output_chunks", data.get("output_chunks", 0), 0, MAX_CHUNKS)
    return _Buffers(algorithm, dtype, size, chunks, scratch, output)


def _with_layout(where: str, data: Mapping[str, Any], bufs: _Buffers, block: int, equal: bool) -> _Buffers:
    """``bufs`` with its :class:`ChunkLayout`; ``equal``: the chunks must be equal (before version 3, and in a
    schedule of segments)."""
    if equal:
        check_chunking(bufs.size, bufs.chunks, where, bufs.dtype)
    layout = chunk_layout(bufs.size, bufs.chunks, block, where, bufs.dtype)
    if "chunk_bytes" in data and (not layout.equal or data["chunk_bytes"] != layout.largest_bytes):
        expected = (f"{layout.largest_bytes} (size / chunks)" if layout.equal
                    else "nothing (the chunks differ by one element)")
        raise FieldError(where, "chunk_bytes", expected, data["chunk_bytes"])
    return replace(bufs, layout=layout)


def _parse_ranks(where: str, raw_ranks: list[Any], bufs: _Buffers) -> tuple[RankProgram, ...]:
    """Every rank's host and operations."""
    p = len(raw_ranks)
    limits = bufs.limits()
    ranks: list[RankProgram] = []
    seen_hosts: dict[str, int] = {}
    for r, raw in enumerate(raw_ranks):
        path = f"ranks[{r}]"
        if not isinstance(raw, Mapping):
            raise FieldError(where, path, "a mapping with rank, host and ops", raw)
        _reject_unknown(where, f"{path}.", raw, _RANK_KEYS)
        if raw.get("rank") != r or isinstance(raw.get("rank"), bool):
            raise FieldError(where, f"{path}.rank", f"{r} (ranks are listed in order from 0)", raw.get("rank"))
        host = raw.get("host")
        if not isinstance(host, str) or not HOST_RE.match(host):
            raise FieldError(where, f"{path}.host", "a host name such as h1", host)
        if host in seen_hosts:
            raise FieldError(where, f"{path}.host", f"a host not used by another rank (rank {seen_hosts[host]} "
                             "runs there)", host)
        seen_hosts[host] = r
        raw_ops = raw.get("ops")
        if not isinstance(raw_ops, list):
            raise FieldError(where, f"{path}.ops", "a list of operations", raw_ops)
        ops: list[Op] = []
        steps_by_id: dict[int, int] = {}
        for i, rop in enumerate(raw_ops):
            op = _parse_op(where, f"{path}.ops[{i}]", rop, r, p, limits, bufs.chunks_of, steps_by_id)
            steps_by_id[op.id] = op.step
            ops.append(op)
        ranks.append(RankProgram(r, host, tuple(ops)))
    return tuple(ranks)


def _parse_segments(where: str, raw: list[Any], collective: str, p: int, chunks: int,
                    output: int, version: int) -> tuple[Segment, ...]:
    """The segments, each a valid collective on its own disjoint ranges of ``data`` and ``output``."""
    if collective == MIXED and not raw:
        raise FieldError(where, "segments", f"a non-empty list for collective {MIXED}", raw)
    out: list[Segment] = []
    used = {"data": [0] * chunks, "output": [0] * output}
    kinds = set()
    for i, seg in enumerate(raw):
        path = f"segments[{i}]"
        if not isinstance(seg, Mapping):
            raise FieldError(where, path, "a mapping with name, collective, chunk and chunks", seg)
        _reject_unknown(where, f"{path}.", seg, _SEGMENT_KEYS)
        name = seg.get("name", f"segment {i}")
        if not isinstance(name, str) or not name:
            raise FieldError(where, f"{path}.name", "a non-empty string", name)
        kind = seg.get("collective")
        if kind not in COLLECTIVES:
            raise FieldError(where, f"{path}.collective", "one of " + ", ".join(COLLECTIVES), kind)
        kinds.add(kind)
        first = int_field(where, f"{path}.chunk", seg.get("chunk", "nothing"), 0, max(chunks - 1, 0))
        n = int_field(where, f"{path}.chunks", seg.get("chunks", "nothing"), 1, chunks - first)
        n_out = int_field(where, f"{path}.output_chunks", seg.get("output_chunks", 0), 0, output)
        first_out = int_field(where, f"{path}.output_chunk", seg.get("output_chunk", 0), 0, output - n_out)
        root = int_field(where, f"{path}.root", seg.get("root", 0), 0)
        groups = _parse_groups(where, path, seg.get("groups"), p, version)
        for g, group in enumerate(groups or (tuple(range(p)),)):
            problem = Shape(kind, len(group), n, n_out, root).problem()
            if problem is not None:
                of = f" (in group {g}, {len(group)} ranks)" if groups else ""
                raise FieldError(where, f"{path}.{problem[0]}", problem[1] + of, problem[2])
        for buf, lo, count in (("data", first, n), ("output", first_out, n_out)):
            taken = next((c for c in range(lo, lo + count) if used[buf][c]), None)
            if taken is not None:
                raise FieldError(where, f"{path}.{'chunk' if buf == 'data' else 'output_chunk'}",
                                 f"{buf} chunks no other segment uses (chunk {taken} is taken)", lo)
            used[buf][lo:lo + count] = [1] * count
        out.append(Segment(name, kind, first, n, first_out, n_out, root, groups))
    if out:
        expected = kinds.pop() if len(kinds) == 1 else MIXED
        if collective != expected:
            raise FieldError(where, "collective", f"{expected!r} (the segments' collective)", collective)
    return tuple(out)


def _parse_groups(where: str, path: str, raw: object, p: int, version: int) -> tuple[tuple[int, ...], ...]:
    """A segment's process groups: lists of at least two distinct ranks, no rank in two groups."""
    if raw is None:
        return ()
    if version < 3:
        raise FieldError(where, f"{path}.groups", "nothing before version 3 (groups came with version 3)", raw)
    if not isinstance(raw, list) or not raw:
        raise FieldError(where, f"{path}.groups", "a non-empty list of groups, each a list of ranks", raw)
    seen: dict[int, int] = {}
    out = []
    for g, group in enumerate(raw):
        gpath = f"{path}.groups[{g}]"
        if not isinstance(group, list) or len(group) < 2:
            raise FieldError(where, gpath, "a list of at least 2 ranks", group)
        for i, rank in enumerate(group):
            rank = int_field(where, f"{gpath}[{i}]", rank, 0, p - 1)
            if rank in seen:
                raise FieldError(where, f"{gpath}[{i}]", f"a rank in no other group of the segment (group "
                                 f"{seen[rank]} has it)", rank)
            seen[rank] = g
        out.append(tuple(group))
    return tuple(out)


def _parse_op(where: str, path: str, raw: object, rank: int, p: int, bufsize: Mapping[str, int],
              layout: ChunkLayout, steps_by_id: Mapping[int, int]) -> Op:
    if not isinstance(raw, Mapping):
        raise FieldError(where, path, "a mapping with id, kind, chunk, nchunks, bytes, step, deps", raw)
    _reject_unknown(where, f"{path}.", raw, _OP_KEYS)
    op_id = int_field(where, f"{path}.id", raw.get("id", "nothing"))
    if op_id in steps_by_id:
        raise FieldError(where, f"{path}.id", "an id not used by another op of this rank", op_id)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise FieldError(where, f"{path}.kind", f"one of {', '.join(KINDS)}", kind)
    if kind == COMPUTE:
        return _parse_compute(where, path, raw, op_id, steps_by_id)
    peer = raw.get("peer")
    lane = raw.get("lane", 0)
    if kind in COMM_KINDS:
        peer = int_field(where, f"{path}.peer", raw.get("peer", "nothing"), 0, p - 1)
        if peer == rank:
            raise FieldError(where, f"{path}.peer", f"a rank other than the op's own ({rank})", peer)
        lane = int_field(where, f"{path}.lane", lane, 0, MAX_LANES - 1)
    elif peer is not None:
        raise FieldError(where, f"{path}.peer", f"no peer for a {kind} (local) op", peer)
    elif lane != 0:
        raise FieldError(where, f"{path}.lane", f"no lane for a {kind} (local) op", lane)
    buffer = raw.get("buffer", "data")
    if buffer not in BUFFERS:
        raise FieldError(where, f"{path}.buffer", "data, output or scratch", buffer)
    nchunks = int_field(where, f"{path}.nchunks", raw.get("nchunks", 1), 1)
    limit = bufsize[buffer]
    if limit == 0:
        raise FieldError(where, f"{path}.buffer", f"a buffer with chunks ({buffer}_chunks is 0)", buffer)
    chunk = int_field(where, f"{path}.chunk", raw.get("chunk", "nothing"), 0, limit - 1)
    if chunk + nchunks > limit:
        raise FieldError(where, f"{path}.nchunks", f"at most {limit - chunk} (the {buffer} buffer has {limit} "
                         f"chunks, this op starts at chunk {chunk})", nchunks)
    wanted = layout.range_bytes(chunk, nchunks)
    nbytes = raw.get("bytes", wanted)
    if nbytes != wanted or isinstance(nbytes, bool):
        how = (f"nchunks x chunk_bytes {layout.largest_bytes}" if layout.equal
               else f"the bytes of chunks {chunk}..{chunk + nchunks - 1}")
        raise FieldError(where, f"{path}.bytes", f"{wanted} ({how})", nbytes)
    step = int_field(where, f"{path}.step", raw.get("step", "nothing"), 0, MAX_STEPS - 1)
    src = raw.get("src")
    src_chunk = raw.get("src_chunk")
    if kind in LOCAL_KINDS:
        if src not in BUFFERS:
            raise FieldError(where, f"{path}.src", "data, output or scratch (the buffer a local op reads)", src)
        slimit = bufsize[src]
        if slimit == 0:
            raise FieldError(where, f"{path}.src", f"a buffer with chunks ({src}_chunks is 0)", src)
        src_chunk = int_field(where, f"{path}.src_chunk", raw.get("src_chunk", "nothing"), 0, slimit - 1)
        if src_chunk + nchunks > slimit:
            raise FieldError(where, f"{path}.src_chunk", f"at most {slimit - nchunks} (nchunks {nchunks} must fit "
                             f"the {src} buffer of {slimit} chunks)", src_chunk)
        if src == buffer and src_chunk < chunk + nchunks and chunk < src_chunk + nchunks:
            raise FieldError(where, f"{path}.src_chunk", "a source range that does not overlap the target range",
                             src_chunk)
        if layout.range_bytes(src_chunk, nchunks) != wanted:
            raise FieldError(where, f"{path}.src_chunk", f"a source range of {wanted} bytes, as the target's (the "
                             "chunks differ by one element)", src_chunk)
    else:
        for key in ("src", "src_chunk"):
            if raw.get(key) is not None:
                raise FieldError(where, f"{path}.{key}", f"nothing for a {kind} op (only reduce and copy read a "
                                 "second buffer)", raw.get(key))
    deps = _parse_deps(where, path, raw, step, steps_by_id)
    return Op(id=op_id, kind=kind, chunk=chunk, nchunks=nchunks, bytes=nbytes, step=step, peer=peer,
              buffer=buffer, src=src if kind in LOCAL_KINDS else None,
              src_chunk=src_chunk if kind in LOCAL_KINDS else None, deps=deps, lane=lane)


def _parse_deps(where: str, path: str, raw: Mapping[str, Any], step: int,
                steps_by_id: Mapping[int, int]) -> tuple[int, ...]:
    deps = raw.get("deps", [])
    if not isinstance(deps, list):
        raise FieldError(where, f"{path}.deps", "a list of op ids", deps)
    for j, dep in enumerate(deps):
        if isinstance(dep, bool) or not isinstance(dep, int) or dep not in steps_by_id:
            raise FieldError(where, f"{path}.deps[{j}]", "the id of an earlier op of the same rank", dep)
        if steps_by_id[dep] > step:
            raise FieldError(where, f"{path}.step", f"at least {steps_by_id[dep]} (the step of dependency {dep})",
                             step)
    return tuple(deps)


def _parse_compute(where: str, path: str, raw: Mapping[str, Any], op_id: int,
                   steps_by_id: Mapping[int, int]) -> Op:
    """A ``compute`` op: ``seconds`` of local work (real time, before dilation), touching no buffer."""
    for key in raw:
        if key not in _COMPUTE_KEYS:
            raise FieldError(where, f"{path}.{key}", "only id, kind, seconds, step and deps for a compute op",
                             f"key {key}")
    seconds = raw.get("seconds", "nothing")
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
            or not 0 <= seconds <= MAX_COMPUTE_S):
        raise FieldError(where, f"{path}.seconds", f"a duration of 0 to {MAX_COMPUTE_S:g} seconds", seconds)
    step = int_field(where, f"{path}.step", raw.get("step", "nothing"), 0, MAX_STEPS - 1)
    deps = _parse_deps(where, path, raw, step, steps_by_id)
    return Op(id=op_id, kind=COMPUTE, chunk=0, nchunks=0, bytes=0, step=step, deps=deps, seconds=float(seconds))


def compute_op(op_id: int, seconds: float, step: int, deps: Iterable[int] = ()) -> Op:
    """A ``compute`` operation (what generators and importers build)."""
    return Op(id=op_id, kind=COMPUTE, chunk=0, nchunks=0, bytes=0, step=step, deps=tuple(deps), seconds=seconds)


def validate(schedule: Schedule, where: str = "schedule") -> Schedule:
    """Re-validate a schedule built in Python (round trip through :func:`from_dict`)."""
    return from_dict(schedule.to_dict(), where)


def check_hosts(schedule: Schedule, topo: Any, where: str = "schedule") -> None:
    """Raise :class:`FieldError` unless every rank's host exists in the topology."""
    for r in schedule.ranks:
        if not topo.is_host(r.host):
            raise FieldError(where, f"ranks[{r.rank}].host", f"a host of {topo.spec} (h1..h{len(topo.hosts)})",
                             r.host)


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    pass


class _FlowMap(dict):
    pass


_Dumper.add_representer(_FlowMap, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(),
                                                                       flow_style=True))


def dumps(schedule: Schedule, fmt: str = "yaml") -> str:
    """The schedule as YAML (one op per line) or JSON text."""
    data = schedule.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=1) + "\n"
    for r in data["ranks"]:
        r["ops"] = [_FlowMap(op) for op in r["ops"]]
    header = f"# {FORMAT_NAME} version {FORMAT_VERSION}; see docs/schedule-format.md\n"
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=200)


def save(schedule: Schedule, path: str) -> None:
    """Write the schedule atomically; ``.json`` files get JSON, anything else YAML."""
    write_atomic(path, dumps(schedule, format_of(path)))


def loads(text: str, where: str = "schedule", fmt: str = "yaml") -> Schedule:
    return from_dict(parse_text(text, where, fmt), where)


def load(path: str) -> Schedule:
    """Read and validate a schedule file (YAML, or JSON when the name ends in ``.json``)."""
    where = f"schedule {path!r}"
    return from_dict(read_document(path, where), where)


# ---------------------------------------------------------------------------
# Building helpers (used by the generators and importers)
# ---------------------------------------------------------------------------

def rank_view(schedule: Schedule, rank: int) -> Schedule:
    """The schedule as one rank's agent needs it: every field, but only ``rank``'s operations.

    A 64-rank training iteration has ~90,000 operations; 64 agents each parsing all of them took minutes to
    start, so the replay writes each agent its view (:meth:`emulator.emulation.agents.fleet.AgentFiles.write_schedule`).
    """
    return with_ops(schedule, [r.ops if r.rank == rank else () for r in schedule.ranks])


def with_ops(schedule: Schedule, ops_by_rank: Iterable[Iterable[Op]]) -> Schedule:
    ranks = tuple(RankProgram(r.rank, r.host, tuple(ops)) for r, ops in zip(schedule.ranks, ops_by_rank, strict=True))
    return replace(schedule, ranks=ranks)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def log2_exact(n: int) -> int:
    return int(math.log2(n)) if is_power_of_two(n) else -1

