"""Link queues and shapers (pure command building): control packets first, bounded FIFOs, small bursts, netem.

Also host set-up commands, and reading the shaping back from ``tc class show``.
"""

from __future__ import annotations

import platform
import shlex
import subprocess

import pytest

from emulator.emulation.machine.system import has_netem
from emulator.emulation.network.host_commands import (
    failed_command,
    host_script,
    host_setup_commands,
    static_arp_batch,
    static_flow_files,
    tcp_rto_min_ms,
)
from emulator.emulation.network.tc_commands import (
    HOST_CONTROL_PACKET_BYTES,
    class_show_command,
    host_queue_commands,
    leaf_queue_command,
    parse_htb_rates,
    port_block_match,
    queue_packets_for,
    root_interface_rates,
    root_interfaces,
    shaping_class_command,
    shaping_tree_commands,
    switch_port_queue_commands,
    tc_batch,
)
from emulator.model import topology
from emulator.model.latency import SHAPER_BURST_BYTES
from emulator.model.routing import AGENT_LISTEN_PORT, AGENT_SOURCE_PORT_BASE
from emulator.runs.mpi_plan import BTL_PORT_MIN, BTL_PORT_RANGE

#: ``tc class show`` of a host NIC after bring-up's commands (20 Mbit/s), captured with iproute2 6.1
#: (whose ``tc -j class show`` prints exactly this text too).
HOST_CLASSES = ("class htb 5:1 root leaf 10: prio 0 rate 20Mbit ceil 20Mbit burst 100b cburst 100b \n"
                "class htb 10:1 root leaf 11: prio 0 rate 10Gbit ceil 10Gbit burst 1046250b cburst 1046250b \n"
                "class htb 10:2 root leaf 12: prio 1 rate 10Gbit ceil 10Gbit burst 1046250b cburst 1046250b \n")
#: Two shaping classes at 500 kbit/s and 1.5 Gbit/s, captured the same way.
OTHER_RATES = ("class htb 5:1 root prio 0 rate 500Kbit ceil 500Kbit burst 100b cburst 100b \n"
               "class htb 5:2 root prio 0 rate 1500Mbit ceil 1500Mbit burst 1500b cburst 1500b \n")


def test_host_queues_send_short_ip_packets_to_the_high_priority_class():
    cmds = host_queue_commands("efh1-eth0", 28)
    [flt] = [c for c in cmds if c[1] == "filter" and c[c.index("prio") + 1] == "2"]
    mask = int(flt[flt.index("u16") + 2], 16)
    assert HOST_CONTROL_PACKET_BYTES == 256 and mask == 0xFF00
    # a 52-byte ACK matches (length & mask == 0), a 32000-byte frame and a 256-byte packet do not
    assert 52 & mask == 0 and 32000 & mask != 0 and 256 & mask != 0
    assert flt[-1] == "10:1"
    classes = {c[c.index("classid") + 1]: c for c in cmds if c[1] == "class"}
    assert classes["10:1"][classes["10:1"].index("prio") + 1] == "0"
    assert classes["10:2"][classes["10:2"].index("prio") + 1] == "1"
    assert all(c[c.index("rate") + 1] == "10gbit" for c in classes.values())  # shaping stays Mininet's 5:1
    fifos = [c for c in cmds if "pfifo" in c]
    assert {c[c.index("parent") + 1] for c in fifos} == {"10:1", "10:2"}
    assert all(c[c.index("limit") + 1] == "28" for c in fifos)
    assert cmds[0][:2] == ["tc", "qdisc"] and cmds[0][cmds[0].index("parent") + 1] == "5:1"


def test_tc_batch_drops_the_program_name_one_line_per_command():
    text = tc_batch([leaf_queue_command("efs1-eth1", 10), leaf_queue_command("efs1-eth2", 20)])
    assert text == ("qdisc replace dev efs1-eth1 parent 5:1 handle 10: pfifo limit 10\n"
                    "qdisc replace dev efs1-eth2 parent 5:1 handle 10: pfifo limit 20\n")


def test_every_shaping_class_gets_a_small_burst_at_its_links_rate():
    cmd = shaping_class_command("efs1-eth3", 20.0)
    assert cmd[:4] == ["tc", "class", "change", "dev"] and cmd[cmd.index("classid") + 1] == "5:1"
    assert cmd[cmd.index("rate") + 1] == "20Mbit"
    assert cmd[cmd.index("burst") + 1] == cmd[cmd.index("cburst") + 1] == f"{SHAPER_BURST_BYTES}b"
    topo = topology.build("leafspine:leaves=2,spines=1,hosts_per_leaf=2,host_bw=20,switch_bw=40")
    rates = root_interface_rates(topo)
    assert sorted(rates) == sorted(root_interfaces(topo))
    assert rates["efs1-eth1"] == 20 and rates["efs1-eth3"] == 40 and rates["efs3-eth1"] == 40
    assert topo.host_link("h1").bw_mbps == 20


