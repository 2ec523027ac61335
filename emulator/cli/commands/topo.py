"""``emu topo show|export``: describe a topology model without building it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from emulator.base.files import write_json_atomic
from emulator.model import topology


def register(subparsers: argparse._SubParsersAction) -> None:
    topo = subparsers.add_parser("topo", help="describe topology models")
    sub = topo.add_subparsers(dest="topo_command", metavar="SUBCOMMAND")
    sub.required = True

    show = sub.add_parser("show", help="hosts, switches, links, diameter and bisection of a spec")
    show.add_argument("spec", metavar="SPEC", help="e.g. bigraph:upper=4,lower=4,hosts_per_switch=2")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=cmd_show)

    export = sub.add_parser("export", help="write the model as networkx node-link JSON")
    export.add_argument("spec", metavar="SPEC")
    export.add_argument("-o", "--output", metavar="FILE", help="file to write (default: stdout)")
    export.set_defaults(func=cmd_export)


def cmd_show(args: argparse.Namespace) -> int:
    topo = topology.load(args.spec)
    summary = topo.summary()
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    print(f"topology   {summary['spec']}")
    print(f"hosts      {summary['hosts']}")
    print(f"switches   {summary['switches']}  ({_roles(topo)})")
    if topo.has_servers:
        print(f"links      {summary['links']}  ({summary['host_links']} accelerator-PCIe, {summary['nic_links']} NIC, "
              f"{summary['switch_links']} switch-switch)")
        print(f"rates      PCIe links {summary['pcie_bw_mbps']:g} Mbit/s, NIC links {summary['host_bw_mbps']:g} Mbit/s, "
              f"switch links {summary['switch_bw_mbps']:g} Mbit/s")
        print(f"servers    {summary['servers']} x ({summary['accels_per_server']} accelerators, "
              f"{summary['nics_per_server']} NICs), NICs {summary['nic_placement']} on {summary['host_slots']} host slots")
        if topo.has_domain:
            print(f"domain     accelerator interconnect {summary['domain_bw_mbps']:g} Mbit/s per accelerator and "
                  "direction (timed transfers, no packets)")
    else:
        print(f"links      {summary['links']}  ({summary['host_links']} host, {summary['switch_links']} switch-switch)")
        print(f"rates      host links {summary['host_bw_mbps']:g} Mbit/s, "
              f"switch links {summary['switch_bw_mbps']:g} Mbit/s")
    if "rails" in summary:
        print(f"rails      {_rails(summary)}")
    print(f"diameter   {summary['diameter_hops']} switch hops")
    print(f"bisection  {summary['bisection_bw_mbps']:g} Mbit/s")
    return 0


def _rails(summary: dict[str, Any]) -> str:
    """``4 (one leaf per rail, spines join them)``: how the fabric's rails are built."""
    if summary["rail_only"]:
        how = "one leaf per rail, no spines: traffic changes rails inside the sending server"
    elif summary["planes"] == 2:
        how = (f"two planes, each a leaf per rail joined by spines; every NIC has a port on each plane at "
               f"{summary['nic_port_bw_mbps']:g} Mbit/s, connections split between them")
    else:
        how = "one leaf per rail, spines join them"
    return f"{summary['rails']} ({how})"


def _roles(topo: topology.Topology) -> str:
    counts: dict[str, int] = {}
    for sw in topo.switches:
        counts[sw.role] = counts.get(sw.role, 0) + 1
    return ", ".join(f"{n} {role}" for role, n in counts.items())


def cmd_export(args: argparse.Namespace) -> int:
    data = topology.load(args.spec).to_json()
    if args.output:
        write_json_atomic(args.output, data)
    else:
        print(json.dumps(data, indent=1, sort_keys=True))
    return 0
