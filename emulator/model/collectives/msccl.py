"""Import MSCCL XML algorithms (msccl-tools, the MSCCL runtimes of NCCL and RCCL) into our schedule format.

The file
    ``<algo name proto nchannels nchunksperloop ngpus coll inplace ...>``
    holding ``<gpu id i_chunks o_chunks s_chunks>``, each holding threadblocks
    ``<tb id send recv chan>`` (``send``/``recv``: the peer gpus, -1 for none;
    ``chan``: the channel), each a list of
    ``<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep>``.
    Required: ``coll``, ``ngpus``, ``nchunksperloop``, ``nchannels``,
    ``inplace`` and ``proto`` (``LL``, ``LL128`` or ``Simple``) of the algo;
    ``id``, ``i_chunks``, ``o_chunks``, ``s_chunks`` of a gpu; ``id``,
    ``send``, ``recv``, ``chan`` of a threadblock; ``s`` and ``type`` of a
    step, and the buffer, offset and ``cnt`` its type uses. ``depid``
    (default -1), ``deps`` and ``hasdep`` (default 0) are optional, as are
    ``name``, ``outofplace``, ``minBytes`` and ``maxBytes`` (recorded).
    The sends of each (sender, receiver, channel) must be as many as its
    receives (the runtime would wait forever for the others).

Collectives (``coll``)
    ``allreduce``, ``allgather``, ``alltoall``, ``reducescatter`` (also
    msccl-tools' spelling ``reduce_scatter``), ``broadcast`` and ``reduce``.
    The runtime's other values (``send``, ``recv``, ``gather``, ``scatter``,
    ``alltoallv``) have no :class:`~emulator.model.schedule.semantics.Shape` and
    are refused. A broadcast's root is the one gpu with no receiving step, a
    reduce's the one gpu with no sending step.

Buffers
    ``nchunksperloop`` (``C``) counts chunks of the larger of the
    collective's buffers, as the runtime's ``sizePerMscclChunk`` does: MSCCL
    input ``i`` and output ``o`` have ``C`` chunks, except allgather's input
    and reduce_scatter's output, which have ``C/ngpus`` (``k``). With
    ``inplace="1"`` both are our ``data`` (``C`` chunks): ``i`` chunk ``j`` is
    ``data`` chunk ``j``, except allgather's, which is ``data`` chunk
    ``rank·k + j``; ``o`` chunk ``j`` is ``data`` chunk ``j``, except
    reduce_scatter's, which is ``data`` chunk ``rank·k + j`` (NCCL's
    in-place layouts, as msccl-tools' ``get_buffer_index``). With
    ``inplace="0"`` ``i`` is ``data`` and ``o`` is ``output``. ``s`` is
    ``scratch`` at the same offset. A gpu's ``i_chunks``, ``o_chunks`` and
    ``s_chunks`` bound the offsets of its steps (every chunk a step names
    must lie inside them) and must fit the collective's buffers. The
    schedule's ``size`` is the bytes of ``data`` (the input of an
    out-of-place collective).

Step types (``src``/``dst``: the buffer and chunks ``srcbuf``/``srcoff`` and ``dstbuf``/``dstoff``, ``cnt`` chunks)
    ==========  ==================================================================
    ``s``       send ``src`` to the threadblock's send peer
    ``r``       receive from the recv peer into ``dst``
    ``rcs``     receive into ``dst``, then send ``dst`` on
    ``rrc``     copy ``src`` to ``dst`` (unless the same), recv_reduce into ``dst``
    ``rrcs``    as ``rrc``, then send ``dst``
    ``rrs``     copy ``src`` to fresh scratch chunks, recv_reduce into them, send them
    ``cpy``     copy ``src`` to ``dst``; dropped when they are the same chunks
    ``re``      reduce: ``dst += src``
    ``nop``     no op (``cnt`` and offsets are ignored); its dependency holds
    ==========  ==================================================================

    Partly overlapping ``src`` and ``dst``, and an ``re`` onto itself, are
    errors.

Order and dependencies (per gpu)
    A threadblock runs its steps in order, and ``depid``/``deps`` make a step
    wait for step ``deps`` of threadblock ``depid`` of the same gpu. The
    runtime signals dependents only after steps with ``hasdep="1"`` (a flag
    that counts up), so a dependency is kept waiting forever unless its step,
    or a later one of its threadblock, has ``hasdep="1"``: that is an error.
    A gpu's steps are listed in a topological order of these edges (a cycle
    is an error), smallest ``(s, threadblock id)`` first among the steps that
    may go next. An op waits for the ops that complete the steps before it:
    a receive completes its step, a send does not (MSCCL sends are buffered,
    our model is rendezvous), a ``nop`` passes its own dependencies on. The
    data hazards of the resulting list are added
    (:func:`~emulator.model.schedule.deps.derive_deps`).

Channels and lanes
    MSCCL connects a gpu to a peer once per channel, and a message's receive
    is the one at the same position in the FIFO of its (sender, receiver,
    channel). An op's ``lane`` is its threadblock's ``chan``. When several
    threadblocks of a gpu send to (or receive from) the same peer on the same
    channel they share that connection: their messages are one lane, in the
    gpu's step order above, and the k-th send in the sender's order matches
    the k-th receive in the receiver's (the proof says whether that is the
    algorithm the file meant). msccl-tools never emits such files.

Instances
    ``instances`` (an argument; the file does not say) replicates the
    algorithm as msccl-tools' ``replicate`` does with its default
    interleaved policy: instance ``i`` of threadblock ``t`` becomes
    threadblock ``t·I + i`` on channel ``chan + nchannels·i`` (its own
    connections), its dependencies point to instance ``i`` of their steps,
    ``i``/``o`` chunk ``j`` becomes chunk ``j·I + i`` (instance ``i`` works on
    slice ``i`` of every chunk) and ``s`` chunk ``j`` becomes
    ``j + s_chunks·i``; ``nchunksperloop``, ``nchannels`` and the chunk
    counts are multiplied by ``I``. A step of ``cnt`` > 1 becomes ``cnt``
    steps of one chunk (msccl-tools' ``index·I + i·cnt`` agrees for
    ``cnt`` = 1, the only count it supports on ``i``/``o``), its dependency on
    the first, its dependents waiting for the last. ``nchannels·I`` must not
    exceed 64 lanes.

Gpu ``g`` becomes rank ``g`` on host ``h(g+1)``. Steps of the schedule are the
rounds of the symbolic execution (:func:`emulator.model.schedule.executor.execute`).
``meta["msccl"]`` records the file's name, protocol, channels and the
instances (the protocol changes nothing here).

Every bad input raises one :class:`~emulator.base.errors.FieldError` whose field is
the XML path of the attribute, elements indexed by their position among their
siblings from 0: ``algo@coll``, ``gpu[3]@s_chunks``, ``gpu[3].tb[2]@chan``,
``gpu[3].tb[2].step[5]@type``.
"""

