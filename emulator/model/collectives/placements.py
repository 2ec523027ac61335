"""Rank placements: which host runs each rank of a generated schedule.

``identity`` (rank ``r`` on host ``h(r+1)``; with servers accelerators are
numbered server by server), ``random`` (a seeded permutation), ``hdrm``
(BiGraph without servers; any fabric with servers, see ``hdrm`` in
:mod:`emulator.model.collectives.algorithms`: on the fabrics with rails and
one NIC per rail, partners in other servers share a local index and so a
rail, and every step is contention-free), ``rail`` (servers only: each odd
server's accelerators in reverse, so that a ring goes from server to server
on one rail, :func:`rail_placement`).
"""

from __future__ import annotations

import random

from emulator.base.errors import FieldError
from emulator.model.schedule.format import is_power_of_two
from emulator.model.topology import Topology, hdrm_problem, hdrm_slot_order

#: Where the generators' errors are reported.
WHERE = "schedule gen"

PLACEMENTS = ("identity", "random", "hdrm", "rail")


def hdrm_placement(topo: Topology) -> list[str]:
    """Hosts for ranks ``0..p-1`` so that halving-doubling is contention-free.

    Without servers: a BiGraph with ``U = L``, ``M <= U`` hosts per switch
    and ``p = 2·U·M`` a power of two; rank ``r`` runs on the host of slot
    :func:`emulator.model.topology.hdrm_slot_order` ``[r]`` (the construction and
    its proof are there). With servers: the identity over accelerators, with
    ``servers`` and ``accels_per_server`` powers of two (see ``hdrm`` in
    :mod:`emulator.model.collectives.algorithms`).
    """
    if topo.has_servers:
        servers, accels = topo.params["servers"], topo.params["accels_per_server"]
        if not (is_power_of_two(servers) and is_power_of_two(accels)):
            raise FieldError(WHERE, "topology", "servers and accels_per_server powers of two for hdrm on servers "
                             "(rank r runs on accelerator r, the low bits of r pair accelerators of one server)",
                             topo.spec)
        return [h.name for h in topo.hosts]
    if topo.kind != "bigraph":
        raise FieldError(WHERE, "placement", "a bigraph topology for the hdrm placement", topo.spec)
    upper, m = topo.params["upper"], topo.params["hosts_per_switch"]
    problem = hdrm_problem(upper, topo.params["lower"], m)
    if problem:
        raise FieldError(WHERE, "topology", problem, topo.spec)
    return [topo.hosts[slot].name for slot in hdrm_slot_order(upper, m)]


def rail_placement(topo: Topology) -> list[str]:
    """Hosts for ranks ``0..p-1`` so that a ring crosses between servers on one rail: the servers in order,
    the accelerators of every even server in order and those of every odd server in reverse.

    A ring then enters and leaves every server by the same local index, ``0`` or ``A-1`` (with the rail NIC
    placement: the same rail), as NCCL's rings do: each hop between servers joins two NICs on one leaf, and
    no ring traffic crosses a spine, or on a rail-only fabric changes rails. With an odd number of servers
    the hop that closes the ring joins local ``A-1`` to ``0``. Needs servers.
    """
    if not topo.has_servers:
        raise FieldError(WHERE, "placement", "a topology with servers for the rail placement (it orders each "
                         "server's accelerators)", topo.spec)
    out: list[str] = []
    for s, accels in enumerate(topo.servers()):
        out += accels if s % 2 == 0 else accels[::-1]
    return out


def placement_hosts(topo: Topology, placement: str, seed: int = 0) -> list[str]:
    """Hosts of ranks ``0..p-1`` (``p`` = every host of ``topo``) under ``placement``."""
    if placement == "identity":
        return [h.name for h in topo.hosts]
    if placement == "random":
        hosts = [h.name for h in topo.hosts]
        random.Random(seed).shuffle(hosts)
        return hosts
    if placement == "hdrm":
        return hdrm_placement(topo)
    if placement == "rail":
        return rail_placement(topo)
    raise FieldError(WHERE, "placement", f"one of {', '.join(PLACEMENTS)}", placement)
