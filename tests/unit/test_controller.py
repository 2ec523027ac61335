"""The controller's pure core, its settings, the launcher's checks and the pingall helpers (no root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_routing import FakeFlowTable, reverse

from controllers.core import ControllerCore, Settings, parse_listen
from emulator.base.errors import UserError
from emulator.cli.commands.controller import PingResult, parse_ping_output, ping_script
from emulator.cli.main import main
from emulator.emulation.network.controller_process import controller_command, listening, proc_net_address
from emulator.model import routing, topology
from emulator.model.routing import Flow

FATTREE = "fattree:k=4"
BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeSwitches:
    """Applies the core's decisions to per-switch tables, as the app does to real switches."""

    def __init__(self, core: ControllerCore):
        self.core = core
        self.tables: dict[str, dict[tuple, routing.FlowEntry]] = {}

    def connect_all(self) -> None:
        for sw in self.core.topo.switches:
            self.tables[sw.name] = {e.key(): e for e in self.core.connect(sw.name)}

    def apply(self, update) -> None:
        for sw in update.clear_learned:  # OFPFC_DELETE by cookie, before the adds
            for key in [k for k, e in self.tables[sw].items() if e.cookie == routing.LEARNED_COOKIE]:
                del self.tables[sw][key]
        for sw, entries in update.adds.items():
            for e in entries:
                self.tables[sw][e.key()] = e
        for sw, entries in update.deletes.items():
            for e in entries:
                del self.tables[sw][e.key()]

    def packet_in(self, switch: str, pkt: dict[str, object]) -> int | None:
        """What the app does with a TCP packet-in: the core's entries to every switch, the packet on."""
        learned = self.core.tcp_packet_in(switch, str(pkt["ipv4_src"]), str(pkt["ipv4_dst"]),
                                          int(pkt["tcp_src"]), int(pkt["tcp_dst"]))  # type: ignore[call-overload]
        if learned is None:
            return None
        for sw, entries in learned.entries.items():
            for e in entries:
                self.tables[sw][e.key()] = e
        return learned.out_port

    def learned(self) -> list[routing.FlowEntry]:
        return [e for t in self.tables.values() for e in t.values() if e.cookie == routing.LEARNED_COOKIE]

    def fake(self) -> FakeFlowTable:
        """A fake switch fabric over these very tables (learned entries show in both)."""
        return FakeFlowTable(self.core.topo, self.tables, self.packet_in)


@pytest.mark.parametrize("spec,policy", [(FATTREE, "ecmp"), (BIGRAPH, "bigraph"), (FATTREE, "dmodk")])
def test_port_down_reroutes_exactly_like_route(spec, policy):
    topo = topology.load(spec)
    core = ControllerCore(topo, policy, seed=4)
    sw = FakeSwitches(core)
    sw.connect_all()
    flow = routing.agent_flow(topo, "h1", topo.hosts[-1].name)
    a, b = routing.switch_links_of(routing.route(topo, policy, flow, seed=4))[0]
    update = core.port_state(a, topo.port_to(a, b), up=False)
    assert update is not None and update.size() > 0 and update.newly_cut == []
    assert update.failed_links == [tuple(sorted((a, b), key=topology.node_sort_key))]
    sw.apply(update)
    dead = [frozenset((a, b))]
    fake = sw.fake()
    for src, dst in topology.all_host_pairs(topo):
        for f in (Flow(src, dst, routing.IPPROTO_ICMP), routing.agent_flow(topo, src, dst)):
            assert fake.trace(f) == routing.route(topo, policy, f, seed=4, failed=dead)
    # The other end going down too changes nothing more; both coming back restores the original table.
    assert core.port_state(b, topo.port_to(b, a), up=False) is None
    assert core.port_state(a, topo.port_to(a, b), up=True) is None  # still down at b
    sw.apply(core.port_state(b, topo.port_to(b, a), up=True))
    assert sw.tables == {s: {e.key(): e for e in es}
                         for s, es in routing.flow_table(topo, policy, seed=4, reactive=True).items()}


