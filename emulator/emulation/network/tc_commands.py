"""Link shaping and queues as ``tc`` command lines, and reading the shaping back.

Pure functions: they build argument lists (and ``tc -batch`` text) from a
topology model; :class:`emulator.emulation.network.emulated_network.EmulatedNetwork` runs them at
bring-up, :mod:`emulator.selfcheck.live.calibration` when it reshapes links in place.

Every link end carries the tree Mininet's ``TCLink`` builds, made here in one
``tc -batch`` per namespace (:func:`shaping_tree_commands`; ``TCLink`` ran
four ``tc`` processes per link end through a shell, and again after Open
vSwitch took the ports: 6.1 of a fat-tree k=4's 8.8 s of bring-up): a root
HTB (handle ``5:``) with one shaping class ``5:1`` at the link's rate
(:func:`shaping_class_command` changes it in place). Under that class:

* a switch port (root-namespace link end) has one FIFO, :func:`queue_limits`
  frames deep, optionally netem's to hold every packet a switch latency
  (:func:`switch_port_queue_commands`);
* a host NIC has a second, never-limiting HTB that sends short control
  packets ahead of queued data (:func:`host_queue_commands`).

Reading back: :func:`class_show_command` and :func:`parse_htb_rates`.
"""

from __future__ import annotations

from collections.abc import Iterable

from emulator.base.naming import switch_intf, switch_of_intf
from emulator.model.latency import SHAPER_BURST_BYTES
from emulator.model.topology import Topology
from emulator.runs.mpi_plan import BTL_PORT_MIN, BTL_PORT_RANGE

#: Bytes a switch port queues before it drops (the HTB leaf's pfifo limit is
#: this in whole frames, at least 16): about 0.7 s at 10 Mbit/s.
DEFAULT_QUEUE_BYTES = 900_000

#: PCIe is lossless (credit-based flow control): where accelerators of a
#: server converge on a shared NIC nothing is dropped, the senders wait. The
#: PCIe switch's ports approximate that with queues deeper than anything TCP
#: keeps in flight (a flow holds at most one message here).
PCIE_QUEUE_BYTES = 64 << 20

#: IP packets shorter than this (ACKs, the agents' clear-to-send messages)
#: leave a host before its queued data frames. A power of two: the filter
#: matches the IP total length's high bits.
HOST_CONTROL_PACKET_BYTES = 256

#: TCP ports whose connections keep their packets in order in a host's queue
#: (first port, how many): Open MPI's transport, whose one connection per pair
#: of ranks carries both directions' messages (:func:`host_queue_commands`).
IN_ORDER_PORTS = (BTL_PORT_MIN, BTL_PORT_RANGE)


def root_interface_rates(topo: Topology) -> dict[str, float]:
    """Every link end in the root namespace with its link's rate in Mbit/s.

    The root namespace holds the switch side of every link: one end of a host
    link, both ends of a switch or NIC link.
    """
    rates = {switch_intf(lk.b, lk.b_port): lk.bw_mbps for lk in topo.links}
    rates.update((switch_intf(lk.a, lk.a_port), lk.bw_mbps) for lk in topo.links if lk.kind != "host")
    return rates


def root_interfaces(topo: Topology) -> list[str]:
    """The names of :func:`root_interface_rates`, in the same order."""
    return list(root_interface_rates(topo))


def shaping_tree_commands(intf: str, rate_mbps: float) -> list[list[str]]:
    """The root HTB ``5:`` of ``intf`` (unclassified traffic to ``5:1``) and its shaping class ``5:1`` at ``rate_mbps``."""
    burst = f"{SHAPER_BURST_BYTES}b"
    return [["tc", "qdisc", "replace", "dev", intf, "root", "handle", "5:", "htb", "default", "1"],
            ["tc", "class", "replace", "dev", intf, "parent", "5:", "classid", "5:1", "htb", "rate",
             f"{rate_mbps:g}Mbit", "burst", burst, "cburst", burst]]


def shaping_class_command(intf: str, rate_mbps: float) -> list[str]:
    """Change the shaping class 5:1 of ``intf`` (:func:`shaping_tree_commands`) to ``rate_mbps``, burst
    :data:`SHAPER_BURST_BYTES`."""
    burst = f"{SHAPER_BURST_BYTES}b"
    return ["tc", "class", "change", "dev", intf, "parent", "5:0", "classid", "5:1", "htb", "rate",
            f"{rate_mbps:g}Mbit", "burst", burst, "cburst", burst]


