"""``emu schedule gen|check|import``: schedules of collectives as data (see docs/schedule-format.md).

``gen`` writes one collective's schedule, or with ``--model`` one
data-parallel training iteration (:mod:`emulator.model.workloads.training`)
or one hybrid-parallel language-model iteration
(:mod:`emulator.model.workloads.llm`, with ``--tp/--pp/--dp``).
``check`` exits 0 when the schedule is proved to compute its collective(s),
1 when it is well formed but wrong (deadlock, double counting, race...), 2
for malformed input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from emulator.base.errors import FieldError
from emulator.base.progress import Meter
from emulator.cli.arguments import fabric_choice, int_at_least, number
from emulator.cli.commands import admit
from emulator.emulation.machine import calibration_file
from emulator.emulation.session import fidelity
from emulator.model import fabric, routing, topology
from emulator.model.collectives import msccl
from emulator.model.collectives.generators import generate
from emulator.model.collectives.placements import PLACEMENTS
from emulator.model.collectives.registry import GENERATED, algorithms, check_topology_groups
from emulator.model.prediction.check import check
from emulator.model.schedule import format as fmt
from emulator.model.schedule.semantics import ALLREDUCE, MEANINGS
from emulator.model.workloads import chakra, llm, llm_models, training
from emulator.runs import admission
from emulator.runs.admission import MAX_SEED


def register(subparsers: argparse._SubParsersAction) -> None:
    sched = subparsers.add_parser("schedule", help="generate, check and import schedules of collectives")
    sub = sched.add_subparsers(dest="schedule_command", metavar="SUBCOMMAND")
    sub.required = True

    gen = sub.add_parser("gen", help="generate a collective's schedule (default allreduce) for every host of a "
                         "topology")
    gen.add_argument("--algo", metavar="ALGO",
                     help="; ".join(f"{', '.join(algorithms(c))} for {c}" for c in GENERATED)
                     + f"; with a language model, the data-parallel one: {', '.join(llm.DP_ALGOS)} (default ring)")
    gen.add_argument("--collective", default=ALLREDUCE, choices=GENERATED, metavar="COLLECTIVE",
                     help=f"one of {', '.join(GENERATED)} (default allreduce)")
    gen.add_argument("--root", type=int_at_least(0), default=0, metavar="N",
                     help="the root rank of broadcast and reduce (default 0)")
    gen.add_argument("--topology", required=True, metavar="SPEC", help="topology spec or exported JSON file")
    gen.add_argument("--size", metavar="SIZE",
                     help="bytes of every rank's data buffer (nccl-tests' size), e.g. 64KiB, 16MiB, 1MB")
    gen.add_argument("--model", choices=(*training.MODELS, *llm_models.MODELS), metavar="MODEL",
                     help=f"instead of --size: one data-parallel training iteration of {', '.join(training.MODELS)} "
                     "(forward, backward per layer, DDP's bucketed allreduces overlapping it), or one Megatron-LM "
                     f"iteration of {', '.join(llm_models.MODELS)} (with --tp, --pp, --dp)")
    gen.add_argument("--batch", type=int_at_least(1), metavar="N",
                     help=f"--model: samples per accelerator (default {training.DEFAULT_BATCH})")
    _add_llm_arguments(gen)
    gen.add_argument("--scale", type=number(training.SCALE_EXPECTED, lambda x: 1 <= x <= training.MAX_SCALE), default=1.0, metavar="S",
                     help="--model: divide every gradient and compute time by S, to keep emulated runs short "
                     "(check and replay divide the fabric's latencies by S as well)")
    gen.add_argument("--placement", metavar="P", help=f"one of {', '.join(PLACEMENTS)} "
                     "(default: hdrm for --algo hdrm, else identity)")
    gen.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=0, metavar="S", help="seed of the random placement")
    gen.add_argument("--chunks", type=int_at_least(1, fmt.MAX_CHUNKS), metavar="N", help="number of chunks (default: the algorithm's own)")
    gen.add_argument("-o", "--output", required=True, metavar="FILE", help="file to write (.json: JSON, else YAML)")
    gen.set_defaults(func=cmd_gen)

    chk = sub.add_parser("check", help="prove a schedule computes its collective; predict contention and time")
    chk.add_argument("file", metavar="FILE")
    chk.add_argument("--topology", metavar="SPEC", help="topology spec or JSON (default: the schedule's own)")
    chk.add_argument("--routing", default="shortest", metavar="POLICY",
                     help=f"one of {', '.join(routing.POLICIES)} (default: shortest)")
    chk.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=0, metavar="S", help="seed of hash-based routing")
    chk.add_argument("--fabric", default=None, metavar="PROFILE",
                     help=f"the real fabric the emulation stands for: a preset ({', '.join(fabric.PRESETS)}) or "
                     f"key=value,... of {', '.join(fabric.KEYS)} (default {fabric.DEFAULT_PRESET}); a topology "
                     "whose host links have a rate of their own maps it onto them, as for replay")
    chk.add_argument("--gamma", type=number("a finite number >= 0", lambda x: 0 <= x < math.inf), default=0.0,
                     metavar="S_PER_BYTE",
                     help="reduction cost in seconds per byte (default 0)")
    chk.add_argument("--json", action="store_true", help="print one JSON object")
    chk.set_defaults(func=cmd_check)

    imp = sub.add_parser("import", help="convert an MSCCL XML algorithm or Chakra traces to a schedule")
    imp.add_argument("files", nargs="+", metavar="FILE", help="one MSCCL .xml, or the <prefix>.<rank>.et files")
    imp.add_argument("-o", "--output", required=True, metavar="OUT")
    imp.add_argument("--size", metavar="SIZE", help="MSCCL: bytes per rank (default: about 1 MiB)")
    imp.add_argument("--instances", type=int_at_least(1), default=1, metavar="N",
                     help="MSCCL: replicate the algorithm N times, as msccl-tools' instances do (default 1)")
    imp.add_argument("--algo", default="ring", metavar="ALGO",
                     help="Chakra: generator to expand its collectives with (default ring; direct for alltoall)")
    imp.add_argument("--index", type=int_at_least(0), default=None, metavar="K",
                     help="Chakra: only the K-th collective node (from 0, every collective type counted); default: "
                     "the whole trace as recorded")
    imp.add_argument("--placement", metavar="P", help=f"Chakra: placement of the generated collectives' ranks "
                     f"(one of {', '.join(PLACEMENTS)})")
    imp.add_argument("--topology", metavar="SPEC", help="Chakra: topology (default star:hosts=<ranks>)")
    imp.add_argument("--ranks", type=int_at_least(2), default=None, metavar="N",
                     help="Chakra: replicate one rank's trace file to N ranks (one rank of a symmetric data-parallel "
                     "job; its collectives span all N)")
    imp.add_argument("--scale", type=number(training.SCALE_EXPECTED, lambda x: 1 <= x <= training.MAX_SCALE), default=1.0, metavar="S",
                     help="Chakra: divide every size and compute time by S (>= 1), as a training iteration's "
                     "--scale does; replays divide the fabric's latencies alike (default 1)")
    imp.set_defaults(func=cmd_import)


def _add_llm_arguments(gen: argparse.ArgumentParser) -> None:
    """``gen``'s options for a language model (:mod:`emulator.model.workloads.llm`); None: not given."""
    for flag, what in (("--tp", "tensor"), ("--pp", "pipeline"), ("--dp", "data")):
        gen.add_argument(flag, type=int_at_least(1), metavar="N", help=f"language model: {what}-parallel size "
                         "(tp x pp x dp = the topology's hosts)")
    gen.add_argument("--ep", type=int_at_least(1), metavar="E", help="language model: expert-parallel size, "
                     "dividing dp and the experts (default 1)")
    gen.add_argument("--microbatches", type=int_at_least(1), metavar="M",
                     help=f"language model: microbatches per iteration (default {llm.DEFAULT_MICROBATCHES})")
    gen.add_argument("--micro-batch", type=int_at_least(1), metavar="B",
                     help="language model: sequences per microbatch (default 1)")
    gen.add_argument("--sequence-parallel", action="store_true", default=None,
                     help="language model: Megatron's sequence parallelism (reduce-scatter and all-gather pairs)")
    gen.add_argument("--tp-algo", metavar="ALGO", help="language model: the tensor-parallel collectives' "
                     "algorithm (default ring)")
    gen.add_argument("--layers-per-collective", type=int_at_least(1), metavar="K",
                     help="language model: treat every K layers of a stage as one (one compute op and one "
                     "collective of K layers' bytes each): K times fewer collectives, same bytes (default 1)")
    gen.add_argument("--accelerator", choices=tuple(llm_models.ACCELERATORS), metavar="NAME",
                     help=f"language model: one of {', '.join(llm_models.ACCELERATORS)} (default a100)")
    gen.add_argument("--placement-file", metavar="FILE",
                     help="language model: YAML or JSON list of hosts, the host of rank 0, 1, ... (default "
                     "Megatron's rank order on the topology's hosts)")


