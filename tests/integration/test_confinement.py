"""Confinement on real Mininet, Open vSwitch and Open MPI (root): memory limits sized from the admission estimate.

An agent given a limit below its buffers fails its run within seconds with
one line naming its rank and the limit; the same session then replays a
small schedule whose agents run under their default limits (each agent's
log says its limit). An MPI program that allocates beyond its limit fails
with a line naming the rank and the limit, and ``emu mpirun`` exits non-zero.
Nothing is left behind, and the kernel's out-of-memory killer never ran
(``oom_kill`` of ``/proc/vmstat`` unchanged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from emulator.emulation.machine import started, system
from emulator.emulation.session.replay import ReplayFailed, ReplaySession
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.runs import admission

from .census import clean_removals

pytestmark = pytest.mark.integration

EMU = [sys.executable, "-m", "emulator"]
MiB = 1 << 20
STAR = "star:hosts=2"
#: Just above what an agent maps when it starts (the launcher's ~72 MiB of VmData, forked), below rank 1's first
#: 64 MiB buffer on top of that.
TOO_LOW = 100 * MiB


def oom_kills() -> int:
    """How many processes the kernel's out-of-memory killer has killed since boot."""
    with open("/proc/vmstat", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("oom_kill "))


def test_an_agent_below_its_buffers_fails_in_seconds_naming_it_then_default_limits_replay(tmp_path):
    topo = topology.build(STAR)
    big = generators.generate("ring", topo, 64 * MiB)
    small = generators.generate("ring", topo, 64 * 1024)

    def limit(schedule, rank):  # rank 1 of the big schedule only; everything else the admission estimate
        return TOO_LOW if schedule is big and rank == 1 else admission.agent_limit_bytes(schedule, rank)

    kills = oom_kills()
    with ReplaySession(topo, "shortest", work_dir=str(tmp_path / "session"), agent_memory_limit=limit) as session:
        t0 = time.monotonic()
        with pytest.raises(ReplayFailed) as failed:
            session.run(big, str(tmp_path / "big"), repeat=1, warmup=0)
        took = time.monotonic() - t0
        assert str(failed.value) == ("rank 1: agent ran out of its memory limit (100 MiB, from the admission "
                                     "estimate) before 'ready'")
        assert took < 20, took
        log = (tmp_path / "big" / "agents" / "rank-1.log").read_text()
        assert "agent: out of memory: rank 1 reached its memory limit 100 MiB (RLIMIT_DATA, sized from the " \
               "admission estimate of its buffers" in log, log
        doc = json.loads((tmp_path / "big" / "results.json").read_text())
        assert doc["status"] == "failed" and doc["error"] == str(failed.value)
        assert doc["config"]["agent_memory_limits_bytes"]["1"] == TOO_LOW

        res = session.run(small, str(tmp_path / "small"), repeat=1, warmup=0)  # the session is still good
        assert res.status == "ok" and all(r.correct for r in res.repetitions)
        for rank in range(2):
            want = admission.agent_limit_bytes(small, rank)
            assert res.config["agent_memory_limits_bytes"][str(rank)] == want
            log = (tmp_path / "small" / "agents" / f"rank-{rank}.log").read_text()
            assert f"memory limit {admission.format_bytes(want)} (RLIMIT_DATA)" in log
        recorded = session.en.state.processes()
    assert len([p for p in recorded if p["role"] == "agent"]) == 4  # two runs of two agents
    assert not [p for p in recorded if started.alive(p["pid"], p.get("start_time"))]
    assert not [r for r in started.all_runs() if (r.owner() or {}).get("pid") == os.getpid()]
    assert oom_kills() == kills
    assert clean_removals() == []


#: Every rank prints its RLIMIT_DATA (and stops without one: the allocation would really take memory); after a
#: barrier rank 1 allocates twice its limit while rank 0 waits. Run by plain ``python3``: rank 1 dies of its
#: MemoryError while rank 0 waits in the barrier, and emu mpirun stops the job when it sees the MemoryError
#: (without that, it waited until --timeout).
GREEDY = ("import resource, sys\n"
          "from mpi4py import MPI\n"
          "soft, hard = resource.getrlimit(resource.RLIMIT_DATA)\n"
          "print('limit', soft, flush=True)\n"
          "if soft == resource.RLIM_INFINITY: sys.exit(5)\n"
          "MPI.COMM_WORLD.Barrier()\n"
          "if MPI.COMM_WORLD.rank == 1:\n"
          "    import numpy; numpy.ones(2 * soft, numpy.uint8)\n"
          "MPI.COMM_WORLD.Barrier()\n")


def test_an_mpi_program_beyond_its_limit_fails_naming_the_rank_and_the_limit(tmp_path):
    out = tmp_path / "run"
    kills = oom_kills()
    t0 = time.monotonic()
    proc = subprocess.Popen([*EMU, "mpirun", "--topology", STAR, "--routing", "shortest", "--out", str(out),
                             "--timeout", "120", "--np", "2", "--", "python3", "-c", GREEDY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate(timeout=240)
    assert time.monotonic() - t0 < 60, stdout[-3000:]  # stopped on the MemoryError, not at --timeout
    res = subprocess.CompletedProcess(proc.args, proc.returncode, stdout)
    doc = json.loads((out / "results.json").read_text())
    limit = doc["memory_limit_bytes"]
    _, total = system.memory_available()
    # a program of unknown size: a share of what the machine can give
    assert limit is not None and admission.MPI_RANK_BASE_BYTES < limit < total // 2
    assert res.returncode != 0 and doc["status"] == "failed"
    for rank in range(2):  # rank 1 runs under an orted on the other host: the limit went down the whole tree
        assert (out / "ranks" / f"rank-{rank}.stdout").read_text().split() == ["limit", str(limit)]
    assert doc["out_of_memory"] == [1]
    line = (f"mpirun: rank 1 ran out of its memory limit {admission.format_bytes(limit)} (RLIMIT_DATA, from the "
            "admission estimate): ")
    assert doc["error"].startswith(line) and "MemoryError" in doc["error"], doc["error"]
    assert [ln for ln in res.stdout.splitlines() if ln.startswith(f"# {line}")], res.stdout[-3000:]
    assert oom_kills() == kills
    assert not [r for r in started.all_runs() if (r.owner() or {}).get("pid") == proc.pid]
    assert clean_removals() == []
