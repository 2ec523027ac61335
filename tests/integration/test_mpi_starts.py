"""Open MPI starts again and again on one network without a failure (each host its own host name).

``EF_MPI_STARTS`` starts (default 2; ``make soak`` runs 100) of the bundled
benchmark on BiGraph 2/2/2, without ``emu mpirun``'s retry of daemons that
die before any rank ran: with one host name for every host, about one start
in ten failed here (docs/fidelity.md, 2026-12-03 evening).
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from emulator.emulation.mpi import mpi_run
from emulator.emulation.session.replay import ReplaySession
from emulator.model import fabric
from emulator.runs.mpi_plan import MpiRunConfig

pytestmark = pytest.mark.integration

PROGRAM = ("emu-allreduce-bench", "--algo", "ring", "--sizes", "4KiB", "--iters", "1", "--warmup", "0", "--start",
           "barrier")  # what is tested is the start: no window to size


def starts() -> int:
    return max(1, int(os.environ.get("EF_MPI_STARTS", "2")))


def test_open_mpi_starts_every_time_with_each_host_named(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi_run, "START_ATTEMPTS", 1)  # a failed start is a failure, not hidden by a retry
    base = MpiRunConfig(network=fabric.rebuild("bigraph:upper=2,lower=2,hosts_per_switch=2", interconnect=False),
                        routing="bigraph", out=str(tmp_path / "run-0"), program=PROGRAM, timeout_s=60)
    prep = mpi_run.prepare(base)
    failed = []
    with ReplaySession(prep.topo, "bigraph", latency=prep.latency, work_dir=str(tmp_path / "session"),
                       echo=lambda line: None, agents=False) as session:
        for i in range(starts()):
            run = mpi_run.prepare(dataclasses.replace(base, out=str(tmp_path / f"run-{i + 1}")))
            results = mpi_run.run_in_session(run, session, echo=lambda line: None)
            if results.status != "ok":
                failed.append(f"start {i + 1}: {results.status} (exit {results.exit_status}), see {run.out}")
    assert failed == [], failed
    print(f"{starts()} Open MPI starts in a row, none failed")
