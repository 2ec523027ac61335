"""Tearing a network down ends every shell Mininet started, the controller node's too (no root needed)."""

from __future__ import annotations

from emulator.emulation.network.emulated_network import CONTROLLER_PROBE_S, EmulatedNetwork, warn_unless_listening
from emulator.model import topology


class FakeNode:
    def __init__(self, name: str, fails: bool = False):
        self.name, self.fails, self.terminated = name, fails, False

    def terminate(self) -> None:
        self.terminated = True
        if self.fails:
            raise OSError("pty already closed")


class FakeMininet:
    def __init__(self, controllers: list[FakeNode]):
        self.controllers = controllers
        self.stopped = False

    def stop(self) -> None:  # Mininet.stop calls RemoteController.stop, which does nothing
        self.stopped = True


def test_stop_terminates_every_controller_node_shell_even_when_one_fails():
    en = EmulatedNetwork(topology.build("star:hosts=2"))
    nodes = [FakeNode("c0", fails=True), FakeNode("c1")]
    en.net = FakeMininet(nodes)
    en.stop()
    assert all(n.terminated for n in nodes) and en.net is None
    en.stop()  # twice is safe


def test_the_controller_probe_connects_and_reads_nothing():
    """Mininet's telnet probe read the controller's OpenFlow hello as text and failed; ours opens and closes."""
    opened: list[tuple[tuple[str, int], float]] = []

    class Sock:
        closed = False

        def close(self) -> None:
            Sock.closed = True

    def connect(address: tuple[str, int], timeout: float) -> Sock:
        opened.append((address, timeout))
        return Sock()

    def refused(address: tuple[str, int], timeout: float) -> Sock:
        raise ConnectionRefusedError("refused")

    assert warn_unless_listening("127.0.0.1", 6653, connect) and Sock.closed
    assert opened == [(("127.0.0.1", 6653), CONTROLLER_PROBE_S)]
    assert not warn_unless_listening("127.0.0.1", 6653, refused)
