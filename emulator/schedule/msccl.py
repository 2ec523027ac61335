"""Import MSCCL XML allreduce algorithms (msccl-tools format) into our schedule format.

The XML (``msccl/language/ir.py`` in msccl-tools) is
``<algo name coll ngpus nchunksperloop inplace ...>`` containing
``<gpu id i_chunks o_chunks s_chunks>`` containing threadblocks
``<tb id send recv chan>`` (``send``/``recv`` are the peer gpus, -1 for none)
containing ``<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep>``.
A threadblock runs its steps in order; ``depid``/``deps`` add a dependency on
step ``deps`` of threadblock ``depid`` of the same gpu.

Mapping: gpu ``i`` becomes rank ``i`` on host ``h(i+1)``; ``nchunksperloop``
becomes ``chunks``; buffers ``i`` and ``o`` both become ``data`` (an
allreduce's output is its input, reduced; for ``inplace="0"`` algorithms this
assumes no step reads an input chunk after the output chunk at the same
offset was written), ``s`` becomes ``scratch``. Step types:

=======  ==========================================================
s        send
r        recv
rcs      recv, then send the received chunk on
rrc      (copy src -> dst if they differ), recv_reduce into dst
rrcs     as rrc, then send dst
rrs      copy src -> a fresh scratch chunk, recv_reduce into it, send it
cpy      copy src -> dst
re       reduce: dst += src
nop      nothing (its dependencies pass through)
=======  ==========================================================

Dependencies are the threadblock order, ``depid``/``deps``, and the data
hazards of the resulting list (:func:`~emulator.schedule.deps.derive_deps`).
MSCCL sends are buffered (they complete into the peer's connection buffer),
while our model is rendezvous; so nothing waits for a send merely because it
came earlier in its threadblock -- the order of messages per pair and the data
hazards still order everything that matters.
Messages are matched in order per pair of gpus, so at most one threadblock
of a gpu may send to (and one receive from) each peer; several channels
between the same pair are rejected. Steps are the rounds of the symbolic
execution (:func:`emulator.schedule.executor.execute`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import networkx as nx

from emulator.errors import FieldError, UserError
from emulator.schedule.deps import derive_deps
from emulator.schedule.executor import execute
from emulator.schedule.format import (
    COPY,
    MAX_CHUNKS,
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

STEP_TYPES = ("s", "r", "rcs", "rrc", "rrcs", "rrs", "cpy", "re", "nop")
BUFS = {"i": "data", "o": "data", "s": "scratch"}
DEFAULT_TARGET_SIZE = 1 << 20


def _attr_int(where: str, elem: ET.Element, name: str, path: str, minimum: int | None = None,
              default: int | None = None, maximum: int | None = None) -> int:
    raw = elem.get(name)
    if raw is None:
        if default is not None:
            return default
        raise FieldError(where, f"{path}@{name}", "an integer attribute", "nothing")
    try:
        value = int(raw)
    except ValueError:
        raise FieldError(where, f"{path}@{name}", "an integer", raw) from None
    if minimum is not None and value < minimum:
        raise FieldError(where, f"{path}@{name}", f"an integer >= {minimum}", raw)
    if maximum is not None and value > maximum:
        raise FieldError(where, f"{path}@{name}", f"an integer <= {maximum}", raw)
    return value


def default_size(chunks: int) -> int:
    """The smallest size >= 1 MiB that splits into ``chunks`` float32 chunks."""
    unit = 4 * chunks
    return -(-DEFAULT_TARGET_SIZE // unit) * unit


def load(path: str, size: int | None = None) -> Schedule:
    """Read an MSCCL XML allreduce and convert it (see the module docstring)."""
    where = f"MSCCL file {path!r}"
    try:
        root = ET.parse(path).getroot()
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    except (ET.ParseError, LookupError, ValueError) as exc:  # LookupError: an unknown encoding="..."
        raise UserError(f"{where}: not valid XML ({' '.join(str(exc).split())})") from None
    return from_xml(root, where, size)


def from_xml(root: ET.Element, where: str, size: int | None = None) -> Schedule:
    if root.tag != "algo":
        raise FieldError(where, "root element", "<algo>", f"<{root.tag}>")
    coll = root.get("coll", "")
    if coll.lower() != "allreduce":
        raise FieldError(where, "algo@coll", "allreduce", coll)
    ngpus = _attr_int(where, root, "ngpus", "algo", 2, maximum=MAX_RANKS)
    chunks = _attr_int(where, root, "nchunksperloop", "algo", 1, maximum=MAX_CHUNKS)
    size = default_size(chunks) if size is None else size
    chunk_bytes = check_chunking(size, chunks, where)
    gpus = root.findall("gpu")
    ids = sorted(_attr_int(where, g, "id", f"gpu[{n}]", 0) for n, g in enumerate(gpus))
    if ids != list(range(ngpus)):
        raise FieldError(where, "gpu@id", f"the ids 0..{ngpus - 1} once each (ngpus={ngpus})", ids)
    scratch_base = max(_attr_int(where, g, "s_chunks", f"gpu[{n}]", 0, 0, MAX_CHUNKS) for n, g in enumerate(gpus))
    scratch_next = scratch_base
    programs: list[list[Op]] = [[] for _ in range(ngpus)]
    extras: list[list[list[int]]] = [[] for _ in range(ngpus)]
    for gpu in gpus:
        rank = int(gpu.get("id"))  # type: ignore[arg-type]
        gpath = f"gpu[{rank}]"
        for name in ("i_chunks", "o_chunks"):
            given = _attr_int(where, gpu, name, gpath, 0, chunks)
            if given not in (0, chunks):
                raise FieldError(where, f"{gpath}@{name}", f"{chunks} (nchunksperloop)", given)
        ops, extra, scratch_next = _convert_gpu(where, gpath, gpu, rank, ngpus, chunks, scratch_base,
                                                scratch_next, chunk_bytes)
        programs[rank], extras[rank] = ops, extra
    ranks = tuple(RankProgram(r, f"h{r + 1}", tuple(derive_deps(programs[r], extras[r]))) for r in range(ngpus))
    meta = {"imported_from": "msccl", "name": root.get("name", ""), "inplace": root.get("inplace", "1"),
            "proto": root.get("proto", "")}
    sched = Schedule(algorithm=f"msccl:{root.get('name', 'unnamed')}", size=size, chunks=chunks, ranks=ranks,
                     scratch_chunks=scratch_next, placement="identity", meta=meta)
    return assign_steps(sched)


def _loc(where: str, path: str, step: ET.Element, which: str, chunks: int, scratch: int,
         cnt: int = 1) -> tuple[str, int]:
    buf = step.get(f"{which}buf")
    if buf not in BUFS:
        raise FieldError(where, f"{path}@{which}buf", "i, o or s", buf)
    off = _attr_int(where, step, f"{which}off", path, 0)
    limit = chunks if BUFS[buf] == "data" else scratch
    if off + cnt > limit:
        raise FieldError(where, f"{path}@{which}off", f"an offset at most {limit - cnt} in buffer {buf} ({cnt} "
                         f"chunks from it must fit its {limit})", off)
    return BUFS[buf], off


def _threadblocks(where: str, gpath: str, gpu: ET.Element, rank: int, ngpus: int) -> dict[int, ET.Element]:
    """The threadblocks of one gpu by id, after checking the ids and their peers.

    Ids must be unique, peers (``send``/``recv``) another gpu or -1, and at most
    one threadblock may send to (and one receive from) each peer, since messages
    are matched in order per pair of gpus.
    """
    tbs: dict[int, ET.Element] = {}
    senders: dict[int, int] = {}
    receivers: dict[int, int] = {}
    for t, tb in enumerate(gpu.findall("tb")):
        tpath = f"{gpath}.tb[{t}]"
        tid = _attr_int(where, tb, "id", tpath, 0)
        if tid in tbs:
            raise FieldError(where, f"{tpath}@id", "a threadblock id used once per gpu", tid)
        tbs[tid] = tb
        for attr, seen in (("send", senders), ("recv", receivers)):
            peer = _attr_int(where, tb, attr, tpath, -1, -1)
            if peer == -1:
                continue
            if peer >= ngpus or peer == rank:
                raise FieldError(where, f"{tpath}@{attr}", f"-1 or another gpu in 0..{ngpus - 1}", peer)
            if peer in seen:
                raise FieldError(where, f"{tpath}@{attr}", f"one threadblock per peer (tb {seen[peer]} already "
                                 f"{attr}s with gpu {peer}; several channels per pair are not supported)", peer)
            seen[peer] = tid
    return tbs


def _step_graph(where: str, gpath: str,
                tbs: dict[int, ET.Element]) -> tuple[nx.DiGraph, dict[tuple[int, int], ET.Element]]:
    """The steps of one gpu by ``(threadblock id, step)``, and the graph of what each waits for.

    Edges run from every step to the next one of its threadblock, and from the
    step named by ``depid``/``deps`` to the step that names it.
    """
    graph = nx.DiGraph()
    steps: dict[tuple[int, int], ET.Element] = {}
    for tid, tb in tbs.items():
        prev = None
        for k, step in enumerate(tb.findall("step")):
            spath = f"{gpath}.tb[{tid}].step[{k}]"
            s = _attr_int(where, step, "s", spath, 0)
            if s != k:
                raise FieldError(where, f"{spath}@s", f"{k} (steps numbered in order)", s)
            node = (tid, s)
            steps[node] = step
            graph.add_node(node)
            if prev is not None:
                graph.add_edge(prev, node)
            prev = node
    for (tid, s), step in steps.items():
        spath = f"{gpath}.tb[{tid}].step[{s}]"
        depid = _attr_int(where, step, "depid", spath, -1, -1)
        if depid != -1:
            dep = (depid, _attr_int(where, step, "deps", spath, 0))
            if dep not in steps:
                raise FieldError(where, f"{spath}@deps", "a step of an existing threadblock of this gpu", dep)
            graph.add_edge(dep, (tid, s))
    return graph, steps


def _step_order(where: str, gpath: str, graph: nx.DiGraph) -> list[tuple[int, int]]:
    """The steps in a topological order of ``graph``, step number first, then threadblock id; a cycle is an error."""
    try:
        return list(nx.lexicographical_topological_sort(graph, key=lambda n: (n[1], n[0])))
    except nx.NetworkXUnfeasible:
        raise FieldError(where, f"{gpath} dependencies", "no cycle between threadblock steps", "a cycle") from None


def _step_kind(where: str, spath: str, step: ET.Element, tb: ET.Element, tid: int,
               chunks: int) -> tuple[str, int, int, int]:
    """A step's checked ``type`` and ``cnt``, with its threadblock's send and receive peers (-1 for none).

    A step that sends (or receives) needs a threadblock with a send (or recv) peer.
    """
    kind = step.get("type")
    if kind is None or kind not in STEP_TYPES:
        raise FieldError(where, f"{spath}@type", f"one of {', '.join(STEP_TYPES)}", kind)
    cnt = _attr_int(where, step, "cnt", spath, 1, 1, chunks)
    send_peer, recv_peer = int(tb.get("send", -1)), int(tb.get("recv", -1))
    if kind in ("s", "rcs", "rrcs", "rrs") and send_peer < 0:
        raise FieldError(where, f"{spath}@type", f"a step without a send (threadblock {tid} has send=-1)", kind)
    if kind in ("r", "rcs", "rrc", "rrcs", "rrs") and recv_peer < 0:
        raise FieldError(where, f"{spath}@type", f"a step without a receive (threadblock {tid} has recv=-1)",
                         kind)
    return kind, cnt, send_peer, recv_peer


class _GpuOps:
    """The ops of one gpu as its steps are converted, each with its program-order predecessors.

    ``scratch_base`` is the scratch every gpu declares (the largest
    ``s_chunks``), the limit of the offsets steps may name; ``rrs`` steps take
    fresh chunks from ``scratch_next`` on, a count that runs on across gpus.
    """

    def __init__(self, where: str, chunks: int, scratch_base: int, scratch_next: int, chunk_bytes: int):
        self.where = where
        self.chunks = chunks
        self.scratch_base = scratch_base
        self.scratch_next = scratch_next
        self.chunk_bytes = chunk_bytes
        self.ops: list[Op] = []
        self.extra: list[list[int]] = []

    def add(self, kind: str, buf: str, chunk: int, n: int, preds: list[int], peer: int | None = None,
            src: tuple[str, int] | None = None) -> int:
        """Append an op of ``n`` chunks after the ops ``preds``; return its index."""
        self.ops.append(Op(id=len(self.ops), kind=kind, chunk=chunk, nchunks=n, bytes=n * self.chunk_bytes, step=0,
                           peer=peer, buffer=buf, src=src[0] if src else None, src_chunk=src[1] if src else None))
        self.extra.append(list(preds))
        return len(self.ops) - 1

    def loc(self, spath: str, step: ET.Element, which: str, cnt: int) -> tuple[str, int]:
        """The buffer and offset of a step's ``src`` or ``dst`` (see :func:`_loc`)."""
        return _loc(self.where, spath, step, which, self.chunks, self.scratch_base, cnt)

    def step(self, spath: str, step: ET.Element, kind: str, cnt: int, send_peer: int, recv_peer: int,
             preds: list[int]) -> list[int]:
        """Emit the ops of one step (mapped as in the module docstring) after the ops ``preds``.

        Returns the ops that complete the step, which the steps that depend on
        it wait for: none of its own for ``nop`` and ``s`` (MSCCL sends are
        buffered), the receive for the others that receive.
        """
        if kind == "nop":
            return preds
        if kind == "rrs":
            src = self.loc(spath, step, "src", cnt)
            tmp = self.scratch_next
            self.scratch_next += cnt
            if self.scratch_next > MAX_CHUNKS:
                raise FieldError(self.where, f"{spath}@cnt", f"rrs steps that need at most {MAX_CHUNKS} scratch "
                                 "chunks in all", cnt)
            a = self.add(COPY, "scratch", tmp, cnt, preds, src=src)
            b = self.add(RECV_REDUCE, "scratch", tmp, cnt, [a], peer=recv_peer)
            self.add(SEND, "scratch", tmp, cnt, [b], peer=send_peer)
            return [b]
        if kind == "s":
            buf, off = self.loc(spath, step, "src", cnt)
            self.add(SEND, buf, off, cnt, preds, peer=send_peer)
            return preds  # sends are buffered in MSCCL: later steps need not wait for them
        dst = self.loc(spath, step, "dst", cnt)
        if kind in ("r", "rcs"):
            a = self.add(RECV, dst[0], dst[1], cnt, preds, peer=recv_peer)
            if kind == "rcs":
                self.add(SEND, dst[0], dst[1], cnt, [a], peer=send_peer)
            return [a]
        src = self.loc(spath, step, "src", cnt)
        if kind in ("rrc", "rrcs"):
            if src != dst:
                preds = [self.add(COPY, dst[0], dst[1], cnt, preds, src=src)]
            a = self.add(RECV_REDUCE, dst[0], dst[1], cnt, preds, peer=recv_peer)
            if kind == "rrcs":
                self.add(SEND, dst[0], dst[1], cnt, [a], peer=send_peer)
            return [a]
        # cpy, re
        if src == dst:
            raise FieldError(self.where, f"{spath}@srcoff", "a source other than the destination", src[1])
        return [self.add(COPY if kind == "cpy" else REDUCE, dst[0], dst[1], cnt, preds, src=src)]