def test_every_tcp_connection_is_learned_along_route_and_relearned_after_a_reroute():
    topo = topology.load(FATTREE)
    core = ControllerCore(topo, "ecmp", seed=4, lanes=2)
    sw = FakeSwitches(core)
    sw.connect_all()
    fake = sw.fake()
    pairs = list(topology.all_host_pairs(topo))[::5]
    conns = [Flow(s, d, routing.IPPROTO_TCP, 40000 + i, 5201) for i, (s, d) in enumerate(pairs)]
    agents = [f for s, d in pairs for f in routing.exact_flows(topo, s, d, lanes=2)]
    for f in agents:  # proactive: never at the controller
        assert fake.trace(f) == routing.route(topo, "ecmp", f, seed=4)
    assert fake.packet_ins == [] and core.status()["learned_connections"] == 0
    for f in conns:
        assert fake.trace(f) == routing.route(topo, "ecmp", f, seed=4)
        assert fake.trace(reverse(f)) == routing.route(topo, "ecmp", reverse(f), seed=4)
    crossing = [f for f in conns if topo.switch_hops(f.src, f.dst) > 1]  # a choice point on the way
    assert len(fake.packet_ins) == core.status()["learned_connections"] == core.learned_total == len(crossing)
    assert len(sw.learned()) == sum(len(routing.learned_entries(topo, "ecmp", g, seed=4))
                                    for f in crossing for g in (f, reverse(f)))
    # A packet-in again (a race with the flow-mods, a downstream switch, an expired entry): the same answer.
    f = crossing[0]
    path = routing.route(topo, "ecmp", f, seed=4)
    first = core.tcp_packet_in(path[1], topo.host(f.src).ip, topo.host(f.dst).ip, f.sport, f.dport)
    again = core.tcp_packet_in(path[2], topo.host(f.src).ip, topo.host(f.dst).ip, f.sport, f.dport)
    assert first is not None and again is not None and not first.new and not again.new
    assert first.connection == min((f.src, f.dst, f.sport, f.dport), (f.dst, f.src, f.dport, f.sport))
    assert again.entries == first.entries and again.out_port == topo.port_to(path[2], path[3])
    # The farthest downstream switch of the forward direction gets its entries first.
    assert list(first.entries)[0] == routing.learned_entries(topo, "ecmp", f, seed=4)[-1].switch
    # A reroute deletes every learned entry and the core forgets them; packets re-learn the new paths.
    a, b = routing.switch_links_of(path)[0]
    update = core.port_state(a, topo.port_to(a, b), up=False)
    assert update is not None and update.clear_learned == sorted(sw.tables, key=topology.node_sort_key)
    assert core.status()["learned_connections"] == 0
    sw.apply(update)
    assert sw.learned() == []
    dead = [frozenset((a, b))]
    for g in conns:
        assert fake.trace(g) == routing.route(topo, "ecmp", g, seed=4, failed=dead)
    # (Fewer choices are left around the dead link: connections without one are not learned.)
    relearned = [g for g in conns if any(routing.learned_entries(topo, "ecmp", x, seed=4, failed=dead)
                                         for x in (g, reverse(g)))]
    assert 0 < len(relearned) < len(crossing) and sw.learned()
    assert core.status()["learned_connections"] == len(relearned)
    assert core.learned_total == len(crossing) + len(relearned)


def test_tcp_packet_in_that_learns_nothing():
    topo = topology.load(FATTREE)
    core = ControllerCore(topo, "ecmp", seed=1)
    h1, h16 = topo.host("h1").ip, topo.host("h16").ip
    assert core.tcp_packet_in("s1", "10.9.9.9", h16, 40000, 80) is None  # no host has that address
    assert core.tcp_packet_in("s1", h1, "192.168.0.1", 40000, 80) is None
    assert core.tcp_packet_in("s1", h1, h1, 40000, 80) is None
    assert ControllerCore(topo, "dmodk").tcp_packet_in("s1", h1, h16, 40000, 80) is None  # no miss entries there
    core.port_state("s1", topo.host("h1").switch_port, up=False)  # h1 cut off
    assert core.tcp_packet_in("s1", h1, h16, 40000, 80) is None
    assert core.tcp_packet_in("s1", h16, h1, 80, 40000) is None
    assert core.status()["learned_connections"] == 0


