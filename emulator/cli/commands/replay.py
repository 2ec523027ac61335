"""``emu replay``: a schedule over real TCP on an emulated network (see :mod:`emulator.emulation.session.replay`)."""

from __future__ import annotations

import argparse
import dataclasses
import os

from emulator.base.errors import UserError
from emulator.cli.arguments import add_cluster_arguments, cluster_run, fabric_choice, int_at_least, timeout_seconds
from emulator.cli.commands import admit
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.emulation.session.replay import ReplayConfig, ReplayFailed, prepare, replay
from emulator.model import fabric
from emulator.model.workloads import training
from emulator.runs import admission
from emulator.runs.fault_plan import fault_line
from emulator.runs.metrics import nccl_table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="replay a schedule over real TCP and measure it")
    p.add_argument("schedule", metavar="SCHEDULE", help="schedule file (YAML or JSON)")
    p.add_argument("--topology", required=True, metavar="SPEC")
    p.add_argument("--routing", required=True, metavar="POLICY")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--repeat", type=int_at_least(1, admission.MAX_REPEAT), default=3, metavar="N",
                   help="measured repetitions (default 3)")
    p.add_argument("--warmup", type=int_at_least(0, admission.MAX_WARMUP), default=1, metavar="W",
                   help="unmeasured repetitions first (default 1)")
    p.add_argument("--ecmp-seed", type=int_at_least(0, admission.MAX_SEED), default=0, metavar="S")
    p.add_argument("--timeout", type=timeout_seconds, default=None, metavar="SECONDS",
                   help="per repetition (default: 5x the prediction + 15 s, at least 30 s)")
    p.add_argument("--pcap", default="", metavar="LINK,...", help="capture these links, e.g. s1-s5,h1-s1")
    p.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"))
    p.add_argument("--fabric", default=None, metavar="PROFILE",
                   help=f"the real fabric the emulation stands for: a preset ({', '.join(fabric.PRESETS)}) or "
                   f"key=value,... of {', '.join(fabric.KEYS)} (default {fabric.DEFAULT_PRESET}); a topology "
                   "whose host links have a rate of their own maps the fabric onto it (the dilation follows) "
                   "unless the profile names its dilation; links the topology spec leaves unset run at its "
                   "emulated rate (the rule of emu mpirun, emu schedule check and emu run too)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a fault, repeatable: ACTION[:TARGET]@WHEN[,rep=R] with ACTION one of link_down, "
                        "link_up, controller_kill, controller_restart, agent_kill and WHEN 1.5s or step=N "
                        "(see emulator/runs/fault_plan.py)")
    admit.add_arguments(p)
    add_cluster_arguments(p)
    p.set_defaults(func=cmd_replay)



def replay_config(args: argparse.Namespace) -> ReplayConfig:
    """The replay the arguments ask for: its network resolved from ``--topology`` and ``--fabric``
    (:func:`emulator.model.fabric.resolve`)."""
    network = fabric.resolve(args.topology, fabric_choice(args.fabric, "replay"), where="replay: topology")
    return ReplayConfig(schedule=args.schedule, network=network, routing=args.routing, out=args.out,
                        repeat=args.repeat, warmup=args.warmup, seed=args.ecmp_seed, timeout_s=args.timeout,
                        pcap=[x for x in args.pcap.split(",") if x], datapath=args.datapath, faults=args.fault)


def cmd_replay(args: argparse.Namespace) -> int:
    cfg = replay_config(args)
    prep = prepare(cfg)
    schedule, topo, report = prep.schedule, prep.topo, prep.report
    cluster = cluster_run(args)
    if cluster is not None and cfg.pcap:
        raise UserError("replay: field 'pcap': expected no captures with --cluster (tcpdump runs on the head's "
                        f"interfaces only), got {args.pcap!r}")
    if os.path.exists(os.path.join(args.out, "results.json")):
        raise UserError(f"replay: field 'out': expected a new or empty directory, got {args.out!r} "
                        "(it holds results.json)")
    request = admission.replay_request("replay", schedule, topo, report, args.warmup + args.repeat, prep.profile,
                                       admit.envelope(prep.profile.emulated_mtu))
    spread = ""
    if cluster is not None:  # each server holds its share; the head's is what this machine must fit
        cluster.cluster.check_mtu(prep.profile.emulated_mtu, f"cluster file {cluster.cluster.name}")
        placed = cluster.placement(topo)
        shares = admission.replay_memory_per_server(schedule, topo, placed.of, cluster.cluster.head)
        request = dataclasses.replace(request, memory=shares[cluster.cluster.head])
        spread = (f"on cluster {cluster.cluster.name}: {placed.describe(topo, cluster.cluster.head)}; "
                  f"{admit.check_cluster('replay', shares, cluster.cluster)}")
    verdict = admit.check(request, args, echo=lambda line: None)
    print(f"replay {schedule.algorithm}, {schedule.p} ranks, {schedule.size} B on {topo.spec} "
          f"({args.routing} routing); predicted {report.predicted_time_s:.3f} s")
    print(f"# {prep.profile.describe()}")
    if spread:
        print(f"# {spread}")
    for line in verdict.lines:
        print(f"# {line}")
    require_root()
    interrupt_on_sigterm()
    scale = training.workload_scale(schedule)
    if scale != 1:
        print(f"# a training iteration at scale {scale:g}: the fabric's latencies are divided by {scale:g} as its "
              "gradients and compute are, so the replay stands for the full iteration (docs/schedule-format.md)")
    try:
        results = replay(cfg, prep=prep, cluster=cluster)
    except ReplayFailed as exc:
        print(f"emu: replay failed: {exc} (partial results in {args.out})")
        return 1
    print(nccl_table(schedule, results.repetitions))
    for f in results.faults:
        print(fault_line(f))
    summary = results.summary()  # a finished replay has repeat >= 1 measured repetitions
    if summary is not None and summary.scaling_efficiency is not None:
        print(f"# iteration median {summary.iteration_s:.3f} s, compute alone {summary.compute_only_s:.3f} s: "
              f"scaling efficiency {summary.scaling_efficiency:.3f} (model {report.scaling_efficiency or 0:.3f})")
    median = f"{summary.busbw_mbps:.2f}" if summary is not None else "(none)"
    print(f"# busbw median {median} Mbit/s on {results.link_mbps:g} Mbit/s links; results in {args.out}")
    return 0
