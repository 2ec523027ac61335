"""Fault actions on a fake network: the ``ip link`` commands, the controller's answers, restoring, the records."""

from __future__ import annotations

import time

import pytest

from emulator.emulation.machine.system import Result
from emulator.emulation.session.fault_injection import (
    FaultActions,
    fault_records,
    link_commands,
    link_key,
    measure_affected,
)
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.prediction import cost
from emulator.runs import fault_plan as faults
from emulator.runs.fault_plan import Fault, FaultEvent

TOPO = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
INTERFACES = {"efs1-eth3": ("s1", "s3"), "efs3-eth3": ("s1", "s3")}


class FakeNetwork:
    """Runs ``ip link`` commands by marking links down or up, and plays a controller that sees them.

    ``reroutes``: the controller reports a downed link as failed (and every
    switch confirmed); without it the controller never notices.
    """

    def __init__(self, reroutes: bool = True):
        self.reroutes = reroutes
        self.commands: list[list[str]] = []
        self.down: set[tuple[str, str]] = set()
        self.alive = True
        self.calls: list[str] = []

    # the command runner
    def __call__(self, cmd):
        self.commands.append(list(cmd))
        link = INTERFACES[cmd[4]]
        if cmd[5] == "down":
            self.down.add(link)
        else:
            self.down.discard(link)
        return Result(0, "", "")

    # the controller
    def running(self):
        return self.alive

    def status(self):
        failed = [list(link) for link in sorted(self.down)] if self.reroutes else []
        return {"failed_links": failed, "installed": [sw.name for sw in TOPO.switches]}

    def kill(self):
        self.calls.append("kill")
        self.alive = False

    def start(self):
        self.calls.append("start")
        self.alive = True

    def wait_installed(self, timeout=60.0, switches=None, no_failures=True):
        self.calls.append(f"wait_installed(no_failures={no_failures})")
        return self.status()


def actions_on(net, killed=None):
    return FaultActions(TOPO, net, kill_agent=(killed.append if killed is not None else lambda rank: None),
                        runner=net)


def test_a_link_is_set_on_its_root_namespace_ends_in_either_order():
    assert link_commands(TOPO, "s3", "s1", up=False) == [["ip", "link", "set", "dev", "efs1-eth3", "down"],
                                                         ["ip", "link", "set", "dev", "efs3-eth3", "down"]]
    assert link_commands(TOPO, "h1", "s1", up=True) == [["ip", "link", "set", "dev", "efs1-eth1", "up"]]
    assert link_key("s3", "s1") == link_key("s1", "s3") == ("s1", "s3")


def test_link_down_waits_for_the_reroute_and_restore_brings_it_up():
    net = FakeNetwork()
    actions = actions_on(net)
    note, seconds = actions.table()["link_down"](Fault("link_down", "s3-s1", at_s=0.0))
    assert note == "s3-s1 down; controller rerouted" and seconds is not None and seconds < 1.0
    assert net.down == {("s1", "s3")} and actions.downed == {("s1", "s3")}
    actions.restore()
    assert net.down == set() and actions.downed == set()
    assert [c[-1] for c in net.commands] == ["down", "down", "up", "up"]
    assert net.calls == ["wait_installed(no_failures=True)"]


def test_link_up_is_confirmed_when_the_controller_no_longer_sees_the_failure():
    net = FakeNetwork()
    actions = actions_on(net)
    actions.set_link("s1", "s3", up=False)
    note, seconds = actions.link(Fault("link_up", "s1-s3", step=1), up=True)
    assert note == "s1-s3 up; controller rerouted" and seconds is not None and actions.downed == set()


def test_without_a_running_controller_nobody_reroutes_and_nothing_waits():
    net = FakeNetwork()
    net.alive = False
    started = time.monotonic()
    note, seconds = actions_on(net).link(Fault("link_down", "s1-s3", at_s=0.0), up=False)
    assert note == "s1-s3 down; no controller rerouted it" and seconds is None
    assert time.monotonic() - started < 1.0


def test_a_controller_that_never_confirms_times_out():
    net = FakeNetwork(reroutes=False)
    actions = actions_on(net)
    started = time.monotonic()
    assert actions.wait_confirmed(lambda st: bool(st["failed_links"]), timeout_s=0.1) is None
    assert 0.1 <= time.monotonic() - started < 1.0


def test_controller_kill_restart_and_restore():
    net = FakeNetwork()
    actions = actions_on(net)
    assert "killed" in actions.controller_kill(Fault("controller_kill", at_s=0.0)) and not net.alive
    actions.restore()  # a killed controller is started again, and every switch confirmed
    assert net.alive and net.calls == ["kill", "start", "wait_installed(no_failures=True)"]
    net.calls.clear()
    note, seconds = actions.controller_restart(Fault("controller_restart", at_s=0.0))
    assert "restarted" in note and seconds is not None and seconds >= 0
    assert net.calls == ["kill", "start", "wait_installed(no_failures=False)"]


def test_agent_kill_kills_that_rank():
    killed: list[int] = []
    note = actions_on(FakeNetwork(), killed).table()["agent_kill"](Fault("agent_kill", "3", at_s=0.0))
    assert killed == [3] and note == "rank 3's agent killed"


def test_the_injector_fires_through_the_table_and_the_records_say_what_it_hit():
    net = FakeNetwork()
    plan = [Fault("link_down", "s1-s3", step=1), Fault("controller_kill", at_s=30.0)]
    inj = faults.Injector(plan, actions_on(net).table(), start_at=time.monotonic())
    inj.step_started(1)
    events = inj.finish(timeout_s=5)
    schedule = generators.generate("hdrm", TOPO, 8 * 1024)
    planned = cost.transfers(schedule, TOPO, "bigraph")
    records = fault_records(events, planned, rep=2)
    down, kill = records
    assert down["rep_index"] == kill["rep_index"] == 2
    assert down["fired_s"] is not None and down["note"] == "s1-s3 down; controller rerouted"
    assert down["affected_transfers"] == faults.crossing_transfers(planned, "s1", "s3") != []
    assert kill["fired_s"] is None and kill["note"] == "not fired: the repetition ended first"
    assert kill["affected_transfers"] == []
    first = down["affected_transfers"][0]
    transfers = [{"step": first["step"], "src": first["src"], "dst": first["dst"], "start": 1.0, "end": 1.25}]
    measure_affected([down], transfers)
    assert first["time_s"] == pytest.approx(0.25)
    assert all(t.get("time_s") is None for t in down["affected_transfers"][1:])


def test_an_unfired_fault_keeps_its_event_fields():
    (rec,) = fault_records([FaultEvent(Fault("agent_kill", "1", at_s=5.0))], [], rep=0)
    assert rec["spec"] == "agent_kill:1@5s" and rec["fired_s"] is None and rec["error"] is None
