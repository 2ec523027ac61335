"""``emu cluster place``: where each node of a topology would run on a cluster's servers; ``emu cluster check``:
whether every server of a cluster is ready to take part (docs/cluster.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from emulator.base.errors import printable
from emulator.base.files import read_json
from emulator.cli.arguments import fabric_choice
from emulator.emulation.cluster import cluster_probe, remote_shell
from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.system import Result, Runner, interrupt_on_sigterm, machine_identity, require_root, run
from emulator.model import cluster_placement, fabric, topology
from emulator.runs import cluster_check, cluster_file
from emulator.runs.cluster_check import CalibrationStatus, ServerFindings, Ssh

#: Seconds a minimal calibration may take on one server (about a minute on an idle 2-core machine).
CALIBRATION_TIMEOUT_S = 1200.0


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
    check = sub.add_parser("check", help="check every server of a cluster: ssh, kernel, Open vSwitch, Mininet and "
                           "project versions, the MTU through a tunnel, clocks, calibrations; exit 1 if any fails")
    check.add_argument("cluster", metavar="CLUSTER", help="cluster file (YAML, docs/cluster.md)")
    check.add_argument("--fabric", default=None, metavar="PROFILE",
                       help=f"check (or make) each server's calibration at this fabric profile's MTU (default: "
                       f"{fabric.DEFAULT_PRESET}; see emu replay --help)")
    check.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    check.set_defaults(func=cmd_check)
    # What `emu cluster check` runs on each server (no help: not listed); one JSON line.
    mine = sub.add_parser("calibration", description="this machine's calibration at a fabric profile's MTU, as "
                          "one JSON line (what emu cluster check runs on each server)")
    mine.add_argument("--fabric", default=None, metavar="PROFILE")
    mine.add_argument("--make", action="store_true", help="where there is none, make a minimal one (as emu run does)")
    mine.set_defaults(func=cmd_calibration)


def cmd_place(args: argparse.Namespace) -> int:
    cluster = cluster_file.load(args.cluster)
    topo = topology.load(args.topology)
    placed = cluster_placement.place(topo, cluster.names)
    if args.placement:
        overrides = cluster_placement.read_overrides(args.placement, cluster.names)
        placed = cluster_placement.overridden(placed, topo, overrides, where=printable(args.placement))
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


def cmd_check(args: argparse.Namespace) -> int:
    cluster = cluster_file.load(args.cluster)
    profile = fabric_choice(args.fabric, "cluster check").profile
    require_root()
    interrupt_on_sigterm()  # a terminated check still removes its probe's tunnels (tunnel_mtu's finally)
    findings = check(cluster, profile, echo=lambda line: print(line, file=sys.stderr))
    found = cluster_check.failures(cluster, findings, sys.executable)
    if args.json:
        print(json.dumps(cluster_check.document(cluster, findings, found), sort_keys=True))
    else:
        print(cluster_check.table(cluster, findings, found))
    sys.stdout.flush()
    for failure in found:
        print(f"emu: {failure.line}", file=sys.stderr)
    return 1 if found else 0


def _local(command: Sequence[str]) -> Result:
    return run(command)


def _long(command: Sequence[str]) -> Result:
    return run(command, timeout=CALIBRATION_TIMEOUT_S)


def clock_session(cluster: cluster_file.Cluster, server: cluster_file.Server) -> cluster_probe.ClockSession:
    """A shell kept open on ``server`` over ssh that answers with its clock (round trips without a login each)."""
    return cluster_probe.ClockSession(partial(remote_shell.popen, cluster, server))


def check(cluster: cluster_file.Cluster, profile: fabric.FabricProfile,
          echo: Callable[[str], None] = print) -> list[ServerFindings]:
    """Every server's findings, in the cluster file's order: the head's read here, the others' over ssh.

    A server ssh does not reach is not probed further; a server without a
    calibration at the profile's MTU gets a minimal one, made there.
    """
    runners = remote_shell.runners(cluster, _local)
    remote_shell.open_shared(cluster)  # a server it fails for is found out by its own ssh check
    try:
        return _findings(cluster, profile, runners, echo)
    finally:
        remote_shell.close_shared(cluster)


def _findings(cluster: cluster_file.Cluster, profile: fabric.FabricProfile, runners: dict[str, Runner],
              echo: Callable[[str], None]) -> list[ServerFindings]:
    """:func:`check`'s probes, server after server."""
    head = cluster.server(cluster.head)
    mtu, spec = cluster_check.tunnel_mtu(cluster), profile.short_spec()
    out = []
    for index, server in enumerate(cluster.servers):
        runner, is_head = runners[server.name], server.name == cluster.head
        ssh = Ssh(True, local=True) if is_head else cluster_probe.reach(runner)
        if not ssh.ok:
            out.append(ServerFindings(server.name, is_head, ssh))
            continue
        versions = cluster_probe.versions(runner)
        if is_head:
            clock = replace(cluster_check.HEAD_CLOCK, chrony=cluster_probe.chrony(runner))
        else:
            with clock_session(cluster, server) as session:
                clock = cluster_probe.clock_offset(session, chrony_line=cluster_probe.chrony(runner))
        tunnel = None if is_head else cluster_probe.tunnel_mtu(
            runners[head.name], runner, head, server, mtu, cluster_check.tunnel_names(server.name, index, os.getpid()))
        cal = cluster_probe.calibration(runner, spec, profile.emulated_mtu)
        if not cal.found and not cal.error:
            echo(f"{server.name}: no calibration at MTU {profile.emulated_mtu}"
                 f"{f' ({cal.problem})' if cal.problem else ''}: making a minimal one there, as emu run does "
                 "(about a minute)")
            cal = cluster_probe.calibration(remote_shell.remote_runner(cluster, server, _long), spec,
                                            profile.emulated_mtu, make=True)
        out.append(ServerFindings(server.name, is_head, ssh, versions, clock, tunnel, cal))
    return out


def cmd_calibration(args: argparse.Namespace) -> int:
    """This machine's calibration at the profile's MTU as one JSON line; with --make, a minimal one made where there
    is none (:func:`emulator.selfcheck.live.calibration.ensure_calibration`, what emu run does)."""
    profile = fabric_choice(args.fabric, "cluster calibration").profile
    mtu = profile.emulated_mtu
    path = calibration_file.calibration_path(mtu)
    found = calibration_file.load_calibration(mtu)
    problem, made = None, False
    if found is None:
        data = read_json(path)
        problem = None if data is None else calibration_file.calibration_problem(data, machine_identity())
        if args.make:
            from emulator.selfcheck.live.calibration import ensure_calibration

            require_root()
            interrupt_on_sigterm()
            found, made = ensure_calibration(profile, echo=lambda line: print(line, file=sys.stderr)), True
    status = CalibrationStatus(path, mtu, found is not None, minimal=bool(found and found.minimal),
                               quick=bool(found and found.quick), date=found.machine.date if found else None,
                               problem=problem if found is None else None, made=made)
    print(json.dumps(status.to_json(), sort_keys=True))
    return 0
