"""``emu bench``'s run (live): every section in order on one fabric profile, the results written after each."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

from emulator.base.files import PROJECT_ROOT, write_json_atomic
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.machine.system import choose_datapath, load_average
from emulator.emulation.session import fidelity
from emulator.emulation.session.nccl_packets import Gate
from emulator.model.fabric import FabricProfile
from emulator.model.schedule.format import format_size
from emulator.selfcheck.bench.cases import (
    BIGRAPH,
    BRINGUP_TOPOLOGY,
    CROSSOVERS,
    DEFAULT_CASES,
    DEFAULT_SIZES,
    SCALE_BRINGUP_TOPOLOGIES,
    Case,
    Crossover,
    Size,
)
from emulator.selfcheck.bench.crossovers import CrossoverRow
from emulator.selfcheck.bench.results import BenchResults
from emulator.selfcheck.bench.rows import AgentsVsIperf, HdrmMissing, NcclPacketRow, SectionError
from emulator.selfcheck.live.bench_bringup import measure_bringup
from emulator.selfcheck.live.bench_mpi_pairs import failed_pairs, run_mpi_pairs
from emulator.selfcheck.live.bench_nccl_packets import run_nccl_packets
from emulator.selfcheck.live.bench_replays import failed_case, run_case
from emulator.selfcheck.live.calibration import (
    ensure_calibration,
    machine_info,
    measure_agents_aggregate,
    measure_agents_vs_iperf,
)

Echo = Callable[[str], None]


def agents_section(results: BenchResults, datapath: str, echo: Echo) -> None:
    echo("agents vs iperf3 on one link:")
    try:
        agents = AgentsVsIperf.of(measure_agents_vs_iperf(results.link_mbps, seconds=4.0, repeat=3,
                                                          datapath=datapath, mtu=results.mtu))
        results.agents = agents
        results.machine["datapath"] = choose_datapath(datapath)
        echo(f"  {agents.agent_mbps:.2f} vs {agents.iperf3_mbps:.2f} Mbit/s per direction")
    except Exception as exc:  # a benchmark reports and goes on
        results.agents = SectionError.of(exc)
        echo(f"  failed: {exc}")


def aggregate_section(results: BenchResults, datapath: str, echo: Echo) -> None:
    echo("agents vs iperf3, every flow at once:")
    try:
        agents = AgentsVsIperf.of(measure_agents_aggregate(results.calibration_capacity_mbps, datapath=datapath,
                                                           mtu=results.mtu))
        results.agents_aggregate = agents
        echo(f"  {agents.agent_mbps:.0f} vs {agents.iperf3_mbps:.0f} Mbit/s in all")
    except Exception as exc:
        results.agents_aggregate = SectionError.of(exc)
        echo(f"  failed: {exc}")


def replays_section(results: BenchResults, cases: tuple[Case, ...], datapath: str, echo: Echo,
                    save: Callable[[], None]) -> None:
    echo("replays:")
    for case in cases:
        try:
            results.replays += run_case(case, results.link_mbps, results.sizes, results.runs_dir, datapath,
                                        results.latency, echo)
        except Exception as exc:
            results.replays += failed_case(case, results.link_mbps, results.sizes, SectionError.of(exc).error)
            echo(f"  {case.label} failed: {exc}")
        save()


def figures_of_replays(results: BenchResults, crossovers: tuple[Crossover, ...]) -> None:
    """hdrm's busbw at the largest size, and the crossovers, measured and predicted."""
    largest = max(s.bytes for s in results.sizes)
    results.hdrm = next((r for r in results.replays if r.algorithm == "hdrm" and r.topology == BIGRAPH
                         and r.size == largest), HdrmMissing(largest))
    results.crossovers = [CrossoverRow.of(c, results.replays, results.link_mbps, results.latency, results.mtu)
                          for c in crossovers]


