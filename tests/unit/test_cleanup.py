"""``emu clean`` and the run state, with a fake command runner: only our names and our processes are touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from emulator.emulation.machine import cleanup, started
from emulator.emulation.machine.system import Result

#: ``ip -j link show`` of a namespace holding one veth pair, captured with iproute2 6.1.
IP_LINK_JSON = (
    '[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK"],"mtu":65536,"qdisc":"noop","operstate":"DOWN",'
    '"linkmode":"DEFAULT","group":"default","txqlen":1000,"link_type":"loopback","address":"00:00:00:00:00:00",'
    '"broadcast":"00:00:00:00:00:00"},{"ifindex":2,"link":"efh1-a","ifname":"efh1-b","flags":["BROADCAST",'
    '"MULTICAST","M-DOWN"],"mtu":1500,"qdisc":"noop","operstate":"DOWN","linkmode":"DEFAULT","group":"default",'
    '"txqlen":1000,"link_type":"ether","address":"4a:a4:9e:08:bb:5f","broadcast":"ff:ff:ff:ff:ff:ff"},'
    '{"ifindex":3,"link":"efh1-b","ifname":"efh1-a","flags":["BROADCAST","MULTICAST","M-DOWN"],"mtu":1500,'
    '"qdisc":"noop","operstate":"DOWN","linkmode":"DEFAULT","group":"default","txqlen":1000,"link_type":"ether",'
    '"address":"32:9e:79:a7:ed:21","broadcast":"ff:ff:ff:ff:ff:ff"}]')


class FakeMachine:
    """Answers ``ovs-vsctl list-br`` and ``ip -j link show`` from lists; records every command."""

    def __init__(self, bridges: list[str], links: list[str]):
        self.bridges, self.links, self.ran = bridges, links, []

    def __call__(self, cmd):
        cmd = list(cmd)
        self.ran.append(cmd)
        if cmd[-1] == "list-br":
            return Result(0, "\n".join(self.bridges) + "\n", "")
        if cmd[:4] == ["ip", "-j", "link", "show"]:
            return Result(0, json.dumps([{"ifindex": i, "ifname": n} for i, n in enumerate(self.links)]), "")
        if cmd[:3] == ["ip", "-force", "-batch"]:  # as `ip` would: every line, on past one already gone
            with open(cmd[3], encoding="ascii") as fh:
                for line in fh:
                    assert line.startswith("link del dev ")
                    if line.split()[-1] in self.links:
                        self.links.remove(line.split()[-1])
        return Result(0, "", "")


def test_interface_names_come_from_ip_json_without_the_peer():
    assert cleanup.interface_names(IP_LINK_JSON) == ["lo", "efh1-b", "efh1-a"]
    assert cleanup.interface_names("") == [] and cleanup.interface_names('{"ifname": "x"}') == []


def test_removing_our_bridges_deletes_their_ports_and_nothing_else():
    machine = FakeMachine([], ["lo", "eth0", "efs1-eth1", "efs1-eth2", "efs10-eth1", "efs2-eth1"])
    cleanup.remove_our_bridges(machine, ["efs1"])
    assert machine.ran[0] == ["ovs-vsctl", "--timeout=60", "--", "--if-exists", "del-br", "efs1"]
    assert machine.links == ["lo", "eth0", "efs10-eth1", "efs2-eth1"]
    assert sum(c[:3] == ["ip", "-force", "-batch"] for c in machine.ran) == 1  # one ip for all of them
    cleanup.remove_our_bridges(machine, ["efs1"])  # again: nothing left to delete, no ip batch
    assert sum(c[:3] == ["ip", "-force", "-batch"] for c in machine.ran) == 1


def test_clean_removes_our_pattern_only(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    machine = FakeMachine(["br0", "efs1", "efs2", "efsX"], ["eth0", "efs1-eth1", "efh3-eth0", "efother", "efs9-eth2"])
    report = cleanup.clean(runner=machine)
    deleted = [c for c in machine.ran if c[:2] == ["ovs-vsctl", "--timeout=60"]]
    assert deleted == [["ovs-vsctl", "--timeout=60", "--", "--if-exists", "del-br", "efs1", "--", "--if-exists",
                        "del-br", "efs2"]]
    assert machine.links == ["eth0", "efother"]
    assert report == ["deleted 2 bridges: efs1 efs2", "deleted 2 interfaces"]
    assert cleanup.clean(runner=FakeMachine([], [])) == ["nothing of ours to clean"]


def test_a_live_run_keeps_its_bridges_unless_forced(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    state = started.StartedRecord.create("test")  # owned by this live process
    machine = FakeMachine(["efs1"], ["efs1-eth1"])
    report = cleanup.clean(runner=machine)
    assert len(report) == 1 and report[0].startswith(f"left run {state.run_id} alone")
    assert machine.links == ["efs1-eth1"] and os.path.isdir(state.path)
    cleanup.clean(force=True, runner=machine)
    assert machine.links == [] and not os.path.exists(state.path)


def test_processes_are_known_by_pid_and_start_time():
    me = os.getpid()
    start = started.proc_start_time(me)
    assert start is not None and started.alive(me, start) and started.alive(me, None)
    assert not started.alive(me, start + 1)
    assert started.proc_netns(me) == os.stat(f"/proc/{me}/ns/net").st_ino
    assert started.proc_netns(2**22 + 1) is None and started.proc_start_time(2**22 + 1) is None


def test_kill_recorded_kills_what_was_recorded_and_not_a_recycled_pid(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    state = started.StartedRecord.create("test")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state.record_process("agent", child.pid)
        with open(os.path.join(state.path, "processes.jsonl"), "a", encoding="utf-8") as fh:
            start = started.proc_start_time(other.pid)
            assert start is not None
            fh.write(json.dumps({"role": "agent", "pid": other.pid, "start_time": start - 1}) + "\n")
        assert started.kill_recorded(state, grace_s=5.0) == [child.pid]
        assert child.wait(5) != 0 and other.poll() is None
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()


def test_pids_in_netns_lists_the_processes_of_a_namespace():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ns = started.proc_netns(os.getpid())
        assert ns is not None
        found = started.pids_in_netns({ns})
        assert child.pid in found and os.getpid() not in found and 1 not in found
        assert started.pids_in_netns({0}) == []
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("name, ours", [("efh1-eth0", True), ("efs1-eth1", False), ("eth0", False)])
def test_a_namespace_is_ours_when_it_holds_a_host_interface(tmp_path, name, ours):
    dev = tmp_path / "7" / "net" / "dev"
    dev.parent.mkdir(parents=True)
    dev.write_text("Inter-|   Receive\n face |bytes\n    lo: 0 0\n" + f"  {name}: 0 0\n")
    assert started.has_our_interface(7, proc=str(tmp_path)) is ours
    assert not started.has_our_interface(8, proc=str(tmp_path))


class CheckLeftovers(FakeMachine):
    """A machine where a killed ``emu cluster check`` left its probe's namespace and a VXLAN device."""

    def __init__(self):
        super().__init__([], ["lo", "efvxef0042", "efvxnot-hex", "vxlan0"])
        self.netns = ["efchk-b", "blue"]

    def __call__(self, cmd):
        if list(cmd)[:4] == ["ip", "-j", "netns", "list"]:
            self.ran.append(list(cmd))
            return Result(0, json.dumps([{"name": n} for n in self.netns]), "")
        if list(cmd)[:3] == ["ip", "netns", "delete"]:
            self.netns.remove(cmd[3])
        return super().__call__(cmd)


