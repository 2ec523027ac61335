"""Packet captures of chosen links of a live network with tcpdump (``emu replay --pcap``): which links a user
names, which interface sees both directions of one, and starting and stopping the captures. What is in them is
read by ``emu analyze`` (:mod:`emulator.selfcheck.capture_analysis`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from emulator.base.errors import UserError
from emulator.base.naming import switch_intf
from emulator.model.topology import Topology


def parse_link_name(topo: Topology, name: str) -> tuple[str, str]:
    """``"s1-s5"`` or ``"h3-s2"`` -> the two model node names of an existing link."""
    parts = name.split("-")
    if len(parts) != 2 or topo.link_between(parts[0], parts[1]) is None:
        raise UserError(f"pcap: field 'link': expected a link of {topo.spec} written A-B (e.g. "
                        f"{topo.links[-1].a}-{topo.links[-1].b}), got {name!r}")
    return parts[0], parts[1]


def capture_interface(topo: Topology, a: str, b: str) -> str:
    """The root-namespace interface that sees both directions of link a-b (a switch end)."""
    link = topo.link_between(a, b)
    assert link is not None
    switch = link.b if link.kind == "host" else link.a
    return switch_intf(switch, link.port_of(switch))


def tcpdump_command(intf: str, path: str, snaplen: int = 96) -> list[str]:
    return ["tcpdump", "-i", intf, "-s", str(snaplen), "-w", path, "-U", "--immediate-mode", "tcp"]


def start_capture(en: Any, topo: Topology, link: str, out: str) -> subprocess.Popen:
    a, b = parse_link_name(topo, link)
    os.makedirs(os.path.join(out, "pcap"), exist_ok=True)
    path = os.path.join(out, "pcap", f"{a}-{b}.pcap")
    proc = subprocess.Popen(tcpdump_command(capture_interface(topo, a, b), path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    if en.state is not None:
        en.state.record_process("tcpdump", proc.pid, link=f"{a}-{b}")
    time.sleep(0.3)  # tcpdump needs a moment before it sees packets
    return proc


def stop_captures(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2)
