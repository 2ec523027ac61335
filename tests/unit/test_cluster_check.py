"""``emu cluster check`` (emulator/cli/commands/cluster.py) with fake runners: the probes of
emulator/emulation/cluster/cluster_probe.py read scripted results, the findings of emulator/runs/cluster_check.py
compare
them with the head's, and the command's exit status is 0, 1 or 2."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest
import yaml

from emulator.cli.commands import cluster as cluster_cmd
from emulator.cli.main import main
from emulator.emulation.cluster import cluster_probe
from emulator.emulation.machine.system import Result
from emulator.runs import cluster_check, cluster_file
from emulator.runs.cluster_check import ClockSample, tunnel_names

KEY = "/root/.ssh/ef_lab"
OK = Result(0, "", "")


def _cluster_data(names=("a", "b")) -> dict:
    return {"name": "lab", "head": names[0], "underlay_mtu": 9100,
            "servers": [{"name": n, "ssh": f"192.0.2.{10 + i}", "key": KEY, "underlay": f"10.77.0.{1 + i}"}
                        for i, n in enumerate(names)]}


def _calibration(found=True, made=False, path="/var/lib/ef-emu/calibration-mtu9000.json") -> dict:
    return {"path": path, "mtu": 9000, "found": found, "minimal": True, "quick": True, "date": "2026-12-03",
            "problem": None, "made": made, "error": ""}


class FakeServers:
    """Every server's answers, by server name; records each command as (server, argv, timeout)."""

    def __init__(self, cluster_data: dict):
        self.by_host = {s["ssh"]: s["name"] for s in cluster_data["servers"]}
        self.head = cluster_data["head"]
        self.state = {name: {"kernel": "6.1.0-28-amd64", "ovs": "3.1.0", "mininet": "2.3.0",
                             "project": "0.1.0 code 0123456789ab", "ssh": 0, "ping": 0, "calibration": _calibration()}
                      for name in self.by_host.values()}
        self.calls: list[tuple[str, list[str], float]] = []

    def __call__(self, argv, timeout=60.0):
        argv = list(argv)
        if argv[0] == "ssh":
            server = self.by_host[argv[-3].split("@", 1)[1]]
            command = shlex.split(argv[-1])
        else:
            server, command = self.head, argv
        self.calls.append((server, command, timeout))
        return self._answer(server, command)

    def _answer(self, server, command):
        s = self.state[server]
        if s["ssh"] != 0:
            return Result(255, "", "root@192.0.2.11: Permission denied (publickey).\r\n")
        if command == ["uname", "-r"]:
            return Result(0, s["kernel"] + "\n", "")
        if command == ["ovs-vsctl", "--version"]:
            return Result(0, f"ovs-vsctl (Open vSwitch) {s['ovs']}\nDB Schema 8.3.1\n", "")
        if command[1:] == ["-c", cluster_probe.MININET_SCRIPT]:
            return Result(0, s["mininet"] + "\n", "")
        if command[1:] == ["-c", cluster_probe.PROJECT_SCRIPT]:
            return Result(0, s["project"] + "\n", "")
        if command == ["chronyc", "tracking"]:
            return Result(127, "", "bash: line 1: chronyc: command not found")
        if command == ["date", "+%s.%N"]:
            return Result(0, f"{time.time():.9f}\n", "")
        if command[:4] == ["ip", "-o", "-4", "addr"]:
            return Result(0, "2: eth1    inet 10.77.0.1/24 scope global eth1\n", "")
        if "ping" in command:
            got = 3 if s["ping"] == 0 else 0
            return Result(s["ping"], f"3 packets transmitted, {got} received, {100 - 33 * got}% packet loss\n", "")
        if command[1:5] == ["-m", "emulator", "cluster", "calibration"]:
            cal = dict(s["calibration"])
            if "--make" in command:
                cal.update(found=True, made=True)
            return Result(0, json.dumps(cal) + "\n", "")
        return OK

    def of(self, server):
        return [c for name, c, _ in self.calls if name == server]

    def clock_session(self, cluster, server):
        """What the command's clock session to ``server`` answers: the server's date, as its runner does."""
        servers = self

        class Session:
            def __call__(self, argv):
                servers.calls.append((server.name, list(argv), 0.0))
                return servers._answer(server.name, list(argv))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass
        return Session()


