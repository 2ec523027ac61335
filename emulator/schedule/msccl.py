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


def _convert_gpu(where: str, gpath: str, gpu: ET.Element, rank: int, ngpus: int, chunks: int, scratch_base: int,
                 scratch_next: int, chunk_bytes: int) -> tuple[list[Op], list[list[int]], int]:
    """Ops of one gpu in a topological order of its threadblock steps, with program-order predecessors."""
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
    try:
        order = list(nx.lexicographical_topological_sort(graph, key=lambda n: (n[1], n[0])))
    except nx.NetworkXUnfeasible:
        raise FieldError(where, f"{gpath} dependencies", "no cycle between threadblock steps", "a cycle") from None
    ops: list[Op] = []
    extra: list[list[int]] = []
    last: dict[tuple[int, int], list[int]] = {}  # node -> op indices that complete it

    def add(kind: str, buf: str, chunk: int, n: int, preds: list[int], peer: int | None = None,
            src: tuple[str, int] | None = None) -> int:
        ops.append(Op(id=len(ops), kind=kind, chunk=chunk, nchunks=n, bytes=n * chunk_bytes, step=0, peer=peer,
                      buffer=buf, src=src[0] if src else None, src_chunk=src[1] if src else None))
        extra.append(list(preds))
        return len(ops) - 1

    for node in order:
        tid, s = node
        step = steps[node]
        tb = tbs[tid]
        spath = f"{gpath}.tb[{tid}].step[{s}]"
        kind = step.get("type")
        if kind not in STEP_TYPES:
            raise FieldError(where, f"{spath}@type", f"one of {', '.join(STEP_TYPES)}", kind)
        cnt = _attr_int(where, step, "cnt", spath, 1, 1, chunks)
        preds = sorted({i for p in graph.predecessors(node) for i in last[p]})
        send_peer, recv_peer = int(tb.get("send", -1)), int(tb.get("recv", -1))
        if kind in ("s", "rcs", "rrcs", "rrs") and send_peer < 0:
            raise FieldError(where, f"{spath}@type", f"a step without a send (threadblock {tid} has send=-1)", kind)
        if kind in ("r", "rcs", "rrc", "rrcs", "rrs") and recv_peer < 0:
            raise FieldError(where, f"{spath}@type", f"a step without a receive (threadblock {tid} has recv=-1)",
                             kind)
        scratch_limit = scratch_base
        if kind == "nop":
            last[node] = preds
            continue
        if kind == "rrs":
            src = _loc(where, spath, step, "src", chunks, scratch_limit, cnt)
            tmp = scratch_next
            scratch_next += cnt
            if scratch_next > MAX_CHUNKS:
                raise FieldError(where, f"{spath}@cnt", f"rrs steps that need at most {MAX_CHUNKS} scratch chunks "
                                 "in all", cnt)
            a = add(COPY, "scratch", tmp, cnt, preds, src=src)
            b = add(RECV_REDUCE, "scratch", tmp, cnt, [a], peer=recv_peer)
            add(SEND, "scratch", tmp, cnt, [b], peer=send_peer)
            last[node] = [b]
            continue
        if kind == "s":
            buf, off = _loc(where, spath, step, "src", chunks, scratch_limit, cnt)
            add(SEND, buf, off, cnt, preds, peer=send_peer)
            last[node] = preds  # sends are buffered in MSCCL: later steps need not wait for them
            continue
        dst = _loc(where, spath, step, "dst", chunks, scratch_limit, cnt)
        if kind in ("r", "rcs"):
            a = add(RECV, dst[0], dst[1], cnt, preds, peer=recv_peer)
            if kind == "rcs":
                add(SEND, dst[0], dst[1], cnt, [a], peer=send_peer)
            last[node] = [a]
        elif kind in ("rrc", "rrcs"):
            src = _loc(where, spath, step, "src", chunks, scratch_limit, cnt)
            if src != dst:
                preds = [add(COPY, dst[0], dst[1], cnt, preds, src=src)]
            a = add(RECV_REDUCE, dst[0], dst[1], cnt, preds, peer=recv_peer)
            if kind == "rrcs":
                add(SEND, dst[0], dst[1], cnt, [a], peer=send_peer)
            last[node] = [a]
        else:  # cpy, re
            src = _loc(where, spath, step, "src", chunks, scratch_limit, cnt)
            if src == dst:
                raise FieldError(where, f"{spath}@srcoff", "a source other than the destination", src[1])
            last[node] = [add(COPY if kind == "cpy" else REDUCE, dst[0], dst[1], cnt, preds, src=src)]
    return ops, extra, scratch_next


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
