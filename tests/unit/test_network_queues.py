"""Link queues and shapers (pure command building): control packets first, bounded FIFOs, small bursts, netem."""

from __future__ import annotations

from emulator import topology
from emulator.network import (
    HOST_CONTROL_PACKET_BYTES,
    SHAPER_BURST_BYTES,
    host_queue_commands,
    leaf_queue_command,
    queue_packets_for,
    root_interface_rates,
    root_interfaces,
    shaping_class_command,
    switch_port_queue_commands,
    tc_batch,
)


def test_host_queues_send_short_ip_packets_to_the_high_priority_class():
    cmds = host_queue_commands("efh1-eth0", 28)
    [flt] = [c for c in cmds if c[1] == "filter"]
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
    import platform

    from emulator.system import has_netem

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
    from emulator import topology
    from emulator.network import host_setup_commands, tcp_rto_min_ms

    assert tcp_rto_min_ms(20) == 200 + 360 and tcp_rto_min_ms(2.5) == 200 + 2880
    topo = topology.build("star:hosts=2,bw=5")
    route = [c for c in host_setup_commands(topo, "h1", "user") if c[:3] == ["ip", "route", "change"]]
    assert len(route) == 1 and route[0][-2:] == ["rto_min", f"{tcp_rto_min_ms(5)}ms"]
    assert topo.host("h1").ip in route[0]