_LLM_OPTIONS = ("tp", "pp", "dp", "ep", "microbatches", "micro_batch", "sequence_parallel", "tp_algo",
                "layers_per_collective", "accelerator", "placement_file")


#: The language-model generator's field names as the command line spells its options (``micro_batch`` is
#: ``--micro-batch``, its ``dp_algo`` is ``--algo``): an error names the flag the user typed.
_LLM_FLAGS = {**{name: name.replace("_", "-") for name in _LLM_OPTIONS}, "dp_algo": "algo", "scale": "scale"}


def _llm_gen(args: argparse.Namespace, where: str) -> fmt.Schedule:
    """``gen --model`` of a language model (:func:`emulator.model.workloads.llm.gen`)."""
    for name, default in (("size", None), ("chunks", None), ("collective", ALLREDUCE), ("root", 0),
                          ("batch", None), ("placement", None), ("seed", 0)):
        if getattr(args, name) != default:
            raise FieldError(where, name, f"nothing with --model {args.model} (use --tp, --pp, --dp, --micro-batch "
                             "and --placement-file)", getattr(args, name))
    for name in ("tp", "pp", "dp"):
        if getattr(args, name) is None:
            raise FieldError(where, name, f"--{name} N for --model {args.model}", "nothing")
    given = {k: getattr(args, k) for k in _LLM_OPTIONS[3:] if getattr(args, k) is not None}
    try:
        return llm.gen(args.model, topology.load(args.topology), tp=args.tp, pp=args.pp, dp=args.dp,
                       dp_algo=args.algo or "ring", scale=args.scale, **given)
    except FieldError as exc:
        flag = _LLM_FLAGS.get(exc.field) if exc.where == llm.WHERE else None
        if flag is None:
            raise
        raise FieldError(where, flag, exc.expected, exc.given) from None


