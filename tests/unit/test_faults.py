"""Fault plans: parsing, validation against topology and schedule, and the injector's timing."""

from __future__ import annotations

import threading
import time

import pytest

from emulator.base.errors import UserError
from emulator.emulation.agents.agent_protocol import Msg
from emulator.emulation.agents.fleet import Fleet
from emulator.emulation.session.replay import ReplayFailed
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.prediction import cost
from emulator.runs import fault_plan as faults

TOPO = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")


def parse(spec, ranks=8, steps=6):
    return faults.parse_fault(spec, TOPO, ranks, steps)


@pytest.mark.parametrize("spec, expected", [
    ("link_down:s1-s3@1.5s", faults.Fault("link_down", "s1-s3", at_s=1.5)),
    ("link_up:s3-s1@2", faults.Fault("link_up", "s3-s1", at_s=2.0)),
    ("controller_kill@0s", faults.Fault("controller_kill", at_s=0.0)),
    ("controller_restart@step=2,rep=1", faults.Fault("controller_restart", step=2, rep=1)),
    ("agent_kill:7@step=5", faults.Fault("agent_kill", "7", step=5)),
    ({"action": "link_down", "target": "h1-s1", "step": 0}, faults.Fault("link_down", "h1-s1", step=0)),
])
def test_valid_faults_parse(spec, expected):
    assert parse(spec) == expected


def test_describe_round_trips():
    for spec in ("link_down:s1-s3@1.5s", "agent_kill:2@step=3,rep=2", "controller_kill@0s",
                 "controller_kill@0.001953125s"):  # 7 significant digits: found by the fuzz test
        f = parse(spec)
        assert parse(f.describe()) == f


@pytest.mark.parametrize("spec, field", [
    ("link_down:s1-s2@1s", "target"),       # two upper switches: not adjacent
    ("link_down@1s", "target"),
    ("link_down:s1@1s", "target"),
    ("agent_kill:8@1s", "target"),          # ranks 0..7
    ("agent_kill:-1@1s", "target"),
    ("controller_kill:s1@1s", "target"),
    ("reboot@1s", "action"),
    ("link_down:s1-s3", "fault"),           # no WHEN
    ("link_down:s1-s3@soon", "at"),
    ("link_down:s1-s3@-1s", "at"),
    ("link_down:s1-s3@nan", "at"),
    ({"action": "link_down", "target": "s1-s3", "at": 10**400}, "at"),   # OverflowError before
    ("link_down:s1-s3@step=6", "step"),     # steps 0..5
    ("link_down:s1-s3@step=x", "step"),
    ("link_down:s1-s3@1s,seed=2", "fault"),
    ("link_down:s1-s3@1s,rep=-1", "rep"),
    ({"action": "link_down", "target": "s1-s3"}, "when"),
    ({"action": "link_down", "target": "s1-s3", "at": 1, "step": 1}, "when"),
    ({"action": "link_down", "target": "s1-s3", "at": 1, "color": 1}, "color"),
    (42, "fault"),
])
def test_bad_faults_name_their_field(spec, field):
    with pytest.raises(UserError) as exc:
        parse(spec)
    message = str(exc.value)
    assert f"'{field}'" in message and "\n" not in message


def test_rep_must_be_a_measured_repetition():
    with pytest.raises(UserError, match="'rep'"):
        faults.parse_faults(["controller_kill@1s,rep=3"], TOPO, 8, 6, repeat=3)
    assert len(faults.parse_faults(["controller_kill@1s,rep=2"], TOPO, 8, 6, repeat=3)) == 1


def test_link_ends_are_the_root_namespace_sides():
    assert faults.link_ends(TOPO, "s1", "s3") == ["efs1-eth3", "efs3-eth3"]
    assert faults.link_ends(TOPO, "h1", "s1") == ["efs1-eth1"]


def test_crossing_transfers_follow_the_planned_paths():
    schedule = generators.generate("hdrm", TOPO, 8 * 1024)
    planned = cost.transfers(schedule, TOPO, "bigraph")
    hit = faults.crossing_transfers(planned, "s3", "s1")
    assert hit  # hdrm pairs every step across upper-lower links
    for t in hit:
        path = next(p.path for p in planned if (p.step, p.src, p.dst) == (t["step"], t["src"], t["dst"]))
        assert ("s1" in path and "s3" in path and abs(path.index("s1") - path.index("s3")) == 1)
    assert len(hit) < len(planned)


