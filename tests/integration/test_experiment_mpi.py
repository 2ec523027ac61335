"""``emu run`` of an experiment with an MPI cell beside a replay cell, on real Mininet, Open vSwitch and Open MPI
(root).

One network (``star:hosts=4``, shortest routing) serves both cells: the replay of a ring allreduce, then the
bundled ``emu-allreduce-bench`` with Open MPI's ring on the same session. Both finish ok; the MPI cell's folder
is an ``emu mpirun`` folder (results.json of kind mpirun with the benchmark's rows and correct data, every
rank's output), and the report has its "MPI programs" section and cells.csv its row.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from emulator.runs.mpi_prediction import MpiPrediction
from emulator.study import experiment as xp

from .test_mpirun import MPI_BAND

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]
EXPERIMENT = """
name: mpi-cell
repeat: 1
warmup: 0
sizes: [64KiB]
series:
  - name: i
    runs:
      - {topology: "star:hosts=4", routing: shortest, algorithms: [ring]}
      - topology: "star:hosts=4"
        routing: shortest
        mpi:
          program: [emu-allreduce-bench, --algo, ring, --sizes, 256KiB, --iters, "2", --warmup, "1"]
          timeout_s: 120
"""


def test_an_mpi_cell_runs_on_its_networks_session_beside_a_replay_cell(tmp_path):
    path = tmp_path / "mpi-cell.yaml"
    path.write_text(EXPERIMENT)
    cells = xp.expand(xp.load(str(path)))
    replay, mpi_cell = cells
    assert mpi_cell.id == "i.star-4.shortest.mpi-emu-allreduce-bench-ring.np4"
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = subprocess.run([*EMU, "run", str(path), "--out", str(out)], capture_output=True, text=True, timeout=300,
                         check=False)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "complete: 2 cells run, 0 skipped, 0 failed" in res.stdout
    assert f"{mpi_cell.id}: MPI program exited 0" in res.stdout

    states = json.loads((out / "state.json").read_text())["cells"]
    assert {cid: s["status"] for cid, s in states.items()} == {replay.id: "ok", mpi_cell.id: "ok"}
    assert len(os.listdir(out / "sessions")) == 1  # one network for both cells

    cdir = out / "cells" / mpi_cell.id
    doc = json.loads((cdir / "results.json").read_text())
    assert doc["kind"] == "mpirun" and doc["status"] == "ok" and doc["exit_status"] == 0
    # dilation: auto chose the replay run's rate, and the MPI run took it: the cell as the plan has it, on its topology
    planned = {c["id"]: c for c in json.loads((out / "experiment.json").read_text())["cells"]}
    rdoc = json.loads((out / "cells" / replay.id / "results.json").read_text())
    assert doc["config"]["cell"] == {k: v for k, v in planned[mpi_cell.id].items() if k in doc["config"]["cell"]}
    assert doc["config"]["cell"]["topology"] == rdoc["config"]["cell"]["topology"] and doc["probe"]["passed"]
    assert {k: v for k, v in doc["config"]["cell"].items() if k not in ("topology", "fabric")} == \
        {k: v for k, v in mpi_cell.to_json().items() if k not in ("topology", "fabric")}
    assert [r["host"] for r in doc["ranks"]] == ["h1", "h2", "h3", "h4"]
    assert [row["size"] for row in doc["bench"]] == [256 << 10]
    row = doc["bench"][0]
    assert row["wrong"] == 0 and row["busbw_mbps"] > 0 and row["count"] == (256 << 10) // 4
    # the cell's run beside the timing model, as `emu mpirun`'s: its row's time within the MPI band
    (predicted,) = [MpiPrediction.from_json(p) for p in doc["predictions"]]
    ratio = predicted.measured_over_predicted
    print(f"MPI cell: ring 256 KiB on star:hosts=4, measured/predicted {ratio}")
    assert predicted.size == 256 << 10 and ratio is not None and MPI_BAND[0] <= ratio <= MPI_BAND[1], predicted
    assert doc["fidelity"] is not None and doc["wall_s"] > 0
    assert os.path.getsize(cdir / "mpirun.log") > 0 and (cdir / "ranks" / "rank-3.stdout").exists()
    assert (cdir / "bench.json").exists() and (cdir / "hostfile").read_text().count("slots=1") == 4

    assert rdoc["status"] == "ok" and rdoc["repetitions"] and all(r["correct"] for r in rdoc["repetitions"])

    md = (out / "report.md").read_text()
    section = md[md.index("## MPI programs"):]
    assert f"`{mpi_cell.id}`" in section.split("\n## ")[0]
    assert "**2 of 2 cells finished**" in md
    with open(out / "cells.csv") as fh:
        by_id = {r["id"]: r for r in csv.DictReader(fh)}
    assert by_id[mpi_cell.id]["exit_status"] == "0" and by_id[mpi_cell.id]["ranks"] == "4"
    assert float(by_id[mpi_cell.id]["busbw_mbps"]) == pytest.approx(row["busbw_mbps"])
    print(f"emu run with an MPI cell and a replay cell: {elapsed:.1f} s")