def _summary(s: fmt.Schedule) -> str:
    return (f"{s.algorithm}, {s.p} ranks, {fmt.format_size(s.size)} in {s.chunks} chunks, {s.steps} steps, "
            f"{sum(len(r.ops) for r in s.ranks)} ops")


def _check_output(path: str, where: str) -> None:
    """Refuse an output path that can never be a file, before any work."""
    if not path or os.path.isdir(path):
        raise FieldError(where, "output", "the name of a file to write", path)


def _save(sched: fmt.Schedule, path: str, where: str) -> None:
    try:
        fmt.save(sched, path)
    except OSError as exc:
        raise FieldError(where, "output", "a file that can be written", f"{path} ({exc.strerror})") from None


def gen_schedule(args: argparse.Namespace) -> fmt.Schedule:
    """The schedule ``emu schedule gen`` writes, from its parsed options (raises :class:`FieldError`)."""
    where = "schedule gen"
    if args.model in llm_models.MODELS:
        return _llm_gen(args, where)
    for name in _LLM_OPTIONS:
        if getattr(args, name) is not None:
            raise FieldError(where, name, "a language model to go with it (--model "
                             f"{' or '.join(llm_models.MODELS)})", getattr(args, name))
    if args.algo is None:
        raise FieldError(where, "algo", "an algorithm (--algo ALGO)", "nothing")
    if args.model is None:
        for name in ("batch",):
            if getattr(args, name) is not None:
                raise FieldError(where, name, "--model to go with it", getattr(args, name))
        if args.scale != 1.0:
            raise FieldError(where, "scale", "--model to go with it", args.scale)
        if args.size is None:
            raise FieldError(where, "size", "a size such as 16MiB (or --model)", "nothing")
    else:
        for name, default in (("size", None), ("chunks", None), ("collective", ALLREDUCE), ("root", 0)):
            if getattr(args, name) != default:
                raise FieldError(where, name, f"nothing with --model (a {args.model} iteration allreduces its "
                                 "gradients in its own buckets)", getattr(args, name))
    topo = topology.load(args.topology)
    check_topology_groups(args.collective, args.algo, topo, where, "algo")
    if args.model is not None:
        return training.gen(args.model, args.algo, topo, batch=args.batch, scale=args.scale,
                            placement=args.placement, seed=args.seed)
    size = fmt.parse_size(args.size, where, "size", fmt.MAX_MESSAGE_BYTES)
    return generate(args.algo, topo, size, placement=args.placement, seed=args.seed, chunks=args.chunks,
                    collective=args.collective, root=args.root)