def mpi_section(results: BenchResults, datapath: str, calibration: Calibration, echo: Echo) -> None:
    echo("Open MPI beside the agents:")
    try:
        results.mpi = run_mpi_pairs(results.link_mbps, results.profile, os.path.join(results.runs_dir, "mpi"),
                                    datapath, calibration, echo)
    except Exception as exc:
        results.mpi = failed_pairs(SectionError.of(exc).error)
        echo(f"  failed: {exc}")


def nccl_packets_section(results: BenchResults, gate: Gate, echo: Echo, save: Callable[[], None]) -> None:
    """NCCL's all-reduce as packets beside its model, admitted through ``gate``; saved after every cluster."""
    echo("NCCL's all-reduce as packets:")

    def progress(rows: list[NcclPacketRow]) -> None:
        results.nccl_packets = rows
        save()

    try:
        results.nccl_packets = run_nccl_packets(results.runs_dir, gate, echo, on_rows=progress)
    except Exception as exc:
        results.nccl_packets = SectionError.of(exc)
        echo(f"  failed: {exc}")


def bringup_section(results: BenchResults, rounds: int, datapath: str, spec: str, echo: Echo) -> None:
    echo("bring-up:")
    try:
        results.bringup = measure_bringup(rounds, datapath, results.mtu, echo, spec)
    except Exception as exc:
        results.bringup = SectionError.of(exc)
        echo(f"  failed: {exc}")


def scale_bringup_section(results: BenchResults, datapath: str, specs: tuple[str, ...], echo: Echo) -> None:
    """One bring-up of each of ``specs``, ours then plain Mininet's; a failure is that topology's row only."""
    if not specs:
        return
    echo("bring-up at scale:")
    results.bringup_at_scale = []
    for spec in specs:
        try:
            results.bringup_at_scale.append(measure_bringup(1, datapath, results.mtu, echo, spec))
        except Exception as exc:
            results.bringup_at_scale.append(SectionError.of(exc))
            echo(f"  {spec} failed: {exc}")


def bench(profile: FabricProfile, sizes: tuple[Size, ...] = DEFAULT_SIZES, bringup_rounds: int = 2,
          datapath: str = "auto", out_dir: str | None = None, cases: tuple[Case, ...] = DEFAULT_CASES,
          crossovers: tuple[Crossover, ...] = CROSSOVERS, bringup_topology: str = BRINGUP_TOPOLOGY,
          scale_bringups: tuple[str, ...] = SCALE_BRINGUP_TOPOLOGIES, echo: Echo = print,
          nccl_gate: Gate | None = None) -> BenchResults:
    """Run every section; returns the results (also written to ``results/bench-<timestamp>.json``). The NCCL
    section runs only with ``nccl_gate``, what its cells are admitted against."""
    t0 = time.monotonic()
    calibration = ensure_calibration(profile, datapath, echo)
    latency = fidelity.latency_model(profile, calibration)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join(PROJECT_ROOT, "results")
    results = BenchResults(stamp, machine_info(datapath, profile.emulated_mtu), profile, latency, sizes,
                           calibration.datapath_capacity_mbps, os.path.join(out_dir, f"bench-{stamp}.json"),
                           os.path.join(out_dir, f"bench-{stamp}"))

    def save() -> None:
        results.duration_s = time.monotonic() - t0
        write_json_atomic(results.path, results.to_json())

    echo(f"bench: {profile.describe()}; sizes {', '.join(format_size(s.bytes) for s in sizes)}")
    agents_section(results, datapath, echo)
    save()
    aggregate_section(results, datapath, echo)
    save()
    replays_section(results, cases, datapath, echo, save)
    figures_of_replays(results, crossovers)
    save()
    mpi_section(results, datapath, calibration, echo)
    save()
    if nccl_gate is not None:
        nccl_packets_section(results, nccl_gate, echo, save)
        save()
    bringup_section(results, bringup_rounds, datapath, bringup_topology, echo)
    save()
    scale_bringup_section(results, datapath, scale_bringups, echo)
    results.machine["loadavg_after"] = load_average()
    save()
    return results
