"""Paper scale, by the model alone: the experiment's comparisons at 128 to 1024 accelerators.

The emulator runs up to 64 hosts on this machine; the paper's claims are about
clusters of hundreds to a thousand accelerators. This module projects the same
comparisons there with the validated timing model
(:func:`emulator.model.prediction.projection.project`, which equals ``schedule check``'s
prediction on the sizes the emulator runs) on equal-radix fabrics
(:func:`~emulator.model.prediction.projection.paper_scale_topologies`): BiGraph + hdrm
against leaf-spine (and fat-tree where one exists at that size) with ECMP
(median over :data:`SEEDS`) and ring or hd. Times are on the real fabric the
profile names (no emulation, no machine latency): the profile's bandwidth,
per-message and per-switch latency.

For experiments on servers (the designs of ``experiments/clusters.yaml``),
:func:`project_families` grows each design the experiment ran to more
accelerators instead (:func:`emulator.model.topology.grown_spec`: the same
servers, rails longer with their spines in proportion, BiGraph by the
equal-radix rule) and projects each of its algorithms there.

It also summarises the model's measured error at the scales the emulator ran
(:func:`model_error`), which the report puts beside the projection. Pure.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from emulator.base.errors import FieldError, UserError
from emulator.model import routing, topology
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.model.prediction.projection import paper_scale_topologies, project
from emulator.model.schedule.semantics import bus_bandwidth_mbps

HOSTS = (128, 256, 512, 1024)
SIZES = (1 << 20, 16 << 20)  # bytes per rank: the emulated scaling series' size, and a bandwidth-bound one
SEEDS = (0, 1)
#: (role of the fabric, routing, algorithm): the reference first.
REFERENCE = ("bigraph", "bigraph", "hdrm")
BASELINES = (("leafspine", "ecmp", "hd"), ("leafspine", "ecmp", "ring"), ("fattree", "ecmp", "hd"),
             ("fattree", "ecmp", "ring"))


@dataclass(frozen=True)
class Point:
    """One projected allreduce (ECMP seeds folded by their median)."""

    hosts: int
    size: int
    fabric: str  # role: bigraph, leafspine, fattree
    topology: str
    routing: str
    algorithm: str
    real_time_s: float
    busbw_gbps: float  # real bus bandwidth, Gbit/s
    efficiency: float  # busbw / the link's TCP goodput


@dataclass(frozen=True)
class Comparison:
    hosts: int
    size: int
    reference: Point
    baseline: Point

    @property
    def speedup(self) -> float:
        return self.baseline.real_time_s / self.reference.real_time_s


def _point(hosts: int, size: int, role: str, spec: str, policy: str, algo: str, profile: FabricProfile) -> Point:
    topo = topology.build(spec, profile.emulated_link_mbps, profile.domain_ratio)
    model = LatencyModel(profile)
    seeds = routing.seeds_of(policy, SEEDS)
    times = [project(algo, topo, policy, size, seed=s, latency=model, mtu=profile.emulated_mtu).time_s for s in seeds]
    emulated = statistics.median(times)
    real = profile.real_seconds(emulated)
    busbw_mbps = bus_bandwidth_mbps(size, hosts, emulated)
    goodput = profile.emulated_link_mbps * topology.tcp_goodput_factor(profile.emulated_mtu)
    return Point(hosts=hosts, size=size, fabric=role, topology=spec, routing=policy, algorithm=algo,
                 real_time_s=real, busbw_gbps=profile.real_mbps(busbw_mbps) / 1000, efficiency=busbw_mbps / goodput)


@functools.cache
def project_comparisons(profile: FabricProfile, sizes: Sequence[int] = SIZES,
                        hosts: Sequence[int] = HOSTS) -> tuple[Comparison, ...]:
    """The reference against every baseline that exists at each host count and size (cached: it is pure)."""
    out = []
    for n in hosts:
        specs = dict(paper_scale_topologies(n))
        for size in sizes:
            ref = _point(n, size, REFERENCE[0], specs[REFERENCE[0]], REFERENCE[1], REFERENCE[2], profile)
            for role, policy, algo in BASELINES:
                if role in specs:
                    base = _point(n, size, role, specs[role], policy, algo, profile)
                    out.append(Comparison(hosts=n, size=size, reference=ref, baseline=base))
    return tuple(out)


@dataclass(frozen=True)
class Family:
    """What an experiment ran on one design: its topology spec (as measured), routing and algorithm."""

    topology: str
    routing: str
    algorithm: str


@dataclass(frozen=True)
class Grown:
    """One family grown to ``hosts`` accelerators and projected at ``size``: its point, or why there is none."""

    family: Family
    hosts: int
    size: int
    point: Point | None
    why: str | None = None


#: Where :func:`project_families` grows the designs to (accelerators), and the bandwidth-bound size it adds.
FAMILY_HOSTS = (256, 1024)
FAMILY_LARGE_SIZE = 256 << 20


@functools.cache
def project_families(families: tuple[Family, ...], profile: FabricProfile, sizes: tuple[int, ...],
                     hosts: tuple[int, ...] = FAMILY_HOSTS) -> tuple[Grown, ...]:
    """Every family grown to each of ``hosts`` and projected at each of ``sizes`` (cached: it is pure). A
    design without that size, or an algorithm the projection does not model there, is a :class:`Grown` with
    ``why``."""
    out = []
    for fam in families:
        for n in hosts:
            # at the profile's own rate, so that its dilation gives real times (the interconnect's ratio kept)
            spec = topology.grown_spec(topology.at_link_rate(fam.topology, profile.emulated_link_mbps), n)
            for size in sizes:
                if spec is None:
                    out.append(Grown(fam, n, size, None, f"{fam.topology.split(':')[0]} has no design of {n}"))
                    continue
                kind = spec.split(":")[0]
                try:
                    point = _point(n, size, kind, spec, fam.routing, fam.algorithm, profile)
                except (FieldError, UserError) as exc:
                    out.append(Grown(fam, n, size, None, str(exc)))
                    continue
                out.append(Grown(fam, n, size, point))
    return tuple(out)


@dataclass(frozen=True)
class ModelError:
    """measured / predicted time of the cells whose measurement is trusted, at one host count."""

    hosts: int
    cells: int
    median: float
    low: float
    high: float


class MeasuredCell(Protocol):
    """What :func:`model_error` reads of a cell (:class:`emulator.study.cell_kinds.replay.CellRow` has it)."""

    @property
    def status(self) -> str: ...
    @property
    def measurement_trusted(self) -> bool: ...  # every check but the model's had its data and passed
    @property
    def hosts(self) -> int: ...
    @property
    def measured_over_predicted(self) -> float | None: ...


def model_error(rows: Iterable[MeasuredCell]) -> list[ModelError]:
    """Per host count, the spread of measured/predicted time over the finished cells whose measurement is trusted.

    The model's own check (its band) is left out of that trust: a cell the model disagrees with is part of the
    model's error, not a reason to leave it out of it; a cell flagged or unchecked by any other check is left out.
    """
    by_hosts: dict[int, list[float]] = {}
    for r in rows:
        ratio = r.measured_over_predicted
        if r.status == "ok" and r.measurement_trusted and ratio:
            by_hosts.setdefault(int(r.hosts), []).append(float(ratio))
    return [ModelError(hosts=h, cells=len(v), median=statistics.median(v), low=min(v), high=max(v))
            for h, v in sorted(by_hosts.items())]
