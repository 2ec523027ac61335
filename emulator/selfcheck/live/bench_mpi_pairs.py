"""Open MPI beside the agents (live): on each network of :data:`~emulator.selfcheck.bench.cases.MPI_FABRICS`, Open
MPI's allreduce run by ``emu mpirun`` with the bundled ``emu-allreduce-bench``, and our agents' replay of the
matching schedule, at the same link rate, without the profile's latencies (Open MPI's messages cannot get them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from emulator.base.errors import UserError
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.mpi.mpi_run import prepare as prepare_mpirun
from emulator.emulation.mpi.mpi_run import run as run_mpirun
from emulator.emulation.session import fidelity
from emulator.emulation.session.replay import ReplayFailed, ReplaySession
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.schedule.format import format_size
from emulator.runs.mpi_plan import MpiRunConfig, message_profile
from emulator.selfcheck.bench.cases import MPI_FABRICS, MPI_PAIRS, MPI_SIZE, MpiFabric
from emulator.selfcheck.bench.rows import MpiPairRow


def _agents(net: MpiFabric, topo: topology.Topology, bare: fabric.FabricProfile, out: str, datapath: str,
            calibration: Calibration, echo: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The agents' replay of every pair's algorithm on ``net``, in one session: each one's results document."""
    agents: dict[str, dict[str, Any]] = {}
    echo(f"  agents on {net.label} ({topo.spec}), {format_size(MPI_SIZE)}:")
    with ReplaySession(topo, net.routing, seed=net.seed, datapath=datapath,
                       latency=fidelity.latency_model(bare, calibration),
                       work_dir=os.path.join(out, "agents", "session"), echo=lambda s: echo("    " + s)) as session:
        for _, algo in MPI_PAIRS:
            schedule = generators.generate(algo, topo, MPI_SIZE, placement=net.placement, seed=net.seed)
            echo(f"   {algo}:")
            try:
                agents[algo] = session.run(schedule, os.path.join(out, "agents", algo), repeat=2, warmup=1).to_json()
            except ReplayFailed as exc:
                agents[algo] = {"status": "failed", "error": str(exc)}
    return agents


def _mpirun(net: MpiFabric, topo: topology.Topology, bare: fabric.FabricProfile, algo: str, out: str,
            datapath: str, echo: Callable[[str], None]) -> dict[str, Any]:
    """One emu mpirun of the bundled benchmark with Open MPI's ``algo`` on ``net``: its results document."""
    echo(f"  Open MPI {algo} on {net.label}:")
    cfg = MpiRunConfig(network=fabric.rebuild(topo.spec, bare, interconnect=False), routing=net.routing,
                       seed=net.seed, placement=net.placement, datapath=datapath, out=os.path.join(out, f"mpi-{algo}"),
                       program=("emu-allreduce-bench", "--algo", algo, "--sizes", str(MPI_SIZE),
                                "--iters", "3", "--warmup", "1"))
    try:
        return run_mpirun(prepare_mpirun(cfg), echo=lambda s: echo("    " + s)).to_json()
    except UserError as exc:
        return {"status": "failed", "error": str(exc)}


def _fabric_pairs(net: MpiFabric, bw: float, bare: fabric.FabricProfile, out: str, datapath: str,
                  calibration: Calibration, echo: Callable[[str], None]) -> list[MpiPairRow]:
    """Every pair on ``net``: the agents' replays in one session, then one emu mpirun per algorithm."""
    topo = topology.build(net.topology, bw)
    try:
        agents = _agents(net, topo, bare, out, datapath, calibration, echo)
    except Exception as exc:  # a benchmark reports and goes on to the next network
        echo(f"  agents on {net.label} failed: {exc}")
        return [MpiPairRow.not_run(net.label, m, a, str(exc)) for m, a in MPI_PAIRS]
    return [MpiPairRow.of(net.label, mpi_algo, agents_algo, _mpirun(net, topo, bare, mpi_algo, out, datapath, echo),
                          agents[agents_algo]) for mpi_algo, agents_algo in MPI_PAIRS]


def run_mpi_pairs(bw: float, profile: fabric.FabricProfile, out: str, datapath: str,
                  calibration: Calibration, echo: Callable[[str], None]) -> list[MpiPairRow]:
    """Every pair of :data:`MPI_PAIRS` on every network of :data:`MPI_FABRICS`, each in its own folder."""
    bare = message_profile(profile, latency=False)
    rows: list[MpiPairRow] = []
    for index, net in enumerate(MPI_FABRICS):
        rows += _fabric_pairs(net, bw, bare, os.path.join(out, f"fabric{index}"), datapath, calibration, echo)
    return rows


def failed_pairs(error: str) -> list[MpiPairRow]:
    """The rows of a section that failed as a whole."""
    return [MpiPairRow.not_run(net.label, m, a, error) for net in MPI_FABRICS for m, a in MPI_PAIRS]
