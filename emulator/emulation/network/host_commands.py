"""What bring-up runs besides ``tc``: each host's set-up, its static ARP, and static flow entries.

Pure functions from a topology model to argument lists and batch files;
:class:`emulator.emulation.network.emulated_network.EmulatedNetwork` runs them. A host gets its MTU,
sysctls (IPv6 off, no slow start after idle, a bound on each flow's own
queue, no tail loss probes), a connected route to :data:`HOST_SUBNET` with a
minimum retransmission timeout that covers a full queue, TX checksum offload
off on the userspace datapath, and a permanent ARP entry for every other
host. Without a controller every bridge gets the routing policy's entries
from an ``ovs-ofctl add-flows`` file.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence

from emulator.base.naming import HOST_SUBNET, bridge_name, host_intf
from emulator.emulation.network.tc_commands import DEFAULT_QUEUE_BYTES
from emulator.model import routing
from emulator.model.topology import DEFAULT_MTU, Topology

#: Bytes one TCP flow may hold in its host's own queue (TCP small queues):
#: keeps a host's ACKs from waiting behind a deep queue of its own data.
DEFAULT_HOST_TSQ_BYTES = 65536

#: Linux's own minimum retransmission timeout; a dilated network's queues can hold longer than it.
KERNEL_RTO_MIN_MS = 200


def tcp_rto_min_ms(rate_mbps: float, queue_bytes: int = DEFAULT_QUEUE_BYTES) -> int:
    """The hosts' minimum TCP retransmission timeout: the kernel's 200 ms plus the time to drain one full queue.

    The kernel's timers are not dilated: on a slow emulated link a window of
    frames queued behind each other can outlast the kernel's minimum, so TCP
    would resend data nobody lost and fall back to slow start
    (docs/fidelity.md, "Spurious retransmissions"). Real losses show as
    qdisc drops and are repaired by fast retransmit.
    """
    return KERNEL_RTO_MIN_MS + math.ceil(queue_bytes * 8 / (rate_mbps * 1e3))


def host_setup_commands(topo: Topology, host: str, datapath: str, mtu: int = DEFAULT_MTU,
                        tsq_bytes: int = DEFAULT_HOST_TSQ_BYTES) -> list[list[str]]:
    """Commands run inside ``host`` after the links are up (argument lists).

    ``datapath`` is ``user`` or ``kernel`` (the userspace datapath needs TX
    checksum offload off); ``tsq_bytes`` bounds what one flow queues in the host.
    """
    intf = host_intf(host)
    # tcp_early_retrans=0 turns tail loss probes off: under time dilation a
    # jumbo frame takes tens of milliseconds, so the probe timer (about two
    # round trips) fired while the tail was still queued and resent whole
    # frames nobody had lost. Loss is still repaired by fast retransmit and the RTO.
    cmds = [
        ["ip", "link", "set", "dev", intf, "mtu", str(mtu)],
        ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
         "net.ipv4.tcp_slow_start_after_idle=0", f"net.ipv4.tcp_limit_output_bytes={tsq_bytes}",
         "net.ipv4.tcp_early_retrans=0"],
        ["ip", "route", "change", HOST_SUBNET, "dev", intf, "proto", "kernel", "scope", "link",
         "src", topo.host(host).ip, "rto_min", f"{tcp_rto_min_ms(topo.host_link(host).bw_mbps)}ms"],
    ]
    if datapath == "user":
        # Userspace OVS does not complete checksums or segment TSO frames:
        # without this, pings work but TCP carries nothing.
        cmds.append(["ethtool", "-K", intf, "tx", "off"])
    # Linux's TCP builds segmentation-offload packets of up to 64 KB whatever the device offers, and they are
    # cut into frames only after the queue: the host's shaper charged seven 9000-byte frames at once, sent
    # them back to back, then held everything (the control class's ACKs too) for 25 ms. One frame per
    # packet keeps the NIC's pace and the ACKs' place (docs/fidelity.md, 2026-12-04 afternoon).
    cmds.append(["ip", "link", "set", "dev", intf, "gso_max_segs", "1"])
    return cmds


def host_script(commands: Sequence[Sequence[str]]) -> list[str]:
    """The argument list of one ``bash`` running ``commands`` in order, stopping at the first that fails and
    tracing each (``set -ex``): one round trip to a host's shell instead of one per command."""
    return ["bash", "-c", "set -ex; " + "; ".join(shlex.join(cmd) for cmd in commands)]


def failed_command(output: str) -> str:
    """The command a :func:`host_script` stopped at: the last line its trace wrote (``+ cmd``), else ``?``."""
    traced = [line[2:].strip() for line in output.splitlines() if line.startswith("+ ")]
    return traced[-1] if traced else "?"


def static_arp_batch(topo: Topology, host: str) -> str:
    """An ``ip -batch`` script giving ``host`` a permanent ARP entry for every other host."""
    intf = host_intf(host)
    return "".join(f"neigh replace {h.ip} lladdr {h.mac} dev {intf} nud permanent\n"
                   for h in topo.hosts if h.name != host)


def static_flow_files(topo: Topology, policy: str, seed: int = 0) -> dict[str, str]:
    """Per bridge, the ``ovs-ofctl add-flows`` file installing ``policy`` without a controller."""
    table = routing.flow_table(topo, policy, seed=seed)
    return {bridge_name(sw): "".join(entry.ofctl() + "\n" for entry in entries)
            for sw, entries in table.items()}