def test_cut_off_pairs_are_reported_and_restored():
    topo = topology.load(FATTREE)
    core = ControllerCore(topo, "shortest")
    core.connect("s1")
    update = core.port_state("s1", topo.host("h1").switch_port, up=False)
    assert len(update.newly_cut) == 30 and ("h1", "h2") in update.newly_cut
    assert core.status()["cut_pairs"][0] == ["h1", "h2"]
    update = core.port_state("s1", topo.host("h1").switch_port, up=True)
    assert len(update.restored) == 30 and core.status()["cut_pairs"] == []
    # Only connected switches get updates; the others get the new table on connect.
    assert set(update.adds) | set(update.deletes) <= {"s1"}


def test_ports_without_links_are_ignored():
    core = ControllerCore(topology.load(FATTREE), "ecmp")
    assert core.port_state("s1", 0xFFFFFFFE, up=False) is None
    assert core.port_states("s1", {1: True, 2: True, 99: False}) is None


def test_reconnect_gets_the_current_table():
    topo = topology.load(FATTREE)
    core = ControllerCore(topo, "ecmp", seed=2)
    first = core.connect("s1")
    core.confirm("s1")
    assert core.status()["installed"] == ["s1"]
    core.disconnect("s1")
    assert core.status()["connected"] == []
    port = topo.port_to("s1", "s9")
    update = core.port_state("s1", port, up=False)
    assert update is not None and update.failed_links == [("s1", "s9")]
    assert update.adds == {} and update.deletes == {}  # nothing is sent to a switch that is not connected
    again = core.connect("s1")
    # On reconnect: exactly the table routing computes around the dead link, and none of it out of that port.
    rerouted = routing.flow_table(topo, "ecmp", seed=2, failed=[frozenset(("s1", "s9"))], reactive=True)["s1"]
    assert again == rerouted and again != first
    assert port in {e.out_port for e in first} and port not in {e.out_port for e in again}
    assert core.status()["connected"] == ["s1"] and core.status()["installed"] == []  # until its barrier reply


def test_stats_records_are_per_directed_link():
    topo = topology.load(FATTREE)
    core = ControllerCore(topo, "ecmp")
    port = topo.port_to("s1", "s9")
    counters = [{"port_no": port, "rx_packets": 1, "tx_packets": 2, "rx_bytes": 100, "tx_bytes": 200,
                 "rx_dropped": 0, "tx_dropped": 3, "rx_errors": 0, "tx_errors": 0},
                {"port_no": 0xFFFFFFFE, "rx_packets": 0, "tx_packets": 0, "rx_bytes": 0, "tx_bytes": 0,
                 "rx_dropped": 0, "tx_dropped": 0, "rx_errors": 0, "tx_errors": 0}]
    (rec,) = core.stats_records("s1", counters, 12.5)
    assert rec["link"] == "s1->s9" and rec["from"] == "s1" and rec["to"] == "s9" and rec["kind"] == "switch"
    assert (rec["bytes"], rec["packets"], rec["drops"], rec["rx_bytes"]) == (200, 2, 3, 100)
    json.dumps(rec)


def test_sharing_report_names_links_and_flows():
    core = ControllerCore(topology.load("leafspine:leaves=4,spines=2,hosts_per_leaf=4"), "ecmp", seed=1)
    lines = core.sharing_report()
    assert lines and all(line.startswith("link s") and "agent flows: h" in line for line in lines)