def test_the_shaping_tree_is_a_root_htb_sending_everything_to_its_one_class_which_the_queues_hang_under():
    qdisc, klass = shaping_tree_commands("efh1-eth0", 12.5)
    assert qdisc == ["tc", "qdisc", "replace", "dev", "efh1-eth0", "root", "handle", "5:", "htb", "default", "1"]
    assert klass[:4] == ["tc", "class", "replace", "dev"] and klass[klass.index("parent") + 1] == "5:"
    assert klass[klass.index("classid") + 1] == "5:1" and klass[klass.index("rate") + 1] == "12.5Mbit"
    # the class the in-place change and every queue refer to
    change = shaping_class_command("efh1-eth0", 12.5)
    assert change[change.index("classid") + 1] == "5:1" and change[change.index("rate") + 1] == "12.5Mbit"
    assert all(cmd[cmd.index("parent") + 1] in ("5:1", "10:", "10:1", "10:2") for cmd in host_queue_commands("x", 9))
    text = tc_batch([*shaping_tree_commands("efh1-eth0", 20), *host_queue_commands("efh1-eth0", 9)])
    assert text.splitlines()[0].startswith("qdisc replace dev efh1-eth0 root handle 5:")


def test_switch_ports_hold_packets_for_the_switch_latency_where_netem_exists():
    topo = topology.build("star:hosts=2")
    plain = switch_port_queue_commands(topo, 9000)
    assert all("pfifo" in c and "netem" not in c for c in plain)
    delayed = switch_port_queue_commands(topo, 9000, delay_s=0.005)
    assert len(delayed) == len(root_interfaces(topo))
    for cmd in delayed:
        assert cmd[cmd.index("netem") + 1:cmd.index("netem") + 3] == ["delay", "5000us"]
        assert cmd[cmd.index("limit") + 1] == str(queue_packets_for(9000))


def test_netem_is_found_from_files_alone(tmp_path):
    sysmod, mods = tmp_path / "sys", tmp_path / "lib"
    sysmod.mkdir()
    assert not has_netem(str(sysmod), str(mods))
    sched = mods / platform.release() / "kernel" / "net" / "sched"
    sched.mkdir(parents=True)
    (sched / "sch_netem.ko.xz").write_text("")
    assert has_netem(str(sysmod), str(mods))
    (sched / "sch_netem.ko.xz").unlink()
    (mods / platform.release() / "modules.builtin").write_text("kernel/net/sched/sch_netem.ko\n")
    assert has_netem(str(sysmod), str(mods))
    (mods / platform.release() / "modules.builtin").write_text("")
    (sysmod / "sch_netem").mkdir()
    assert has_netem(str(sysmod), str(mods))


def test_hosts_get_an_rto_minimum_that_covers_a_full_queue_at_their_link_rate():
    assert tcp_rto_min_ms(20) == 200 + 360 and tcp_rto_min_ms(2.5) == 200 + 2880
    topo = topology.build("star:hosts=2,bw=5")
    route = [c for c in host_setup_commands(topo, "h1", "user") if c[:3] == ["ip", "route", "change"]]
    assert len(route) == 1 and route[0][-2:] == ["rto_min", f"{tcp_rto_min_ms(5)}ms"]
    assert topo.host("h1").ip in route[0]


def test_host_setup_turns_tx_offload_off_only_on_the_userspace_datapath():
    topo = topology.build("star:hosts=2,bw=5")
    user, kernel = host_setup_commands(topo, "h1", "user", mtu=9000), host_setup_commands(topo, "h1", "kernel")
    assert ["ethtool", "-K", "efh1-eth0", "tx", "off"] in user
    assert not [c for c in kernel if c[0] == "ethtool"]
    assert user[0] == ["ip", "link", "set", "dev", "efh1-eth0", "mtu", "9000"]


def test_hosts_hand_their_queue_one_frame_per_packet_on_either_datapath():
    topo = topology.build("star:hosts=2,bw=5")
    for datapath in ("user", "kernel"):
        assert ["ip", "link", "set", "dev", "efh1-eth0", "gso_max_segs", "1"] in host_setup_commands(topo, "h1",
                                                                                                     datapath)


def test_static_arp_names_every_other_host_and_flows_go_to_our_bridges():
    topo = topology.build("star:hosts=3")
    arp = static_arp_batch(topo, "h1").splitlines()
    assert len(arp) == 2 and all(line.endswith("dev efh1-eth0 nud permanent") for line in arp)
    assert topo.host("h1").ip not in " ".join(arp)
    files = static_flow_files(topo, "shortest")
    assert set(files) == {"efs1"} and files["efs1"].endswith("\n")


