"""``emu nccl-tests OP ...``: nccl-tests' table for a cluster, from the NCCL model, with nccl-tests' flags.

``emu nccl-tests all_reduce_perf --nodes 2 --gpus-per-node 8 -b 8 -e 8G -f 2``
prints what ``all_reduce_perf -b 8 -e 8G -f 2`` would print on 2 nodes of 8
GPUs (out-of-place columns), and, per size, the algorithm, protocol and
channels NCCL would choose and what limits the bytes. ``--json`` prints one
object whose ``rows`` are ``{"size", "time_us", "algbw_GBps", "busbw_GBps"}``.
``--packets`` (root) also replays the sizes NCCL runs as rings or trees as real
packets (:mod:`emulator.emulation.session.nccl_packets`) and prints their times
beside the model's, under ``packets`` in the JSON.
"""

from __future__ import annotations

import argparse
import json

from emulator.cli.arguments import fabric_choice, int_at_least
from emulator.cli.commands import nccl_packets
from emulator.emulation.session import nccl_packets as packets
from emulator.model.nccl import cost, tuning
from emulator.model.nccl import nccl_tests as nt
from emulator.model.nccl import system as nccl_system
from emulator.model.nccl.system import System
from emulator.runs.nccl_packets import Measured, NotRun

DEFAULT_FABRIC = "h100-ndr400"
DEFAULT_GPU = "h100-sxm"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("nccl-tests", help="nccl-tests' table for a cluster, from the NCCL model")
    p.add_argument("op", metavar="OP", choices=sorted(nt.OPS), help=f"an nccl-tests binary: {', '.join(nt.OPS)}")
    p.add_argument("--nodes", type=int_at_least(1, nccl_system.MAX_NODES), required=True, metavar="N")
    p.add_argument("--gpus-per-node", type=int_at_least(1, nccl_system.MAX_GPUS_PER_NODE), required=True,
                   metavar="G")
    p.add_argument("--nics-per-node", type=int_at_least(1, nccl_system.MAX_GPUS_PER_NODE), default=None,
                   metavar="K", help="default: one per GPU (GPU i beside NIC i, one rail per NIC index)")
    p.add_argument("--fabric", default=DEFAULT_FABRIC, metavar="PROFILE",
                   help=f"the NICs' line rate and kind from a fabric profile (default {DEFAULT_FABRIC})")
    p.add_argument("--gpu", default=DEFAULT_GPU, choices=sorted(nccl_system.GPUS),
                   help=f"the GPU generation (default {DEFAULT_GPU})")
    p.add_argument("--cpu", default="unknown", choices=sorted(nccl_system.SOCKET_GBS),
                   help="the CPU (its socket link and NCCL's network overhead; default unknown)")
    p.add_argument("--no-gdr", action="store_true", help="GPUDirect RDMA off: data staged through host memory")
    p.add_argument("--cross-socket", action="store_true", help="each GPU's NIC on the other CPU socket")
    p.add_argument("-b", "--minbytes", default="32M", metavar="MIN", help="smallest size (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", metavar="MAX", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int_at_least(2, 1 << 20), default=2, metavar="FACTOR",
                   help="size multiplier (default 2)")
    p.add_argument("--algo", default="auto", choices=("auto", *tuning.ALGORITHMS))
    p.add_argument("--protocol", default="auto", choices=("auto", *tuning.PROTOCOLS))
    p.add_argument("--channels", type=int_at_least(1, tuning.MAX_CHANNELS), default=None, metavar="C",
                   help="channels NCCL runs (NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS = C)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    nccl_packets.add_arguments(p)
    p.set_defaults(func=cmd_nccl_tests)


def system_of(args: argparse.Namespace) -> System:
    """The cluster the flags describe: the fabric profile gives the NICs' rate (and RoCE for its RoCE presets)."""
    return nccl_system.system_on(fabric_choice(args.fabric, "nccl-tests").profile, args.nodes, args.gpus_per_node,
                                 args.gpu, nics_per_node=args.nics_per_node, cpu=args.cpu, gdr=not args.no_gdr,
                                 cross_socket=args.cross_socket)


def cmd_nccl_tests(args: argparse.Namespace) -> int:
    op = nt.OPS[args.op]
    system = system_of(args)
    sizes = nt.sizes(nt.parse_size("minbytes", args.minbytes), nt.parse_size("maxbytes", args.maxbytes),
                     args.stepfactor)
    cost.check_forced(system, op.collective, args.algo, args.protocol)  # before any size, even ones of no bytes
    rows, predictions = [], []
    for requested in sizes:
        count, size = nt.count_and_size(op, requested, system.ranks)
        if size == 0:
            continue
        prediction = cost.predict(system, op.collective, size, args.algo, args.protocol, args.channels)
        rows.append(nt.Row(size, count, op, prediction.time_us, system.ranks))
        predictions.append(prediction)
    measured: list[Measured] = []
    skipped: list[NotRun] = []
    if args.packets:
        planned, skipped = nccl_packets.plan(system, op.collective, predictions, args)
        measured = packets.run(planned, echo=(lambda line: None) if args.json else print)
    if args.json:
        doc = {"op": args.op, "system": system.describe(), "ranks": system.ranks,
               "rows": [{**r.to_json(), "algorithm": p.algorithm, "protocol": p.protocol,
                         "channels": p.channels, "limit": p.bottleneck}
                        for r, p in zip(rows, predictions, strict=True)],
               "avg_busbw_GBps": round(nt.average_busbw(rows), 3)}
        if args.packets:
            doc["packets"] = [m.to_json() for m in measured]
            doc["packets_not_run"] = [{"size": s.prediction.nbytes, "why": s.why} for s in skipped]
        print(json.dumps(doc, sort_keys=True))
        return 0 if all(m.time_us is not None for m in measured) else 1
    print(f"# {args.op} from the NCCL model (not measured): {system.describe()}, {system.ranks} ranks")
    print("# nccl-tests' out-of-place columns; then what NCCL chooses and what limits the bytes")
    print(f"{nt.HEADER[0]}   algorithm/protocol  channels  limit")
    print(nt.HEADER[1])
    for row, p in zip(rows, predictions, strict=True):
        print(f"{nt.format_row(row)}   {p.algorithm + '/' + p.protocol:>18}  {p.channels:8d}  {p.bottleneck}")
    print(f"# Avg bus bandwidth    : {nt.average_busbw(rows):g}")
    if args.packets:
        _print_packets(measured, skipped)
    return 0 if all(m.time_us is not None for m in measured) else 1


def _print_packets(measured: list[Measured], skipped: list[NotRun]) -> None:
    print("# packets: measured time on the real fabric's clock (median / dilation + NCCL's base latency, which is "
          "not a message)")
    print(f"#{'size':>11} {'model us':>10} {'packets us':>11} {'packets/model':>14} {'NIC Mbit/s':>11}  verdict  results")
    for m in measured:
        got = "failed" if m.time_us is None else f"{m.time_us:.2f}"
        ratio = "-" if m.over_model is None else f"{m.over_model:.3f}"
        print(f" {m.prediction.nbytes:>11} {m.prediction.time_us:>10.2f} {got:>11} {ratio:>14} {m.link_mbps:>11g}  "
              f"{m.verdict:>7}  {m.folder}")
    for s in skipped:
        print(f"# packets: {s.prediction.nbytes} B not run: {s.why}")