def _convert_gpu(where: str, gpath: str, gpu: ET.Element, rank: int, ngpus: int, chunks: int, scratch_base: int,
                 scratch_next: int, chunk_bytes: int) -> tuple[list[Op], list[list[int]], int]:
    """Ops of one gpu in a topological order of its threadblock steps, with program-order predecessors.

    Returns the ops, each op's predecessors, and ``scratch_next`` advanced past
    the scratch this gpu's ``rrs`` steps took.
    """
    tbs = _threadblocks(where, gpath, gpu, rank, ngpus)
    graph, steps = _step_graph(where, gpath, tbs)
    order = _step_order(where, gpath, graph)
    out = _GpuOps(where, chunks, scratch_base, scratch_next, chunk_bytes)
    last: dict[tuple[int, int], list[int]] = {}  # node -> op indices that complete it
    for node in order:
        tid, s = node
        spath = f"{gpath}.tb[{tid}].step[{s}]"
        kind, cnt, send_peer, recv_peer = _step_kind(where, spath, steps[node], tbs[tid], tid, chunks)
        preds = sorted({i for p in graph.predecessors(node) for i in last[p]})
        last[node] = out.step(spath, steps[node], kind, cnt, send_peer, recv_peer, preds)
    return out.ops, out.extra, out.scratch_next


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
