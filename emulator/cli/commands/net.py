"""``emu up`` (a network with the Mininet CLI) and ``emu clean`` (remove what we left)."""

from __future__ import annotations

import argparse
import ipaddress
import sys

from emulator.base.errors import UserError
from emulator.cli.arguments import int_at_least
from emulator.emulation.cluster.cluster_network import clean_server
from emulator.emulation.machine.system import choose_datapath, interrupt_on_sigterm, require_root
from emulator.emulation.network.emulated_network import EmulatedNetwork
from emulator.model import routing, topology
from emulator.runs import cluster_file
from emulator.runs.admission import MAX_SEED


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="bring a network up and open the Mininet CLI")
    up.add_argument("spec", metavar="SPEC", help="topology spec or exported topology JSON file")
    up.add_argument("--controller", metavar="HOST:PORT",
                    help="attach to a running OpenFlow controller (default: static routes, no controller)")
    up.add_argument("--routing", default="shortest", metavar="POLICY",
                    help="policy of the static routes when no controller is given (default: shortest)")
    up.add_argument("--ecmp-seed", type=int_at_least(0, MAX_SEED), default=0, metavar="S", help="seed of static ECMP routes")
    up.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"),
                    help="Open vSwitch datapath (default: kernel where the module exists, else user)")
    up.set_defaults(func=cmd_up)

    clean = subparsers.add_parser("clean", help="remove the bridges, links and processes this project left")
    clean.add_argument("--force", action="store_true", help="also tear down runs whose owner is still alive")
    clean.add_argument("--cluster", metavar="CLUSTER", default=None,
                       help="also on every other server of this cluster file, over ssh (after a head was killed)")
    clean.set_defaults(func=cmd_clean)


def parse_hostport(text: str, field: str = "controller") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        host = ""
    if not sep or not host:
        raise UserError(f"field '{field}': expected HOST:PORT with an IPv4 address (e.g. 127.0.0.1:6653), "
                        f"got {text!r}")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise UserError(f"field '{field}': expected a port in 1..65535, got {port!r}")
    return host, number



def cmd_up(args: argparse.Namespace) -> int:
    topo = topology.load(args.spec)
    controller = parse_hostport(args.controller) if args.controller else None
    if controller is None:  # static routes: everything about them is checked before anything starts
        routing.check_policy(topo, args.routing)
    choose_datapath(args.datapath)
    net = EmulatedNetwork(topo, controller=controller, routing=args.routing, seed=args.ecmp_seed,
                          datapath=args.datapath, label="up")
    interrupt_on_sigterm()
    net.start()
    try:
        routes = f"controller {args.controller}" if controller else f"static {args.routing} routes"
        print(f"*** {topo.spec}: {len(topo.hosts)} hosts, {len(topo.switches)} switches, "
              f"{net.datapath} datapath, {routes}, up in {net.bringup_s:.1f} s")
        print("*** switches are named ef<switch> in Mininet (e.g. efs1); type 'exit' to tear down")
        from mininet.cli import CLI

        CLI(net.net, stdin=sys.stdin)
    finally:
        net.stop()
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from emulator.emulation.machine.cleanup import clean

    require_root()
    cluster = cluster_file.load(args.cluster) if args.cluster else None
    report = clean(force=args.force)
    for line in report:
        print(f"{cluster.head}: {line}" if cluster is not None else line)
    if cluster is not None:
        failed = False
        for server in cluster.others:
            ok, lines = clean_server(cluster, server, force=args.force)
            failed |= not ok
            for line in lines:
                print(line)
        return 1 if failed else 0
    return 0
