"""The agent launcher: one pre-imported process forks agents that this process adopts and waits for."""

from __future__ import annotations

import os

import pytest

from emulator.emulation.agents import agent_launcher as launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def started(tmp_path):
    la = launcher.AgentLauncher(dict(os.environ, PYTHONPATH=ROOT), ROOT, str(tmp_path / "launcher.stderr")).start()
    yield la
    la.stop()


def test_a_forked_agent_runs_in_the_namespaces_asked_for_and_is_waited_for_by_us(started, tmp_path):
    out = tmp_path / "rank-0.stderr"
    # this process's own namespaces (no root needed): the agent's argument parser refuses the bogus option
    proc = started.spawn(os.getpid(), ["--bogus"], str(out))
    assert proc.pid != started.proc.pid and proc.wait(20) == 2
    assert "usage: emulator.emulation.agents.agent" in out.read_text() and "arguments are required" in out.read_text()
    assert proc.poll() == 2  # reaped once, remembered


def test_kill_and_a_second_agent(started, tmp_path):
    a = started.spawn(os.getpid(), ["--schedule", "x", "--topology", "y", "--rank", "0", "--control",
                                    str(tmp_path / "no-such.sock"), "--log", str(tmp_path / "a.log")],
                      str(tmp_path / "a.stderr"))
    b = started.spawn(os.getpid(), ["--help"], str(tmp_path / "b.stderr"))
    a.kill()
    assert a.wait(20) != 0 and b.wait(20) == 0
    assert "--latency" in (tmp_path / "b.stderr").read_text()


def test_a_bad_namespace_is_an_error_of_that_agent_not_of_the_launcher(started, tmp_path):
    out = tmp_path / "x.stderr"
    proc = started.spawn(2 ** 22 + 12345, ["--help"], str(out))  # no such pid: setns cannot open its namespace
    assert proc.wait(20) == 1
    assert started.spawn(os.getpid(), ["--help"], str(tmp_path / "y.stderr")).wait(20) == 0


def test_a_stopped_launcher_says_so():
    la = launcher.AgentLauncher(dict(os.environ), ROOT, os.devnull)
    with pytest.raises(launcher.LauncherError, match="not running"):
        la.spawn(os.getpid(), ["--help"], os.devnull)
