"""Symbolic execution: prove that a schedule computes its collective, or say why not.

Instead of numbers, every chunk of every buffer holds a *label* (which chunk of
the collective's global data it stands for) and a *count vector* (how many
times each rank's contribution to that chunk is in it, packed into one
integer). Each rank's ``data`` starts as its collective's input
(:meth:`~emulator.model.schedule.semantics.Shape.input_piece`: for an allreduce,
rank ``r``'s chunk ``c`` is label ``c`` with count 1 for rank ``r``); scratch,
output and chunks without input start empty. A schedule computes its
collective iff, once every operation has run, every result chunk a rank must
hold (:meth:`~emulator.model.schedule.semantics.Shape.result_piece`) has that
label and exactly that count: 1 for every rank when summed over all, 1 for
the one owner otherwise. A ``p2p`` schedule has no result to check: only
matching and deadlock freedom.

Execution model: the host agents' own. Which operation may run when is
decided by one :class:`~emulator.model.schedule.dispatch.Dispatcher` per rank, the
same class the agents and the timing model run on:

* An operation is *ready* when all its ``deps`` have completed; a send or
  receive is queued on its channel (the same peer and direction) once it is
  ready and every earlier op of its rank on that channel is -- messages on a
  channel are matched in list order, the k-th send from a to b with the k-th
  receive at b from a.
* Local operations (``compute`` included: time is not modelled here)
  complete as soon as they are ready.
* A send and its matching receive complete together once both are at the
  heads of their channels (rendezvous: no buffering is assumed, so a
  schedule that passes here cannot deadlock on real sockets either). The
  data sent is the sender's buffer at that moment. A send thus completes
  before anything that depends on it runs, which is at least as strict as
  the agents' early release of an awaited send's receives and local work.

Execution proceeds in *rounds*: all local work that can happen, then every
ready matched pair at once. No progress with work left is a deadlock; the
report names the ranks and operations caught in it (a wait-for cycle when
there is one).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import networkx as nx

from emulator.model.schedule.deps import hazard_errors
from emulator.model.schedule.dispatch import Channel, Dispatcher, Ready
from emulator.model.schedule.format import COMPUTE, COPY, RECV, RECV_REDUCE, SEND, Op, Schedule
from emulator.model.schedule.semantics import ALL, NOBODY, Piece

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
        sizes = {"data": schedule.chunks, "output": schedule.output_chunks, "scratch": schedule.scratch_chunks}
        self.labels = {buf: [[EMPTY] * n for _ in range(p)] for buf, n in sizes.items()}
        self.counts = {buf: [[0] * n for _ in range(p)] for buf, n in sizes.items()}
        for shape in schedule.shapes:
            for r in shape.members:
                for c in range(shape.chunks):
                    piece = shape.input_piece(r, c)
                    if piece.owner != NOBODY:
                        self.labels["data"][r][shape.data_offset + c] = piece.label
                        self.counts["data"][r][shape.data_offset + c] = self.count_of(piece.owner, shape.members)

    def count_of(self, owner: int, members: tuple[int, ...]) -> int:
        """The count vector of one contribution of ``owner`` (every member's for ALL, none for NOBODY)."""
        if owner == ALL:
            return self.full if len(members) == self.p else sum(self.one[m] for m in members)
        return 0 if owner == NOBODY else self.one[owner]

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
    mismatched transfer, no deadlock, and every rank ends with its result of
    the collective, each contribution counted once.
    """
    errors: list[str] = []
    for prog in schedule.ranks:
        errors += hazard_errors(prog, max_errors)
    errors += _channel_count_errors(schedule)
    run = _Run(schedule, errors, max_errors)
    run.run()
    deadlock = None
    if run.remaining:
        deadlock = _deadlock(run)
        errors.append(deadlock.summary())
    else:
        errors += _final_errors(run.state, schedule, max_errors)
    return Execution(valid=not errors, errors=errors, deadlock=deadlock, rounds=run.rounds,
                     completed_round=run.completed_round, matches=run.matches)


def _channel_count_errors(schedule: Schedule) -> list[str]:
    """One error per ordered pair of ranks whose sends and receives do not pair up."""
    sends: dict[tuple[int, int, int], int] = {}
    recvs: dict[tuple[int, int, int], int] = {}
    for prog in schedule.ranks:
        for op in prog.ops:
            if op.kind == SEND:
                key = (prog.rank, op.partner, op.lane)
                sends[key] = sends.get(key, 0) + 1
            elif op.kind in (RECV, RECV_REDUCE):
                key = (op.partner, prog.rank, op.lane)
                recvs[key] = recvs.get(key, 0) + 1
    errors = []
    for src, dst, lane in sorted(set(sends) | set(recvs)):
        ns, nr = sends.get((src, dst, lane), 0), recvs.get((src, dst, lane), 0)
        if ns != nr:
            on = f" on lane {lane}" if lane else ""
            errors.append(f"rank {src} sends {ns} messages to rank {dst}{on} but rank {dst} receives {nr} "
                          f"from rank {src}{on}")
    return errors


@dataclass(frozen=True)
class _Local:
    """A local operation of ``rank`` that is ready to run."""

    rank: int
    op: Op


@dataclass(frozen=True)
class _Transfer:
    """A send and the receive it is matched with, both queued at the heads of their channels."""

    src: int
    send: Op
    dst: int
    recv: Op


class _Run:
    """One symbolic execution: every rank's :class:`~emulator.model.schedule.dispatch.Dispatcher` decides what may
    run, this class runs it on the labels and count vectors (:class:`_State`), round by round."""

    def __init__(self, schedule: Schedule, errors: list[str], max_errors: int):
        self.p = schedule.p
        self.errors = errors
        self.max_errors = max_errors
        self.programs = schedule.ranks
        self.index = [{op.id: i for i, op in enumerate(prog.ops)} for prog in schedule.ranks]
        self.dispatch = [Dispatcher(prog) for prog in schedule.ranks]
        self.state = _State(schedule)
        self.local: deque[_Local] = deque()  # in the order it became ready
        #: per rank and channel, the queued communication not matched yet (the first is the channel's head)
        self.queued: list[dict[Channel, deque[Op]]] = [defaultdict(deque) for _ in range(self.p)]
        self.rounds = 0
        self.completed_round: dict[tuple[int, int], int] = {}
        self.matches: list[tuple[int, int, int, int]] = []

    @property
    def remaining(self) -> int:
        return sum(d.pending for d in self.dispatch)

    def run(self) -> None:
        """Rounds until nothing can be matched any more: all possible local work, then every ready pair."""
        for r in range(self.p):
            self._hand(r, self.dispatch[r].start(0.0))
        while True:
            self._run_local()
            transfers = self._matched()
            if not transfers:
                return
            self._transfer(transfers)
            self.rounds += 1

    def _hand(self, rank: int, ready: list[Ready]) -> None:
        for r in ready:
            if r.op.is_comm:
                self.queued[rank][self.dispatch[rank].channel_of(r.op.id)].append(r.op)
            else:
                self.local.append(_Local(rank, r.op))

    def _complete(self, rank: int, op: Op) -> None:
        self.completed_round[(rank, op.id)] = self.rounds
        self._hand(rank, self.dispatch[rank].done(op.id, float(self.rounds)))

    def _note(self, msg: str) -> None:
        if len(self.errors) < self.max_errors * 3:
            self.errors.append(msg)

    def _accumulate(self, rank: int, op: Op, labels: list[int], counts: list[int]) -> None:
        for c in self.state.accumulate(rank, op.buffer, op.chunk, labels, counts):
            self._note(f"rank {rank}: {op.describe()} adds {_label_name(labels[c - op.chunk])} into chunk {c}, "
                       "which holds another chunk's data")

    def _run_local(self) -> None:
        while self.local:
            work = self.local.popleft()
            r, op = work.rank, work.op
            if op.kind == COMPUTE:
                self._complete(r, op)
                continue
            labels, counts = self.state.read(r, *op.source, op.nchunks)
            if op.kind == COPY:
                self.state.write(r, op.buffer, op.chunk, labels, counts)
            else:
                self._accumulate(r, op, labels, counts)
            self._complete(r, op)

    def _matched(self) -> list[_Transfer]:
        """Every send at the head of its channel whose receive is at the head of the peer's, by rank and
        program order."""
        heads = [(self.index[r][q[0].id], r, q[0]) for r in range(self.p) for ch, q in self.queued[r].items()
                 if ch.sends and q]
        out = []
        for _, r, send in sorted(heads, key=lambda h: (h[1], h[0])):
            peer = send.partner
            theirs = self.queued[peer].get(Channel(r, False, send.lane)) if 0 <= peer < self.p else None
            if theirs:
                out.append(_Transfer(r, send, peer, theirs[0]))
        return out

    def _transfer(self, transfers: list[_Transfer]) -> None:
        """Every matched pair at once: all payloads are read before any is delivered."""
        payloads = []
        for t in transfers:
            if t.send.nchunks != t.recv.nchunks or t.send.step != t.recv.step:
                self._note(f"rank {t.src} {t.send.describe()} is matched with rank {t.dst} {t.recv.describe()} "
                           f"but they differ in {'size' if t.send.nchunks != t.recv.nchunks else 'step'}")
            n = min(t.send.nchunks, t.recv.nchunks)
            payloads.append(self.state.read(t.src, t.send.buffer, t.send.chunk, n))
        for t, (labels, counts) in zip(transfers, payloads, strict=True):
            if t.recv.kind == RECV:
                self.state.write(t.dst, t.recv.buffer, t.recv.chunk, labels, counts)
            else:
                self._accumulate(t.dst, t.recv, labels, counts)
            self.queued[t.src][self.dispatch[t.src].channel_of(t.send.id)].popleft()
            self.queued[t.dst][self.dispatch[t.dst].channel_of(t.recv.id)].popleft()
            self.matches.append((t.src, t.send.id, t.dst, t.recv.id))
            self._complete(t.src, t.send)
            self._complete(t.dst, t.recv)


def _final_errors(state: _State, schedule: Schedule, limit: int) -> list[str]:
    out: list[str] = []
    for shape in schedule.shapes:
        for r in shape.members:
            for c in range(shape.result_chunks):
                want = shape.result_piece(r, c)
                if want is None:
                    continue
                problem = _result_problem(state, r, *shape.result_location(c), want, shape.members)
                if problem:
                    out.append(problem)
                if len(out) >= limit:
                    return out
    return out


def _result_problem(state: _State, r: int, buf: str, c: int, want: Piece, members: tuple[int, ...]) -> str | None:
    """What is wrong with rank ``r``'s chunk ``c`` of ``buf`` against the result it must hold (None: nothing)."""
    where = "" if buf == "data" else f" of {buf}"
    label, count = state.labels[buf][r][c], state.counts[buf][r][c]
    if label != want.label:
        return (f"rank {r} chunk {c}{where}: ends holding {_label_name(label)}'s data, expected "
                f"{_label_name(want.label)}'s")
    wanted_count = state.count_of(want.owner, members)
    if count == wanted_count:
        return None
    vec, wanted = state.unpack(count), state.unpack(wanted_count)
    parts = []
    extra = [k for k, n in enumerate(vec) if n > wanted[k]]
    missing = [k for k, n in enumerate(vec) if n < wanted[k]]
    if extra:
        parts.append("counts the contribution of " + ", ".join(f"rank {k} {vec[k]} times" for k in extra[:5]))
    if missing:
        parts.append(f"misses the contribution of ranks {_short(missing)}")
    return f"rank {r} chunk {c}{where}: " + " and ".join(parts)


def _short(values: list[int]) -> str:
    vals = list(values)
    return str(vals) if len(vals) <= 8 else f"[{', '.join(map(str, vals[:8]))}, ...] ({len(vals)} in all)"


def _deadlock(run: _Run) -> Deadlock:
    """Describe the stuck ops: the ready-but-unmatched ones, and a wait-for cycle among them if any."""
    blocked: list[BlockedOp] = []
    graph = nx.DiGraph()  # nodes: (rank, list index)
    for r, prog in enumerate(run.programs):
        d = run.dispatch[r]
        for i, op in enumerate(prog.ops):
            if d.released(op.id) and op.id not in d.finished:
                graph.add_node((r, i))
                blocked.append(BlockedOp(r, op.id, op.describe(), _why_blocked(run, r, op, graph)))
    cycle: list[tuple[int, int]] = []
    try:
        edges = nx.find_cycle(graph)
        cycle = [(r, run.programs[r].ops[i].id) for (r, i), _ in edges]
    except nx.NetworkXNoCycle:
        pass
    ranks = sorted({b.rank for b in blocked} | {r for r, d in enumerate(run.dispatch) if d.pending})
    return Deadlock(ranks=ranks, blocked=blocked, cycle=cycle)


def _why_blocked(run: _Run, r: int, op: Op, graph: nx.DiGraph) -> str:
    """What ready op ``op`` of rank ``r`` waits for; adds its wait-for edges to ``graph``."""
    me = (r, run.index[r][op.id])
    channel = Channel.of(op)
    head = run.dispatch[r].head(channel)
    assert head is not None  # op itself is not completed
    if head.id != op.id:
        graph.add_edge(me, (r, run.index[r][head.id]))
        return f"waits behind op {head.id} on the same channel"
    q = op.partner
    other = run.dispatch[q].head(channel.opposite(r))
    if other is None:
        what = "receive" if op.kind == SEND else "send"
        return f"waits for a matching {what} that rank {q} never posts"
    holders = _stuck_ancestors(run, q, other)
    held = ", ".join(str(run.programs[q].ops[m].id) for m in holders) or "nothing ready"
    for m in holders:
        graph.add_edge(me, (q, m))
    return f"waits for rank {q} {other.describe()}, itself waiting for its op(s) {held}"


def _stuck_ancestors(run: _Run, q: int, op: Op) -> list[int]:
    """List indices of the ready, unfinished ops of rank ``q`` that ``op`` (not ready) transitively waits for."""
    d, ops, index = run.dispatch[q], run.programs[q].ops, run.index[q]
    seen: set[int] = set()
    stack, out = [index[op.id]], []
    while stack:
        k = stack.pop()
        for dep in ops[k].deps:
            m = index[dep]
            if m in seen or dep in d.finished:
                continue
            seen.add(m)
            if d.released(dep):
                out.append(m)
            else:
                stack.append(m)
    return out
