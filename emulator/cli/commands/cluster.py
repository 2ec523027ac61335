"""``emu cluster place``: where each node of a topology would run on a cluster's servers (docs/cluster.md)."""

from __future__ import annotations

import argparse
import json

from emulator.base.errors import printable
from emulator.base.files import read_text
from emulator.model import placement, topology
from emulator.model.schedule.format import parse_text
from emulator.runs import cluster_file


def register(subparsers: argparse._SubParsersAction) -> None:
    cluster = subparsers.add_parser("cluster", help="a cluster file's servers and where a topology's nodes go")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    sub.required = True
    place = sub.add_parser("place", help="check a cluster file and print a topology's placement on its servers")
    place.add_argument("cluster", metavar="CLUSTER", help="cluster file (YAML, docs/cluster.md)")
    place.add_argument("--topology", required=True, metavar="SPEC")
    place.add_argument("--placement", metavar="FILE", help="placement file: {server: [node, ...]} on top")
    place.add_argument("--json", action="store_true", help="print one JSON object")
    place.set_defaults(func=cmd_place)


def cmd_place(args: argparse.Namespace) -> int:
    cluster = cluster_file.load(args.cluster)
    topo = topology.load(args.topology)
    placed = placement.place(topo, cluster.names)
    if args.placement:
        where = f"placement file {printable(args.placement)}"
        data = parse_text(read_text(args.placement, f"placement file {args.placement!r}"), where)
        placed = placement.overridden(placed, topo, data, where=printable(args.placement))
    if args.json:
        print(json.dumps({"cluster": cluster.name, "topology": topo.spec, **placed.to_json()}, sort_keys=True))
        return 0
    print(f"{topo.spec} on cluster {cluster.name}: {placed.cross_links} of {len(topo.links)} links cross servers "
          "(each a VXLAN tunnel)")
    for server in cluster.names:
        nodes = placed.nodes_on(server)
        hosts = sum(1 for n in nodes if topo.is_host(n))
        head = " (head)" if server == cluster.head else ""
        print(f"  {server}{head}: {hosts} hosts, {len(nodes) - hosts} switches: "
              f"{' '.join(sorted(nodes, key=topology.node_sort_key))}")
    return 0
