"""Process groups of Chakra traces: which ranks each collective node spans, and which nodes are one collective.

This module owns the process-group side of the Chakra importer
(:mod:`emulator.model.workloads.chakra`): reading the groups PyTorch records,
resolving a collective node's ``pg_name`` to its ranks, and matching the
collective nodes of every rank into collectives, grouped as a communicator
split runs them.

The metadata
    PyTorch's execution-trace observer records, once per rank, a node named
    ``## process_group:init ##`` whose one input is the JSON of
    ``torch.distributed``'s ``pg_config_info``: a list of
    ``{pg_name, pg_desc, backend_config, ranks, group_size, group_count}``,
    ``ranks`` the group's global ranks in group order, empty when the group
    spans every rank (pytorch/pytorch ``torch/distributed/distributed_c10d.py``,
    ``_World.pg_config_info``; ``torch/profiler/profiler.py``,
    ``ExecutionTraceObserver._record_pg_config``). Chakra's PyTorch converter
    (mlcommons/chakra ``src/converter/pytorch_converter.py``) makes it a
    ``METADATA_NODE`` of that name whose ``inputs.values`` is Python's ``str``
    of the input list (``['[{"pg_name": "0", ...}]']``), and gives each GPU
    collective node a ``pg_name`` attribute (the kernel's "Process Group
    Name"). :func:`parse_pg_config` reads ``inputs.values`` as Python or JSON
    literals, a string in it as JSON.

Resolving ``pg_name``
    A name the metadata of any rank lists spans its ``ranks`` (every rank
    when empty). Otherwise ``""`` (no attribute) and ``"0"`` span every rank:
    ``"0"`` is PyTorch's default group, and ASTRA-sim reads both as its
    default communicator (astra-sim ``astra-sim/workload/Workload.cc``,
    ``extract_comm_group``). Any other name the metadata does not list is an
    error naming the node. Ranks listing one name must agree on its ranks; a
    node on a group without its rank, a rank out of range, or a group of
    every rank whose ``group_size`` is not the number of files is an error.
    A replicated one-rank trace (``replicated``) spans every rank for
    ``""``, ``"0"`` and groups of every rank of the recorded job (ranks
    ``[]``); a collective on a smaller group is refused, since its ranks in
    the replicated job are unknown.

Matching
    The ``k``-th collective node of group ``g`` on each of ``g``'s ranks (in
    each rank's dependency order) are one *instance* (they must agree on
    ``comm_type`` and ``comm_size``, and every rank of ``g`` must have as
    many). Instances on one rank groups are not communication: their nodes
    only pass dependencies on (:attr:`Matching.solo`). The instances become
    collectives, one per segment: an instance spanning every rank in rank
    order is a collective of its own, as before groups; others with the same
    collective, size, group size and *ordinal* (the instance's smallest
    position among its ranks' collective nodes) and disjoint groups form one
    collective of several groups, as one collective on a split communicator
    (tensor-parallel pairs, data-parallel groups). Collectives are numbered
    by ordinal, then smallest rank.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from emulator.base.errors import FieldError

#: The name (a part of it) of the node PyTorch records its process groups in.
PG_INIT = "process_group:init"
#: PyTorch's default group, ASTRA-sim's default communicator.
DEFAULT_PG = "0"


@dataclass(frozen=True)
class ProcessGroup:
    """One entry of PyTorch's ``pg_config``: ``ranks`` in group order (empty: every rank), ``size`` its
    ``group_size`` (0 when not recorded)."""

    name: str
    ranks: tuple[int, ...]
    size: int = 0
    desc: str = ""


# ---------------------------------------------------------------------------
# The metadata
# ---------------------------------------------------------------------------

def _literal(text: str) -> object:
    """``text`` as a Python literal (the converter's ``str`` of a list), else as JSON; None if neither."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _entries(value: object, depth: int = 0) -> list[object] | None:
    """The group entries in ``value``: dicts, in lists, or in strings of JSON; None if it holds anything else."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, str) and depth < 4:
        parsed = _literal(value)
        return None if parsed is None else _entries(parsed, depth + 1)
    if isinstance(value, (list, tuple)) and depth < 4:
        out: list[object] = []
        for item in value:
            inner = _entries(item, depth + 1)
            if inner is None:
                return None
            out += inner
        return out
    return None


def parse_pg_config(text: str, where: str, label: str) -> tuple[ProcessGroup, ...]:
    """The process groups in a ``## process_group:init ##`` node's ``inputs.values``; :class:`FieldError` if bad."""
    field = f"{label}.inputs.values"
    if not text.strip() or text.strip() == "[]":
        return ()
    entries = _entries(text)
    if entries is None:
        raise FieldError(where, field, "PyTorch's pg_config: a JSON list of {pg_name, ranks, group_size, ...} "
                         "(in a list, as the Chakra converter stores it)", text[:120])
    return tuple(_group(entry, where, f"{field}[{j}]") for j, entry in enumerate(entries))


def _group(entry: object, where: str, path: str) -> ProcessGroup:
    if not isinstance(entry, dict):
        raise FieldError(where, path, "a mapping with pg_name and ranks", entry)
    name = entry.get("pg_name")
    if isinstance(name, int) and not isinstance(name, bool):
        name = str(name)
    if not isinstance(name, str) or not name:
        raise FieldError(where, f"{path}.pg_name", "a process group name (a non-empty string)", name)
    ranks = entry.get("ranks")
    if not isinstance(ranks, list) or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
        raise FieldError(where, f"{path}.ranks", "a list of ranks (integers >= 0; empty: every rank)", ranks)
    if len(set(ranks)) != len(ranks):
        raise FieldError(where, f"{path}.ranks", "distinct ranks", ranks)
    size = entry.get("group_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FieldError(where, f"{path}.group_size", "an integer >= 0", size)
    desc = entry.get("pg_desc", "")
    return ProcessGroup(name, tuple(ranks), size, desc if isinstance(desc, str) else str(desc))


# ---------------------------------------------------------------------------
# Resolving pg_name
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupTable:
    """The process groups of a ``p``-rank trace: per name its ranks in group order (every rank resolved)."""

    p: int
    groups: Mapping[str, tuple[int, ...]]
    recorded: Mapping[str, ProcessGroup]
    replicated: bool = False

    @property
    def has_metadata(self) -> bool:
        return bool(self.recorded)

    def ranks_of(self, pg_name: str, rank: int, where: str, label: str) -> tuple[int, ...]:
        """The ranks of the group ``pg_name`` names, for a node of ``rank``; :class:`FieldError` (one line) if the
        trace does not give them or they lack ``rank``."""
        field = f"{label}.attr.pg_name"
        if pg_name in self.groups:
            ranks = self.groups[pg_name]
        elif pg_name in ("", DEFAULT_PG):
            ranks = tuple(range(self.p))
        elif pg_name in self.recorded:  # replicated: a group of some ranks of the recorded job
            pg = self.recorded[pg_name]
            raise FieldError(where, field, "a process group of every rank for a replicated one-rank trace (its "
                             "collectives span the data-parallel group of all ranks; give every rank's file for a "
                             "trace of smaller groups)", f"{pg_name!r}: ranks {list(pg.ranks)} of {pg.size or '?'}")
        else:
            listed = ", ".join(sorted(self.recorded)) or "none"
            where_from = (f"the ranks of process group {pg_name!r} in a '## {PG_INIT} ##' METADATA_NODE (the "
                          f"trace's lists: {listed})")
            raise FieldError(where, field, where_from + ("" if self.recorded else "; the trace has no such node, "
                             "so only pg_name '' or '0' (every rank) can be replayed"), pg_name)
        if rank not in ranks:
            raise FieldError(where, field, f"a process group with rank {rank} (the file's own)",
                             f"{pg_name!r}: ranks {list(ranks)}")
        return ranks


def group_table(per_file: Sequence[tuple[str, Sequence[ProcessGroup]]], p: int, replicated: bool = False) -> GroupTable:
    """The groups the files' metadata list (``(where, groups)`` per file), resolved for ``p`` ranks."""
    recorded: dict[str, tuple[str, ProcessGroup]] = {}
    for where, groups in per_file:
        for pg in groups:
            first = recorded.setdefault(pg.name, (where, pg))
            if first[1].ranks != pg.ranks:
                raise FieldError(where, f"process group {pg.name!r}.ranks", f"{list(first[1].ranks)}, as "
                                 f"{first[0]} lists it", list(pg.ranks))
    resolved: dict[str, tuple[int, ...]] = {}
    for name, (where, pg) in recorded.items():
        if pg.ranks:
            if replicated:
                continue
            bad = next((r for r in pg.ranks if r >= p), None)
            if bad is not None:
                raise FieldError(where, f"process group {name!r}.ranks", f"ranks of the trace (0..{p - 1}, one "
                                 "file each)", list(pg.ranks))
            resolved[name] = pg.ranks
        else:
            if pg.size and pg.size != p and not replicated:
                raise FieldError(where, "FILE", f"the files of all {pg.size} ranks of the recorded job (process "
                                 f"group {name!r} spans every rank, group_size {pg.size})", f"{p} files")
            resolved[name] = tuple(range(p))
    return GroupTable(p, resolved, {name: pg for name, (_, pg) in recorded.items()}, replicated)


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CollNode:
    """A collective node of one rank, as matching needs it: its ``position`` in the rank's dependency order."""

    rank: int
    position: int
    pg_name: str
    collective: str
    size: int
    node_id: int
    name: str

    @property
    def label(self) -> str:
        return f"node {self.node_id} ({self.name or 'unnamed'})"


@dataclass(frozen=True)
class Instance:
    """The ``k``-th collective node of process group ``pg`` on each of its ranks: ``positions[i]`` on
    ``group[i]``."""

    pg: str
    k: int
    group: tuple[int, ...]
    positions: tuple[int, ...]
    ordinal: int

    @property
    def members(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.group, self.positions, strict=True))


@dataclass(frozen=True)
class TraceCollective:
    """Collective ``index``: ``instances`` of one collective and size in disjoint groups of one size (one segment).

    ``world``: one instance over every rank in rank order (no segment groups).
    """

    index: int
    collective: str
    comm_size: int
    instances: tuple[Instance, ...]
    node_id: int
    node_name: str
    world: bool = True

    @property
    def group_size(self) -> int:
        return len(self.instances[0].group)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        return () if self.world else tuple(inst.group for inst in self.instances)

    @property
    def members(self) -> tuple[tuple[int, int], ...]:
        return tuple(m for inst in self.instances for m in inst.members)

    @property
    def name(self) -> str:
        return f"collective {self.index} ({self.collective}, node {self.node_id} {self.node_name or 'unnamed'})"


@dataclass(frozen=True)
class Matching:
    """The trace's collectives, and the ``(rank, position)`` of nodes on one-rank groups (dependencies only)."""

    collectives: tuple[TraceCollective, ...]
    solo: frozenset[tuple[int, int]]


def match_collectives(per_rank: Sequence[Sequence[CollNode]], wheres: Sequence[str], table: GroupTable) -> Matching:
    """Every rank's collective nodes (each rank's in dependency order) matched into collectives; see the module
    docstring. :class:`FieldError` naming the rank and node unless the ranks of each group agree."""
    ordinal = {(n.rank, n.position): o for nodes in per_rank for o, n in enumerate(nodes)}
    by_pg: dict[str, dict[int, list[CollNode]]] = {}
    group_of: dict[str, tuple[int, ...]] = {}
    world = tuple(range(table.p))
    default_is_world = table.groups.get(DEFAULT_PG, world) == world
    for r, nodes in enumerate(per_rank):
        for node in nodes:
            group = table.ranks_of(node.pg_name, r, wheres[r], node.label)
            key = node.pg_name or (DEFAULT_PG if default_is_world else "")  # "" and "0" are one world group
            group_of.setdefault(key, group)
            by_pg.setdefault(key, {}).setdefault(r, []).append(node)
    instances: list[Instance] = []
    kinds: dict[Instance, CollNode] = {}
    solo: set[tuple[int, int]] = set()
    for pg, ranks in by_pg.items():
        group = group_of[pg]
        if len(group) == 1:
            solo.update((n.rank, n.position) for nodes in ranks.values() for n in nodes)
            continue
        for k, nodes in enumerate(_agreeing(pg, group, ranks, wheres)):
            inst = Instance(pg, k, group, tuple(n.position for n in nodes),
                            min(ordinal[(n.rank, n.position)] for n in nodes))
            instances.append(inst)
            kinds[inst] = nodes[0]
    return Matching(_classes(instances, kinds, table.p), frozenset(solo))


def _agreeing(pg: str, group: tuple[int, ...], ranks: Mapping[int, list[CollNode]],
              wheres: Sequence[str]) -> list[list[CollNode]]:
    """Per ``k`` the ``k``-th node of ``pg`` on each rank of ``group``; :class:`FieldError` unless they agree."""
    first = group[0]
    of_pg = "" if pg in ("", DEFAULT_PG) else f" of process group {pg!r}"
    counts = {r: len(ranks.get(r, [])) for r in group}
    for r in group:
        if counts[r] != counts[first]:
            raise FieldError(wheres[r], f"COMM_COLL_NODE nodes{of_pg}", f"{counts[first]}, as many as rank {first} "
                             "has", counts[r])
    out = []
    for k in range(counts[first]):
        mine = ranks[first][k]
        for r in group[1:]:
            node = ranks[r][k]
            for key, theirs, ours in (("comm_type", node.collective, mine.collective),
                                      ("comm_size", node.size, mine.size)):
                if theirs != ours:
                    raise FieldError(wheres[r], f"{node.label}.attr.{key}", f"{ours!r}, as rank {first}'s "
                                     f"collective {k}{of_pg} ({mine.label}) has", theirs)
        out.append([ranks[r][k] for r in group])
    return out


def _classes(instances: Sequence[Instance], kinds: Mapping[Instance, CollNode], p: int) -> tuple[TraceCollective, ...]:
    """Instances as collectives: alike ones with disjoint groups together (module docstring, "Matching")."""
    world = tuple(range(p))
    open_: dict[tuple[int, str, int, int], list[list[Instance]]] = {}
    order: list[list[Instance]] = []
    for inst in sorted(instances, key=lambda i: (i.ordinal, min(i.group), i.pg, i.k)):
        node = kinds[inst]
        if inst.group == world:
            order.append([inst])
            continue
        key = (inst.ordinal, node.collective, node.size, len(inst.group))
        home = next((c for c in open_.get(key, []) if not set(inst.group) & {r for i in c for r in i.group}), None)
        if home is None:
            home = []
            open_.setdefault(key, []).append(home)
            order.append(home)
        home.append(inst)
    out = []
    for index, members in enumerate(order):
        node = kinds[members[0]]
        out.append(TraceCollective(index, node.collective, node.size, tuple(members), node.node_id, node.name,
                                   world=members[0].group == world))
    return tuple(out)
