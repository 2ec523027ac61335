"""``emu mpirun`` on real Mininet, Open vSwitch and Open MPI (root).

Eight ranks of the bundled ``emu-allreduce-bench`` on two fabrics: BiGraph
2/2/2 with the hdrm placement and bigraph routing, and a leaf-spine with ECMP
(every MPI connection hashed by its 5-tuple: the controller learns them).
Each run leaves a results folder: results.json with the ranks' hosts, the
benchmark's rows with correct data, fidelity, every rank's output, the
launch files and the port counters. A program that fails on one rank makes
``emu mpirun`` exit with its status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from emulator.model import topology
from emulator.model.collectives.placements import placement_hosts
from emulator.runs import trust
from emulator.runs.mpi_prediction import MpiPrediction
from emulator.runs.mpi_results import load_results

from .measured import band
from .soak_only import soak_only

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]
BIGRAPH = "bigraph:upper=2,lower=2,hosts_per_switch=2"
LEAFSPINE = "leafspine:leaves=2,spines=2,hosts_per_leaf=4"
#: Open MPI's measured/predicted time: the accuracy docs/fidelity.md states for it with the latency on (±15 %,
#: 0.98-1.07 over the grid of 2026-12-05; a report flags model_disagrees outside it) widened by the spread
#: measured here (1.028-1.063 over this file's two 512 KiB rows and test_experiment_mpi's cell, 2026-12-06:
#: docs/testing-accuracy.md).
MPI_BAND = band(noise=0.035, accuracy=trust.MPI_BAND.accuracy)


def emu_mpirun(out, topo: str, routing: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [*EMU, "mpirun", "--topology", topo, "--routing", routing, "--out", str(out), "--timeout", "180", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def check_folder(out, ranks: int) -> dict:
    for name in ("results.json", "hostfile", "launch-agent", "launch-agent.log", "mpirun.log", "links.jsonl",
                 "bench.json"):
        assert os.path.getsize(out / name) > 0, name
    for r in range(ranks):
        assert (out / "ranks" / f"rank-{r}.stdout").exists() and (out / "ranks" / f"rank-{r}.stderr").exists()
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("topo, routing, placement, algo", [
    (BIGRAPH, "bigraph", "hdrm", "rabenseifner"),
    pytest.param(LEAFSPINE, "ecmp", "identity", "ring", marks=soak_only(
        "20 s; the BiGraph case holds the bundled benchmark, its data check, results folder and model band, "
        "test_ecmp_flows.py the learned ECMP connections (make test over 15 minutes on 2026-12-07)")),
])
def test_the_bundled_benchmark_runs_with_correct_data_and_leaves_a_results_folder(tmp_path, topo, routing,
                                                                                   placement, algo):
    out = tmp_path / "run"
    res = emu_mpirun(out, topo, routing, "--placement", placement, "--",
                     "emu-allreduce-bench", "--algo", algo, "--sizes", "64KiB,512KiB", "--iters", "2",
                     "--warmup", "1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"algorithm: {algo}" in res.stdout and "# mpirun ok (exit status 0)" in res.stdout
    doc = check_folder(out, 8)
    results = load_results(str(out / "results.json"))
    assert results.status == "ok" and results.exit_status == 0
    model = topology.load(topo)
    assert [r.host for r in results.ranks] == placement_hosts(model, placement)
    assert [r.ip for r in results.ranks] == [model.host(r.host).ip for r in results.ranks]
    hostfile = (out / "hostfile").read_text().split("\n")
    assert [line.split()[0] for line in hostfile if line] == [r.ip for r in results.ranks]
    assert [row["size"] for row in results.bench] == [65536, 524288]
    assert all(row["wrong"] == 0 and row["busbw_mbps"] > 0 for row in results.bench)
    fid = results.fidelity
    assert fid is not None and 0 <= fid.cpu_idle <= 1 and fid.datapath_load_mbps > 0
    assert doc["wall_s"] > 0 and doc["bringup_s"] > 0
    if routing == "ecmp":  # every connection between leaves crosses a choice point and is learned
        assert (results.learned_connections or 0) >= 8
    # Each row beside the timing model, under ecmp with the ports Open MPI's connections had; the 512 KiB row held
    # to MPI_BAND (a 64 KiB row is mostly Open MPI's own start-up of the size)
    predicted = [MpiPrediction.from_json(p) for p in results.predictions]
    assert [p.size for p in predicted] == [65536, 524288] and all(p.predicted_s for p in predicted), predicted
    ratio = predicted[-1].measured_over_predicted
    print(f"emu mpirun {algo} on {topo}: measured/predicted {[p.measured_over_predicted for p in predicted]}")
    assert ratio is not None and MPI_BAND[0] <= ratio <= MPI_BAND[1], predicted[-1]
    assert "# model: 524288 B" in res.stdout
    bench_rank0 = (out / "ranks" / "rank-0.stdout").read_text()
    assert "emu-allreduce-bench" in bench_rank0


def test_a_rank_that_fails_makes_mpirun_exit_with_its_status(tmp_path):
    out = tmp_path / "run"
    program = "import sys; from mpi4py import MPI; sys.exit(3 if MPI.COMM_WORLD.rank == 1 else 0)"
    res = emu_mpirun(out, "star:hosts=2", "shortest", "--", "python3", "-c", program)
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    results = load_results(str(out / "results.json"))
    assert results.status == "failed" and results.exit_status == 3


def test_a_program_past_its_timeout_is_stopped_and_recorded(tmp_path):
    out = tmp_path / "run"
    res = emu_mpirun(out, "star:hosts=2", "shortest", "--timeout", "4", "--", "python3", "-c",
                     "import time; time.sleep(120)")
    assert res.returncode == 124, res.stdout[-2000:] + res.stderr[-2000:]
    results = load_results(str(out / "results.json"))
    assert results.status == "timeout" and "--timeout 4" in (results.error or "")
    assert results.wall_s is not None and results.wall_s < 60