def test_injector_fires_timed_and_step_faults_once_and_cancels_the_rest():
    fired: list[tuple[str, float]] = []
    lock = threading.Lock()

    def action(f):
        with lock:
            fired.append((f.action, time.monotonic()))
        return ("done", 0.25) if f.action == "link_down" else "ok"

    plan = [faults.Fault("link_down", "s1-s3", at_s=0.05), faults.Fault("controller_kill", step=2),
            faults.Fault("agent_kill", "1", at_s=30.0), faults.Fault("link_up", "s1-s3", step=4)]
    start = time.monotonic()
    inj = faults.Injector(plan, {a: action for a in faults.ACTIONS}, start_at=start)
    assert inj.watch_steps == [2, 4]
    inj.start()
    inj.step_started(2)
    inj.step_started(2)  # a second report of the same step fires nothing more
    time.sleep(0.2)
    events = inj.finish(timeout_s=2)
    assert sorted(a for a, _ in fired) == ["controller_kill", "link_down"]
    by_action = {e.fault.action: e for e in events}
    assert by_action["link_down"].fired_s == pytest.approx(0.05, abs=0.04)
    assert by_action["link_down"].reroute_s == 0.25 and by_action["link_down"].note == "done"
    assert by_action["controller_kill"].fired_s is not None
    assert by_action["agent_kill"].fired_s is None  # cancelled by finish()
    assert by_action["link_up"].fired_s is None  # its step never came
    assert [e.fault.action for e in events if e.fired_s is not None] == ["link_down", "controller_kill"]


def test_a_failing_action_is_recorded_not_raised():
    def boom(f):
        raise RuntimeError("ip: no such device")

    inj = faults.Injector([faults.Fault("link_down", "s1-s3", step=0)], {"link_down": boom}, start_at=time.monotonic())
    inj.step_started(0)
    (ev,) = inj.finish()
    assert ev.error == "ip: no such device" and ev.action_s is not None


def test_fault_line_reads_at_a_glance():
    rec = {"spec": "link_down:s1-s3@step=1", "fired_s": 0.412, "reroute_s": 0.031,
           "affected_transfers": [{"step": 1, "src": 0, "dst": 2}], "note": "s1-s3 down; controller rerouted"}
    line = faults.fault_line(rec)
    assert "fired at 0.412 s" in line and "31 ms" in line and "1 planned transfers" in line
    assert "not fired" in faults.fault_line({"spec": "controller_kill@9s", "fired_s": None})


class _Silent:
    """A control channel on which ranks 0 and 2 report done and rank 1 never does."""

    path = "unused"

    def poll(self, timeout):
        time.sleep(min(timeout, 0.01))
        return [{"type": "done", "rank": 0}, {"type": "done", "rank": 2}]


class _Alive:
    returncode = None

    def poll(self):
        return None


def test_a_hung_agent_fails_the_run_naming_it_within_the_timeout():
    started = time.monotonic()
    fleet = Fleet(_Silent(), {r: _Alive() for r in range(3)})
    with pytest.raises(ReplayFailed, match=r"rank 1 .*did not report 'done' within 1 s: agent hung"):
        fleet.wait_for(Msg.DONE, timeout=1.0)
    assert time.monotonic() - started < 3


def test_step_reports_reach_the_injector_while_waiting():
    class Control:
        path = "unused"

        def __init__(self):
            self.batches = [[{"type": "step", "rank": 1, "step": 2}], [{"type": "done", "rank": 0}]]

        def poll(self, timeout):
            return self.batches.pop(0) if self.batches else []

    seen = []
    got = Fleet(Control(), {0: _Alive()}).wait_for(Msg.DONE, timeout=5, on_step=seen.append)
    assert seen == [2] and list(got) == [0]


def test_a_second_network_waits_for_the_lock_then_says_so_in_one_line(tmp_path, monkeypatch):
    from emulator.emulation.machine.network_lock import NetworkLock

    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("EF_NET_LOCK_WAIT", "0.3")
    with NetworkLock():
        started = time.monotonic()
        with pytest.raises(UserError) as exc:
            NetworkLock().acquire()
        assert 0.3 <= time.monotonic() - started < 3
        assert "another emulated network" in str(exc.value) and "\n" not in str(exc.value)
    second = NetworkLock()
    second.acquire()  # free again once the first is released
    second.release()
