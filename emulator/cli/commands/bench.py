"""``emu bench``: fidelity and performance ratios measured side by side (see :mod:`emulator.selfcheck.bench`)."""

from __future__ import annotations

import argparse
import os

from emulator.base.errors import UserError
from emulator.cli.arguments import fabric_choice, int_at_least
from emulator.cli.commands import admit, nccl_packets
from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.emulation.session import fidelity
from emulator.model import fabric
from emulator.model.schedule.format import parse_size
from emulator.selfcheck.bench.cases import DEFAULT_SIZES, Size


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="agents/iperf3 (one link, every flow at once), hdrm busbw, "
                               "measured/predicted, Open MPI beside the agents, NCCL's all-reduce as packets beside its model and "
                               "bring-up, in one run")
    p.add_argument("--fabric", default=None, metavar="PROFILE",
                   help=f"the real fabric the emulation stands for: a preset ({', '.join(fabric.PRESETS)}) or "
                   f"key=value,... of {', '.join(fabric.KEYS)} (default {fabric.DEFAULT_PRESET})")
    p.add_argument("--bw", type=float, default=None, metavar="MBPS",
                   help="emulated link rate instead of the profile's (its dilation follows)")
    p.add_argument("--sizes", default=None, metavar="SIZE,...",
                   help="bytes per rank of the replays (default 64KiB,1MiB,16MiB)")
    p.add_argument("--repeat", type=int_at_least(1), default=2, metavar="N",
                   help="measured repetitions per replay, after one warm-up, at every size but the largest, which "
                   "has one and no warm-up (default 2)")
    p.add_argument("--bringup-rounds", type=int_at_least(1), default=2, metavar="N",
                   help="bring-ups of each kind (default 2)")
    p.add_argument("--out", default=None, metavar="DIR", help="results directory (default: results/)")
    p.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"))
    p.add_argument("--no-nccl", action="store_true",
                   help="leave out NCCL's all-reduce as packets beside its model (2 x 1, 2 x 8 and 4 x 8 H100 "
                   "servers at 8 KiB, 1 MiB and 64 MiB)")
    admit.add_arguments(p)
    p.set_defaults(func=cmd_bench)



def _sizes(text: str | None, repeat: int) -> tuple[Size, ...]:
    """``--sizes`` and ``--repeat`` as the bench's sizes: the largest one once, without warm-up."""
    if text is None:
        return tuple(Size(s.bytes, s.warmup, repeat if s.repeat > 1 else s.repeat) for s in DEFAULT_SIZES)
    items = [x for x in text.split(",") if x.strip()]
    if not items:
        raise UserError(f"bench: field 'sizes': expected sizes separated by commas, got {text!r}")
    sizes = sorted({parse_size(x.strip(), where="bench", field_name="sizes") for x in items})
    return tuple(Size(n, 0, 1) if n == sizes[-1] and len(sizes) > 1 else Size(n, 1, repeat) for n in sizes)


def cmd_bench(args: argparse.Namespace) -> int:
    from emulator.selfcheck.bench import admission_request, bench_profile, format_report
    from emulator.selfcheck.live.bench_run import bench

    sizes = _sizes(args.sizes, args.repeat)
    profile = bench_profile(fabric_choice(args.fabric, "bench").profile, args.bw)  # --fabric and --bw, parsed once
    calibration = calibration_file.load_calibration(profile.emulated_mtu)
    admit.check(admission_request(profile, sizes, fidelity.latency_model(profile, calibration),
                                  calibration_file.envelope(calibration, os.cpu_count()),
                                  bringup_rounds=args.bringup_rounds), args)
    require_root()
    interrupt_on_sigterm()
    results = bench(profile, sizes=sizes, bringup_rounds=args.bringup_rounds, datapath=args.datapath,
                    out_dir=args.out, nccl_gate=None if args.no_nccl else nccl_packets.gate(args))
    print()
    print(format_report(results))
    return 0  # a benchmark: misses are printed, not failures
