"""A hybrid-parallel language-model iteration at more accelerators, by the model alone.

Pure. Weak scaling, as a cluster grows its data-parallel degree: the tensor-
and pipeline-parallel split stays, each rank keeps its layers, microbatches
and compute, and only the data-parallel groups grow (``D = N / (T·P)``). Of
an iteration (:mod:`emulator.model.workloads.llm`) that changes the
distributed optimizer's phase after the pipeline: its reduce-scatters and
all-gathers run over groups of ``D`` on a fabric of ``N`` accelerators. The
pipeline's own traffic (tensor-parallel collectives inside each server,
pipeline messages between two stages) is per rank the same; what other
groups' traffic does to it on a bigger fabric is not modelled.

So the iteration at ``N`` is the timing model's iteration at the measured
size, plus the data-parallel phase's change: that phase alone
(:func:`~emulator.model.workloads.llm.dp_phase`, every rank starting at once)
by the timing model on the design grown to ``N``
(:func:`~emulator.model.topology.grown_spec`), minus the same at the measured
size. Both phases use the cell's scale, algorithm, routing and fabric
profile (the one it replayed on: its latencies already divided by the
scale, :func:`~emulator.model.fabric.for_workload_scale`), so the sum is in
the cell's emulated seconds; :attr:`LlmPoint.real_iteration_s` is the full-size
iteration on the real fabric (the dilation and the scale undone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from emulator.base.errors import FieldError, UserError
from emulator.model import topology
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import time_only
from emulator.model.workloads import llm

#: The sizes the report grows a language-model cell to.
HOSTS = (256, 1024)


@dataclass(frozen=True)
class LlmPoint:
    """One grown size: its fabric, data-parallel degree, the phase's time there and the iteration's (emulated
    seconds of the cell's scaled run; None with ``why`` where the design or the model has no such size)."""

    hosts: int
    topology: str | None
    dp: int
    dp_phase_s: float | None = None
    iteration_s: float | None = None
    compute_only_s: float | None = None
    dilation: float = 1.0
    scale: float = 1.0
    why: str = ""

    @property
    def efficiency(self) -> float | None:
        """Compute-only time over iteration time at this size."""
        if self.iteration_s is None or self.compute_only_s is None or self.iteration_s <= 0:
            return None
        return self.compute_only_s / self.iteration_s

    @property
    def real_iteration_s(self) -> float | None:
        """The full-size iteration on the real fabric: emulated seconds over the dilation, times the scale."""
        return None if self.iteration_s is None else self.iteration_s / self.dilation * self.scale


def dp_phase_s(spec: str, routing: str, config: llm.LlmConfig, dp_algo: str, scale: float,
               profile: FabricProfile) -> float:
    """The timing model's time of :func:`~emulator.model.workloads.llm.dp_phase` at ``scale`` on ``spec``
    (emulated seconds on ``profile``, the fabric the scaled workload replays on)."""
    topo = topology.build(spec, profile.emulated_link_mbps, profile.domain_ratio)
    phase = llm.dp_phase(topo, config, dp_algo=dp_algo, scale=scale)
    # not proved here: at 1024 ranks the proof would take tens of GiB; the same generators' parts prove in the
    # iteration that was measured and in tests/unit/test_llm_scale.py
    return time_only(phase, topo, routing, latency=LatencyModel(profile), mtu=profile.emulated_mtu)


def grow(spec: str, routing: str, config: llm.LlmConfig, dp_algo: str, scale: float, profile: FabricProfile,
         iteration_s: float, compute_only_s: float, hosts: tuple[int, ...] = HOSTS) -> list[LlmPoint]:
    """The iteration of ``config`` on ``spec`` (the timing model's ``iteration_s`` and ``compute_only_s``,
    emulated seconds) grown to each of ``hosts`` (see the module docstring)."""
    own = topology.at_link_rate(spec, profile.emulated_link_mbps)
    here = dp_phase_s(own, routing, config, dp_algo, scale, profile)
    per_replica = config.tp * config.pp
    out = []
    for n in hosts:
        point = LlmPoint(n, None, n // per_replica, dilation=profile.dilation, scale=scale)
        grown = topology.grown_spec(own, n) if n % per_replica == 0 else None
        if grown is None:
            out.append(replace(point, why=f"{own.split(':')[0]} has no design of {n} accelerators for tp x pp "
                                          f"{per_replica}"))
            continue
        try:
            there = dp_phase_s(grown, routing, replace(config, dp=n // per_replica), dp_algo, scale, profile)
        except (FieldError, UserError) as exc:
            out.append(replace(point, topology=grown, why=str(exc)))
            continue
        out.append(replace(point, topology=grown, dp_phase_s=there, iteration_s=iteration_s - here + there,
                           compute_only_s=compute_only_s))
    return out
