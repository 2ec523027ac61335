"""Host NIC queues (pure command building): control packets first, data frames in a bounded FIFO."""

from __future__ import annotations

from emulator.network import HOST_CONTROL_PACKET_BYTES, host_queue_commands, leaf_queue_command, tc_batch


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
