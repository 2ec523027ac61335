"""The agent fleet against fake agents: real processes speaking the control protocol over a real Unix socket.

The fake agents (``tests/unit/fake_agents.py``) connect with
:class:`emulator.emulation.agents.agent_protocol.AgentChannel` and behave as each test says for their rank.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest
from fake_agents import STEP_S, FakeLauncher

from emulator.emulation.agents.agent_protocol import Msg
from emulator.emulation.agents.fleet import AgentFiles, Fleet, RankReport, ReplayFailed
from emulator.model import topology
from emulator.model.collectives import generators

TOPO = topology.build("star:hosts=3")
RING = generators.generate("ring", TOPO, 3 * 1024)


@pytest.fixture
def work():
    path = tempfile.mkdtemp(prefix="ef-fleet-")  # short: a Unix socket path has at most 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(work, behaviours, launcher=None, on_spawn=None):
    """A fleet of ``len(behaviours)`` fake agents on :data:`RING` (rank r behaves as ``behaviours[r]``)."""
    files = AgentFiles(schedule=os.path.join(work, "schedule.json"), topology=os.path.join(work, "topology.json"),
                       latency=os.path.join(work, "latency.json"), logs=work)
    files.write_schedule(RING)
    hosts = {rank: 1000 + rank for rank in range(len(behaviours))}
    launcher = launcher or FakeLauncher()
    launcher.behaviours = dict(enumerate(behaviours))
    return Fleet.start(os.path.join(work, "control.sock"), hosts, launcher, files,
                       **({"on_spawn": on_spawn} if on_spawn else {}))


def test_a_repetition_runs_behind_the_barrier_and_the_agents_quit(work):
    launcher = FakeLauncher()
    spawned = []
    fleet = start(work, ["ok", "ok", "ok"], launcher, on_spawn=lambda rank, proc: spawned.append((rank, proc.pid)))
    assert [rank for rank, _ in spawned] == [0, 1, 2]
    assert [netns for netns, _, _ in launcher.spawned] == [1000, 1001, 1002]
    argv = launcher.spawned[1][1]
    assert argv[argv.index("--rank") + 1] == "1" and argv[argv.index("--log") + 1] == os.path.join(work, "rank-1.log")
    with fleet:
        fleet.wait_ready(timeout=20)
        start_at = time.monotonic()
        steps = []
        fleet.go(rep=0, start_at=start_at, watch_steps=[1])
        done = fleet.wait_done(timeout=20, on_step=steps.append)
        assert sorted(done) == [0, 1, 2] and steps == [1, 1, 1]
        report = done[2]
        assert isinstance(report, RankReport) and report.rank == 2 and report.correct and report.wrong is None
        program = RING.ranks[2]
        assert report.ops == {op.id: (pytest.approx(start_at + op.step * STEP_S),
                                      pytest.approx(start_at + (op.step + 1) * STEP_S)) for op in program.ops}
        assert sorted(report.sends) == [op.id for op in program.ops if op.kind == "send"]
        fleet.quit()
        assert [p.poll() for _, _, p in launcher.spawned] == [0, 0, 0]
    assert not os.path.exists(os.path.join(work, "control.sock"))


def test_wrong_data_is_reported_not_raised(work):
    with start(work, ["ok", "wrong", "ok"]) as fleet:
        ready = fleet.wait_for(Msg.READY, timeout=20)
        assert sorted(ready) == [0, 1, 2] and ready[1]["type"] == Msg.READY
        fleet.go(rep=0, start_at=time.monotonic())
        done = fleet.wait_done(timeout=20)
        assert done[0].correct and not done[1].correct and done[1].wrong == "element 3 is 7.0"


@pytest.mark.parametrize("behaviour, message", [
    ("exit", r"rank 1: agent exited .*before 'done'"),
    ("error", r"rank 1 failed: boom"),
])
def test_an_agent_that_dies_or_fails_fails_the_run_naming_its_rank(work, behaviour, message):
    with start(work, ["ok", behaviour, "ok"]) as fleet:
        fleet.wait_ready(timeout=20)
        fleet.go(rep=0, start_at=time.monotonic())
        with pytest.raises(ReplayFailed, match=message):
            fleet.wait_done(timeout=20)


def test_a_hung_agent_is_named_and_killed_on_close(work):
    launcher = FakeLauncher()
    with start(work, ["hang", "ok", "ok"], launcher) as fleet:
        fleet.wait_ready(timeout=20)
        fleet.go(rep=0, start_at=time.monotonic())
        started = time.monotonic()
        with pytest.raises(ReplayFailed, match=r"rank 0 \(of 1 missing: \[0\]\) did not report 'done' within 1 s"):
            fleet.wait_done(timeout=1.0)
        assert time.monotonic() - started < 5
    hung = launcher.spawned[0][2]
    assert hung.poll() is not None  # killed by close()


def test_a_failed_spawn_reaps_the_agents_already_started(work):
    launcher = FakeLauncher(fail_at=1)
    with pytest.raises(RuntimeError, match="launcher is gone"):
        start(work, ["ok", "ok", "ok"], launcher)
    assert len(launcher.spawned) == 1 and launcher.spawned[0][2].poll() is not None
    assert not os.path.exists(os.path.join(work, "control.sock"))


def test_kill_ends_one_rank_and_the_barrier_names_it(work):
    launcher = FakeLauncher()
    with start(work, ["hang", "hang", "hang"], launcher) as fleet:
        fleet.wait_ready(timeout=20)
        fleet.go(rep=0, start_at=time.monotonic())
        fleet.kill(1)
        with pytest.raises(ReplayFailed, match=r"rank 1: agent exited"):
            fleet.wait_done(timeout=20)
        assert launcher.spawned[0][2].poll() is None  # rank 0 untouched until close


@pytest.mark.parametrize("behaviour", ["oom", "oom_exit"])
def test_an_agent_out_of_its_memory_limit_fails_the_run_naming_its_rank_and_limit(work, behaviour):
    launcher = FakeLauncher()
    files = AgentFiles(schedule=os.path.join(work, "schedule.json"), topology=os.path.join(work, "topology.json"),
                       latency=os.path.join(work, "latency.json"), logs=work)
    files.write_schedule(RING)
    launcher.behaviours = {0: "ok", 1: behaviour, 2: "ok"}
    limits = {0: 300 << 20, 1: 1288490189, 2: 300 << 20}  # rank 1: 1.2 GiB
    with Fleet.start(os.path.join(work, "control.sock"), {r: 1000 + r for r in range(3)}, launcher, files,
                     memory_limits=limits) as fleet:
        with pytest.raises(ReplayFailed) as failed:
            fleet.wait_ready(timeout=20)
    assert launcher.memory_limits == [limits[0], limits[1], limits[2]]  # each rank's own, in spawn order
    assert str(failed.value) == ("rank 1: agent ran out of its memory limit (1.2 GiB, from the admission estimate) "
                                 "before 'ready'")


def test_agents_without_a_limit_are_spawned_without_one(work):
    launcher = FakeLauncher()
    with start(work, ["ok", "ok", "ok"], launcher) as fleet:
        fleet.wait_ready(timeout=20)
        fleet.quit()
    assert launcher.memory_limits == [None, None, None]
