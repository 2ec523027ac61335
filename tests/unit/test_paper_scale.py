"""Paper-scale projection: the report's comparisons by the model alone, equal to `schedule check` where both run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction import paper_scale
from emulator.model.prediction.check import predict


def _predicted_s(algo: str, spec: str, policy: str, size: int, seed: int, profile: fabric.FabricProfile) -> float:
    topo = topology.build(f"{spec},bw={profile.emulated_link_mbps:g}")
    schedule = generators.generate(algo, topo, size)
    return predict(schedule, topo, policy, seed=seed, latency=LatencyModel(profile),
                   mtu=profile.emulated_mtu).predicted_time_s


@pytest.mark.parametrize("hosts", [8, 32])
def test_on_small_sizes_the_projection_is_the_model_of_the_same_schedules(hosts):
    profile = fabric.default()
    size = 256 * 1024
    comps = paper_scale.project_comparisons(profile, (size,), (hosts,))
    roles = {(c.baseline.fabric, c.baseline.algorithm) for c in comps}
    assert ("leafspine", "hd") in roles and ("leafspine", "ring") in roles
    for c in comps:
        ref = c.reference
        assert ref.real_time_s == pytest.approx(
            profile.real_seconds(_predicted_s("hdrm", ref.topology, "bigraph", size, 0, profile)), rel=0.035)
        seeds = [_predicted_s(c.baseline.algorithm, c.baseline.topology, "ecmp", size, s, profile)
                 for s in paper_scale.SEEDS]
        median = sorted(seeds)[len(seeds) // 2] if len(seeds) % 2 else sum(seeds) / len(seeds)
        assert c.baseline.real_time_s == pytest.approx(profile.real_seconds(median), rel=1e-6)
        assert c.speedup == pytest.approx(c.baseline.real_time_s / ref.real_time_s)
        assert 0 < ref.efficiency <= 1 and 0 < c.baseline.efficiency <= 1


def test_the_paper_scale_grid_reaches_1024_accelerators_with_fat_trees_where_they_exist():
    comps = paper_scale.project_comparisons(fabric.default(), (16 << 20,), (1024,))
    assert {c.hosts for c in comps} == {1024}
    assert {c.baseline.fabric for c in comps} == {"leafspine", "fattree"}
    assert all(c.reference.topology.startswith("bigraph:") and c.speedup > 0 for c in comps)


@dataclass(frozen=True)
class Cell:
    """The fields of a report row that :func:`paper_scale.model_error` reads."""

    status: str
    measurement_trusted: bool
    hosts: int
    measured_over_predicted: float | None


def test_model_error_summarises_trusted_cells_by_host_count():
    rows = [Cell("ok", True, 16, r) for r in (1.0, 1.1, 0.9)]
    rows += [Cell("ok", False, 16, 3.0), Cell("failed", False, 64, None), Cell("ok", True, 64, 1.2)]
    errors = paper_scale.model_error(rows)
    assert [(e.hosts, e.cells, e.median, e.low, e.high) for e in errors] == [
        (16, 3, pytest.approx(1.0), 0.9, 1.1), (64, 1, 1.2, 1.2, 1.2)]
