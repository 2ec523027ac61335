"""``emu calibrate``: measure this machine's emulation limits (see :mod:`emulator.selfcheck.calibration`)."""

from __future__ import annotations

import argparse
import json

from emulator.cli.arguments import number
from emulator.emulation import calibration_file
from emulator.emulation.system import interrupt_on_sigterm, require_root
from emulator.model import fabric


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
    p.set_defaults(func=cmd_calibrate)



def cmd_calibrate(args: argparse.Namespace) -> int:
    from emulator.selfcheck.calibration import calibrate, summary_table

    profile = fabric.parse(args.fabric, where="calibrate: fabric")
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