def test_settings_check_and_environment():
    s = Settings(topology=FATTREE, routing="ecmp", seed=3, stats_file="/tmp/x", stats_interval=0.5)
    assert s.check().kind == "fattree"
    assert Settings.from_env(s.to_env()) == s
    for bad in (Settings(topology=FATTREE, routing="bigraph"), Settings(topology=FATTREE, routing="ecmp", seed=-1),
                Settings(topology=FATTREE, routing="ecmp", stats_interval=0), Settings(topology="ring:n=3")):
        with pytest.raises(UserError):
            bad.check()
    with pytest.raises(UserError):
        Settings.from_env({})
    assert parse_listen("127.0.0.1:6653") == ("127.0.0.1", 6653)
    for text in ("localhost:6653", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", "1.2.3:4"):
        with pytest.raises(UserError):
            parse_listen(text)


def test_controller_command_line():
    s = Settings(topology=FATTREE, routing="ecmp", seed=3, stats_file="/tmp/st.jsonl", listen=("127.0.0.1", 7777))
    cmd = controller_command(s, "/tmp/state.json", python="py")
    assert cmd[:4] == ["py", "-m", "emulator", "controller"]
    assert cmd[cmd.index("--listen") + 1] == "127.0.0.1:7777" and cmd[cmd.index("--ecmp-seed") + 1] == "3"
    assert cmd[cmd.index("--stats-file") + 1] == "/tmp/st.jsonl"


def test_listening_reads_proc_net_tcp(tmp_path):
    table = tmp_path / "tcp"
    assert (proc_net_address("127.0.0.1"), proc_net_address("10.0.0.1")) == ("0100007F", "0100000A")
    # As the kernel writes them: IPv4 in little-endian byte order, the port in hex; state 0A is LISTEN.
    table.write_text("  sl  local_address rem_address   st\n"
                     "   0: 0100007F:19FD 00000000:0000 0A 0 0\n"  # 127.0.0.1:6653
                     "   1: 00000000:1A0B 00000000:0000 01 0 0\n"  # 0.0.0.0:6667, established
                     "   2: 0100000A:1A0C 00000000:0000 0A 0 0\n"  # 10.0.0.1:6668
                     "   3: 00000000:1A0D 00000000:0000 0A 0 0\n")  # 0.0.0.0:6669
    assert listening("127.0.0.1", 6653, str(table)) and not listening("10.0.0.1", 6653, str(table))
    assert not listening("127.0.0.1", 6667, str(table))  # not listening (state 01)
    assert not listening("127.0.0.1", 6654, str(table))
    assert listening("10.0.0.1", 6668, str(table)) and not listening("127.0.0.1", 6668, str(table))
    assert listening("127.0.0.1", 6669, str(table)) and listening("10.0.0.1", 6669, str(table))  # any address
    assert not listening("127.0.0.1", 6653, str(tmp_path / "missing"))


@pytest.mark.parametrize("argv", [
    ["controller", "--topology", "fattree:k=3", "--routing", "ecmp"],
    ["controller", "--topology", "/nonexistent/topo.json", "--routing", "ecmp"],
    ["controller", "--topology", FATTREE, "--routing", "bigraph"],
    ["controller", "--topology", FATTREE, "--routing", "nope"],
    ["controller", "--topology", FATTREE, "--routing", "ecmp", "--listen", "0.0.0.0"],
    ["controller", "--topology", FATTREE, "--routing", "ecmp", "--stats-file", "/nonexistent/dir/s.jsonl"],
    ["pingall", FATTREE, "--routing", "bigraph"],
    ["pingall", "star:hosts=0", "--routing", "ecmp"],
])
def test_bad_input_is_one_line_and_status_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("emu: ")


def test_bad_input_from_a_real_process():
    res = subprocess.run([sys.executable, "-m", "emulator", "controller", "--topology", FATTREE, "--routing", "x"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "field 'policy'" in res.stderr


def test_ping_script_and_parser():
    topo = topology.load("star:hosts=3")
    script = ping_script(topo, "h1")
    assert "10.0.0.2 10.0.0.3;" in script and "10.0.0.1 " not in script and script.endswith("wait")
    assert parse_ping_output(topo, "h1", "ok 10.0.0.3\nlost 10.0.0.2\n") == {"h2": False, "h3": True}
    assert parse_ping_output(topo, "h1", "ok 10.0.0.3\n") == {"h2": False, "h3": True}
    result = PingResult(pairs=4, lost=[("h1", "h2")])
    assert result.to_json() == {"pairs": 4, "lost": 1, "loss": 0.25, "lost_pairs": [["h1", "h2"]]}


def test_app_module_imports_without_a_running_controller():
    code = "import controllers.eflops_controller as m; print(m.EflopsController.OFP_VERSIONS)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[4]"


def test_busy_listen_address_is_refused_before_starting(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["controller", "--topology", FATTREE, "--routing", "ecmp", "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'listen'" in err and "in use" in err
