"""Where the ranks of a hybrid-parallel iteration run: Megatron-LM's rank order, its process groups, and their hosts.

Pure. This module owns the map between a rank and its coordinates in the
tensor- (``tp``), pipeline- (``pp``), data- (``dp``) and expert-parallel
(``ep``) dimensions, the process groups that follow from it (:class:`Grid`),
and which host each rank runs on (:class:`Placement`).

Rank order: Megatron-Core's default, ``order="tp-cp-ep-dp-pp"``
(``megatron/core/parallel_state.py``, ``initialize_model_parallel``): the
first dimension varies fastest. Without context parallelism (``cp = 1``) the
dense groups come from ``rank = tp + T·(dp + D·pp)``; the expert groups from
a second generator over the same order with the expert tensor-parallel size
(by default ``T``), ``E`` and the expert data-parallel size ``D/E``:
``rank = tp + T·(ep + E·edp) + T·D·pp``. So a rank's data-parallel index is
``dp = ep + E·edp``: an expert-parallel group is ``E`` consecutive
data-parallel ranks of one tensor-parallel index and stage, and the
expert-data-parallel group (which reduces the experts' gradients) is the
ranks of the same ``ep`` among them.

Hosts: rank ``r`` runs on the ``r``-th host of the topology, as a launcher
places local rank ``r mod A`` on accelerator ``r mod A`` of node ``r // A``.
With servers the accelerators are numbered server by server, so a
tensor-parallel group (``T`` consecutive ranks) lies inside one server
whenever ``T`` divides the accelerators per server, and with ``T`` equal to
them every pipeline and data-parallel group crosses servers on one local
accelerator index (one NIC, one rail). A placement file overrides this: a
YAML or JSON list of host names, the host of rank ``0, 1, ...``
(:func:`read_placement_file`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from emulator.base.documents import read_document
from emulator.base.errors import FieldError
from emulator.model.topology import Topology

#: Megatron-Core's default rank order (``cp`` is 1 here and ``ep`` splits ``dp``).
MEGATRON_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class Grid:
    """The parallel sizes and the process groups of Megatron's rank order (see the module docstring)."""

    tp: int
    pp: int
    dp: int
    ep: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """The expert data-parallel size: the replicas of each expert."""
        return self.dp // self.ep

    def rank(self, t: int, d: int, s: int) -> int:
        """The rank of tensor-parallel index ``t``, data-parallel index ``d`` and pipeline stage ``s``."""
        return t + self.tp * (d + self.dp * s)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(tp, dp, pp)`` of ``rank``."""
        return rank % self.tp, rank // self.tp % self.dp, rank // (self.tp * self.dp)

    def stage_ranks(self, s: int) -> list[int]:
        return [self.rank(t, d, s) for d in range(self.dp) for t in range(self.tp)]

    def tp_groups(self, s: int) -> list[list[int]]:
        return [[self.rank(t, d, s) for t in range(self.tp)] for d in range(self.dp)]

    def dp_groups(self, s: int) -> list[list[int]]:
        return [[self.rank(t, d, s) for d in range(self.dp)] for t in range(self.tp)]

    def ep_groups(self, s: int) -> list[list[int]]:
        return [[self.rank(t, k * self.ep + e, s) for e in range(self.ep)]
                for k in range(self.edp) for t in range(self.tp)]

    def edp_groups(self, s: int) -> list[list[int]]:
        return [[self.rank(t, k * self.ep + e, s) for k in range(self.edp)]
                for e in range(self.ep) for t in range(self.tp)]

    def pp_pairs(self, src: int, dst: int) -> list[list[int]]:
        """``[sender, receiver]`` of every tensor- and data-parallel index between stages ``src`` and ``dst``."""
        return [[self.rank(t, d, src), self.rank(t, d, dst)] for d in range(self.dp) for t in range(self.tp)]


@dataclass(frozen=True)
class RankPlace:
    """One rank: its host, its coordinates and its server (None without servers)."""

    rank: int
    host: str
    tp: int
    pp: int
    dp: int
    ep: int
    server: int | None


@dataclass(frozen=True)
class Placement:
    """The host of every rank of ``grid`` and where that came from (``megatron`` or ``file PATH``)."""

    grid: Grid
    hosts: tuple[str, ...]
    source: str
    servers: tuple[int, ...] | None = None

    @property
    def ranks(self) -> list[RankPlace]:
        g = self.grid
        out = []
        for r, host in enumerate(self.hosts):
            t, d, s = g.coords(r)
            out.append(RankPlace(r, host, t, s, d, d % g.ep, None if self.servers is None else self.servers[r]))
        return out

    def split_tp_groups(self) -> int:
        """Tensor-parallel groups whose ranks are on more than one server (0 without servers)."""
        if self.servers is None or self.grid.tp == 1:
            return 0
        g = self.grid
        return sum(len({self.servers[r] for r in group}) > 1 for s in range(g.pp) for group in g.tp_groups(s))

    def describe(self) -> list[str]:
        """A few lines: the order, whether TP groups stay in a server, then one line per server (or per stage)."""
        g = self.grid
        head = (f"placement ({self.source}): rank = tp + {g.tp}*dp + {g.tp * g.dp}*pp (Megatron order "
                f"{MEGATRON_ORDER}; ep = dp mod {g.ep})")
        if self.servers is not None and g.tp > 1:
            split = self.split_tp_groups()
            groups = g.pp * g.dp
            head += ("; every TP group inside one server" if not split
                     else f"; {split} of {groups} TP groups span servers")
        lines = [head]
        places = self.ranks
        if self.servers is None:
            for s in range(g.pp):
                mine = [p for p in places if p.pp == s]
                lines.append(f"  stage {s}: ranks {ranges(p.rank for p in mine)} on {host_ranges(p.host for p in mine)}")
            return lines
        for server in sorted(set(self.servers)):
            mine = [p for p in places if p.server == server]
            lines.append(f"  server {server} ({host_ranges(p.host for p in mine)}): ranks "
                         f"{ranges(p.rank for p in mine)}: pp {ranges(p.pp for p in mine)}, dp "
                         f"{ranges(p.dp for p in mine)}, tp {ranges(p.tp for p in mine)}")
        return lines


def ranges(values: Iterable[int]) -> str:
    """``0-3,8,10-11`` for the distinct values."""
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def host_ranges(hosts: Iterable[str]) -> str:
    """``h1-h8,h17`` for host names ``h<N>``."""
    return ",".join("h" + part.replace("-", "-h") for part in ranges(int(h[1:]) for h in hosts).split(","))


def megatron_hosts(topo: Topology, grid: Grid) -> list[str]:
    """The hosts of ranks ``0..world-1`` in Megatron's order: rank ``r`` on the topology's ``r``-th host."""
    return [h.name for h in topo.hosts][:grid.world]


def check_hosts(hosts: Sequence[object], topo: Topology, n: int, where: str, field: str) -> list[str]:
    """``hosts`` as a list of ``n`` distinct hosts of ``topo``; :class:`FieldError` naming ``field`` or its entry."""
    if len(hosts) != n:
        raise FieldError(where, field, f"{n} hosts, one per rank (tp x pp x dp)", f"{len(hosts)} hosts")
    seen: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if not isinstance(host, str) or not topo.is_host(host):
            raise FieldError(where, f"{field}[{i}]", f"a host of {topo.spec} (h1..h{len(topo.hosts)})", host)
        if host in seen:
            raise FieldError(where, f"{field}[{i}]", f"a host no other rank runs on (rank {seen[host]} has it)", host)
        seen[host] = i
    return [str(h) for h in hosts]


def read_placement_file(path: str, topo: Topology, n: int) -> list[str]:
    """The hosts of ranks ``0..n-1`` from a YAML or JSON list (``.json``: JSON); one-line errors naming the entry."""
    where = f"placement file {path!r}"
    data = read_document(path, where)
    if not isinstance(data, list):
        raise FieldError(where, "hosts", "a list of host names, the host of rank 0, 1, ...", type(data).__name__)
    return check_hosts(data, topo, n, where, "hosts")


def place(topo: Topology, grid: Grid, hosts: Sequence[str] | None = None, source: str = "megatron") -> Placement:
    """The placement of ``grid`` on ``topo``: ``hosts`` (checked) when given, else Megatron's order."""
    if hosts is None:
        chosen = megatron_hosts(topo, grid)
    else:
        chosen = check_hosts(list(hosts), topo, grid.world, "schedule gen", "placement_hosts")
    servers = None
    if topo.has_servers:
        servers = tuple(topo.server_of(h) for h in chosen)
    return Placement(grid, tuple(chosen), source, servers)
