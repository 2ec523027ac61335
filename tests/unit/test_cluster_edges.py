"""The cluster's edges without a cluster: ssh command lines, inline batches, interfaces per server, VXLAN set-up,
control over TCP (connected before an agent enters its host), clocks per rank, the adopting launcher's requests,
and the refusals of ``--cluster`` before anything starts."""

from __future__ import annotations

import os
import shlex
import socket

import pytest
import yaml

from emulator.cli.main import main
from emulator.emulation.agents import agent_launcher
from emulator.emulation.agents.agent_protocol import AgentChannel, ControlServer, Msg, preconnect
from emulator.emulation.agents.fleet import RankReport
from emulator.emulation.cluster import cluster_network, remote_shell
from emulator.emulation.machine.system import Result
from emulator.emulation.network.tc_commands import root_interface_rates
from emulator.model import cluster_placement, topology
from emulator.runs import clocks, cluster_file, trust
from emulator.runs.results import CellResults, Fidelity, Repetition
from emulator.runs.trust import Trust, Verdict

SERVERS = [
    {"name": "a", "ssh": "192.0.2.10", "key": "/keys/ef lab%1", "underlay": "10.77.0.1"},
    {"name": "b", "ssh": "192.0.2.11", "user": "ops", "port": 2222, "key": "/keys/ef_lab", "underlay": "10.77.0.2"},
]


def cluster(private: bool = True, **extra: object) -> cluster_file.Cluster:
    return cluster_file.from_dict({"name": "lab", "head": "a", "underlay_mtu": 9100, "private_underlay": private,
                                   "known_hosts": "/state/lab hosts", "servers": SERVERS, **extra})


def test_ssh_logs_in_with_the_files_key_and_known_hosts_only_quoting_paths_and_the_command():
    lab = cluster()
    argv = remote_shell.ssh_argv(lab.server("b"), ["tc", "-batch", "a file"], lab.known_hosts)
    assert argv[0] == "ssh" and argv[argv.index("-F") + 1] == "none" and argv[argv.index("-p") + 1] == "2222"
    options = [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]
    assert 'IdentityFile="/keys/ef_lab"' in options and "IdentitiesOnly=yes" in options
    assert 'UserKnownHostsFile="/state/lab hosts"' in options and "BatchMode=yes" in options
    assert "-T" in argv and "-tt" not in argv and argv[-3:-1] == ["ops@192.0.2.11", "--"]
    assert shlex.split(argv[-1]) == ["sudo", "-n", "-E", "tc", "-batch", "a file"]  # not root: sudo, no password
    root = remote_shell.ssh_argv(lab.server("a"), ["true"], lab.known_hosts, tty=True)
    assert 'IdentityFile="/keys/ef lab%%1"' in root and "-tt" in root and root[-1] == "true"


def test_the_heads_commands_run_locally_and_the_others_over_ssh():
    seen: list[list[str]] = []

    def local(cmd):
        seen.append(list(cmd))
        return Result(0, "", "")
    runners = remote_shell.runners(cluster(), local)
    runners["a"](["ovs-vsctl", "show"])
    runners["b"](["ovs-vsctl", "show"])
    assert seen[0] == ["ovs-vsctl", "show"] and seen[1][0] == "ssh" and seen[1][-1] == "sudo -n -E ovs-vsctl show"


def test_inline_batches_keep_whole_lines_under_the_limit_and_add_up_to_the_text():
    text = "".join(f"neigh replace 10.0.0.{i} lladdr 02:00:00:00:00:{i:02x} dev efh1-eth0\n" for i in range(200))
    pieces = cluster_network.inline_batches(["ip"], text, limit=1000)
    assert len(pieces) > 5
    for cmd in pieces:
        assert cmd[:3] == ["sh", "-c", 'printf %s "$1" | ip -batch -'] and cmd[3] == "sh"
        assert len(cmd[4]) <= 1000 and cmd[4].endswith("\n")
    assert "".join(cmd[4] for cmd in pieces) == text
    assert cluster_network.inline_batches(["tc"], "") == []


def test_each_link_end_is_set_up_on_the_server_of_its_switch():
    topo = topology.load("bigraph:upper=2,lower=2,hosts_per_switch=2")
    placed = cluster_placement.place(topo, ["a", "b"])
    grouped = cluster_network.interfaces_by_server(topo, placed)
    assert sorted(grouped) == ["a", "b"]
    merged = {name: rate for part in grouped.values() for name, rate in part.items()}
    assert merged == root_interface_rates(topo)
    for server, names in grouped.items():
        assert all(placed.of[name.split("-")[0].removeprefix("ef")] == server for name in names)


