"""Bisection bandwidth of a topology, in closed form per kind, from its spec's parameters.

This module owns the numbers :meth:`Topology.bisection_bw_mbps
<emulator.model.topology.model.Topology.bisection_bw_mbps>` reports (its docstring
says what they mean). It works on a parsed ``(kind, params)`` pair
(:func:`emulator.model.topology.spec.parse_spec`) rather than on a built
:class:`~emulator.model.topology.model.Topology`, so that the model can call it and
it imports nothing of the package.

A cut assigns every switch to a side; hosts whose switch is on the wrong side
for the balance cost their host link. BiGraph and leaf-spine are symmetric
within each switch group, so only how many switches of each group sit on one
side matters: enumerating those counts is exact. The unit tests compare every
form with a search over all switch assignments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _balance_cost(side_hosts: int, n: int, hbw: float) -> float:
    """Host links cut to move hosts until one side holds floor(N/2) or ceil(N/2)."""
    return min(abs(side_hosts - n // 2), abs(side_hosts - (n + 1) // 2)) * hbw


def _bisect_two_groups(g1: int, g2: int, hosts1: int, hosts2: int, hbw: float, sbw: float) -> float:
    """Complete bipartite switch graph g1 x g2 with hosts1/hosts2 hosts per switch."""
    n = g1 * hosts1 + g2 * hosts2
    return min((a * (g2 - c) + (g1 - a) * c) * sbw + _balance_cost(a * hosts1 + c * hosts2, n, hbw)
               for a in range(g1 + 1) for c in range(g2 + 1))


def _bisect_bigraph(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    m = p["hosts_per_switch"]
    return _bisect_two_groups(p["upper"], p["lower"], m, m, hbw, sbw)


def _bisect_leafspine(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return _bisect_two_groups(p["leaves"], p["spines"], p["hosts_per_leaf"], 0, hbw, sbw)


def _bisect_fattree(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    # Full bisection: cut the hosts' links, or half the pods' k/2 * (k/2)^2
    # aggregation-core links (k**3 / 8 in all).
    k = p["k"]
    return min((k**3 // 4 // 2) * hbw, (k**3 // 8) * sbw)


def _bisect_star(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return (p["hosts"] // 2) * hbw


_BISECTION: dict[str, Callable[[Mapping[str, Any], float, float], float]] = {
    "bigraph": _bisect_bigraph,
    "fattree": _bisect_fattree,
    "leafspine": _bisect_leafspine,
    "star": _bisect_star,
}


def bisection_mbps(kind: str, params: Mapping[str, Any]) -> float:
    """Bisection bandwidth in Mbit/s (one direction) of the topology ``kind`` with parsed ``params``.

    Without servers the fabric's own; with one server the PCIe links of half
    its accelerators; with more the fabric's, capped by the NICs of half of
    the servers (see :meth:`~emulator.model.topology.model.Topology.bisection_bw_mbps`).
    """
    host_bw = float(params["host_bw"])
    fabric = _BISECTION[kind](params, host_bw, float(params["switch_bw"]))
    if "servers" not in params:
        return fabric
    servers, accels, nics = params["servers"], params["accels_per_server"], params["nics_per_server"]
    if servers == 1:
        return (accels // 2) * float(params["pcie_bw"])
    return min(fabric, (servers // 2) * nics * host_bw)
