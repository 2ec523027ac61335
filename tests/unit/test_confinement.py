"""Confinement without root: a real launcher forks a real agent under RLIMIT_DATA, and what running out says.

The agent runs in this process's own namespaces (no host), so it gets as far
as allocating its buffers: a limit below them makes it fail there, as it
would inside an emulated host.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile

import pytest

from emulator.base.files import write_json_atomic
from emulator.emulation.agents import agent_launcher as launcher
from emulator.emulation.agents.agent import AgentError, latency_plan
from emulator.emulation.agents.fleet import AgentFiles, Fleet, ReplayFailed
from emulator.emulation.machine import confinement
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.schedule.buffers import rank_bytes
from emulator.runs import admission

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
TOPO = topology.build("star:hosts=2")
#: Its first buffer alone (256 MiB) is above LIMIT: the agent fails before it touches any memory.
BIG_RING = generators.generate("ring", TOPO, 256 * MiB)
#: Above what the forked launcher already maps (about 72 MiB of VmData), far below BIG_RING's buffers.
LIMIT = 160 * MiB


@pytest.fixture
def work():
    path = tempfile.mkdtemp(prefix="ef-conf-")  # short: the control socket lives here
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent_launcher(work):
    la = launcher.AgentLauncher(dict(os.environ, PYTHONPATH=ROOT), ROOT, os.path.join(work, "launcher.stderr")).start()
    yield la
    la.stop()


def agent_files(work, schedule):
    files = AgentFiles(schedule=os.path.join(work, "schedule.json"), topology=os.path.join(work, "topology.json"),
                       latency=os.path.join(work, "latency.json"), logs=work)
    files.write_schedule(schedule)
    write_json_atomic(files.topology, TOPO.to_json())
    write_json_atomic(files.latency, latency_plan({}))
    return files


def test_an_agent_over_its_memory_limit_fails_ready_with_one_line_naming_its_rank_and_limit(work, agent_launcher):
    files = agent_files(work, BIG_RING)
    # only rank 1 is started: the message must name it, not a default rank 0
    fleet = Fleet.start(os.path.join(work, "control.sock"), {1: os.getpid()}, agent_launcher, files,
                        memory_limits={1: LIMIT})
    with fleet, pytest.raises(ReplayFailed) as failed:
        fleet.wait_ready(timeout=30)
    assert str(failed.value) == ("rank 1: agent ran out of its memory limit (160 MiB, from the admission estimate) "
                                 "before 'ready'")
    assert fleet.agents[1].wait(10) == confinement.OUT_OF_MEMORY_STATUS
    estimate = admission.format_bytes(rank_bytes(BIG_RING, 1))
    line = (f"agent: out of memory: rank 1 reached its memory limit 160 MiB (RLIMIT_DATA, sized from the admission "
            f"estimate of its buffers {estimate})")
    log = open(os.path.join(work, "rank-1.log")).read()
    assert line in log and "MemoryError" in log
    assert [ln for ln in open(files.stderr(1)).read().splitlines() if ln.startswith("agent:")] == [line]
    # the limit is the agent's alone: the launcher it was forked from has none
    assert re.search(r"Max data size\s+unlimited\s+unlimited", open(f"/proc/{agent_launcher.proc.pid}/limits").read())


def test_under_its_admission_limit_an_agent_gets_past_its_buffers(work, agent_launcher):
    small = generators.generate("ring", TOPO, 4 * MiB)
    files = agent_files(work, small)
    fleet = Fleet.start(os.path.join(work, "control.sock"), {1: os.getpid()}, agent_launcher, files,
                        memory_limits={1: admission.agent_limit_bytes(small, 1)})
    with fleet, pytest.raises(ReplayFailed) as failed:
        fleet.wait_ready(timeout=30)  # no host here: it fails connecting to rank 0's address, not on memory
    assert str(failed.value).startswith("rank 1 failed: ") and "memory" not in str(failed.value)
    assert "out of memory" not in open(os.path.join(work, "rank-1.log")).read()


@pytest.mark.parametrize("exc", [
    MemoryError(),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    RuntimeError("can't start new thread"),
])
def test_refused_allocations_are_recognised_also_when_a_worker_wrapped_them(exc):
    assert confinement.is_out_of_memory(exc)
    wrapped = AgentError("send op 3 to rank 1: MemoryError")
    wrapped.__cause__ = exc
    assert confinement.is_out_of_memory(wrapped)
    try:
        try:
            raise exc
        except BaseException:
            raise AgentError("connection to rank 2") from None
    except AgentError as caught:
        assert confinement.is_out_of_memory(caught)  # the context survives "from None"


@pytest.mark.parametrize("exc", [OSError(errno.ECONNREFUSED, "refused"), RuntimeError("boom"), ValueError("x"),
                                 AgentError("peer gone")])
def test_other_failures_are_not_out_of_memory(exc):
    assert not confinement.is_out_of_memory(exc)


def test_an_mpi_ranks_output_that_ran_out_is_found_and_said_in_one_line():
    stderr = "Traceback (most recent call last):\n  File \"<string>\", line 1\nnumpy.core._exceptions._ArrayMemoryError: " \
             "Unable to allocate 16.0 GiB for an array\n"
    assert confinement.memory_failure_in("all fine\n") is None
    found = confinement.memory_failure_in(stderr)
    assert found is not None and found.startswith("numpy.core._exceptions._ArrayMemoryError")
    line = confinement.mpi_rank_ran_out([(1, found), (0, "MemoryError")], 578 * MiB)
    assert line is not None and "\n" not in line
    assert line.startswith("mpirun: rank 0 (and 1 more rank) ran out of its memory limit 578 MiB (RLIMIT_DATA, from "
                           "the admission estimate): 'MemoryError' in ranks/rank-0.stderr")
    assert confinement.mpi_rank_ran_out([], 578 * MiB) is None