def cmd_gen(args: argparse.Namespace) -> int:
    _check_output(args.output, "schedule gen")
    sched = gen_schedule(args)
    _save(sched, args.output, "schedule gen")
    what = "" if sched.collective == ALLREDUCE else f"{sched.collective} "
    print(f"wrote {args.output}: {what}{_summary(sched)}")
    for line in llm.describe(sched) if sched.meta.get("generator") == "llm" else ():
        print(line)
    note = memory_note(sched, args, admit.machine())
    if note:
        print(note, file=sys.stderr)
    return 0


def memory_note(sched: fmt.Schedule, args: argparse.Namespace, machine: admission.Machine) -> str | None:
    """What ``gen`` says (on stderr) of a schedule whose replay would not fit this machine's memory: what its
    buffers need, what the machine gives, and the ``--scale`` (or ``--size``) that fits. A warning, not a
    refusal: projections, ``emu schedule check`` and ``emu run --check`` need no buffers, and a cluster spreads
    them over servers; ``emu replay`` and ``emu run`` refuse it before anything starts (admission)."""
    if not sched.topology:
        return None
    topo = topology.load(sched.topology)
    over = admission.buffers_over(sched, topo, machine)
    if over is None:
        return None
    need = admission.format_bytes(admission.replay_memory(sched, topo).total_bytes)
    if math.isinf(over):
        what = "not even its agents and network fit: use fewer ranks or a cluster"
    elif args.model is not None:
        fits = _round_up(args.scale * over * MEMORY_MARGIN)
        what = (f"--scale {fits:g} would fit" if fits <= training.MAX_SCALE
                else f"no --scale up to {training.MAX_SCALE:,.0f} fits: use fewer ranks or a cluster")
    else:
        size = math.floor(sched.size / (over * MEMORY_MARGIN))
        what = f"--size {fmt.format_size(size - size % admission.MiB if size > admission.MiB else max(size, 1))} would fit"
    return (f"emu: schedule gen: note: a replay of {args.output} needs {need} of memory ({sched.p} agents and "
            f"their buffers), this machine can give {admission.format_bytes(machine.usable_bytes)}: {what} "
            "(projections and checks need no buffers; emu replay and emu run refuse it as it is)")


