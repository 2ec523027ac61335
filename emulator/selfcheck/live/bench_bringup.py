"""The bench's bring-ups (live): :class:`EmulatedNetwork` start and stop against plain Mininet's, alternated."""

from __future__ import annotations

import time
from collections.abc import Callable

from emulator.emulation.network.emulated_network import EmulatedNetwork
from emulator.model import topology
from emulator.selfcheck.bench.cases import BRINGUP_TOPOLOGY
from emulator.selfcheck.bench.rows import BringupSummary, BringupTimes
from emulator.selfcheck.live.plain_mininet import plain_mininet_bringup


def our_bringup(topo: topology.Topology, datapath: str, mtu: int) -> BringupTimes:
    """:class:`EmulatedNetwork` start (static routes) and stop; start excludes the lock wait."""
    en = EmulatedNetwork(topo, routing="bigraph" if topo.kind == "bigraph" else "shortest", datapath=datapath,
                         label="bench-bringup", mtu=mtu)
    en.start()
    t1 = time.monotonic()
    en.stop()
    down = time.monotonic() - t1
    return BringupTimes(en.bringup_s or 0.0, down, en.datapath)


def measure_bringup(rounds: int, datapath: str, mtu: int, echo: Callable[[str], None],
                    spec: str = BRINGUP_TOPOLOGY) -> BringupSummary:
    topo = topology.build(spec)
    ours: list[BringupTimes] = []
    plain: list[BringupTimes] = []
    for i in range(rounds):
        ours.append(our_bringup(topo, datapath, mtu))
        plain.append(plain_mininet_bringup(topo, ours[-1].datapath or datapath))
        echo(f"  bring-up {i + 1}/{rounds} ({len(topo.hosts)} hosts, {len(topo.switches)} switches, "
             f"{len(topo.links)} links): ours {ours[-1].up_s:.1f} s up + {ours[-1].down_s:.1f} s down, "
             f"plain Mininet {plain[-1].up_s:.1f} s + {plain[-1].down_s:.1f} s")
    return BringupSummary(topo.spec, len(topo.hosts), len(topo.switches), len(topo.links), tuple(ours), tuple(plain))
