"""``emu bench``: fidelity and performance ratios measured side by side (see :mod:`emulator.bench`)."""

from __future__ import annotations

import argparse

from emulator.errors import UserError
from emulator.schedule.format import parse_size
from emulator.system import interrupt_on_sigterm, require_root


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="agent/iperf3, hdrm busbw, measured/predicted and bring-up, in one run")
    p.add_argument("--bw", type=float, default=None, metavar="MBPS",
                   help="link rate (default: the calibration's recommended rate, else 10)")
    p.add_argument("--size", default=None, metavar="SIZE",
                   help="bytes per rank of every replay (default 1MiB, halved while a 16-rank ring would take "
                        "more than 3.5 s at the link rate)")
    p.add_argument("--repeat", type=int, default=2, metavar="N",
                   help="measured repetitions per replay, after one warm-up (default 2)")
    p.add_argument("--bringup-rounds", type=int, default=2, metavar="N", help="bring-ups of each kind (default 2)")
    p.add_argument("--out", default=None, metavar="DIR", help="results directory (default: results/)")
    p.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"))
    p.set_defaults(func=cmd_bench)



def cmd_bench(args: argparse.Namespace) -> int:
    from emulator.bench import bench, format_report, link_rate

    size = parse_size(args.size, where="bench", field_name="size") if args.size is not None else None
    for name, value in (("repeat", args.repeat), ("bringup-rounds", args.bringup_rounds)):
        if value < 1:
            raise UserError(f"bench: field '{name}': expected an integer >= 1, got {value!r}")
    link_rate(args.bw, None)  # validates --bw
    require_root()
    interrupt_on_sigterm()
    data = bench(args.bw, size=size, repeat=args.repeat, bringup_rounds=args.bringup_rounds,
                 datapath=args.datapath, out_dir=args.out)
    print()
    print(format_report(data))
    return 0  # a benchmark: misses are printed, not failures
