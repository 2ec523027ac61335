"""Which of ovs-vswitchd's sockets get larger buffers: read from /proc/net/packet rows (no root, no daemon)."""

from __future__ import annotations

from emulator.emulation.network.ovs_sockets import interface_indexes, packet_sockets, socket_kind

#: /proc/net/packet: the datapath's send socket (protocol 0, no interface) and receive sockets per port.
PROC_NET_PACKET = """\
sk               RefCnt Type Proto  Iface R Rmem   User   Inode
0000000000000000 3      3    0000   0     0 0      0      1001
0000000000000000 3      3    0003   7     1 0      0      1002
0000000000000000 3      3    0003   9     1 0      0      1003
"""


def test_packet_sockets_are_read_by_inode(tmp_path):
    path = tmp_path / "packet"
    path.write_text(PROC_NET_PACKET)
    assert packet_sockets(str(path)) == {1001: (0, 0), 1002: (3, 7), 1003: (3, 9)}


def test_the_send_socket_and_our_ports_receive_sockets_are_chosen():
    ours = {7: "efs1-eth1"}
    assert socket_kind(0, 0, ours) == "send"
    assert socket_kind(3, 7, ours) == "receive"
    assert socket_kind(3, 9, ours) is None  # somebody else's interface


def test_interface_indexes_skip_interfaces_that_do_not_exist(tmp_path):
    (tmp_path / "efs1-eth1").mkdir()
    (tmp_path / "efs1-eth1" / "ifindex").write_text("7\n")
    assert interface_indexes(["efs1-eth1", "efs1-eth2"], str(tmp_path)) == {7: "efs1-eth1"}
