"""Symbolic execution: prove that a schedule is an allreduce, or say why not.

Instead of numbers, every chunk of every buffer holds a *label* (which chunk of
the original buffers it stands for) and a *count vector* (how many times each
rank's contribution to that chunk is in it, packed into one integer). Rank ``r``'s data chunk ``c``
starts as label ``c`` with count 1 for rank ``r``; scratch chunks start empty.
A schedule is an allreduce iff, once every operation has run, every rank's
data chunk ``c`` has label ``c`` and count exactly 1 for every rank.

Execution model (the one a host agent follows):

* An operation is *ready* when all its ``deps`` have completed; a send or
  receive additionally waits for every earlier op of its rank on the same
  channel (the same peer and direction) -- messages on a channel are matched
  in list order, the k-th send from a to b with the k-th receive at b from a.
* Local operations complete as soon as they are ready.
* A send and its matching receive complete together once both are ready
  (rendezvous: no buffering is assumed, so a schedule that passes here cannot
  deadlock on real sockets either). The data sent is the sender's buffer at
  that moment.

Execution proceeds in *rounds*: all local work that can happen, then every
ready matched pair at once. No progress with work left is a deadlock; the
report names the ranks and operations caught in it (a wait-for cycle when
there is one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import networkx as nx

from emulator.schedule.deps import hazard_errors
from emulator.schedule.format import COPY, RECV, RECV_REDUCE, REDUCE, SEND, Op, Schedule

EMPTY = -1
MIXED = -2


@dataclass
class BlockedOp:
    rank: int
    op_id: int
    description: str
    waits_for: str


@dataclass
class Deadlock:
    """Operations that can never run: ``cycle`` is a wait-for cycle when one exists."""

    ranks: list[int]
    blocked: list[BlockedOp]
    cycle: list[tuple[int, int]] = field(default_factory=list)  # (rank, op id)

    def summary(self) -> str:
        ops = self.blocked
        if self.cycle:
            wanted = set(self.cycle)
            ops = [b for b in self.blocked if (b.rank, b.op_id) in wanted] or ops
        shown = "; ".join(f"rank {b.rank} {b.description} {b.waits_for}" for b in ops[:6])
        more = f"; and {len(ops) - 6} more" if len(ops) > 6 else ""
        kind = "wait-for cycle" if self.cycle else "blocked"
        return f"deadlock: ranks {self.ranks} blocked ({kind}): {shown}{more}"


@dataclass
class Execution:
    """The outcome of :func:`execute`."""

    valid: bool
    errors: list[str]
    deadlock: Deadlock | None
    rounds: int
    #: (rank, op id) -> the round in which the op completed
    completed_round: dict[tuple[int, int], int]
    #: matched transfers: (sender rank, send op id, receiver rank, recv op id)
    matches: list[tuple[int, int, int, int]]


#: Bits per rank in a packed count vector; the top bit of each field flags overflow.
FIELD_BITS = 32


class _State:
    """Labels and count vectors of every chunk of every buffer of every rank.

    A count vector is packed into one Python int, ``FIELD_BITS`` bits per rank,
    so adding two vectors is one integer addition.
    """

    def __init__(self, schedule: Schedule):
        p = schedule.p
        self.p = p
        self.one = [1 << (FIELD_BITS * k) for k in range(p)]
        self.full = sum(self.one)
        self.guard = sum(1 << (FIELD_BITS * k + FIELD_BITS - 1) for k in range(p))
        self.labels = {"data": [list(range(schedule.chunks)) for _ in range(p)],
                       "scratch": [[EMPTY] * schedule.scratch_chunks for _ in range(p)]}
        self.counts = {"data": [[self.one[r]] * schedule.chunks for r in range(p)],
                       "scratch": [[0] * schedule.scratch_chunks for _ in range(p)]}

    def unpack(self, packed: int) -> list[int]:
        mask = (1 << FIELD_BITS) - 1
        return [(packed >> (FIELD_BITS * k)) & mask for k in range(self.p)]

    def read(self, rank: int, buf: str, chunk: int, n: int) -> tuple[list[int], list[int]]:
        return self.labels[buf][rank][chunk:chunk + n], self.counts[buf][rank][chunk:chunk + n]

    def write(self, rank: int, buf: str, chunk: int, labels: list[int], counts: list[int]) -> None:
        self.labels[buf][rank][chunk:chunk + len(labels)] = labels
        self.counts[buf][rank][chunk:chunk + len(labels)] = counts

    def accumulate(self, rank: int, buf: str, chunk: int, labels: list[int], counts: list[int]) -> list[int]:
        """Add; returns the chunk indices where different chunks' data got mixed (or counts overflowed)."""
        mine_l, mine_c = self.labels[buf][rank], self.counts[buf][rank]
        bad = []
        for k, (lab, cnt) in enumerate(zip(labels, counts, strict=True)):
            c = chunk + k
            have = mine_l[c]
            if have == EMPTY:
                mine_l[c] = lab
            elif lab != have and lab != EMPTY:
                mine_l[c] = MIXED
                bad.append(c)
            total = mine_c[c] + cnt
            if total & self.guard:
                mine_l[c] = MIXED
                bad.append(c)
            mine_c[c] = total
        return bad