def test_a_tunnel_end_is_a_vxlan_device_of_its_own_id_at_the_fabrics_mtu_without_gro():
    script = cluster_network.vxlan_command("efs1-eth3", 7, "10.77.0.1", "10.77.0.2", 9000)[-1]
    assert "ip link add efs1-eth3 mtu 9000 type vxlan id 7 local 10.77.0.1 remote 10.77.0.2 dstport 4789 " \
           "nolearning" in script
    assert "ethtool -K efs1-eth3 gro off" in script and script.startswith("ip link del efs1-eth3")
    moved = cluster_network.vxlan_command("efh1-eth0", 8, "10.77.0.1", "10.77.0.2", 9000, address="02:00:00:00:00:01",
                                          netns_pid=42)[-1]
    assert moved.endswith("; ip link set efh1-eth0 address 02:00:00:00:00:01; ip link set efh1-eth0 netns 42")


def test_a_report_moves_onto_the_heads_clock_but_keeps_its_durations():
    report = RankReport(rank=3, ops={1: (10.0, 12.0)}, sends={1: [10.0, 10.5, 11.0, 0.25]}, correct=True,
                        arrivals={2: 11.5}, cpu_s=0.1)
    moved = report.shifted(2.0)
    assert moved.ops == {1: (8.0, 10.0)} and moved.sends == {1: [8.0, 8.5, 9.0, 0.25]}
    assert moved.arrivals == {2: 9.5} and moved.cpu_s == 0.1 and report.shifted(0.0) is report


def test_control_over_tcp_connected_before_the_agent_and_go_on_each_ranks_clock():
    server = ControlServer("/unused", 2, tcp_host="127.0.0.1")
    try:
        assert server.address.startswith("tcp:127.0.0.1:")
        argv = preconnect(["--rank", "0", "--control", server.address])
        assert argv[3].startswith("fd:")
        agents = [AgentChannel(argv[3]), AgentChannel(server.address)]
        for rank, agent in enumerate(agents):
            agent.send(Msg.HELLO, rank=rank)
        while len(server.conns) < 2:
            server.poll(1.0)
        server.send_all(Msg.GO, {1: {"start_at": 7.5}}, rep=0, start_at=5.0)
        assert [a.receive()["start_at"] for a in agents] == [5.0, 7.5]
        for agent in agents:
            agent.close()
    finally:
        server.close()
    assert preconnect(["--control", "/run/x.sock"]) == ["--control", "/run/x.sock"]