def test_shaping_rates_are_read_back_from_tc_class_show():
    assert parse_htb_rates(HOST_CLASSES) == [20.0]  # a host's priority classes (10:) never limit
    assert parse_htb_rates(OTHER_RATES) == [0.5, 1500.0]
    assert parse_htb_rates("") == [] and parse_htb_rates("Cannot find device \"efh9-eth0\"\n") == []
    assert class_show_command("efs1-eth1") == ["tc", "class", "show", "dev", "efs1-eth1"]
    assert class_show_command("efh1-eth0", 42)[:3] == ["mnexec", "-a", "42"]


def test_a_host_script_runs_its_commands_in_one_shell_and_stops_at_the_first_failure_naming_it():
    argv = host_script([["echo", "one two"], ["sh", "-c", "echo oops >&2; exit 3"], ["echo", "never"]])
    # as the host's shell runs it (EmulatedNetwork._host_run): quoted, with the status echoed after it
    res = subprocess.run(["bash", "-c", shlex.join(argv) + "; echo __rc=$?"], capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert "one two" in out and "never" not in out and "__rc=3" in out
    assert failed_command(out) == "sh -c 'echo oops >&2; exit 3'"
    ok = subprocess.run(["bash", "-c", shlex.join(host_script([["true"], ["echo", "a b"]])) + "; echo __rc=$?"],
                        capture_output=True, text=True)
    assert "__rc=0" in ok.stdout
    assert failed_command("no trace here") == "?"


def _u32_matches(flt: list[str]) -> list[tuple[int, int, int, int]]:
    """(width in bits, value, mask, offset) of every ``match`` of a ``u32`` filter command."""
    out = []
    for i, word in enumerate(flt):
        if word == "match":
            width = {"u8": 8, "u16": 16, "u32": 32}[flt[i + 1]]
            out.append((width, int(flt[i + 2], 0), int(flt[i + 3], 0), int(flt[i + 5])))
    return out


def _packet_class(cmds: list[list[str]], packet: bytes) -> str:
    """The class the host queue's filters put ``packet`` (an IP packet) in: the lowest ``prio`` whose matches all
    hold, else the qdisc's default (10:2)."""
    filters = sorted((c for c in cmds if c[1] == "filter"), key=lambda c: int(c[c.index("prio") + 1]))
    for flt in filters:
        if all(int.from_bytes(packet[off:off + width // 8], "big") & mask == value & mask
               for width, value, mask, off in _u32_matches(flt)):
            return flt[flt.index("flowid") + 1]
    return "10:2"


def _tcp_packet(sport: int, dport: int, payload: int) -> bytes:
    """A TCP/IPv4 packet without options: total length, protocol and ports where the filters look."""
    total = 20 + 32 + payload
    ip = bytes([0x45, 0]) + total.to_bytes(2, "big") + bytes(5) + bytes([6]) + bytes(10)
    return ip + sport.to_bytes(2, "big") + dport.to_bytes(2, "big") + bytes(28) + bytes(payload)


@pytest.mark.parametrize("sport,dport", [(BTL_PORT_MIN, 40000), (45678, BTL_PORT_MIN + BTL_PORT_RANGE - 1),
                                         (BTL_PORT_MIN + 7, BTL_PORT_MIN + 300)])
def test_an_open_mpi_connections_acks_stay_behind_its_own_data(sport, dport):
    # one connection carries both directions of a pair's messages: its ACKs must not overtake its data frames
    cmds = host_queue_commands("efh1-eth0", 28)
    assert _packet_class(cmds, _tcp_packet(sport, dport, 0)) == "10:2"
    assert _packet_class(cmds, _tcp_packet(sport, dport, 8948)) == "10:2"


@pytest.mark.parametrize("sport,dport", [(20000 + 5, AGENT_LISTEN_PORT), (AGENT_LISTEN_PORT, 32767),
                                         (BTL_PORT_MIN - 1, 40000), (40000, BTL_PORT_MIN + BTL_PORT_RANGE)])
def test_other_connections_acks_still_leave_before_queued_data(sport, dport):
    cmds = host_queue_commands("efh1-eth0", 28)
    assert _packet_class(cmds, _tcp_packet(sport, dport, 0)) == "10:1"
    assert _packet_class(cmds, _tcp_packet(sport, dport, 8948)) == "10:2"


def test_open_mpis_ports_are_one_aligned_block_below_the_ephemeral_ones_and_the_agents():
    assert port_block_match(BTL_PORT_MIN, BTL_PORT_RANGE) == (BTL_PORT_MIN, 0xFFFF & ~(BTL_PORT_RANGE - 1))
    assert BTL_PORT_MIN + BTL_PORT_RANGE <= min(AGENT_SOURCE_PORT_BASE, 32768)
    assert not BTL_PORT_MIN <= AGENT_LISTEN_PORT < BTL_PORT_MIN + BTL_PORT_RANGE
    for first, count in [(20000, 1000), (16384, 1000), (16000, 1024), (0, 0)]:
        with pytest.raises(ValueError, match="aligned power-of-two block"):
            port_block_match(first, count)