def test_emu_clean_removes_what_a_killed_cluster_check_left_and_bring_up_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    machine = CheckLeftovers()
    cleanup.clean(runner=machine, network_lock_held=True)  # a network's bring-up: a check may be running
    assert machine.netns == ["efchk-b", "blue"] and "efvxef0042" in machine.links
    report = cleanup.clean(runner=machine)
    assert machine.netns == ["blue"] and machine.links == ["lo", "efvxnot-hex", "vxlan0"]
    assert any("efchk-b" in line for line in report)


def test_the_ssh_folder_goes_once_its_masters_have_ended_and_stays_while_one_listens(tmp_path, monkeypatch):
    import socket
    import threading
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    folder = tmp_path / started.SSH_FOLDER
    folder.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(folder / "stale"))  # a master that died without unlinking: bound, never listening
    stale.close()
    ending = socket.socket(socket.AF_UNIX)
    ending.bind(str(folder / "ending"))
    ending.listen()

    def end_later():  # a master told to exit, which unlinks its socket a moment after `ssh -O exit` returned
        ending.close()
        os.unlink(folder / "ending")
    threading.Timer(0.3, end_later).start()
    started.remove_ssh_folder(timeout_s=5)
    assert not folder.exists()

    folder.mkdir()
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(folder / "live"))
        live.listen()
        started.remove_ssh_folder(timeout_s=0.2)
        assert os.listdir(folder) == ["live"]