def test_an_adopting_launcher_answers_clock_and_files_inside_its_folder_only(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(agent_launcher, "become_subreaper", lambda: None)
    adopted = agent_launcher.Adopted()
    try:
        assert isinstance(adopted.handle({"op": "clock"})["monotonic"], float)
        path = os.path.join(adopted.state.path, "in", "f.json")
        adopted.handle({"op": "write", "path": path, "text": "{}"})
        assert adopted.handle({"op": "read", "path": path}) == {"text": "{}"}
        with pytest.raises(agent_launcher.LauncherError, match="outside"):
            adopted.handle({"op": "write", "path": str(tmp_path / "elsewhere"), "text": "x"})
        with pytest.raises(agent_launcher.LauncherError, match="outside"):
            adopted.handle({"op": "read", "path": os.path.join(adopted.state.path, "..", "x")})
    finally:
        adopted.close()
    assert not os.path.exists(adopted.state.path)


def test_clocks_are_trusted_while_error_and_drift_stay_under_a_hundredth_of_the_shortest_step():
    records = clocks.clock_records([{"server": "b", "offset_s": 1.0, "error_s": 1e-4}],
                                   [{"server": "b", "offset_s": 1.0002, "error_s": 2e-4}])
    assert records == [{"server": "b", "offset_s": 1.0, "error_s": 2e-4, "offset_after_s": 1.0002,
                        "drift_s": pytest.approx(2e-4)}]
    assert clocks.uncertainty_s(records) == pytest.approx(4e-4)
    assert clocks.check(records, [{"time_s": 0.05}, {"time_s": 0.1}]).verdict is Verdict.TRUSTED
    assert clocks.check(records, [{"time_s": 0.03}]) == Trust(flags=(clocks.FLAG,))
    lost = clocks.clock_records([{"server": "b", "offset_s": 0.0, "error_s": 1e-5}], [])
    assert lost[0]["drift_s"] is None and clocks.uncertainty_s(lost) == 1e-5


def test_clocks_without_a_predicted_step_or_a_second_measurement_are_unchecked_never_trusted():
    records = clocks.clock_records([{"server": "b", "offset_s": 1.0, "error_s": 1e-4}],
                                   [{"server": "b", "offset_s": 1.0002, "error_s": 2e-4}])
    assert clocks.check(records, []) == Trust(unchecked=(trust.CLOCKS,))
    assert clocks.check(records, [{"step": 0, "time_s": None}]).verdict is Verdict.UNCHECKED
    lost = clocks.clock_records([{"server": "b", "offset_s": 0.0, "error_s": 1e-5}], [])
    assert clocks.check(lost, [{"time_s": 0.05}]).verdict is Verdict.UNCHECKED  # its drift was never measured
    assert clocks.check(lost, [{"time_s": 1e-4}]).verdict is Verdict.FLAGGED  # its error alone is too large
    cell = CellResults(status="ok", prediction={"predicted_time_s": 1.0}, clocks=records,
                       repetitions=[Repetition(rep=0, time_s=1.0, algbw_mbps=1.0, busbw_mbps=1.0,
                                               fidelity=Fidelity(cpu_idle=0.5, datapath_load_mbps=1.0,
                                                                 datapath_capacity_mbps=10.0))])
    assert cell.trust() == Trust(unchecked=(trust.CLOCKS,)) and cell.trusted is False


def test_a_cluster_run_needs_a_stated_private_underlay_and_a_placement_needs_a_cluster(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({**cluster(private=False).to_json(), "known_hosts": "k"}))
    schedule = tmp_path / "s.yaml"
    assert main(["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "64KiB",
                 "--out", str(schedule)]) == 0
    base = ["replay", str(schedule), "--topology", "star:hosts=4", "--routing", "shortest", "--out",
            str(tmp_path / "out")]
    capsys.readouterr()
    assert main([*base, "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'private_underlay': expected true" in err[0]
    assert main([*base, "--placement", str(path)]) == 2
    assert "expected it with --cluster" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(cluster_file.FieldError, match="private_underlay"):
        cluster_file.from_dict({**cluster().to_json(), "private_underlay": "yes"})


def test_the_known_hosts_file_defaults_beside_the_cluster_file(tmp_path):
    data = {**cluster().to_json()}
    del data["known_hosts"]
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cluster_file.load(str(path)).known_hosts == str(tmp_path / "lab.known_hosts")


def test_tcp_prefix_is_what_the_server_listens_on():
    server = ControlServer("/unused", 1, tcp_host="127.0.0.1")
    try:
        host, port = server.address.removeprefix("tcp:").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2):
            pass
    finally:
        server.close()


def test_admission_holds_each_servers_share_to_its_own_memory():
    topo = topology.load("bigraph:upper=2,lower=2,hosts_per_switch=2")
    from emulator.model.collectives import generators
    from emulator.runs import admission

    schedule = generators.generate("ring", topo, 64 << 20)
    small = generators.generate("ring", topo, 1 << 20)
    placed = cluster_placement.place(topo, ["a", "b"])
    big = admission.replay_memory_per_server(schedule, topo, placed.of, "a")
    little = admission.replay_memory_per_server(small, topo, placed.of, "a")
    peak = admission.largest_per_server([little, big, little])
    assert peak == big
    roomy = admission.Machine(64 << 30, 64 << 30, 8)
    tight = admission.Machine(big["b"].total_bytes, 64 << 30, 8)  # nothing left after the reserve
    assert admission.cluster_memory_refusals("run", big, {"a": roomy, "b": roomy}) == []
    refusals = admission.cluster_memory_refusals("run", big, {"a": roomy, "b": tight})
    assert len(refusals) == 1 and refusals[0].startswith("run: field 'memory': expected server b's share")
    line = admission.cluster_memory_line(big, {"a": roomy, "b": roomy})
    assert line.startswith("memory per server: a ") and ", b " in line


def test_a_servers_memory_is_measured_there_or_it_does_not_answer():
    from emulator.emulation.cluster import cluster_probe

    assert cluster_probe.machine(lambda cmd: Result(0, "100 200 4\n", "")) == (100, 200, 4)
    assert cluster_probe.machine(lambda cmd: Result(255, "", "ssh: connect to host")) is None
    assert cluster_probe.machine(lambda cmd: Result(0, "garbage", "")) is None


def test_calibrate_cluster_runs_each_servers_own_calibration_in_turn(tmp_path, monkeypatch, capsys):
    from emulator.cli.commands import calibrate

    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({**cluster().to_json(), "known_hosts": "lab hosts"}))  # a folder that exists
    seen: list[list[str]] = []

    def fake(timeout):
        def runner(cmd):
            seen.append(list(cmd))
            failing = cmd[0] == "ssh"  # server b
            return Result(1 if failing else 0, "table\n", "ovs-vsctl: no Open vSwitch" if failing else "")
        return runner
    monkeypatch.setattr(calibrate.remote_shell, "run_with_timeout", fake)
    assert main(["calibrate", "--cluster", str(path), "--quick", "--fabric", "roce100"]) == 1
    assert seen[0][1:] == ["-m", "emulator", "calibrate", "--datapath", "auto", "--fabric", "roce100", "--quick"]
    assert seen[1][0] == "ssh" and seen[1][-1].endswith("calibrate --datapath auto --fabric roce100 --quick")
    out, err = capsys.readouterr()
    assert "== a (head): emu calibrate" in out and "== b: emu calibrate" in out
    assert err.strip() == "emu: server b: emu calibrate failed (status 1): ovs-vsctl: no Open vSwitch"
    assert main(["calibrate", "--cluster", str(tmp_path / "none.yaml")]) == 2


def test_mpi_on_a_cluster_needs_rank_0_on_the_head_and_each_server_holds_its_ranks():
    from emulator.emulation.mpi import mpi_run
    from emulator.runs import admission

    topo = topology.load("bigraph:upper=2,lower=2,hosts_per_switch=1")
    run = cluster_file.ClusterRun(cluster())
    placed = run.placement(topo)
    on_b = next(h.name for h in topo.hosts if placed.of[h.name] == "b")
    on_a = next(h.name for h in topo.hosts if placed.of[h.name] == "a")

    class Prep:
        hosts = [on_b, on_a]
    Prep.topo = topo
    with pytest.raises(cluster_file.FieldError, match=f"rank 0's host {on_b} on the head a"):
        mpi_run.check_cluster(Prep(), run)  # type: ignore[arg-type]
    Prep.hosts = [on_a, on_b]
    mpi_run.check_cluster(Prep(), run)  # type: ignore[arg-type]
    shares = admission.mpi_memory_per_server([on_a, on_b, on_b], 1 << 20, topo, placed.of, "a")
    assert shares["a"].ranks == 1 and shares["b"].ranks == 2 and shares["b"].session_bytes == 0
    whole = admission.mpi_memory(3, 1 << 20, topo)
    assert sum(e.total_bytes for e in shares.values()) == whole.total_bytes


def test_a_faults_link_command_runs_on_the_server_of_its_interface():
    topo = topology.load("bigraph:upper=2,lower=2,hosts_per_switch=1")
    placed = cluster_placement.place(topo, ["a", "b"])
    seen: list[list[str]] = []

    def local(cmd):
        seen.append(list(cmd))
        return Result(0, "", "")
    net = cluster_network.ClusterNetwork(topo, cluster(), placed, controller=("10.77.0.1", 6653), runner=local)
    runner = net.interface_runner()
    for switch in ("s1", "s2", "s3", "s4"):
        seen.clear()
        runner(["ip", "link", "set", "dev", f"ef{switch}-eth1", "down"])
        over_ssh = seen[0][0] == "ssh"
        assert over_ssh == (placed.of[switch] == "b"), (switch, seen)


def test_captures_are_refused_on_a_cluster(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({**cluster().to_json(), "known_hosts": "lab hosts"}))  # a folder that exists
    schedule = tmp_path / "s.yaml"
    assert main(["schedule", "gen", "--algo", "ring", "--topology", "star:hosts=4", "--size", "64KiB",
                 "--out", str(schedule)]) == 0
    capsys.readouterr()
    assert main(["replay", str(schedule), "--topology", "star:hosts=4", "--routing", "shortest", "--out",
                 str(tmp_path / "out"), "--cluster", str(path), "--pcap", "s1-h1"]) == 2
    assert "field 'pcap': expected no captures with --cluster" in capsys.readouterr().err


def test_shared_ssh_connections_live_beside_the_run_states_not_as_one(tmp_path, monkeypatch):
    from emulator.emulation.machine import cleanup, started

    monkeypatch.setenv("EF_RUN_DIR", str(tmp_path))
    lab = cluster()
    assert remote_shell.control_path() == str(tmp_path / "ssh" / "%C")
    options = remote_shell.ssh_options(lab.server("b"), lab.known_hosts)
    assert "ControlMaster=no" in options and f"ControlPath={tmp_path}/ssh/%C" in options  # never opens one itself
    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "0123abcd").write_text("")  # a master's socket
    assert list(started.all_runs()) == []
    ran: list[list[str]] = []

    def machine(cmd):
        ran.append(list(cmd))
        if "-O" in cmd:  # the master exits and removes its socket
            (tmp_path / "ssh" / "0123abcd").unlink()
        return Result(0, "", "")
    report = cleanup.clean(runner=machine)  # a killed head's master: ended, its folder removed
    assert ["-o", f"ControlPath={tmp_path}/ssh/0123abcd", "-O", "exit"] == ran[0][3:7]
    assert not (tmp_path / "ssh").exists() and "ended 1 shared ssh connections" in report
