"""Faults on real networks: controller killed and restarted mid-run, a link down mid-step, an agent
killed, and SIGINT / SIGKILL to ``emu run`` followed by a clean restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from emulator.base.naming import BRIDGE_RE
from emulator.emulation.machine.started import all_runs
from emulator.emulation.machine.system import run
from emulator.emulation.session.replay import ReplayConfig, ReplayFailed, replay
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.schedule import format as sformat
from emulator.study import experiment as xp
from emulator.study.folder.results_folder import ResultsFolder

from .soak_only import soak_only

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIGRAPH = "bigraph:upper=2,lower=2,hosts_per_switch=2"
SIZE = 1 << 20  # 8 ranks at 10 Mbit/s: about 1.5 s per repetition


def schedule_file(tmp_path, algo="hdrm", spec=BIGRAPH) -> str:
    path = str(tmp_path / f"{algo}.json")
    sformat.save(generators.generate(algo, topology.build(spec), SIZE), path)
    return path


def nothing_of_ours_left() -> None:
    assert not [b for b in run(["ovs-vsctl", "list-br"]).stdout.split() if BRIDGE_RE.match(b)]
    assert not [r for r in all_runs() if not r.owner_alive()], "run state of a dead run left behind"


def test_controller_killed_mid_run_switches_keep_forwarding_then_restart_resyncs(tmp_path):
    out = tmp_path / "ctl"
    res = replay(ReplayConfig(schedule=schedule_file(tmp_path), network=fabric.rebuild(BIGRAPH), routing="bigraph",
                              out=str(out), repeat=2, warmup=0,
                              faults=["controller_kill@0.2s", "controller_restart@step=5"]))
    assert res.status == "ok" and res.outcome == "degraded"
    assert all(rep.correct for rep in res.repetitions)
    kill, restart = res.faults
    assert kill["fired_s"] is not None and kill["error"] is None
    assert restart["fired_s"] is not None and restart["error"] is None
    assert restart["reroute_s"] is not None and restart["reroute_s"] < 20, restart
    assert [len(r.faults) for r in res.repetitions] == [2, 0]
    # The restarted controller resynchronised every switch: the second
    # repetition ran through its entries as fast as the first.
    t0, t1 = (r.time_s for r in res.repetitions)
    assert t1 < 2 * t0
    saved = json.loads((out / "results.json").read_text())
    assert saved["outcome"] == "degraded" and len(saved["faults"]) == 2
    nothing_of_ours_left()


def test_link_down_mid_step_reroutes_and_the_run_completes_degraded(tmp_path):
    out = tmp_path / "link"
    res = replay(ReplayConfig(schedule=schedule_file(tmp_path), network=fabric.rebuild(BIGRAPH), routing="bigraph",
                              out=str(out), repeat=1, warmup=0, faults=["link_down:s1-s3@step=1"]))
    assert res.status == "ok" and res.outcome == "degraded"
    assert res.repetitions[0].correct
    (down,) = res.faults
    assert down["error"] is None and down["fired_s"] is not None
    assert down["reroute_s"] is not None and down["reroute_s"] < 3.0, down
    affected = down["affected_transfers"]
    assert affected and all(t["time_s"] is not None and t["time_s"] > 0 for t in affected)
    assert {t["step"] for t in affected} <= set(range(res.prediction["steps"]))
    nothing_of_ours_left()


def test_agent_killed_by_a_fault_fails_the_run_naming_the_rank(tmp_path):
    out = tmp_path / "agent"
    started = time.monotonic()
    with pytest.raises(ReplayFailed, match="rank 3"):
        replay(ReplayConfig(schedule=schedule_file(tmp_path), network=fabric.rebuild(BIGRAPH), routing="bigraph",
                            out=str(out), repeat=2, warmup=0, timeout_s=30, faults=["agent_kill:3@step=2"]))
    assert time.monotonic() - started < 60
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "failed" and saved["outcome"] == "failed" and "rank 3" in saved["error"]
    assert saved["faults"][0]["fired_s"] is not None
    nothing_of_ours_left()


#: tiny.yaml's cells take about a second each, too short to interrupt one
#: reliably: these take about 4 s (1 MiB on 4 hosts, 1 warm-up + 2 repetitions).
SLOW = """
name: slow
dilation: 5000  # 20 Mbit/s: cells long enough to interrupt
repeat: 2
warmup: 1
sizes: [1MiB]
series:
  - name: s
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm, hd, ring]
"""


def _default_sigint() -> None:
    # A shell's background job (as CI may run us) inherits SIGINT ignored, and
    # Python then never raises KeyboardInterrupt: give the child Ctrl-C back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_run(path: str, out: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "emulator", "run", path, "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            preexec_fn=_default_sigint)


def _wait_finished_cells(out: str, exp, n: int, proc: subprocess.Popen, timeout_s: float = 240) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = [c.id for c in xp.expand(exp) if ResultsFolder(out).cell_finished(c)]
        if len(done) >= n:
            return done
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} cells finished in {timeout_s} s")


@soak_only('three runs of a slow experiment (about 60 s); '
           "test_crash_consistency.py's random SIGKILL trial holds the resume in `make test`")
def test_sigint_then_sigkill_to_emu_run_then_a_clean_restart_keeps_finished_cells(tmp_path):
    path = str(tmp_path / "slow.yaml")
    with open(path, "w") as fh:
        fh.write(SLOW)
    exp = xp.load(path)
    cells = xp.expand(exp)
    out = str(tmp_path / "slow")

    proc = _start_run(path, out)
    first = _wait_finished_cells(out, exp, 1, proc)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, output
    assert "Traceback" not in output, output
    nothing_of_ours_left()
    kept = {c: os.stat(os.path.join(out, "cells", c, "results.json")).st_mtime_ns for c in first}

    proc = _start_run(path, out)
    # SIGKILL while the next cell's network is up: nothing gets to clean up.
    deadline = time.monotonic() + 120
    while not [b for b in run(["ovs-vsctl", "list-br"]).stdout.split() if BRIDGE_RE.match(b)]:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert [b for b in run(["ovs-vsctl", "list-br"]).stdout.split() if BRIDGE_RE.match(b)], "SIGKILL left nothing?"
    assert [r for r in all_runs() if not r.owner_alive()], "SIGKILL left no run state?"

    proc = _start_run(path, out)  # its bring-up removes what the killed run left
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    assert all(ResultsFolder(out).cell_finished(c) for c in cells)
    for cid, mtime in kept.items():
        assert os.stat(os.path.join(out, "cells", cid, "results.json")).st_mtime_ns == mtime
    assert f"skipped {first[0]}" in open(os.path.join(out, "run.log")).read()
    nothing_of_ours_left()