#: What a suggested scale or size leaves for rounding (sizes are rounded up to whole elements and padded).
MEMORY_MARGIN = 1.1


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits."""
    digits = 10 ** max(0, math.floor(math.log10(x)) - 1)
    return math.ceil(x / digits) * digits


def check_network(args: argparse.Namespace, sched: fmt.Schedule, choice: fabric.FabricChoice) -> fabric.Resolved:
    """The network ``check`` predicts on: ``--topology``, else the schedule's own, with the user's fabric
    (:func:`emulator.model.fabric.resolve`)."""
    spec = args.topology or sched.topology
    if not spec:
        raise FieldError(f"schedule {args.file!r}", "topology", "a topology in the file or --topology SPEC",
                         "nothing")
    return fabric.resolve(spec, choice, where="schedule check: topology")


def cmd_check(args: argparse.Namespace) -> int:
    choice = fabric_choice(args.fabric, "schedule check")
    sched = fmt.load(args.file)
    network = check_network(args, sched, choice)
    profile = fabric.for_workload_scale(network.profile, training.workload_scale(sched))
    topo = network.topology
    routing.check_policy(topo, args.routing)
    where = f"schedule {args.file!r}"
    fmt.check_hosts(sched, topo, where)
    model = fidelity.latency_model(profile, calibration_file.load_calibration(profile.emulated_mtu))
    report = check(sched, topo, args.routing, seed=args.seed, latency=model, gamma=args.gamma,
                   mtu=profile.emulated_mtu, where=where)
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
        return 0 if report.valid else 1
    data = report.to_json()
    print(f"schedule   {args.file}: {_summary(sched)}")
    print(f"topology   {topo.spec}, routing {args.routing} (seed {args.seed})")
    print(f"fabric     {profile.describe()}")
    print(f"latency    intrinsic: {model.intrinsic.source}"
          + (f"; this machine cannot reach the profile's latency on paths of {report.latency_floors()} switches "
             "(latency_floor)" if report.latency_floors() else ""))
    what = "schedule of collectives" if len(sched.shapes) > 1 else sched.collective
    if report.valid:
        print(f"proof      valid {what}: {_proved(sched)}")
    else:
        print(f"proof      NOT a correct {what} ({len(report.execution.errors)} problem(s)):")
        for err in report.execution.errors[:10]:
            print(f"  - {err}")
    print(f"{'step':>5} {'xfers':>6} {'bytes':>10} {'flows/link':>10} {'alpha-beta s':>13} {'max-min s':>11} "
          f"{'model s':>9}  busiest")
    for st in data["per_step"]:
        busy = ", ".join(f"{a}->{b}:{n}" for (a, b), n in
                         ((tuple(x["link"]), x["flows"]) for x in st["busiest_links"]))
        span = f"{st['time_s']:>9.4f}" if st["time_s"] is not None else f"{'-':>9}"
        print(f"{st['step']:>5} {st['transfers']:>6} {st['bytes']:>10} {st['max_flows_per_link']:>10} "
              f"{st['alpha_beta_s']:>13.6f} {st['maxmin_s']:>11.6f} {span}  {busy}")
    print(f"steps      lockstep sums: alpha-beta {data['alpha_beta_time_s']:.6f} s, max-min fair "
          f"{data['maxmin_time_s']:.6f} s")
    if report.valid:
        print(f"predicted  {data['time_s']:.6f} s emulated (busbw {data['busbw_mbps']:.2f} Mbit/s) = "
              f"{data['real_time_s'] * 1e6:.1f} us on the real fabric (busbw {data['real_busbw_gbps']:.1f} Gbit/s)")
    if report.valid and report.compute_only_s is not None and report.scaling_efficiency is not None:
        print(f"iteration  compute alone {report.compute_only_s:.3f} s emulated, with communication "
              f"{report.iteration_time_s:.3f} s: scaling efficiency {report.scaling_efficiency:.3f}")
    return 0 if report.valid else 1


def _proved(sched: fmt.Schedule) -> str:
    """What the proof established, in words."""
    if len(sched.shapes) > 1:
        return f"each of its {len(sched.shapes)} segments computes its collective, each contribution once"
    meaning = MEANINGS.get(sched.collective)
    return meaning.result if meaning is not None else "it computes its collective"


def cmd_import(args: argparse.Namespace) -> int:
    files = args.files
    _check_output(args.output, "schedule import")
    if all(f.lower().endswith(".xml") for f in files):
        if len(files) != 1:
            raise FieldError("schedule import", "FILE", "one MSCCL XML file", f"{len(files)} files")
        if args.ranks is not None:
            raise FieldError("schedule import", "ranks", "no --ranks for MSCCL (the XML gives its ranks)", args.ranks)
        if args.scale != 1:
            raise FieldError("schedule import", "scale", "no --scale for MSCCL (--size gives its size)", args.scale)
        size = fmt.parse_size(args.size, "schedule import", "size", fmt.MAX_MESSAGE_BYTES) if args.size else None
        with Meter(f"importing the MSCCL algorithm {files[0]}"):
            sched = msccl.load(files[0], size, instances=args.instances)
    elif all(f.lower().endswith(".et") for f in files):
        if args.size:
            raise FieldError("schedule import", "size", "no --size for Chakra traces (comm_size gives it)",
                             args.size)
        with Meter(f"importing {len(files)} Chakra trace file{'s' if len(files) > 1 else ''}"):
            sched = chakra.load(files, algo=args.algo, index=args.index, topology=args.topology,
                                placement=args.placement, ranks=args.ranks, scale=args.scale)
    else:
        raise FieldError("schedule import", "FILE", "one MSCCL .xml file or Chakra .et files", " ".join(files))
    with Meter(f"writing {args.output}"):
        _save(sched, args.output, "schedule import")
    print(f"wrote {args.output}: {_summary(sched)}")
    for line in chakra.notes(sched.meta) if sched.meta.get("imported_from") == "chakra" else ():
        print(line)
    return 0
