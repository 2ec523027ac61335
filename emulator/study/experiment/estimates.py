"""What an experiment's cells are expected to cost: wall seconds per cell, and ``emu run``'s admission request.

Estimates come from the model's prediction (:mod:`~emulator.study.experiment.prediction`);
an MPI cell, which no model predicts, is :data:`MPI_ESTIMATE_S`. The
request (:func:`experiment_request`) is what :mod:`emulator.runs.admission`
holds against this machine before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from emulator.model.prediction.check import CheckReport
from emulator.model.topology import Topology
from emulator.runs import admission
from emulator.runs.dilation import Envelope
from emulator.runs.mpi_plan import rank_hosts, require_rank0_on_head
from emulator.study.experiment.grid import groups
from emulator.study.experiment.prediction import PreparedCell

#: What a cell costs beyond its repetitions until measured: its agents' start-up (seconds; :func:`estimate_s`).
CELL_OVERHEAD_S = 1.5
#: The wall seconds an MPI cell is expected to take (no model predicts it): Open MPI's start-up and a short
#: benchmark, about what experiments/mpi.yaml's cells took here (37 to 58 s).
MPI_ESTIMATE_S = 45.0


def estimate_s(pc: PreparedCell, overhead_s: float) -> float:
    """Wall seconds a cell should take if the network met the model: repetitions plus agent start-up; for an
    MPI cell (no model) :data:`MPI_ESTIMATE_S`."""
    if pc.predicted_s is None:
        return MPI_ESTIMATE_S + overhead_s
    return (pc.cell.warmup + pc.cell.repeat) * pc.predicted_s + overhead_s


def cell_load(pc: PreparedCell, report: CheckReport, envelope_of: Callable[[int], Envelope]) -> admission.Load:
    """A replay cell's busiest step (its ``report``'s) against the machine's envelope at its MTU (capacity,
    agents' costs), at the rate of its topology's host links: the rate the load was predicted at."""
    profile = pc.cell.fabric
    return admission.load_of(report, envelope_of(profile.emulated_mtu), pc.cell.id, pc.topo, profile)


def experiment_request(todo: Sequence[PreparedCell], envelope_of: Callable[[int], Envelope]) -> admission.Request:
    """The unfinished cells of ``emu run``: one network at a time, so memory is the largest cell's; time the sum
    of every cell and every network's bring-up and probe. ``envelope_of(mtu)``: what the calibration at that MTU
    gives."""
    memory: list[admission.MemoryEstimate] = []
    loads: list[admission.Load] = []
    cells_s = 0.0
    for pc in todo:
        cells_s += estimate_s(pc, CELL_OVERHEAD_S)
        if pc.cell.mpi is not None:
            memory.append(admission.mpi_memory(pc.cell.ranks, admission.mpi_program_bytes(pc.cell.mpi.program), pc.topo))
        elif pc.schedule is not None and pc.report is not None:
            memory.append(admission.replay_memory(pc.schedule, pc.topo))
            loads.append(cell_load(pc, pc.report, envelope_of))
    networks = groups([pc.cell for pc in todo])
    by_id = {pc.cell.id: pc for pc in todo}
    networks_s = sum(admission.bringup_estimate_s(by_id[cells[0].id].topo) + admission.PROBE_S for _, cells in networks)
    mpi_cells = sum(pc.cell.mpi is not None for pc in todo)
    guess = f", MPI cells {MPI_ESTIMATE_S:g} s each (a guess)" if mpi_cells else ""
    empty = admission.MemoryEstimate(ranks=0, rank_bytes=0, programs_bytes=0, network_bytes=0, session_bytes=0)
    return admission.Request("run", admission.largest(memory) if memory else empty, cells_s + networks_s,
                             f"{len(todo)} cells left at the model's times, {len(networks)} bring-ups and probes"
                             f"{guess}", tuple(loads),
                             time_hint="raise --max-time (or the file's max_time), or use smaller sizes or fewer "
                             "repetitions")


def cluster_memory(todo: Sequence[PreparedCell], server_of: Callable[[Topology], Mapping[str, str]],
                   head: str) -> dict[str, admission.MemoryEstimate]:
    """The unfinished cells spread over a cluster (``server_of``: a topology's placement): each server's largest
    share (one network at a time). :class:`FieldError` for an MPI cell whose rank 0 would not run on the head."""
    shares = []
    for pc in todo:
        if pc.schedule is not None:
            shares.append(admission.replay_memory_per_server(pc.schedule, pc.topo, server_of(pc.topo), head))
        elif pc.cell.mpi is not None:
            hosts = rank_hosts(pc.topo, pc.cell.placement, pc.cell.mpi.np, pc.cell.seed)
            require_rank0_on_head(hosts, server_of(pc.topo), head)
            shares.append(admission.mpi_memory_per_server(
                hosts, admission.mpi_program_bytes(pc.cell.mpi.program), pc.topo, server_of(pc.topo), head))
    return admission.largest_per_server(shares)
