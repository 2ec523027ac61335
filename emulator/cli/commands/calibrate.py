"""``emu calibrate``: measure this machine's emulation limits (see :mod:`emulator.selfcheck.live.calibration`)."""

from __future__ import annotations

import argparse
import json
import sys

from emulator.cli.arguments import fabric_choice, number
from emulator.emulation.cluster import remote_shell
from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.model import fabric
from emulator.runs import cluster_file


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure link fidelity, agents vs iperf3 and datapath capacity")
    p.add_argument("--bw", type=number("Mbit/s in (0, 1000]", lambda x: 0 < x <= 1000), default=None,
                   metavar="MBPS",
                   help="link rate of the one-link and agent measurements (default: the recommended rate "
                        "derived from the measured capacity)")
    p.add_argument("--quick", action="store_true", help="shorter flows and a coarser rate ladder (about two minutes)")
    p.add_argument("--fabric", default=None, metavar="PROFILE",
                   help="measure at this fabric profile's MTU, the latency at its emulated link rate (default: "
                   f"{fabric.DEFAULT_PRESET}; see emu replay --help)")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON instead of a table")
    p.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"))
    p.add_argument("--cluster", metavar="CLUSTER", default=None,
                   help="calibrate every server of this cluster file instead, one after another, each its own "
                        "datapath (its calibration is written on it; docs/cluster.md)")
    p.set_defaults(func=cmd_calibrate)


#: How long one server's calibration may take (a full one is about ten minutes per MTU).
SERVER_CALIBRATION_TIMEOUT_S = 3600.0


def forwarded(args: argparse.Namespace) -> list[str]:
    """The options of this command as every server's own ``emu calibrate`` takes them."""
    out = ["--datapath", args.datapath]
    if args.bw is not None:
        out += ["--bw", f"{args.bw:g}"]
    if args.fabric is not None:
        out += ["--fabric", args.fabric]
    return out + (["--quick"] if args.quick else []) + (["--json"] if args.json else [])


def calibrate_cluster(args: argparse.Namespace) -> int:
    """``emu calibrate --cluster``: each server in turn (they would measure each other where they share a
    machine), through the project at the head's path on it; 1 when any fails."""
    cluster = cluster_file.load(args.cluster)
    command = [sys.executable, "-m", "emulator", "calibrate", *forwarded(args)]
    failed = []
    for server in cluster.servers:
        print(f"== {server.name}{' (head)' if server.name == cluster.head else ''}: emu calibrate", flush=True)
        runner = remote_shell.remote_runner(cluster, server, remote_shell.run_with_timeout(
            SERVER_CALIBRATION_TIMEOUT_S))
        res = runner(command)
        print(res.stdout.rstrip())
        if res.returncode != 0:
            failed.append(server.name)
            print(f"emu: server {server.name}: emu calibrate failed (status {res.returncode}): "
                  f"{res.stderr.strip()[-300:]}", file=sys.stderr)
    return 1 if failed else 0



def cmd_calibrate(args: argparse.Namespace) -> int:
    from emulator.selfcheck.live.calibration import calibrate, summary_table

    profile = fabric_choice(args.fabric, "calibrate").profile
    if args.cluster:
        return calibrate_cluster(args)
    require_root()
    interrupt_on_sigterm()
    echo = (lambda s: None) if args.json else print
    data = calibrate(args.bw, quick=args.quick, datapath=args.datapath, echo=echo, mtu=profile.emulated_mtu,
                     latency_mbps=profile.emulated_link_mbps).to_json()
    if args.json:
        print(json.dumps(data, indent=1, sort_keys=True))
    else:
        print(summary_table(data))
        print(f"written to {calibration_file.calibration_path(profile.emulated_mtu)}")
    return 0
