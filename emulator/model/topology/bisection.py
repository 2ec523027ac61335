"""Bisection bandwidth of a topology, from its spec's parameters: the kind's closed form, capped by servers.

This module owns the numbers :meth:`Topology.bisection_bw_mbps
<emulator.model.topology.model.Topology.bisection_bw_mbps>` reports (its docstring
says what they mean). It works on a parsed ``(kind, params)`` pair
(:func:`emulator.model.topology.spec.parse_spec`) rather than on a built
:class:`~emulator.model.topology.model.Topology`, so that the model can call it.
Each kind's closed form is part of its registration
(:data:`emulator.model.topology.kinds.KINDS`, where the method is described);
this module adds what servers do to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from emulator.model.topology.kinds import KINDS


def bisection_mbps(kind: str, params: Mapping[str, Any]) -> float:
    """Bisection bandwidth in Mbit/s (one direction) of the topology ``kind`` with parsed ``params``.

    Without servers the fabric's own; with one server the PCIe links (or the
    interconnect ports, ``domain_bw``) of half its accelerators; with more the fabric's, capped by the NICs of half of
    the servers (see :meth:`~emulator.model.topology.model.Topology.bisection_bw_mbps`).
    """
    host_bw = float(params["host_bw"])
    fabric = KINDS[kind].bisection(params, host_bw, float(params["switch_bw"]))
    if "servers" not in params:
        return fabric
    servers, accels, nics = params["servers"], params["accels_per_server"], params["nics_per_server"]
    if servers == 1:
        return (accels // 2) * float(params.get("domain_bw", params["pcie_bw"]))
    return min(fabric, (servers // 2) * nics * host_bw)
