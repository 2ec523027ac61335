"""The bench before it runs: its fabric profile (:func:`bench_profile`: ``--fabric``'s, parsed by the command line,
with ``--bw`` applied) and the whole bench as admission sees it (:func:`admission_request`), from the model alone
(pure: no network)."""

from __future__ import annotations

from emulator.base.errors import UserError
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import predict
from emulator.model.schedule.format import format_size
from emulator.runs import admission
from emulator.runs.dilation import Envelope
from emulator.selfcheck.bench.cases import (
    BRINGUP_TOPOLOGY,
    DEFAULT_CASES,
    MPI_FABRICS,
    MPI_PAIRS,
    MPI_SIZE,
    SCALE_BRINGUP_TOPOLOGIES,
    Case,
    Size,
)

#: Sections no model predicts, as measured here (docs/fidelity.md): agents vs iperf3 (six 4 s runs, two networks),
#: and one Open MPI run of the bundled benchmark with its network.
AGENTS_VS_IPERF_S = 60.0
MPI_RUN_S = 60.0


def bench_profile(profile: fabric.FabricProfile, bw: float | None) -> fabric.FabricProfile:
    """The fabric profile of the bench: ``profile`` (``--fabric``'s); ``--bw`` changes its dilation so that links
    emulate at ``bw``."""
    if bw is None:
        return profile
    if isinstance(bw, bool) or not fabric.MIN_LINK_MBPS <= bw <= fabric.MAX_LINK_MBPS:
        raise UserError(f"bench: field 'bw': expected Mbit/s from {fabric.MIN_LINK_MBPS:g} to "
                        f"{fabric.MAX_LINK_MBPS:g}, got {bw!r}")
    return fabric.at_link_rate(profile, bw, where="bench: bw")


class _Tally:
    """What admission adds up over the bench's networks: memory, time, and every replay's load."""

    def __init__(self, profile: fabric.FabricProfile, latency: LatencyModel, env: Envelope) -> None:
        self.profile, self.latency, self.env = profile, latency, env
        self.memory: list[admission.MemoryEstimate] = []
        self.loads: list[admission.Load] = []
        self.time_s = AGENTS_VS_IPERF_S

    def case(self, case: Case, sizes: tuple[Size, ...]) -> None:
        """One session of ``case``: its bring-up and each replay, predicted as ``schedule check`` would."""
        topo = topology.build(case.topology, self.profile.emulated_link_mbps)
        self.time_s += admission.bringup_estimate_s(topo)
        for size, algo in case.runs(sizes):
            schedule = generators.generate(algo, topo, size.bytes)
            report = predict(schedule, topo, case.routing, seed=case.seed, latency=self.latency,
                             mtu=self.profile.emulated_mtu)
            self.memory.append(admission.replay_memory(schedule, topo))
            self.loads.append(admission.load_of(report, self.env, f"{algo} {format_size(size.bytes)} on "
                                                f"{case.label}", topo, self.profile))
            self.time_s += admission.replay_time_s(report, size.warmup + size.repeat)

    def mpi_pairs(self) -> None:
        """On each MPI fabric, the agents' session and one Open MPI run per pair, each with its network."""
        for net in MPI_FABRICS:
            topo = topology.build(net.topology, self.profile.emulated_link_mbps)
            self.memory.append(admission.mpi_memory(len(topo.hosts), 3 * MPI_SIZE, topo))
            self.time_s += (len(MPI_PAIRS) + 1) * admission.bringup_estimate_s(topo) + len(MPI_PAIRS) * MPI_RUN_S
            for _, algo in MPI_PAIRS:
                schedule = generators.generate(algo, topo, MPI_SIZE, placement=net.placement)
                report = predict(schedule, topo, net.routing, seed=net.seed, latency=self.latency,
                                 mtu=self.profile.emulated_mtu)
                self.time_s += admission.replay_time_s(report, 3)


def admission_request(profile: fabric.FabricProfile, sizes: tuple[Size, ...], latency: LatencyModel,
                      env: Envelope, cases: tuple[Case, ...] = DEFAULT_CASES, bringup_rounds: int = 2,
                      bringup_topology: str = BRINGUP_TOPOLOGY,
                      scale_bringups: tuple[str, ...] = SCALE_BRINGUP_TOPOLOGIES) -> admission.Request:
    """The whole bench as admission sees it: its largest replay's memory, every section's time, every replay's
    load (each replay is predicted, as ``schedule check`` would)."""
    tally = _Tally(profile, latency, env)
    for case in cases:
        tally.case(case, sizes)
    tally.mpi_pairs()
    tally.time_s += 2 * bringup_rounds * admission.bringup_estimate_s(topology.build(bringup_topology))
    for spec in scale_bringups:  # one round each, ours and plain Mininet's
        topo = topology.build(spec)
        tally.time_s += 2 * admission.bringup_estimate_s(topo)
        tally.memory.append(admission.MemoryEstimate(0, 0, 0, admission.network_bytes(topo)))
    return admission.Request("bench", admission.largest(tally.memory), tally.time_s,
                             f"{len(tally.loads)} replays at the model's times, bring-ups, agents vs iperf3 and "
                             f"{len(MPI_PAIRS) * len(MPI_FABRICS)} Open MPI runs at {AGENTS_VS_IPERF_S:g} s and {MPI_RUN_S:g} s",
                             tuple(tally.loads))