def queue_packets_for(mtu: int, queue_bytes: int = DEFAULT_QUEUE_BYTES) -> int:
    """``queue_bytes`` in whole frames of ``mtu`` bytes, at least 16."""
    return max(16, queue_bytes // mtu)


def queue_limits(topo: Topology, mtu: int, queue_packets: int | None = None) -> dict[str, int]:
    """The pfifo limit (frames) of every root-namespace link end: PCIe switch ports deep, the others ``queue_packets``."""
    default = queue_packets or queue_packets_for(mtu)
    pcie = queue_packets_for(mtu, PCIE_QUEUE_BYTES)
    return {name: pcie if topo.is_pcie_switch(switch_of_intf(name)) else default for name in root_interfaces(topo)}


def leaf_queue_command(intf: str, packets: int, parent: str = "5:1", handle: str = "10:",
                       delay_s: float = 0.0) -> list[str]:
    """Bound the queue under an HTB class (default the shaping class 5:1): a plain FIFO of ``packets``.

    With ``delay_s`` the FIFO is netem's, holding every packet that long
    (a switch's forwarding latency, where the kernel has netem).
    """
    cmd = ["tc", "qdisc", "replace", "dev", intf, "parent", parent, "handle", handle]
    if delay_s > 0:
        return [*cmd, "netem", "delay", f"{delay_s * 1e6:.0f}us", "limit", str(packets)]
    return [*cmd, "pfifo", "limit", str(packets)]


def switch_port_queue_commands(topo: Topology, mtu: int, queue_packets: int | None = None,
                               delay_s: float = 0.0) -> list[list[str]]:
    """The queue of every switch port (root-namespace link end): :func:`queue_limits` frames, ``delay_s`` each.

    A packet crossing ``s`` switches leaves ``s`` switch ports, so it is held
    ``s · delay_s`` in all: the switch latency of a fabric profile.
    """
    limits = queue_limits(topo, mtu, queue_packets)
    return [leaf_queue_command(name, limits[name], delay_s=delay_s) for name in root_interfaces(topo)]


def port_block_match(first: int, count: int) -> tuple[int, int]:
    """The (value, mask) of a 16-bit match of the ports ``first`` .. ``first + count - 1``.

    :class:`ValueError` unless they are an aligned power-of-two block (one mask cannot match another range).
    """
    if count <= 0 or count & (count - 1) or first % count or not 0 < first + count <= 1 << 16:
        raise ValueError(f"ports {first}..{first + count - 1} are not an aligned power-of-two block")
    return first, 0xFFFF & ~(count - 1)


def host_queue_commands(intf: str, packets: int) -> list[list[str]]:
    """A host NIC's queue under the shaping class 5:1: control packets first, then data frames (FIFO of ``packets``).

    A NIC serves its transmit queues (queue pairs) in turn, packet by packet,
    so a small control message waits for at most the frame on the wire, not
    for the data the host has queued. Emulated with a second HTB whose classes
    never limit (10 Gbit/s; the shaping is 5:1's) and differ only in
    priority; a ``u32`` filter sends IP packets under
    :data:`HOST_CONTROL_PACKET_BYTES` to the first.

    A NIC keeps one connection's packets in one queue, in order. The control
    class would let a connection's ACKs overtake its own queued data: harmless
    where the data flows one way (the agents), but Open MPI's connections carry
    both directions' messages, so a data frame reached the peer with an
    acknowledgement older than ACKs already sent by more than a window, and
    the peer dropped it as a blind injection (RFC 5961); a lost last frame
    then waited for the retransmission timeout (docs/fidelity.md, 2026-12-05).
    Every packet of a connection with an end in :data:`IN_ORDER_PORTS` goes to
    the data FIFO (hosts send no IP options: the TCP ports are at bytes 20-23).
    """
    short = 0xFFFF & ~(HOST_CONTROL_PACKET_BYTES - 1)  # total length & mask == 0 <=> shorter than the constant
    port, port_mask = port_block_match(*IN_ORDER_PORTS)
    in_order = [["tc", "filter", "add", "dev", intf, "parent", "10:", "protocol", "ip", "prio", "1", "u32",
                 "match", "u8", "6", "0xff", "at", "9", "match", "u16", f"0x{port:04x}", f"0x{port_mask:04x}",
                 "at", str(offset), "flowid", "10:2"] for offset in (20, 22)]
    return [
        ["tc", "qdisc", "replace", "dev", intf, "parent", "5:1", "handle", "10:", "htb", "default", "2"],
        ["tc", "class", "add", "dev", intf, "parent", "10:", "classid", "10:1", "htb", "rate", "10gbit",
         "burst", "1mb", "cburst", "1mb", "prio", "0"],
        ["tc", "class", "add", "dev", intf, "parent", "10:", "classid", "10:2", "htb", "rate", "10gbit",
         "burst", "1mb", "cburst", "1mb", "prio", "1"],
        leaf_queue_command(intf, packets, parent="10:1", handle="11:"),
        leaf_queue_command(intf, packets, parent="10:2", handle="12:"),
        *in_order,
        ["tc", "filter", "add", "dev", intf, "parent", "10:", "protocol", "ip", "prio", "2", "u32",
         "match", "u16", "0x0000", f"0x{short:04x}", "at", "2", "flowid", "10:1"],
    ]


def tc_batch(commands: Iterable[list[str]]) -> str:
    """``tc -batch`` text for ``tc`` argument lists (one process instead of one per command)."""
    return "".join(" ".join(cmd[1:]) + "\n" for cmd in commands)


def class_show_command(intf: str, netns_pid: int | None = None) -> list[str]:
    """``tc class show`` of ``intf``; inside the namespace of process ``netns_pid`` (``mnexec -a``) when given.

    Its output is text for :func:`parse_htb_rates`: ``tc -j class show``
    prints the same text in iproute2 6.1 (Debian 12's), which has no JSON
    for classes.
    """
    cmd = ["tc", "class", "show", "dev", intf]
    return cmd if netns_pid is None else ["mnexec", "-a", str(netns_pid), *cmd]


#: tc's rate units (SI, as ``tc class show`` prints them) in Mbit/s.
_RATE_UNITS_MBPS = {"Gbit": 1e3, "Mbit": 1.0, "Kbit": 1e-3, "bit": 1e-6}


def parse_htb_rates(text: str) -> list[float]:
    """Rates in Mbit/s of the shaping classes (the root HTB, handle 5:) in ``tc class show`` output.

    A host's inner priority classes (:func:`host_queue_commands`, handle 10:)
    never limit and are left out. Lines of other qdiscs' classes are ignored.
    """
    rates = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[:2] != ["class", "htb"] or not words[2].startswith("5:") or "rate" not in words:
            continue
        raw = words[words.index("rate") + 1]
        unit = next((u for u in _RATE_UNITS_MBPS if raw.endswith(u)), None)
        if unit is not None:
            rates.append(float(raw[: -len(unit)]) * _RATE_UNITS_MBPS[unit])
    return rates
