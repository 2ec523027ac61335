"""The bench's replays (live): every algorithm of one case at every size, in one replay session on its network."""

from __future__ import annotations

import os
from collections.abc import Callable

from emulator.emulation.session.replay import ReplayFailed, ReplaySession
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.schedule.format import format_size
from emulator.selfcheck.bench.cases import Case, Size
from emulator.selfcheck.bench.rows import ReplayRow


def run_case(case: Case, bw: float, sizes: tuple[Size, ...], out: str, datapath: str, latency: LatencyModel,
             echo: Callable[[str], None]) -> list[ReplayRow]:
    """Replay every algorithm of ``case`` at every size in one session; a failed replay becomes a failed row."""
    topo = topology.build(case.topology, bw)
    rows = []
    slug = f"{topo.kind}-{case.routing}-{case.seed}"
    echo(f"  {case.label}:")
    with ReplaySession(topo, case.routing, seed=case.seed, datapath=datapath, latency=latency,
                       work_dir=os.path.join(out, slug, "session"), echo=lambda s: echo("    " + s)) as session:
        for size, algo in case.runs(sizes):
            schedule = generators.generate(algo, topo, size.bytes)
            echo(f"   {algo} {format_size(size.bytes)}:")
            try:
                results = session.run(schedule, os.path.join(out, slug, f"{algo}-{format_size(size.bytes)}"),
                                      repeat=size.repeat, warmup=size.warmup).to_json()
            except ReplayFailed as exc:
                results = {"status": "failed", "error": str(exc)}
            rows.append(ReplayRow.of(case, algo, results, bw, size.bytes))
    return rows


def failed_case(case: Case, bw: float, sizes: tuple[Size, ...], error: str) -> list[ReplayRow]:
    """The rows of a case whose session failed as a whole: one per size and algorithm (its extra sizes aside)."""
    return [ReplayRow.failed(case, algo, error, bw, size.bytes) for size in sizes for algo in case.algorithms]
