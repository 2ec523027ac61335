"""``emu analyze DIR``: per-flow throughput over time from a replay's captures (see :mod:`emulator.selfcheck.capture_analysis`)."""

from __future__ import annotations

import argparse
import json

from emulator.cli.arguments import positive


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("analyze", help="per-flow throughput over time from DIR/pcap/*.pcap")
    p.add_argument("dir", metavar="DIR", help="a replay output directory (run with --pcap LINK,...)")
    p.add_argument("--bin", type=positive("milliseconds", finite=True), default=100.0, metavar="MS",
                   help="bin width in ms (default 100)")
    p.add_argument("--json", action="store_true", help="print flows.json instead of the summary")
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    from emulator.selfcheck.capture_analysis import analyze_dir, summary
    result = analyze_dir(args.dir, args.bin / 1000.0)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print(summary(result))
        print(f"# written to {args.dir}/flows.json")
    return 0
