"""ReplaySession.run without root: fake agents (real processes, real control socket) on a fake network.

The session is not started: the test gives it what :meth:`ReplaySession.start`
would have made (a network object with hosts and a run-state folder, the
launcher, the topology file), and the machine's counters are a fixed
snapshot. What run() writes and returns is then checked as a user sees it:
results.json, the logs, the console lines, and the errors that name a rank.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import pytest
from fake_agents import FakeLauncher

from emulator.base.files import read_jsonl, write_json_atomic
from emulator.emulation.session import fidelity
from emulator.emulation.session.replay import ReplayFailed, ReplaySession
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.runs import admission, results
from emulator.runs.results import CellResults

TOPO = topology.build("star:hosts=3")
RING = generators.generate("ring", TOPO, 3 * 1024)


class FakeState:
    def __init__(self, path):
        self.path = path
        self.recorded = []

    def record_process(self, role, pid, **extra):
        self.recorded.append((role, pid, extra))


class FakeHost:
    pid = os.getpid()


class FakeNetwork:
    datapath = "user"
    bringup_s = 1.5

    def __init__(self, path):
        self.state = FakeState(path)

    def host(self, name):
        return FakeHost()


@pytest.fixture
def work(monkeypatch):
    path = tempfile.mkdtemp(prefix="ef-session-")  # short: the control socket lives here
    monkeypatch.setenv("EF_STATE_DIR", os.path.join(path, "state"))  # no calibration: flagged uncalibrated
    monkeypatch.setattr(fidelity, "snapshot", lambda en, topo: fidelity.Snapshot(time=time.monotonic(),
                                                                              cpu_idle=0.0, cpu_total=0.0))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def session_on(work, behaviours=None, **options):
    lines: list[str] = []
    session = ReplaySession(TOPO, "shortest", latency=LatencyModel(), echo=lines.append, **options)
    session.en = FakeNetwork(work)
    session.launcher = FakeLauncher(behaviours)
    session.topo_path = os.path.join(work, "topology.json")
    write_json_atomic(session.topo_path, TOPO.to_json())
    session.stats_file = os.path.join(work, "controller-ports.jsonl")
    with open(session.stats_file, "w") as fh:
        fh.write(json.dumps({"dpid": 1, "port": 1, "tx_bytes": 10}) + "\n")
    return session, lines


def test_a_run_writes_its_results_and_says_each_repetition(work):
    session, lines = session_on(work)
    out = os.path.join(work, "out")
    res = session.run(RING, out, repeat=2, warmup=1, config={"cell": {"id": "c1"}})
    assert isinstance(res, CellResults)
    assert res.status == res.outcome == "ok" and res.error is None and res.cell_id() == "c1"
    assert len(res.warmup) == 1 and [r.rep for r in res.repetitions] == [1, 2]
    assert all(r.correct and r.fidelity is not None and r.fidelity.flags == ["uncalibrated"]
               for r in res.repetitions)
    assert res.datapath == "user" and res.bringup_s == 1.5 and res.config["ranks"] == 3
    summary = res.summary()
    assert summary is not None and summary.time_s > 0
    # the fixture's CPU counters never advance: the CPU check had no data, so the cell is not trusted
    assert "cpu_idle" in summary.trust.unchecked and not summary.trusted
    assert res.repetitions[0].predicted_time_s == res.predicted_time_s
    saved = results.load(os.path.join(out, "results.json"))
    assert saved is not None and saved.to_json() == res.to_json()
    doc = json.loads(open(os.path.join(out, "results.json")).read())
    assert doc["busbw_mbps_median"] == summary.busbw_mbps and doc["schema"] == results.SCHEMA_VERSION

    assert [line.split(":")[0] for line in lines] == ["  warmup", "  rep 1/2", "  rep 2/2"]
    assert all(" Mbit/s, measured/predicted " in line and line.endswith("correct") for line in lines)

    timeline = read_jsonl(os.path.join(out, "timeline.jsonl"))
    sends = sum(1 for prog in RING.ranks for op in prog.ops if op.kind == "send")
    assert len(timeline) == 3 * sends and {r["rep"] for r in timeline} == {0, 1, 2}
    links = read_jsonl(os.path.join(out, "links.jsonl"))
    assert {"source": "controller", "dpid": 1, "port": 1, "tx_bytes": 10} not in links  # written before the run
    for name in ("schedule.json", "topology.json", "latency.json", "agents/rank-2.stderr"):
        assert os.path.exists(os.path.join(out, name)), name
    agents = [(role, extra["rank"]) for role, _, extra in session.en.state.recorded]
    assert agents == [("agent", 0), ("agent", 1), ("agent", 2)]
    assert all(p.poll() == 0 for p in session.launcher.processes())
    assert not os.path.exists(os.path.join(work, "control.sock"))


def test_the_controllers_port_counters_of_the_run_land_in_links_jsonl(work):
    session, _ = session_on(work)
    out = os.path.join(work, "out")

    real_spawn = session.launcher.spawn

    def spawn_and_count(*args):
        with open(session.stats_file, "a") as fh:
            fh.write(json.dumps({"dpid": 2, "port": 3}) + "\n")
        return real_spawn(*args)

    session.launcher.spawn = spawn_and_count
    session.run(RING, out, repeat=1, warmup=0)
    controller = [r for r in read_jsonl(os.path.join(out, "links.jsonl")) if r["source"] == "controller"]
    assert controller == [{"source": "controller", "dpid": 2, "port": 3}] * 3


def test_wrong_data_fails_the_run_naming_the_rank_and_keeps_the_repetition(work):
    session, lines = session_on(work, {1: "wrong"})
    out = os.path.join(work, "out")
    with pytest.raises(ReplayFailed, match=r"rank 1 computed wrong data: element 3 is 7.0"):
        session.run(RING, out, repeat=2, warmup=1)
    saved = results.load(os.path.join(out, "results.json"))
    assert saved is not None and saved.status == saved.outcome == "failed"
    assert saved.error == "rank 1 computed wrong data: element 3 is 7.0"
    assert len(saved.warmup) == 1 and not saved.warmup[0].correct and saved.repetitions == []
    assert lines == [lines[0]] and lines[0].startswith("  warmup:") and lines[0].endswith("WRONG")


def test_an_agent_that_exits_fails_the_run_naming_it(work):
    session, _ = session_on(work, {2: "exit"})
    out = os.path.join(work, "out")
    with pytest.raises(ReplayFailed, match=r"rank 2: agent exited"):
        session.run(RING, out, repeat=1, warmup=0)
    saved = results.load(os.path.join(out, "results.json"))
    assert saved is not None and saved.status == "failed" and "rank 2" in (saved.error or "")
    assert all(p.poll() is not None for p in session.launcher.processes())  # every agent reaped


def test_a_session_that_is_not_started_says_so(work):
    session, _ = session_on(work)
    session.launcher = None
    with pytest.raises(RuntimeError, match="not started"):
        session.run(RING, os.path.join(work, "out"), repeat=1, warmup=0)


def test_every_agent_runs_under_its_admission_limit_and_results_record_it(work):
    session, _ = session_on(work)
    out = os.path.join(work, "out")
    session.run(RING, out, repeat=1, warmup=0)
    want = [admission.agent_limit_bytes(RING, r) for r in range(3)]
    assert session.launcher.memory_limits == want and all(limit > 256 << 20 for limit in want)
    config = json.loads(open(os.path.join(out, "results.json")).read())["config"]
    assert config["agent_memory_limit_bytes"] == max(want)
    assert config["agent_memory_limits_bytes"] == {str(r): want[r] for r in range(3)}


def test_an_agent_out_of_its_limit_fails_the_run_naming_rank_and_limit_in_results(work):
    session, _ = session_on(work, {2: "oom"}, agent_memory_limit=lambda schedule, rank: (rank + 1) << 30)
    out = os.path.join(work, "out")
    with pytest.raises(ReplayFailed) as failed:
        session.run(RING, out, repeat=1, warmup=0)
    assert session.launcher.memory_limits == [1 << 30, 2 << 30, 3 << 30]
    message = "rank 2: agent ran out of its memory limit (3.0 GiB, from the admission estimate) before 'ready'"
    assert str(failed.value) == message
    saved = results.load(os.path.join(out, "results.json"))
    assert saved is not None and saved.status == "failed" and saved.error == message
    assert saved.config["agent_memory_limit_bytes"] == 3 << 30


def test_no_limit_is_recorded_as_none(work):
    session, _ = session_on(work, agent_memory_limit=lambda schedule, rank: None)
    out = os.path.join(work, "out")
    session.run(RING, out, repeat=1, warmup=0)
    assert session.launcher.memory_limits == [None, None, None]
    config = json.loads(open(os.path.join(out, "results.json")).read())["config"]
    assert config["agent_memory_limit_bytes"] is None and config["agent_memory_limits_bytes"] == {}
