"""The bench's baseline (live): the same network brought up and down by plain Mininet, the only bench module that
imports Mininet."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

from emulator.base.naming import bridge_name, host_intf, switch_intf
from emulator.emulation.machine.cleanup import remove_our_bridges
from emulator.emulation.machine.network_lock import NetworkLock
from emulator.emulation.machine.started import StartedRecord, kill_recorded, proc_netns
from emulator.emulation.machine.system import run
from emulator.model import topology
from emulator.selfcheck.bench.rows import BringupTimes


def _add_nodes_and_links(net: Any, topo: topology.Topology, state: StartedRecord) -> None:
    """``topo``'s hosts (recorded in ``state``), switches and shaped links, with our names; Mininet's ``bw``."""
    for h in topo.hosts:
        node = net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
        state.record_process("host", node.pid, node=h.name, netns=proc_netns(node.pid))
    for s in topo.switches:
        net.addSwitch(bridge_name(s.name), dpid=f"{s.dpid:016x}")
    for lk in topo.links:
        if lk.kind == "host":
            net.addLink(lk.a, bridge_name(lk.b), port1=0, port2=lk.b_port, intfName1=host_intf(lk.a),
                        intfName2=switch_intf(lk.b, lk.b_port), bw=lk.bw_mbps)
        else:
            net.addLink(bridge_name(lk.a), bridge_name(lk.b), port1=lk.a_port, port2=lk.b_port,
                        intfName1=switch_intf(lk.a, lk.a_port), intfName2=switch_intf(lk.b, lk.b_port),
                        bw=lk.bw_mbps)


def plain_mininet_bringup(topo: topology.Topology, datapath: str) -> BringupTimes:
    """Build, start and stop ``topo`` with bare Mininet; returns the times up and down.

    The same hosts (IP, MAC), switches (dpid) and shaped links as
    :class:`~emulator.emulation.network.emulated_network.EmulatedNetwork`, and our names (so ``emu clean`` can remove
    what a
    killed run leaves); no controller, no MTU, sysctl, ARP or flow set-up.
    Holds the machine-wide network lock; host shells are recorded in a run state.
    """
    # Mininet is imported here, not at the top: it is slow to import and only a bring-up needs it.
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    setLogLevel(os.environ.get("EF_MININET_LOG", "error"))
    with NetworkLock():
        state = StartedRecord.create("bench-plain")
        net = None
        try:
            t0 = time.monotonic()
            net = Mininet(topo=None, switch=partial(OVSSwitch, datapath=datapath), link=TCLink, controller=None,
                          build=False, autoSetMacs=False, autoStaticArp=False, waitConnected=False)
            _add_nodes_and_links(net, topo, state)
            net.build()
            net.start()
            up = time.monotonic() - t0
            t1 = time.monotonic()
            net.stop()
            net = None
            down = time.monotonic() - t1
        finally:
            if net is not None:
                try:
                    net.stop()
                except Exception:
                    pass
            kill_recorded(state)
            remove_our_bridges(run, [bridge_name(s.name) for s in topo.switches])
            state.remove()
    return BringupTimes(up, down)