from __future__ import annotations

import heapq
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import networkx as nx

from emulator.base.errors import FieldError, UserError
from emulator.model.schedule.deps import derive_deps
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import (
    COPY,
    MAX_CHUNKS,
    MAX_LANES,
    MAX_RANKS,
    RECV,
    RECV_REDUCE,
    REDUCE,
    SEND,
    Op,
    RankProgram,
    Schedule,
    check_chunking,
)
from emulator.model.schedule.semantics import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE_SCATTER,
    REDUCE_TO_ROOT,
    Shape,
)

STEP_TYPES = ("s", "r", "rcs", "rrc", "rrcs", "rrs", "cpy", "re", "nop")
SENDING = frozenset({"s", "rcs", "rrcs", "rrs"})
RECEIVING = frozenset({"r", "rcs", "rrc", "rrcs", "rrs"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
PROTOCOLS = ("LL", "LL128", "Simple")
#: ``coll`` values and our collectives.
COLLS = {"allreduce": ALLREDUCE, "allgather": ALLGATHER, "alltoall": ALLTOALL, "reducescatter": REDUCE_SCATTER,
         "reduce_scatter": REDUCE_SCATTER, "broadcast": BROADCAST, "reduce": REDUCE_TO_ROOT}
MSCCL_BUFFERS = ("i", "o", "s")
DEFAULT_TARGET_SIZE = 1 << 20
#: An integer attribute as the runtime's ``strtol`` reads it (ASCII digits), at most 12 of them.
_INT_RE = re.compile(r"\s*[+-]?[0-9]{1,12}\s*")


# ---------------------------------------------------------------------------
# The file as data
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Loc:
    """A buffer (``i``, ``o`` or ``s``) and a chunk offset in it."""

    buf: str
    off: int


@dataclass(frozen=True)
class Step:
    """One ``<step>``; ``src``/``dst`` only where its type uses them; ``dep`` is ``(tb id, step)``."""

    path: str
    kind: str
    cnt: int
    src: Loc | None
    dst: Loc | None
    dep: tuple[int, int] | None
    hasdep: bool


@dataclass(frozen=True)
class Threadblock:
    """One ``<tb>``: its peers (-1 for none), its channel and its steps in order."""

    path: str
    tid: int
    send: int
    recv: int
    chan: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Gpu:
    """One ``<gpu>``: the chunks of its buffers ``i``, ``o``, ``s`` and its threadblocks, by id."""

    path: str
    rank: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[Threadblock, ...]

    def limit(self, buf: str) -> int:
        """The chunks of MSCCL buffer ``buf`` this gpu declares."""
        return {"i": self.i_chunks, "o": self.o_chunks}.get(buf, self.s_chunks)


@dataclass(frozen=True)
class Header:
    """The ``<algo>`` element's attributes (``coll`` as the file spells it)."""

    name: str
    coll: str
    ngpus: int
    nchunks: int
    nchannels: int
    inplace: bool
    proto: str
    outofplace: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None

    @property
    def collective(self) -> str:
        return COLLS[self.coll]


@dataclass(frozen=True)
class Algo:
    """A whole file's algorithm, its gpus by id; ``instances`` counts the replicas it holds."""

    header: Header
    gpus: tuple[Gpu, ...]
    instances: int = 1


@dataclass(frozen=True)
class Meta:
    """What ``meta["msccl"]`` records of the file."""

    source: str
    name: str
    coll: str
    proto: str
    nchannels: int
    instances: int
    lanes: int
    inplace: bool
    outofplace: int | None
    min_bytes: int | None
    max_bytes: int | None


# ---------------------------------------------------------------------------
# Reading attributes
# ---------------------------------------------------------------------------

class _Elem:
    """One XML element and its path, with checked attribute readers."""

    def __init__(self, where: str, path: str, elem: ET.Element):
        self.where, self.path, self.elem = where, path, elem

    def error(self, name: str, expected: str, given: object) -> FieldError:
        return FieldError(self.where, f"{self.path}@{name}", expected, given)

    def integer(self, name: str, minimum: int, maximum: int | None = None, default: int | None = None) -> int:
        raw = self.elem.get(name)
        if raw is None:
            if default is not None:
                return default
            raise self.error(name, "an integer attribute", "nothing")
        expected = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum}"
        if not _INT_RE.fullmatch(raw):
            raise self.error(name, expected, raw)
        value = int(raw)
        if value < minimum or (maximum is not None and value > maximum):
            raise self.error(name, expected, raw)
        return value

    def choice(self, name: str, options: Iterable[str]) -> str:
        raw = self.elem.get(name)
        allowed = tuple(options)
        if raw not in allowed:
            raise self.error(name, "one of " + ", ".join(allowed), raw if raw is not None else "nothing")
        return raw


# ---------------------------------------------------------------------------
# Parsing and checking the file
# ---------------------------------------------------------------------------

def _header(where: str, root: ET.Element) -> Header:
    if root.tag != "algo":
        raise FieldError(where, "root element", "<algo>", f"<{root.tag}>")
    e = _Elem(where, "algo", root)
    coll = root.get("coll")
    if coll not in COLLS:
        raise e.error("coll", "one of " + ", ".join(COLLS) + " (no collective of ours matches the runtime's "
                      "send, recv, gather, scatter or alltoallv)", coll if coll is not None else "nothing")
    ngpus = e.integer("ngpus", 2, MAX_RANKS)
    nchunks = e.integer("nchunksperloop", 1, MAX_CHUNKS)
    if COLLS[coll] in (ALLGATHER, REDUCE_SCATTER, ALLTOALL) and nchunks % ngpus:
        raise e.error("nchunksperloop", f"a multiple of ngpus ({ngpus}) for {coll}", nchunks)
    optional = [e.integer(k, 0, default=-1) for k in ("outofplace", "minBytes", "maxBytes")]
    outofplace, min_bytes, max_bytes = (None if v < 0 else v for v in optional)
    return Header(name=root.get("name", "unnamed"), coll=coll, ngpus=ngpus, nchunks=nchunks,
                  nchannels=e.integer("nchannels", 1, MAX_LANES), inplace=e.integer("inplace", 0, 1) == 1,
                  proto=e.choice("proto", PROTOCOLS), outofplace=outofplace, min_bytes=min_bytes,
                  max_bytes=max_bytes)


def parse(root: ET.Element, where: str) -> Algo:
    """The algorithm of an ``<algo>`` element, every attribute checked (see the module docstring)."""
    header = _header(where, root)
    layout = Layout.of(header)
    gpus: list[Gpu | None] = [None] * header.ngpus
    for n, elem in enumerate(root.findall("gpu")):
        rank = _Elem(where, f"gpu[{n}]", elem).integer("id", 0, header.ngpus - 1)
        if gpus[rank] is not None:
            raise FieldError(where, f"gpu[{n}]@id", "a gpu id used once", rank)
        gpus[rank] = _gpu(where, f"gpu[{n}]", elem, header, layout)
    missing = [r for r, g in enumerate(gpus) if g is None]
    if missing:
        raise FieldError(where, "algo", f"one <gpu> for each id 0..{header.ngpus - 1} (ngpus={header.ngpus})",
                         f"none with id {missing[0]}")
    algo = Algo(header, tuple(g for g in gpus if g is not None))
    _check_connections(where, algo)
    return algo


def _gpu(where: str, gpath: str, elem: ET.Element, header: Header, layout: Layout) -> Gpu:
    e = _Elem(where, gpath, elem)
    rank = e.integer("id", 0, header.ngpus - 1)
    counts = {}
    for name, buf in (("i_chunks", "i"), ("o_chunks", "o")):
        most = layout.msccl_chunks(buf)
        counts[name] = e.integer(name, 0, most)
    counts["s_chunks"] = e.integer("s_chunks", 0, MAX_CHUNKS)
    gpu = Gpu(gpath, rank, counts["i_chunks"], counts["o_chunks"], counts["s_chunks"], ())
    tbs = tuple(_threadblock(where, f"{gpath}.tb[{t}]", tb, gpu, header) for t, tb in enumerate(elem.findall("tb")))
    seen: set[int] = set()
    for tb in tbs:
        if tb.tid >= len(tbs) or tb.tid in seen:
            raise FieldError(where, f"{tb.path}@id", f"the threadblock ids 0..{len(tbs) - 1} once each (the "
                             "runtime's rule)", tb.tid)
        seen.add(tb.tid)
    gpu = replace(gpu, tbs=tuple(sorted(tbs, key=lambda tb: tb.tid)))
    _check_deps(where, gpu)
    return gpu


def _threadblock(where: str, tpath: str, elem: ET.Element, gpu: Gpu, header: Header) -> Threadblock:
    e = _Elem(where, tpath, elem)
    tid = e.integer("id", 0, 10**6)
    peers = []
    for name in ("send", "recv"):
        peer = e.integer(name, -1, header.ngpus - 1)
        if peer == gpu.rank:
            raise e.error(name, f"-1 or a gpu other than this one ({gpu.rank}) in 0..{header.ngpus - 1}", peer)
        peers.append(peer)
    chan = e.integer("chan", 0, header.nchannels - 1)
    tb = Threadblock(tpath, tid, peers[0], peers[1], chan, ())
    steps = tuple(_step(where, f"{tpath}.step[{k}]", k, s, tb, gpu) for k, s in enumerate(elem.findall("step")))
    return replace(tb, steps=steps)


def _step(where: str, spath: str, k: int, elem: ET.Element, tb: Threadblock, gpu: Gpu) -> Step:
    e = _Elem(where, spath, elem)
    if e.integer("s", 0) != k:
        raise e.error("s", f"{k} (steps numbered in order from 0)", elem.get("s"))
    kind = e.choice("type", STEP_TYPES)
    if kind in SENDING and tb.send < 0:
        raise e.error("type", f"a step that sends nothing (threadblock {tb.tid} has send=-1)", kind)
    if kind in RECEIVING and tb.recv < 0:
        raise e.error("type", f"a step that receives nothing (threadblock {tb.tid} has recv=-1)", kind)
    cnt = 0 if kind == "nop" else e.integer("cnt", 1, MAX_CHUNKS)
    src = _loc(e, "src", cnt, gpu) if kind in READS_SRC else None
    dst = _loc(e, "dst", cnt, gpu) if kind in WRITES_DST else None
    depid = e.integer("depid", -1, default=-1)
    dep = (depid, e.integer("deps", 0)) if depid >= 0 else None
    hasdep = e.integer("hasdep", 0, 1, default=0) == 1
    return Step(spath, kind, cnt, src, dst, dep, hasdep)


def _loc(e: _Elem, which: str, cnt: int, gpu: Gpu) -> Loc:
    buf = e.choice(f"{which}buf", MSCCL_BUFFERS)
    limit = gpu.limit(buf)
    off = e.integer(f"{which}off", 0)
    if off + cnt > limit:
        name = {"i": "i_chunks", "o": "o_chunks"}.get(buf, "s_chunks")
        raise e.error(f"{which}off", f"an offset in 0..{limit - cnt} ({cnt} chunks must fit the {limit} of buffer "
                      f"{buf}, {name} of gpu {gpu.rank})", off)
    return Loc(buf, off)


def _check_deps(where: str, gpu: Gpu) -> None:
    """Every ``depid``/``deps`` names a step of this gpu at or before one with ``hasdep="1"`` in its threadblock."""
    for tb in gpu.tbs:
        for step in tb.steps:
            if step.dep is None:
                continue
            depid, deps = step.dep
            if depid >= len(gpu.tbs):
                raise FieldError(where, f"{step.path}@depid", f"-1 or a threadblock id of this gpu (0.."
                                 f"{len(gpu.tbs) - 1})", depid)
            other = gpu.tbs[depid].steps
            if deps >= len(other):
                raise FieldError(where, f"{step.path}@deps", f"a step of threadblock {depid} (0..{len(other) - 1})",
                                 deps)
            if not any(s.hasdep for s in other[deps:]):
                raise FieldError(where, f"{step.path}@deps", f"a step of threadblock {depid} at or before one with "
                                 "hasdep=1 (MSCCL signals dependents only from those: this would wait forever)", deps)


def _check_connections(where: str, algo: Algo) -> None:
    """Every (sender, receiver, channel) carries as many sends as receives (else the runtime waits forever)."""
    count: dict[tuple[int, int, int, bool], int] = {}
    first: dict[tuple[int, int, int, bool], str] = {}
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for sends, kinds in ((True, SENDING), (False, RECEIVING)):
                n = sum(step.kind in kinds for step in tb.steps)
                if n:
                    key = (gpu.rank, tb.send, tb.chan, True) if sends else (tb.recv, gpu.rank, tb.chan, False)
                    count[key] = count.get(key, 0) + n
                    first.setdefault(key, f"{tb.path}@{'send' if sends else 'recv'}")
    for (a, b, chan, sends), n in count.items():
        other = count.get((a, b, chan, not sends), 0)
        if n != other:
            me, peer, verb, theirs = (a, b, "sends to", "receives from") if sends else (b, a, "receives from",
                                                                                        "sends to")
            raise FieldError(where, first[(a, b, chan, sends)], f"a gpu that {verb} gpu {peer} on channel {chan} "
                             f"as many messages as gpu {peer} {theirs} it there ({other})",
                             f"gpu {me} with {n} messages")


# ---------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where MSCCL's buffers lie in ours (see the module docstring); sizes in chunks."""

    collective: str
    inplace: bool
    p: int
    nchunks: int

    @staticmethod
    def of(header: Header) -> Layout:
        return Layout(header.collective, header.inplace, header.ngpus, header.nchunks)

    @property
    def block(self) -> int:
        return self.nchunks // self.p

    def per_rank(self, buf: str) -> bool:
        """Whether MSCCL buffer ``buf`` is one rank's block: allgather's input, reduce_scatter's output."""
        return (self.collective == ALLGATHER and buf == "i") or (self.collective == REDUCE_SCATTER and buf == "o")

    def msccl_chunks(self, buf: str) -> int:
        """The chunks of MSCCL buffer ``i`` or ``o``."""
        return self.block if self.per_rank(buf) else self.nchunks

    @property
    def chunks(self) -> int:
        return self.nchunks if self.inplace else self.msccl_chunks("i")

    @property
    def output_chunks(self) -> int:
        return 0 if self.inplace else self.msccl_chunks("o")

    def place(self, rank: int, loc: Loc) -> tuple[str, int]:
        """Our buffer and chunk for MSCCL chunk ``loc`` of gpu ``rank``."""
        if loc.buf == "s":
            return "scratch", loc.off
        if not self.inplace:
            return ("data" if loc.buf == "i" else "output"), loc.off
        if self.per_rank(loc.buf):
            return "data", rank * self.block + loc.off
        return "data", loc.off


# ---------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------

def replicate(algo: Algo, instances: int, where: str) -> Algo:
    """``algo`` replicated ``instances`` times (see the module docstring); checks the lanes and chunks fit."""
    if instances == 1:
        return algo
    h = algo.header
    if h.nchannels * instances > MAX_LANES:
        raise FieldError(where, "instances", f"at most {MAX_LANES // h.nchannels} ({h.nchannels} channels each, at "
                         f"most {MAX_LANES} lanes in all)", instances)
    most = max([h.nchunks] + [g.s_chunks for g in algo.gpus])
    if most * instances > MAX_CHUNKS:
        raise FieldError(where, "instances", f"at most {MAX_CHUNKS // most} (at most {MAX_CHUNKS} chunks per "
                         "buffer)", instances)
    gpus = tuple(_replicate_gpu(g, h.nchannels, instances) for g in algo.gpus)
    header = replace(h, nchunks=h.nchunks * instances, nchannels=h.nchannels * instances)
    return Algo(header, gpus, instances)


def _replicate_gpu(gpu: Gpu, nchannels: int, instances: int) -> Gpu:
    # per threadblock, the index of the last part of each step once steps of cnt > 1 are split
    ends = [_part_ends(tb.steps) for tb in gpu.tbs]
    tbs = []
    for tb, end in zip(gpu.tbs, ends, strict=True):
        for i in range(instances):
            steps: list[Step] = []
            for step in tb.steps:
                steps += _replicate_step(step, gpu.s_chunks, instances, i, ends)
            assert len(steps) == (end[-1] + 1 if end else 0)
            tbs.append(Threadblock(tb.path, tb.tid * instances + i, tb.send, tb.recv, tb.chan + nchannels * i,
                                   tuple(steps)))
    return Gpu(gpu.path, gpu.rank, gpu.i_chunks * instances, gpu.o_chunks * instances, gpu.s_chunks * instances,
               tuple(sorted(tbs, key=lambda tb: tb.tid)))


def _part_ends(steps: tuple[Step, ...]) -> list[int]:
    out, n = [], 0
    for step in steps:
        n += max(step.cnt, 1)
        out.append(n - 1)
    return out


def _replicate_step(step: Step, s_chunks: int, instances: int, i: int, ends: list[list[int]]) -> list[Step]:
    """Instance ``i`` of one step: ``cnt`` one-chunk steps (one step for ``nop`` and ``cnt`` = 1)."""

    def moved(loc: Loc | None, j: int) -> Loc | None:
        if loc is None:
            return None
        if loc.buf == "s":
            return Loc("s", loc.off + j + s_chunks * i)
        return Loc(loc.buf, (loc.off + j) * instances + i)

    dep = None if step.dep is None else (step.dep[0] * instances + i, ends[step.dep[0]][step.dep[1]])
    parts = max(step.cnt, 1)
    return [Step(step.path, step.kind, min(step.cnt, 1), moved(step.src, j), moved(step.dst, j),
                 dep if j == 0 else None, step.hasdep) for j in range(parts)]


# ---------------------------------------------------------------------------
# Steps to operations
# ---------------------------------------------------------------------------

Node = tuple[int, int]  # (threadblock id, step index)


def _predecessors(gpu: Gpu) -> dict[Node, list[Node]]:
    """What each step waits for: the step before it in its threadblock, and its ``depid``/``deps``."""
    preds: dict[Node, list[Node]] = {}
    for tb in gpu.tbs:
        for k, step in enumerate(tb.steps):
            mine = [(tb.tid, k - 1)] if k else []
            if step.dep is not None:
                mine.append(step.dep)
            preds[(tb.tid, k)] = mine
    return preds


def _step_order(where: str, gpu: Gpu, preds: dict[Node, list[Node]]) -> list[Node]:
    """The steps in topological order, smallest ``(step, threadblock id)`` first; a cycle is an error."""
    succs: dict[Node, list[Node]] = {n: [] for n in preds}
    waiting = {n: len(ps) for n, ps in preds.items()}
    for n, ps in preds.items():
        for q in ps:
            succs[q].append(n)
    heap = [(s, t) for (t, s), w in waiting.items() if w == 0]
    heapq.heapify(heap)
    order: list[Node] = []
    while heap:
        s, t = heapq.heappop(heap)
        order.append((t, s))
        for n in succs[(t, s)]:
            waiting[n] -= 1
            if waiting[n] == 0:
                heapq.heappush(heap, (n[1], n[0]))
    if len(order) < len(preds):
        raise _cycle_error(where, gpu, preds, set(order))
    return order


def _cycle_error(where: str, gpu: Gpu, preds: dict[Node, list[Node]], done: set[Node]) -> FieldError:
    graph = nx.DiGraph((q, n) for n, ps in preds.items() if n not in done for q in ps if q not in done)
    cycle = [n for n, _ in nx.find_cycle(graph)]
    names = " -> ".join(f"tb {t} step {s}" for t, s in cycle + cycle[:1])
    t, s = next(n for n in cycle if gpu.tbs[n[0]].steps[n[1]].dep is not None)
    return FieldError(where, f"{gpu.tbs[t].steps[s].path}@deps", "no dependency cycle between the steps of a gpu",
                      f"the cycle {names}")


class _GpuOps:
    """The ops of one gpu as its steps are converted, each with its program-order predecessors.

    ``scratch_next`` is the first scratch chunk ``rrs`` steps may take afresh
    (every gpu's declared scratch lies below it).
    """

    def __init__(self, rank: int, layout: Layout, chunk_bytes: int, scratch_next: int):
        self.rank, self.layout, self.chunk_bytes = rank, layout, chunk_bytes
        self.scratch_next = scratch_next
        self.ops: list[Op] = []
        self.extra: list[list[int]] = []

    def add(self, kind: str, target: tuple[str, int], n: int, preds: list[int], peer: int | None = None,
            lane: int = 0, src: tuple[str, int] | None = None) -> int:
        """Append an op of ``n`` chunks after the ops ``preds``; return its index."""
        self.ops.append(Op(id=len(self.ops), kind=kind, chunk=target[1], nchunks=n, bytes=n * self.chunk_bytes,
                           step=0, peer=peer, buffer=target[0], src=src[0] if src else None,
                           src_chunk=src[1] if src else None, lane=lane))
        self.extra.append(list(preds))
        return len(self.ops) - 1

    def place(self, loc: Loc | None) -> tuple[str, int]:
        assert loc is not None  # parse() reads the locations a step's type uses
        return self.layout.place(self.rank, loc)

    def step(self, where: str, step: Step, tb: Threadblock, preds: list[int]) -> list[int]:
        """Emit the ops of one step (see the module docstring) after the ops ``preds``.

        Returns the ops that complete the step, which the steps after it wait
        for: none of its own for ``nop``, ``s`` and a dropped ``cpy``, else
        its receive or local op.
        """
        kind, n, lane = step.kind, step.cnt, tb.chan
        if kind == "nop":
            return preds
        if kind == "s":
            self.add(SEND, self.place(step.src), n, preds, tb.send, lane)
            return preds  # sends are buffered in MSCCL: later steps need not wait for them
        if kind in ("r", "rcs"):
            dst = self.place(step.dst)
            a = self.add(RECV, dst, n, preds, tb.recv, lane)
            if kind == "rcs":
                self.add(SEND, dst, n, [a], tb.send, lane)
            return [a]
        if kind == "rrs":
            return [self._rrs(where, step, tb, preds)]
        src, dst = self.place(step.src), self.place(step.dst)
        same = _same_or_apart(where, step, src, dst)
        if kind in ("rrc", "rrcs"):
            if not same:
                preds = [self.add(COPY, dst, n, preds, src=src)]
            a = self.add(RECV_REDUCE, dst, n, preds, tb.recv, lane)
            if kind == "rrcs":
                self.add(SEND, dst, n, [a], tb.send, lane)
            return [a]
        if kind == "cpy":
            return preds if same else [self.add(COPY, dst, n, preds, src=src)]
        if same:
            raise FieldError(where, f"{step.path}@srcoff", "a source other than the destination (re adds src "
                             "into dst)", step.src.off if step.src else None)
        return [self.add(REDUCE, dst, n, preds, src=src)]

    def _rrs(self, where: str, step: Step, tb: Threadblock, preds: list[int]) -> int:
        """``rrs``: copy ``src`` to fresh scratch, recv_reduce into it, send it on; returns the receive."""
        tmp = ("scratch", self.scratch_next)
        self.scratch_next += step.cnt
        if self.scratch_next > MAX_CHUNKS:
            raise FieldError(where, f"{step.path}@cnt", f"rrs steps that need at most {MAX_CHUNKS} scratch chunks "
                             "in all", step.cnt)
        a = self.add(COPY, tmp, step.cnt, preds, src=self.place(step.src))
        b = self.add(RECV_REDUCE, tmp, step.cnt, [a], tb.recv, tb.chan)
        self.add(SEND, tmp, step.cnt, [b], tb.send, tb.chan)
        return b


def _same_or_apart(where: str, step: Step, src: tuple[str, int], dst: tuple[str, int]) -> bool:
    """Whether ``src`` and ``dst`` (``step.cnt`` chunks each) are the same chunks; partial overlap is an error."""
    if src == dst:
        return True
    if src[0] == dst[0] and src[1] < dst[1] + step.cnt and dst[1] < src[1] + step.cnt:
        raise FieldError(where, f"{step.path}@srcoff", f"a source that is the destination (chunk {dst[1]} of "
                         f"{dst[0]}) or does not overlap it ({step.cnt} chunks)", step.src.off if step.src else None)
    return False


def _convert_gpu(where: str, gpu: Gpu, layout: Layout, chunk_bytes: int,
                 scratch_base: int) -> tuple[list[Op], int]:
    """The ops of one gpu with their dependencies, and the scratch chunks they need."""
    preds = _predecessors(gpu)
    out = _GpuOps(gpu.rank, layout, chunk_bytes, scratch_base)
    done: dict[Node, list[int]] = {}  # step -> op indices that complete it
    for node in _step_order(where, gpu, preds):
        tb = gpu.tbs[node[0]]
        waits = sorted({i for q in preds[node] for i in done[q]})
        done[node] = out.step(where, tb.steps[node[1]], tb, waits)
    return derive_deps(out.ops, out.extra), out.scratch_next


# ---------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------

def default_size(chunks: int) -> int:
    """The smallest size >= 1 MiB that splits into ``chunks`` float32 chunks."""
    unit = 4 * chunks
    return -(-DEFAULT_TARGET_SIZE // unit) * unit


def load(path: str, size: int | None = None, *, instances: int = 1) -> Schedule:
    """Read an MSCCL XML algorithm and convert it (see the module docstring).

    ``size`` is the bytes of each rank's ``data`` buffer (default: about
    1 MiB); ``instances`` replicates the algorithm as msccl-tools does.
    """
    where = f"MSCCL file {path!r}"
    try:
        root = ET.parse(path).getroot()
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    except (ET.ParseError, LookupError, ValueError) as exc:  # LookupError: an unknown encoding="..."
        raise UserError(f"{where}: not valid XML ({' '.join(str(exc).split())})") from None
    return from_xml(root, where, size, instances=instances, source=os.path.basename(path))


def from_xml(root: ET.Element, where: str, size: int | None = None, *, instances: int = 1,
             source: str = "") -> Schedule:
    """Convert a parsed ``<algo>`` element; see :func:`load`."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise FieldError(where, "instances", "an integer >= 1", instances)
    algo = replicate(parse(root, where), instances, where)
    h = algo.header
    layout = Layout.of(h)  # the replicated header's nchunks counts every instance
    size = default_size(layout.chunks) if size is None else size
    chunk_bytes = check_chunking(size, layout.chunks, where)
    base = max(g.s_chunks for g in algo.gpus)
    programs, scratch = [], base
    for gpu in algo.gpus:
        ops, used = _convert_gpu(where, gpu, layout, chunk_bytes, base)
        programs.append(RankProgram(gpu.rank, f"h{gpu.rank + 1}", tuple(ops)))
        scratch = max(scratch, used)
    root_rank = _root(where, h, programs)
    problem = Shape(h.collective, h.ngpus, layout.chunks, layout.output_chunks, root_rank).problem()
    if problem is not None:
        raise FieldError(where, *problem)
    meta = Meta(source=source, name=h.name, coll=h.coll, proto=h.proto, nchannels=h.nchannels // instances,
                instances=instances, lanes=h.nchannels, inplace=h.inplace, outofplace=h.outofplace,
                min_bytes=h.min_bytes, max_bytes=h.max_bytes)
    sched = Schedule(algorithm=f"msccl:{h.name}", size=size, chunks=layout.chunks, ranks=tuple(programs),
                     scratch_chunks=scratch, collective=h.collective, output_chunks=layout.output_chunks,
                     root=root_rank, placement="identity", meta={"imported_from": "msccl", "msccl": asdict(meta)})
    return assign_steps(sched)


def _root(where: str, header: Header, programs: list[RankProgram]) -> int:
    """The root of a broadcast (the one rank that receives nothing) or a reduce (that sends nothing); else 0."""
    if header.collective not in (BROADCAST, REDUCE_TO_ROOT):
        return 0
    kinds = (RECV, RECV_REDUCE) if header.collective == BROADCAST else (SEND,)
    roots = [p.rank for p in programs if not any(op.kind in kinds for op in p.ops)]
    if len(roots) != 1:
        what = "receives" if header.collective == BROADCAST else "sends"
        raise FieldError(where, "algo@coll", f"a {header.coll} with one gpu that never {what} (its root)",
                         f"{header.coll} with {len(roots)} such gpus")
    return roots[0]


def assign_steps(schedule: Schedule) -> Schedule:
    """Set every op's ``step`` to the round it completes in under symbolic execution.

    Ops that never run (a deadlock) get the largest step of their
    dependencies, so the file stays loadable and ``schedule check`` reports
    the problem.
    """
    rounds = execute(schedule).completed_round
    ranks = []
    for prog in schedule.ranks:
        steps: dict[int, int] = {}
        ops = []
        for op in prog.ops:
            step = rounds.get((prog.rank, op.id), max((steps[d] for d in op.deps), default=0))
            step = max([step, *(steps[d] for d in op.deps)])
            steps[op.id] = step
            ops.append(replace(op, step=step))
        ranks.append(RankProgram(prog.rank, prog.host, tuple(ops)))
    return replace(schedule, ranks=tuple(ranks))