def _label_name(label: int) -> str:
    return "empty" if label == EMPTY else "mixed" if label == MIXED else f"chunk {label}"


def execute(schedule: Schedule, max_errors: int = 10) -> Execution:
    """Run ``schedule`` symbolically (see the module docstring).

    Returns an :class:`Execution`; ``valid`` is true iff no data race, no
    mismatched transfer, no deadlock, and every rank ends with every chunk
    fully reduced, each contribution counted once.
    """
    errors: list[str] = []
    for prog in schedule.ranks:
        errors += hazard_errors(prog, max_errors)
    p = schedule.p
    ops = [prog.ops for prog in schedule.ranks]
    index = [{op.id: i for i, op in enumerate(r_ops)} for r_ops in ops]
    waiting = [[len(op.deps) for op in r_ops] for r_ops in ops]
    dependents: list[list[list[int]]] = [[[] for _ in r_ops] for r_ops in ops]
    for r in range(p):
        for i, op in enumerate(ops[r]):
            for d in op.deps:
                dependents[r][index[r][d]].append(i)
    # Channel queues: (src, dst) -> list indices of sends at src / receives at dst, in list order.
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for r in range(p):
        for i, op in enumerate(ops[r]):
            if op.kind == SEND:
                sends.setdefault((r, op.peer), []).append(i)  # type: ignore[arg-type]
            elif op.kind in (RECV, RECV_REDUCE):
                recvs.setdefault((op.peer, r), []).append(i)  # type: ignore[arg-type]
    for ch in sorted(set(sends) | set(recvs)):
        ns, nr = len(sends.get(ch, [])), len(recvs.get(ch, []))
        if ns != nr:
            errors.append(f"rank {ch[0]} sends {ns} messages to rank {ch[1]} but rank {ch[1]} receives {nr} "
                          f"from rank {ch[0]}")
    head_send = dict.fromkeys(sends, 0)
    head_recv = dict.fromkeys(recvs, 0)
    done = [[False] * len(r_ops) for r_ops in ops]
    ready = [[False] * len(r_ops) for r_ops in ops]
    remaining = sum(len(r_ops) for r_ops in ops)
    state = _State(schedule)
    completed_round: dict[tuple[int, int], int] = {}
    matches: list[tuple[int, int, int, int]] = []
    local: deque[tuple[int, int]] = deque()
    ready_sends: set[tuple[int, int]] = set()

    def make_ready(r: int, i: int) -> None:
        ready[r][i] = True
        op = ops[r][i]
        if op.kind in (REDUCE, COPY):
            local.append((r, i))
        elif op.kind == SEND:
            ready_sends.add((r, i))

    def complete(r: int, i: int, rnd: int) -> None:
        nonlocal remaining
        done[r][i] = True
        remaining -= 1
        completed_round[(r, ops[r][i].id)] = rnd
        for j in dependents[r][i]:
            waiting[r][j] -= 1
            if waiting[r][j] == 0:
                make_ready(r, j)

    def note(msg: str) -> None:
        if len(errors) < max_errors * 3:
            errors.append(msg)

    for r in range(p):
        for i in range(len(ops[r])):
            if waiting[r][i] == 0:
                make_ready(r, i)

    rnd = 0
    while True:
        while local:
            r, i = local.popleft()
            op = ops[r][i]
            labels, counts = state.read(r, op.src, op.src_chunk, op.nchunks)  # type: ignore[arg-type]
            if op.kind == COPY:
                state.write(r, op.buffer, op.chunk, labels, counts)
            else:
                for c in state.accumulate(r, op.buffer, op.chunk, labels, counts):
                    note(f"rank {r}: {op.describe()} adds {_label_name(labels[c - op.chunk])} into chunk {c}, "
                         "which holds another chunk's data")
            complete(r, i, rnd)
        pairs = []
        for r, i in sorted(ready_sends):
            op = ops[r][i]
            ch = (r, op.partner)
            if sends[ch][head_send[ch]] != i or ch not in recvs or head_recv[ch] >= len(recvs[ch]):
                continue
            j = recvs[ch][head_recv[ch]]
            if ready[op.partner][j]:
                pairs.append((r, i, op.partner, j))
        if not pairs:
            break
        payloads = []
        for r, i, q, j in pairs:
            s_op, r_op = ops[r][i], ops[q][j]
            if s_op.nchunks != r_op.nchunks or s_op.step != r_op.step:
                note(f"rank {r} {s_op.describe()} is matched with rank {q} {r_op.describe()} but they differ in "
                     f"{'size' if s_op.nchunks != r_op.nchunks else 'step'}")
            n = min(s_op.nchunks, r_op.nchunks)
            payloads.append(state.read(r, s_op.buffer, s_op.chunk, n))
        for (r, i, q, j), (labels, counts) in zip(pairs, payloads, strict=True):
            r_op = ops[q][j]
            if r_op.kind == RECV:
                state.write(q, r_op.buffer, r_op.chunk, labels, counts)
            else:
                for c in state.accumulate(q, r_op.buffer, r_op.chunk, labels, counts):
                    note(f"rank {q}: {r_op.describe()} adds {_label_name(labels[c - r_op.chunk])} into chunk "
                         f"{c}, which holds another chunk's data")
            ready_sends.discard((r, i))
            ch = (r, q)
            head_send[ch] += 1
            head_recv[ch] += 1
            matches.append((r, ops[r][i].id, q, r_op.id))
            complete(r, i, rnd)
            complete(q, j, rnd)
        rnd += 1

    deadlock = None
    if remaining:
        deadlock = _deadlock(ops, done, ready, sends, recvs, head_send, head_recv, index)
        errors.append(deadlock.summary())
    else:
        errors += _final_errors(state, schedule, max_errors)
    return Execution(valid=not errors, errors=errors, deadlock=deadlock, rounds=rnd,
                     completed_round=completed_round, matches=matches)