@pytest.fixture
def fake(monkeypatch):
    def make(names=("a", "b")):
        data = _cluster_data(names)
        servers = FakeServers(data)
        monkeypatch.setattr(cluster_cmd, "run", servers)
        monkeypatch.setattr(cluster_cmd, "clock_session", servers.clock_session)
        monkeypatch.setattr(cluster_cmd, "require_root", lambda: None)
        monkeypatch.setattr(cluster_cmd, "interrupt_on_sigterm", lambda: None)
        # no shared ssh connection: it would be a real ssh to the file's (documentation) addresses
        monkeypatch.setattr(cluster_cmd.remote_shell, "open_shared", lambda cluster: [])
        monkeypatch.setattr(cluster_cmd.remote_shell, "close_shared", lambda cluster, local=None: None)
        return data, servers
    return make


def _write(tmp_path, data) -> str:
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# ------------------------------------------------------------------ the CLI
def test_every_check_passing_prints_a_row_per_server_and_exits_0(tmp_path, fake, capsys):
    data, servers = fake()
    path = _write(tmp_path, data)
    assert main(["cluster", "check", path]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("cluster lab: 2 servers, head a, underlay MTU 9100")
    assert "mtu 9050" in lines[1]
    a_row, b_row = lines[2], lines[3]
    assert a_row.startswith("a (head)") and "local" in a_row and a_row.endswith("ok")
    assert b_row.startswith("b ") and "ok " in b_row and "6.1.0-28-amd64" in b_row and b_row.endswith("ok")
    assert "no chrony" in b_row and "minimal /var/lib/ef-emu/calibration-mtu9000.json" in b_row
    assert err == ""
    # the head's own checks ran here, without ssh; b's over ssh, with the cluster's key and known_hosts
    assert all(c[0] != "ssh" for c in servers.of("a"))
    assert ["true"] in servers.of("b") and ["true"] not in servers.of("a")
    assert sum(1 for c in servers.of("b") if c == ["date", "+%s.%N"]) == cluster_probe.CLOCK_SAMPLES
    assert main(["cluster", "check", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["failures"] == [] and [s["name"] for s in doc["servers"]] == ["a", "b"]
    assert doc["servers"][1]["tunnel"] == {"mtu": 9050, "ok": True, "detail": "3/3 echo replies"}
    assert doc["servers"][0]["clock"]["offset_s"] == 0.0 and doc["servers"][0]["tunnel"] is None


def test_a_version_differing_from_the_heads_fails_naming_it(tmp_path, fake, capsys):
    data, servers = fake()
    servers.state["b"]["ovs"] = "2.17.9"
    servers.state["b"]["project"] = "0.1.0 code ffffffffffff"
    assert main(["cluster", "check", _write(tmp_path, data)]) == 1
    out, err = capsys.readouterr()
    assert "FAILED (ovs, project)" in out.splitlines()[3]
    lines = err.splitlines()
    assert lines[0] == "emu: server b: ovs: expected Open vSwitch 3.1.0, the head's, found 2.17.9"
    assert lines[1].startswith("emu: server b: project: expected project 0.1.0 code 0123456789ab, the head's from "
                               f"{sys.executable} (the project must be installed at the same path on every server)")
    assert lines[1].endswith("found 0.1.0 code ffffffffffff") and len(lines) == 2


def test_a_server_ssh_does_not_reach_is_one_failure_line_and_the_other_rows_still_print(tmp_path, fake, capsys):
    data, servers = fake(("a", "b", "c"))
    servers.state["b"]["ssh"] = 255
    assert main(["cluster", "check", _write(tmp_path, data)]) == 1
    out, err = capsys.readouterr()
    rows = out.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["a", "b", "c"]
    assert "FAILED (ssh)" in rows[1] and rows[2].endswith("ok") and rows[0].endswith("ok")
    assert err.splitlines() == [f"emu: server b: ssh: expected a command to run as root@192.0.2.11:22 with the key "
                                f"{KEY}, found exit status 255: root@192.0.2.11: Permission denied (publickey)."]
    assert servers.of("b") == [["true"]]  # nothing more was tried on b
    assert any("ping" in c for c in servers.of("a"))  # c's tunnel was probed from the head


def test_a_tunnel_dropping_jumbo_frames_fails_the_mtu_check(tmp_path, fake, capsys):
    data, servers = fake()
    servers.state["a"]["ping"] = 1
    assert main(["cluster", "check", _write(tmp_path, data)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("emu: server b: mtu: expected 9050-byte packets through a VXLAN tunnel from a "
                          "unfragmented (underlay_mtu 9100 less 50), found 0/3 echo replies to 9022-byte pings")
    # the probe's namespaces and devices were removed on both ends
    for server in ("a", "b"):
        assert ["ip", "netns", "del", "efchk-b"] in servers.of(server)


def test_a_missing_calibration_is_made_there_a_minimal_one_and_said_so(tmp_path, fake, capsys):
    data, servers = fake()
    servers.state["b"]["calibration"] = _calibration(found=False)
    assert main(["cluster", "check", _write(tmp_path, data)]) == 0
    out, err = capsys.readouterr()
    assert "made minimal /var/lib/ef-emu/calibration-mtu9000.json" in out.splitlines()[3]
    assert err.startswith("b: no calibration at MTU 9000: making a minimal one there, as emu run does")
    made = [(c, t) for name, c, t in servers.calls if name == "b" and "--make" in c]
    assert len(made) == 1 and made[0][1] == cluster_cmd.CALIBRATION_TIMEOUT_S
    assert made[0][0][:6] == [sys.executable, "-m", "emulator", "cluster", "calibration", "--fabric"]
    assert not any("--make" in c for c in servers.of("a"))


def test_a_bad_cluster_file_is_exit_status_2_before_anything_runs(tmp_path, fake, capsys):
    data, servers = fake()
    assert main(["cluster", "check", _write(tmp_path, {**data, "head": "z"})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'head'" in err and servers.calls == []
    assert main(["cluster", "check", _write(tmp_path, data), "--fabric", "mtu=12"]) == 2
    assert "field 'mtu'" in capsys.readouterr().err and servers.calls == []


def test_cluster_place_still_works_beside_check(tmp_path, capsys):
    path = _write(tmp_path, _cluster_data())
    assert main(["cluster", "place", path, "--topology", "star:hosts=2"]) == 0
    assert "a (head)" in capsys.readouterr().out


def test_the_calibration_subcommand_reports_this_machines_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EF_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(cluster_cmd, "machine_identity", lambda: {"kernel": "k1", "ovs_version": "3.1.0", "nproc": 2})
    monkeypatch.setattr(cluster_cmd.calibration_file, "machine_identity",
                        lambda: {"kernel": "k1", "ovs_version": "3.1.0", "nproc": 2})
    assert main(["cluster", "calibration"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["found"] is False and status["path"] == str(tmp_path / "calibration-mtu9000.json")
    (tmp_path / "calibration-mtu9000.json").write_text(json.dumps(
        {"version": 2, "minimal": True, "machine": {"kernel": "k0", "ovs_version": "3.1.0", "nproc": 2}}))
    assert main(["cluster", "calibration"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["found"] is False and status["problem"] == "made with kernel 'k0', this machine has 'k1'"
    (tmp_path / "calibration-mtu9000.json").write_text(json.dumps(
        {"version": 2, "minimal": True, "machine": {"kernel": "k1", "ovs_version": "3.1.0", "nproc": 2,
                                                    "date": "2026-12-03"}}))
    assert main(["cluster", "calibration"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["found"] is True and status["minimal"] is True and status["date"] == "2026-12-03"
    assert cluster_check.CalibrationStatus.from_json(status).text == \
        f"minimal {tmp_path / 'calibration-mtu9000.json'}"


# ------------------------------------------------------------------ the probes
def test_the_offset_is_the_shortest_round_trips_remote_less_its_midpoint():
    samples = [ClockSample(100.0, 100.9, 101.0), ClockSample(200.0, 200.25, 200.2), ClockSample(300.0, 301.0, 300.5)]
    offset = cluster_check.offset_from(samples, chrony="no chrony")
    assert offset.offset_s == pytest.approx(0.15) and offset.uncertainty_s == pytest.approx(0.1)
    assert offset.samples == 3 and offset.text == "+150.000 ms ± 100.000"
    assert cluster_check.offset_from([]).error == "no clock reading"
    # through a runner: a server 2.5 s ahead, round trips of 0.2, 0.1 and 0.3 s on a fake clock
    ticks = iter([10.0, 10.2, 20.0, 20.1, 30.0, 30.3])
    answers = iter(["12.6", "22.55", "32.65"])

    def runner(argv):
        if argv == ["chronyc", "tracking"]:
            return Result(0, "Reference ID    : C0A80001 (gw)\nSystem time     : 0.000012345 seconds fast of NTP "
                             "time\nLast offset     : +0.000001\n", "")
        assert argv == ["date", "+%s.%N"]
        return Result(0, next(answers) + "\n", "")
    offset = cluster_probe.clock_offset(runner, clock=lambda: next(ticks), samples=3,
                                        chrony_line=cluster_probe.chrony(runner))
    assert offset.offset_s == pytest.approx(2.5) and offset.uncertainty_s == pytest.approx(0.05)
    assert offset.chrony == "0.000012345 seconds fast of NTP time"
    assert cluster_probe.clock_offset(lambda argv: Result(0, "%N\n", ""), samples=2).error == "date printed '%N'"


def test_a_clock_session_answers_each_request_from_one_shell_and_says_when_it_is_gone():
    def start(argv, **kw):
        return subprocess.Popen(argv, text=True, **kw)
    with cluster_probe.ClockSession(start) as session:
        before = time.time()
        offset = cluster_probe.clock_offset(session)
        assert abs(offset.offset_s) <= offset.uncertainty_s + 1e-3 and offset.uncertainty_s < 0.5
        assert offset.samples == cluster_probe.CLOCK_SAMPLES and time.time() - before < 5
        with pytest.raises(ValueError):
            session(["uname", "-r"])
    assert session.proc.returncode == 0 and session(cluster_probe.DATE).returncode != 0
    gone = cluster_probe.ClockSession(lambda argv, **kw: subprocess.Popen(
        ["sh", "-c", "echo 'Permission denied (publickey).' >&2; exit 255"], text=True, **kw))
    res = gone(cluster_probe.DATE)
    assert res.returncode == 255 and "Permission denied" in res.stderr
    silent = cluster_probe.ClockSession(lambda argv, **kw: subprocess.Popen(["sleep", "30"], text=True, **kw),
                                        timeout_s=0.2)
    assert silent(cluster_probe.DATE) == Result(124, "", "no answer within 0.2 s")
    assert silent.proc.returncode is not None  # ended, not left running


def test_versions_and_chrony_read_what_each_command_prints_or_why_not():
    answers = {("uname", "-r"): Result(0, "6.1.0-28-amd64\n", ""),
               ("ovs-vsctl", "--version"): Result(0, "ovs-vsctl (Open vSwitch) 3.1.0\nDB Schema 8.3.1\n", ""),
               ("py", "-c", cluster_probe.MININET_SCRIPT): Result(1, "", "Traceback\nModuleNotFoundError: x\n"),
               ("py", "-c", cluster_probe.PROJECT_SCRIPT): Result(0, "\n", "")}
    v = cluster_probe.versions(lambda argv: answers[tuple(argv)], python="py")
    assert v.kernel.value == "6.1.0-28-amd64" and v.ovs.value == "3.1.0"
    assert v.mininet.value is None and v.mininet.error == "exit status 1: ModuleNotFoundError: x"
    assert v.project.value is None and v.project.error == "unreadable output ''"
    assert cluster_probe.chrony(lambda argv: Result(1, "", "506 Cannot talk to daemon\n")) == \
        "chronyc: exit status 1: 506 Cannot talk to daemon"
    assert cluster_probe.reach(lambda argv: Result(255, "", "ssh: connect to host x port 22: No route\n")).error == \
        "exit status 255: ssh: connect to host x port 22: No route"


def test_the_project_script_reads_this_projects_version_and_code():
    from emulator.emulation.machine.system import run

    res = run([sys.executable, "-c", cluster_probe.PROJECT_SCRIPT])
    import emulator
    assert res.returncode == 0 and res.stdout.startswith(f"{emulator.__version__} code ")
    assert len(res.stdout.split()[-1]) == 12


class Recorder:
    def __init__(self, name, fail=None, ping=0):
        self.name, self.fail, self.ping, self.calls = name, fail, ping, []

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        if self.fail and argv[:len(self.fail)] == self.fail:
            return Result(2, "", "RTNETLINK answers: File exists\n")
        if argv[:4] == ["ip", "-o", "-4", "addr"]:
            return Result(0, "2: eth1    inet 10.77.0.1/24\n", "")
        if "ping" in argv:
            return Result(self.ping, "3 packets transmitted, 0 received, 100% packet loss\n" if self.ping else
                          "3 packets transmitted, 3 received, 0% packet loss\n", "")
        if argv[:3] == ["ip", "-o", "route"]:
            return Result(0, "10.77.0.2 dev eth1 src 10.77.0.1 uid 0 \\    cache\n", "")
        if argv[:3] == ["ip", "-o", "link"]:
            return Result(0, "3: eth1: <BROADCAST,UP> mtu 1500 qdisc mq state UP\n", "")
        return OK


HEAD = cluster_file.Server("a", "192.0.2.10", "root", KEY, "10.77.0.1")
B = cluster_file.Server("b", "192.0.2.11", "root", KEY, "10.77.0.2")


def test_the_mtu_probe_makes_prefixed_names_on_both_ends_and_removes_them():
    names = tunnel_names("b", 1, 4242)
    assert names.namespace == "efchk-b" and names.device.startswith("efvx") and len(names.device) <= 15
    assert cluster_check.PROBE_VNI_BASE <= names.vni < 1 << 24 and names.vni != tunnel_names("c", 2, 4242).vni
    head, server = Recorder("a"), Recorder("b")
    tunnel = cluster_probe.tunnel_mtu(head, server, HEAD, B, 9050, names)
    assert tunnel.ok and tunnel.detail == "3/3 echo replies"
    dev, ns, vni = names.device, names.namespace, str(names.vni)
    assert head.calls[1:7] == [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", dev, "mtu", "9050", "type", "vxlan", "id", vni, "local", "10.77.0.1",
         "remote", "10.77.0.2", "dstport", "4789", "df", "set"],
        ["ip", "link", "set", dev, "netns", ns],
        ["ip", "-n", ns, "addr", "add", "10.254.0.1/30", "dev", dev],
        ["ip", "-n", ns, "link", "set", dev, "up"],
        ["ip", "netns", "exec", ns, "ping", "-M", "do", "-s", "9022", "-c", "3", "-i", "0.2", "-W", "2", "10.254.0.2"]]
    assert ["ip", "link", "add", dev, "mtu", "9050", "type", "vxlan", "id", vni, "local", "10.77.0.2",
            "remote", "10.77.0.1", "dstport", "4789", "df", "set"] in server.calls
    assert ["ip", "-n", ns, "addr", "add", "10.254.0.2/30", "dev", dev] in server.calls
    for r in (head, server):
        assert r.calls[-2:] == [["ip", "-n", ns, "link", "del", dev], ["ip", "netns", "del", ns]]
    for argv in head.calls + server.calls:  # nothing but our own names is created or removed
        if argv[:3] in (["ip", "link", "add"], ["ip", "link", "del"], ["ip", "netns", "add"]):
            assert argv[3].startswith(("efvx", "efchk-"))


def test_the_mtu_probe_cleans_up_when_ping_fails_and_when_set_up_fails_half_way():
    names = tunnel_names("b", 1, 7)
    head, server = Recorder("a", ping=1), Recorder("b")
    tunnel = cluster_probe.tunnel_mtu(head, server, HEAD, B, 9050, names)
    assert not tunnel.ok and tunnel.detail.startswith("0/3 echo replies to 9022-byte pings with don't-fragment")
    assert tunnel.detail.endswith("the route to 10.77.0.2 leaves by eth1, MTU 1500")
    assert ["ip", "netns", "del", names.namespace] in head.calls and ["ip", "netns", "del", names.namespace] in \
        server.calls
    # the server's device cannot be made: its namespace and everything on the head are removed, nothing more
    head, server = Recorder("a"), Recorder("b", fail=["ip", "link", "add"])
    tunnel = cluster_probe.tunnel_mtu(head, server, HEAD, B, 9050, names)
    assert not tunnel.ok and tunnel.detail.startswith(f"on b, `ip link add {names.device} mtu 9050 type vxlan")
    assert tunnel.detail.endswith("failed: exit status 2: RTNETLINK answers: File exists")
    assert server.calls[-1] == ["ip", "netns", "del", names.namespace]
    assert not any(c[:3] == ["ip", "link", "del"] or c[:4] == ["ip", "-n", names.namespace, "link"] and "del" in c
                   for c in server.calls)
    assert head.calls[-2:] == [["ip", "-n", names.namespace, "link", "del", names.device],
                               ["ip", "netns", "del", names.namespace]]
    assert not any("ping" in c for c in head.calls)
    # a namespace left by an earlier check is not removed: it is not this check's
    head, server = Recorder("a", fail=["ip", "netns", "add"]), Recorder("b")
    tunnel = cluster_probe.tunnel_mtu(head, server, HEAD, B, 9050, names)
    assert not tunnel.ok and "ip netns add efchk-b" in tunnel.detail
    assert head.calls[-1] == ["ip", "netns", "add", names.namespace] and server.calls == []


def test_the_mtu_probe_names_an_underlay_address_the_server_does_not_have():
    server = Recorder("b")

    def server_no_address(argv):
        return Result(0, "", "") if argv[:4] == ["ip", "-o", "-4", "addr"] else server(argv)
    tunnel = cluster_probe.tunnel_mtu(Recorder("a"), server_no_address, HEAD, B, 9050, tunnel_names("b", 1, 7))
    assert tunnel.detail == "b has no address 10.77.0.2 (its underlay in the cluster file)"
