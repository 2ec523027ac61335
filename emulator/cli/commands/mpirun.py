"""``emu mpirun``: an Open MPI program over the emulated fabric (see :mod:`emulator.emulation.mpi.mpi_run`)."""

from __future__ import annotations

import argparse
import dataclasses

from emulator.base.errors import printable
from emulator.cli.arguments import fabric_choice, int_at_least, timeout_seconds
from emulator.cli.commands import admit
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.emulation.mpi.mpi_run import check_cluster, prepare, run
from emulator.emulation.session.fidelity import flag_text
from emulator.model import fabric
from emulator.model.collectives.placements import PLACEMENTS
from emulator.runs import admission, cluster_file
from emulator.runs.cluster_file import ClusterRun
from emulator.runs.mpi_plan import DEFAULT_NICE, DEFAULT_TIMEOUT_S, MpiRunConfig, has_latency
from emulator.runs.mpi_results import MpiResults


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("mpirun", help="run an Open MPI program over the emulated fabric",
                              description="Bring up the network (controller as for replay), run PROGRAM with "
                              "Open MPI, one rank per host, and collect its output, port counters and fidelity "
                              "into --out. Exits with the program's status.")
    p.add_argument("--topology", required=True, metavar="SPEC")
    p.add_argument("--routing", required=True, metavar="POLICY")
    p.add_argument("--out", required=True, metavar="DIR", help="the run's folder (new or empty)")
    p.add_argument("--seed", "--ecmp-seed", dest="seed", type=int_at_least(0, admission.MAX_SEED), default=0, metavar="N",
                   help="ECMP seed (every TCP connection is hashed by its 5-tuple with it), and the random "
                   "placement's")
    p.add_argument("--placement", default="identity", metavar="P",
                   help=f"which host runs rank r: {', '.join(PLACEMENTS)}, or a file naming one host per line in "
                   "rank order (default identity)")
    p.add_argument("--np", type=int_at_least(1), default=None, metavar="N",
                   help="ranks (default: one per host)")
    p.add_argument("--mca", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help="an Open MPI parameter, repeatable (e.g. --mca coll_tuned_use_dynamic_rules 1)")
    p.add_argument("--fabric", default=None, metavar="PROFILE",
                   help=f"the real fabric the emulation stands for (as for replay; default {fabric.DEFAULT_PRESET})")
    p.add_argument("--datapath", default="auto", choices=("auto", "user", "kernel"))
    p.add_argument("--latency", default="on", choices=("on", "off"),
                   help="the fabric's per-message and per-switch latency on the program's messages, from a "
                   "library preloaded into every rank (default on; off: the links stand for its bandwidth only)")
    p.add_argument("--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop the program after this long (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--nice", type=int_at_least(0, 19), default=DEFAULT_NICE, metavar="N",
                   help=f"niceness of every rank (default {DEFAULT_NICE}: Open MPI busy-polls, and its spinning must "
                   "not starve the datapath; 0 to measure what it costs)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]",
                   help="what every rank runs, e.g. -- emu-allreduce-bench --algo ring --sizes 1MiB")
    admit.add_arguments(p)
    p.add_argument("--cluster", metavar="CLUSTER", default=None,
                   help="spread the network over this cluster file's servers (docs/cluster.md); rank 0's host must "
                        "run on its head")
    p.set_defaults(func=cmd_mpirun)


def mpirun_config(args: argparse.Namespace) -> MpiRunConfig:
    """The run the arguments ask for: its network resolved from ``--topology`` and ``--fabric``
    (:func:`emulator.model.fabric.resolve`; no servers' interconnect for an MPI program)."""
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    network = fabric.resolve(args.topology, fabric_choice(args.fabric, "mpirun"), interconnect=False,
                             where="mpirun: topology")
    return MpiRunConfig(network=network, routing=args.routing, out=args.out, program=tuple(program),
                        seed=args.seed, placement=args.placement, np=args.np,
                        mca=tuple((k, v) for k, v in args.mca), datapath=args.datapath,
                        timeout_s=args.timeout, nice=args.nice, latency=args.latency == "on")


def cmd_mpirun(args: argparse.Namespace) -> int:
    cfg = mpirun_config(args)
    program = list(cfg.program)
    prep = prepare(cfg)
    request = admission.mpirun_request(len(prep.hosts), program, prep.topo, args.timeout)
    cluster = None
    spread = ""
    if args.cluster:
        cluster = ClusterRun(cluster_file.load(args.cluster))
        cluster.cluster.require_private_underlay(f"cluster file {printable(args.cluster)}")
        cluster.cluster.check_mtu(prep.profile.emulated_mtu, f"cluster file {cluster.cluster.name}")
        check_cluster(prep, cluster)
        placed, head = cluster.placement(prep.topo), cluster.cluster.head
        shares = admission.mpi_memory_per_server(prep.hosts, admission.mpi_program_bytes(program), prep.topo,
                                                 placed.of, head)
        request = dataclasses.replace(request, memory=shares[head])
        spread = (f"on cluster {cluster.cluster.name}: {placed.describe(prep.topo, head)}; "
                  f"{admit.check_cluster('mpirun', shares, cluster.cluster)}")
    verdict = admit.check(request, args, echo=lambda line: None)
    require_root()
    interrupt_on_sigterm()
    print(f"mpirun {' '.join(program)}: {len(prep.hosts)} ranks on {prep.topo.spec} ({args.routing} routing, "
          f"placement {args.placement})")
    print(f"# {prep.profile.describe()}")
    if spread:
        print(f"# {spread}")
    for line in verdict.lines:
        print(f"# {line}")
    if prep.latency_on:
        print("# Open MPI's messages get the profile's latency (alpha + switches x switch latency) where they are "
              "received, from a library preloaded into every rank; TCP's round trip stays this machine's own "
              "(docs/fidelity.md)")
    elif has_latency(prep.profile):
        print("# Open MPI's messages get none of the profile's latency (--latency off): the emulated links stand "
              "for the fabric's bandwidth only (docs/fidelity.md)")
    results = run(prep, cluster=cluster)
    print(_closing_line(results))
    return exit_code(results)


def exit_code(results: MpiResults) -> int:
    """The program's exit status; 124 when it ran past --timeout (as timeout(1)), 128+N when signal N ended it."""
    if results.status == "timeout":
        return 124
    status = results.exit_status
    if status is None:
        return 1
    return 128 - status if status < 0 else status


def _closing_line(results: MpiResults) -> str:
    fid = results.fidelity
    idle = f"{fid.cpu_idle:.0%}" if fid is not None and fid.cpu_idle is not None else "unknown"
    load = (f"; CPU idle {idle}, datapath {fid.datapath_load_mbps:.0f} of "
            f"{fid.datapath_capacity_mbps:.0f} Mbit/s" if fid is not None else "")
    return (f"# mpirun {results.status} (exit status {results.exit_status}) in {results.wall_s or 0:.1f} s"
            f"{load}{flag_text(fid)}; results in {results.config['out']}")
