"""The report's timelines: which cells the heat map shows, and what their timelines say step by step.

Pure apart from reading the cells' folders (``results.json``,
``timeline.jsonl``, ``schedule.json``, ``topology.json``). It owns the heat
map's cells (:func:`pick_heatmap_cells`), their link x step matrices
(:func:`link_step_matrix`: flows the model routes on every directed
switch-to-switch link, mean measured goodput of the transfers crossing it)
and the first measured repetition's transfers and compute operations
(:func:`first_measured_transfers`, :func:`read_transfers`,
:func:`read_computes`), the Gantt charts' data.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.base.files import read_jsonl
from emulator.model import routing, topology
from emulator.model.prediction import cost
from emulator.model.schedule import format as sformat
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.runs import results
from emulator.study.report.rows import CellRow, Reference, busbw_rows


def pick_heatmap_cells(rows: list[CellRow], ref: Reference) -> tuple[CellRow | None, CellRow | None]:
    """One congested cell and one clean reference cell, at the largest size.

    Congested: an ECMP hd cell if one shares a link (the paper's case), else the cell with the most flows on a
    link; ties go to the lowest busbw. Clean: a reference cell with at most one flow per link. Allreduce cells
    come first, the clean cell is of the congested one's collective if it can be, and training rows are never
    picked (:func:`busbw_rows`).
    """
    ok = [r for r in busbw_rows(rows) if r.status == "ok" and not topology.is_ideal(r.kind)]
    if not ok:
        return None, None
    largest = max(r.size for r in ok)
    pool = [r for r in ok if r.size == largest] or ok
    # the paper's case first: halving-doubling hashed by ECMP; then whatever shares links most
    # at the host count most cells have (the main comparison), not a scaling point
    hosts = statistics.mode(r.hosts for r in pool)
    congested = max(pool, key=lambda r: (r.collective == ALLREDUCE,
                                         routing.hashes_five_tuples(r.routing) and r.algorithm == "hd"
                                         and r.max_flows_per_link > 1,
                                         r.hosts == hosts, r.max_flows_per_link, -(r.busbw_mbps or 0)))
    clean_pool = [r for r in pool if ref.matches(r) and r.max_flows_per_link <= 1] or \
                 [r for r in pool if r.max_flows_per_link <= 1]
    clean = max(clean_pool, key=lambda r: (r.collective == congested.collective, r.hosts == congested.hosts,
                                           r.busbw_mbps or 0)) if clean_pool else None
    if congested.max_flows_per_link <= 1:
        return None, clean
    return congested, clean


@dataclass(frozen=True)
class Transfer:
    """One transfer of ``timeline.jsonl`` (:func:`emulator.runs.metrics.timeline_records`): monotonic seconds."""

    rep: int
    step: int
    src: int  # sending rank
    src_host: str
    dst_host: str
    bytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Compute:
    """One compute operation of ``timeline.jsonl`` (:func:`emulator.runs.metrics.compute_records`): monotonic seconds.

    ``seconds`` is the op's own (real accelerator) time in the schedule; ``end - start`` the dilated time it ran.
    """

    rep: int
    step: int
    rank: int
    host: str
    op: int
    seconds: float
    start: float
    end: float


def _timeline_records(cell_dir: str, rep: int) -> list[dict[str, Any]]:
    return [t for t in read_jsonl(os.path.join(cell_dir, "timeline.jsonl")) if t.get("rep") == rep]


def _transfer(t: Mapping[str, Any]) -> Transfer:
    return Transfer(rep=t["rep"], step=t["step"], src=t["src"], src_host=t["src_host"], dst_host=t["dst_host"],
                    bytes=t["bytes"], start=t["start"], end=t["end"])


def _compute(t: Mapping[str, Any]) -> Compute:
    return Compute(rep=t["rep"], step=t["step"], rank=t["rank"], host=t["host"], op=t["op"],
                   seconds=float(t["seconds"]), start=t["start"], end=t["end"])


def read_transfers(cell_dir: str, rep: int) -> list[Transfer]:
    """The transfers of repetition ``rep`` in the cell's timeline (compute records are left out)."""
    return [_transfer(t) for t in _timeline_records(cell_dir, rep) if t.get("kind") != "compute"]


def read_computes(cell_dir: str, rep: int) -> list[Compute]:
    """The compute operations of repetition ``rep`` in the cell's timeline (``"kind": "compute"`` records)."""
    return [_compute(t) for t in _timeline_records(cell_dir, rep) if t.get("kind") == "compute"]


def _first_measured(res: results.CellResults | None) -> int:
    """The index of the first measured repetition: after the warm-up ones."""
    return int((res.config if res else {}).get("warmup", 0))


@dataclass(frozen=True)
class Timeline:
    """One cell's first measured repetition, transfer by transfer and compute op by op (the Gantt chart's data)."""

    row: CellRow
    rep: int
    transfers: list[Transfer]
    computes: list[Compute] = field(default_factory=list)

    @property
    def start(self) -> float:
        """The first send's or compute op's start (the timeline has at least one of them)."""
        return min([t.start for t in self.transfers] + [c.start for c in self.computes])

    @property
    def end(self) -> float:
        return max([t.end for t in self.transfers] + [c.end for c in self.computes])


def first_measured_transfers(rows: Iterable[CellRow]) -> list[Timeline]:
    """Each row's first measured repetition (transfers and compute ops), for the rows whose timeline has one."""
    out = []
    for row in rows:
        rep = _first_measured(results.load(os.path.join(row.dir, "results.json")))
        records = _timeline_records(row.dir, rep)
        transfers = [_transfer(t) for t in records if t.get("kind") != "compute"]
        computes = [_compute(t) for t in records if t.get("kind") == "compute"]
        if transfers or computes:
            out.append(Timeline(row=row, rep=rep, transfers=transfers, computes=computes))
    return out


@dataclass(frozen=True)
class LinkStepMatrix:
    """Per step x directed switch-to-switch link (``s1>s3``): flows the model routes, mean measured goodput.

    ``flows[i][j]`` and ``measured_mbps[i][j]`` are of step ``steps[i]`` and link ``links[j]``; measured is
    None where no transfer of repetition ``rep`` crossed the link in that step.
    """

    links: list[str]
    steps: list[int]
    flows: list[list[int]]
    measured_mbps: list[list[float | None]]
    rep: int


def link_step_matrix(cell_dir: str, rep: int | None = None) -> LinkStepMatrix:
    """The cell's :class:`LinkStepMatrix` for repetition ``rep`` (default: the first measured one).

    Reads the cell's schedule, topology, results (routing, seed) and timeline, and routes every transfer's
    host pair as the cell did (:func:`emulator.model.routing.route`).
    """
    res = results.load(os.path.join(cell_dir, "results.json"))
    cfg = res.config if res else {}
    topo = topology.load(os.path.join(cell_dir, "topology.json"))
    schedule = sformat.load(os.path.join(cell_dir, "schedule.json"))
    policy, seed = cfg.get("routing", "shortest"), int(cfg.get("seed", 0))
    costs = cost.analyze(schedule, topo, policy, seed=seed)
    links = sorted({lk for st in costs.steps for lk in st.flows_per_link
                    if topo.is_switch(lk[0]) and topo.is_switch(lk[1])},
                   key=lambda lk: (int(lk[0][1:]), int(lk[1][1:])))
    steps = [st.step for st in costs.steps]
    flows = [[st.flows_per_link.get(lk, 0) for lk in links] for st in costs.steps]
    if rep is None:
        rep = _first_measured(res)
    rates: dict[tuple[int, tuple[str, str]], list[float]] = {}
    paths: dict[tuple[str, str], list[str]] = {}
    for t in read_transfers(cell_dir, rep):
        if t.end <= t.start:
            continue
        pair = (t.src_host, t.dst_host)
        if pair not in paths:
            paths[pair] = routing.route(topo, policy, routing.agent_flow(topo, *pair), seed=seed)
        mbps = t.bytes * 8 / (t.end - t.start) / 1e6
        for lk in routing.switch_links_of(paths[pair]):
            rates.setdefault((t.step, lk), []).append(mbps)
    measured = [[statistics.mean(rates[(s, lk)]) if (s, lk) in rates else None for lk in links] for s in steps]
    return LinkStepMatrix(links=[f"{a}>{b}" for a, b in links], steps=steps, flows=flows, measured_mbps=measured,
                          rep=rep)
