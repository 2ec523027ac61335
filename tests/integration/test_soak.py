"""Soak: many bring-ups and replays leave nothing behind and grow nothing.

Three ways of using the emulator over and over, each on a 2-host star with a
64 KiB ring allreduce (one repetition, no warm-up, so a round costs seconds):

* within one process, :class:`emulator.emulation.session.replay.ReplaySession` started, run and
  stopped N times;
* one session kept up for N replays (the controller's and ovs-vswitchd's
  memory and descriptors over replays);
* N ``emu replay`` invocations as subprocesses.

After every round a census (:mod:`tests.integration.census`) is compared
with the one after the first round (its warm-up allocations, Mininet's
import, ovs-vswitchd's first buffers, are not leaks): descriptors, processes,
bridges, interfaces and namespaces exactly back, resident memory within
:func:`~tests.integration.census.rss_allowance`. Every census goes to a
JSON-lines file under ``results/soak/`` (its path is printed). Afterwards
``emu clean`` finds nothing. N is ``EF_SOAK_ROUNDS`` (default 2; ``make soak``
sets 50).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from emulator.emulation.session.replay import ReplaySession
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.schedule import format as sformat
from emulator.runs.results import load as load_results

from . import census
from .census import Census, CensusLog, compare

pytestmark = pytest.mark.integration

STAR = "star:hosts=2"
POLICY = "shortest"
SIZE = 64 * 1024


def rounds() -> int:
    return max(1, int(os.environ.get("EF_SOAK_ROUNDS", "2")))


@pytest.fixture
def tag(monkeypatch) -> str:
    """This test's environment tag: every process it starts carries it (census.TAG_VAR)."""
    value = census.new_tag()
    monkeypatch.setenv(census.TAG_VAR, value)
    return value


def _schedule(topo: topology.Topology):
    return generators.generate("ring", topo, SIZE)


def _check_round(baseline: Census | None, now: Census, log: CensusLog) -> Census:
    """The baseline (this census if there was none yet); fails on anything that grew since."""
    log.write(now)
    if baseline is None:
        return now
    problems = compare(baseline, now)
    assert not problems, f"{'; '.join(problems)} (census log {log.path})"
    return baseline


def _nothing_left() -> None:
    assert census.clean_removals() == []


def test_sessions_started_run_and_stopped_many_times_leak_nothing(tmp_path, tag):
    topo = topology.build(STAR)
    sched = _schedule(topo)
    log = CensusLog("sessions")
    baseline: Census | None = None
    up_baseline: Census | None = None
    for rnd in range(rounds() + 1):
        t0 = time.monotonic()
        session = ReplaySession(topo, POLICY, work_dir=str(tmp_path / f"session-{rnd}"), echo=lambda _line: None)
        try:
            session.start()
            res = session.run(sched, str(tmp_path / f"run-{rnd}"), repeat=1, warmup=0)
            # while up: the same network each round, so the same counts (the controller is a new process)
            up = census.take(tag, rnd, controller_pid=session.ctl.proc.pid)
        finally:
            session.stop()
        assert res.status == "ok" and res.repetitions[0].correct
        log.write({"round": rnd, "phase": "up", "wall_s": time.monotonic() - t0, **up.to_json()})
        if up_baseline is None:
            up_baseline = up
        else:
            problems = [p for p in compare(up_baseline, up) if not p.startswith("controller_")]
            assert not problems, f"while up: {'; '.join(problems)} (census log {log.path})"
        with census.quiet():
            baseline = _check_round(baseline, census.settled(tag, rnd, baseline), log)
    _nothing_left()


def test_one_session_kept_up_for_many_replays_grows_nothing(tmp_path, tag):
    topo = topology.build(STAR)
    sched = _schedule(topo)
    log = CensusLog("kept-up")
    baseline: Census | None = None
    with ReplaySession(topo, POLICY, work_dir=str(tmp_path / "session"), echo=lambda _line: None) as session:
        controller = session.ctl.proc.pid
        for rnd in range(rounds() + 1):
            t0 = time.monotonic()
            res = session.run(sched, str(tmp_path / f"run-{rnd}"), repeat=1, warmup=0)
            assert res.status == "ok" and res.repetitions[0].correct
            log.write({"round": rnd, "phase": "replay", "wall_s": time.monotonic() - t0})
            # the session holds the network lock: no one else's network is up meanwhile
            baseline = _check_round(baseline, census.settled(tag, rnd, baseline, controller_pid=controller), log)
    _nothing_left()


def test_emu_replay_invoked_many_times_leaks_nothing(tmp_path, tag):
    topo = topology.build(STAR)
    path = str(tmp_path / "ring.json")
    sformat.save(_schedule(topo), path)
    log = CensusLog("cli")
    baseline: Census | None = None
    for rnd in range(rounds() + 1):
        out = tmp_path / f"run-{rnd}"
        t0 = time.monotonic()
        proc = subprocess.run([census.EMU, "replay", path, "--topology", STAR, "--routing", POLICY,
                               "--out", str(out), "--repeat", "1", "--warmup", "0"],
                              capture_output=True, text=True, cwd=census.ROOT, timeout=300, env=os.environ.copy())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        res = load_results(str(out / "results.json"))
        assert res is not None and res.status == "ok" and res.repetitions[0].correct
        log.write({"round": rnd, "phase": "replay", "wall_s": time.monotonic() - t0})
        with census.quiet():
            baseline = _check_round(baseline, census.settled(tag, rnd, baseline), log)
    _nothing_left()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "integration", "-q", "-s"]))