def _final_errors(state: _State, schedule: Schedule, limit: int) -> list[str]:
    out: list[str] = []
    for r in range(schedule.p):
        labels, counts = state.labels["data"][r], state.counts["data"][r]
        for c in range(schedule.chunks):
            if labels[c] != c:
                out.append(f"rank {r} chunk {c}: ends holding {_label_name(labels[c])}'s data")
            elif counts[c] != state.full:
                vec = state.unpack(counts[c])
                parts = []
                extra = [k for k, n in enumerate(vec) if n > 1]
                missing = [k for k, n in enumerate(vec) if n == 0]
                if extra:
                    parts.append("counts the contribution of " + ", ".join(f"rank {k} {vec[k]} times"
                                                                           for k in extra[:5]))
                if missing:
                    parts.append(f"misses the contribution of ranks {_short(missing)}")
                out.append(f"rank {r} chunk {c}: " + " and ".join(parts))
            if len(out) >= limit:
                return out
    return out


def _short(values: list[int]) -> str:
    vals = list(values)
    return str(vals) if len(vals) <= 8 else f"[{', '.join(map(str, vals[:8]))}, ...] ({len(vals)} in all)"


def _deadlock(ops: list[tuple[Op, ...]], done: list[list[bool]], ready: list[list[bool]],
              sends: dict, recvs: dict, head_send: dict, head_recv: dict, index: list[dict[int, int]]) -> Deadlock:
    """Describe the stuck ops: the ready-but-unmatched ones, and a wait-for cycle among them if any."""
    blocked: list[BlockedOp] = []
    graph = nx.DiGraph()
    frontier: dict[int, list[int]] = {}
    for r, r_ops in enumerate(ops):
        frontier[r] = [i for i, op in enumerate(r_ops) if ready[r][i] and not done[r][i]]

    def stuck_ancestors(q: int, j: int) -> list[int]:
        """Frontier ops of rank q that op j (not ready) transitively waits for."""
        seen, stack, out = set(), [j], []
        while stack:
            k = stack.pop()
            for d in ops[q][k].deps:
                m = index[q][d]
                if m in seen or done[q][m]:
                    continue
                seen.add(m)
                if ready[q][m]:
                    out.append(m)
                else:
                    stack.append(m)
        return out

    for r, idxs in frontier.items():
        for i in idxs:
            op = ops[r][i]
            q = op.peer
            ch = (r, q) if op.kind == SEND else (q, r)
            mine, theirs = (sends, recvs) if op.kind == SEND else (recvs, sends)
            head_mine = (head_send if op.kind == SEND else head_recv)[ch]
            graph.add_node((r, i))
            if mine[ch][head_mine] != i:
                k = mine[ch][head_mine]
                why = f"waits behind op {ops[r][k].id} on the same channel"
                graph.add_edge((r, i), (r, k))
            else:
                head_theirs = (head_recv if op.kind == SEND else head_send).get(ch, 0)
                if ch not in theirs or head_theirs >= len(theirs[ch]):
                    what = "receive" if op.kind == SEND else "send"
                    why = f"waits for a matching {what} that rank {q} never posts"
                else:
                    j = theirs[ch][head_theirs]
                    other = ops[q][j]  # type: ignore[index]
                    holders = stuck_ancestors(q, j)  # type: ignore[arg-type]
                    held = ", ".join(str(ops[q][m].id) for m in holders) or "nothing ready"  # type: ignore[index]
                    why = f"waits for rank {q} {other.describe()}, itself waiting for its op(s) {held}"
                    for m in holders:
                        graph.add_edge((r, i), (q, m))
            blocked.append(BlockedOp(r, op.id, op.describe(), why))
    cycle: list[tuple[int, int]] = []
    try:
        edges = nx.find_cycle(graph)
        cycle = [(r, ops[r][i].id) for (r, i), _ in edges]
    except nx.NetworkXNoCycle:
        pass
    ranks = sorted({b.rank for b in blocked} | {r for r, r_ops in enumerate(ops)
                                                if not all(done[r])})
    return Deadlock(ranks=ranks, blocked=blocked, cycle=cycle)
