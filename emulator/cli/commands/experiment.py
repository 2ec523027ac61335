"""``emu run FILE [--out DIR] [--check] [--new]`` and ``emu report DIR``: whole experiments and their report.

``emu run`` validates the file and every cell's schedule and prediction
first (``--check`` stops there, starts nothing), then runs the grid with
:class:`emulator.study.live.runner.Runner` on :class:`emulator.emulation.session.replay.ReplaySession`
networks and writes the report (:mod:`emulator.study.report`). Without ``--out`` it
resumes the newest unfinished run of the same experiment under ``results/``
or starts ``results/<name>-<timestamp>/`` (:mod:`emulator.study.folder.results_folder`);
``results/latest`` points at it. Exit
status: 0 all cells ok, 1 some cell failed, 2 bad input, 130 interrupted
(everything finished is kept; the same command resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable

from emulator.base.errors import UserError
from emulator.base.progress import Meter, format_duration
from emulator.cli.arguments import add_cluster_arguments, cluster_run
from emulator.cli.commands import admit
from emulator.emulation.machine import calibration_file, system
from emulator.emulation.machine.calibration_file import Calibration
from emulator.emulation.machine.system import interrupt_on_sigterm
from emulator.emulation.session import fidelity, replay
from emulator.model import routing
from emulator.model.fabric import FabricProfile
from emulator.model.latency import LatencyModel
from emulator.runs import admission
from emulator.runs import mpi_plan as mpi
from emulator.runs.cluster_file import ClusterRun
from emulator.runs.dilation import Envelope
from emulator.selfcheck.live.calibration import ensure_calibration
from emulator.study import experiment as xp
from emulator.study.folder import results_folder
from emulator.study.live import runner

RESULTS_ROOT = "results"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run an experiment file (resumable), then write its report")
    p.add_argument("file", metavar="FILE", help="experiment file, e.g. experiments/default.yaml")
    p.add_argument("--out", metavar="DIR", help="results folder (default: resume the newest unfinished run of "
                   f"this experiment in {RESULTS_ROOT}/, else {RESULTS_ROOT}/<name>-<timestamp>)")
    p.add_argument("--check", action="store_true", help="validate the file and every cell, start nothing")
    p.add_argument("--new", action="store_true", help="start a new results folder even if one is unfinished")
    admit.add_arguments(p)
    add_cluster_arguments(p)
    p.set_defaults(func=cmd_run)

    r = subparsers.add_parser("report", help="(re)write the report of a results folder")
    r.add_argument("dir", metavar="DIR", help="results folder, e.g. results/latest")
    r.set_defaults(func=cmd_report)



def _check_out(out: str | None) -> None:
    """``--out`` must name a folder that is or can become a directory (checked before anything starts)."""
    if out is None:
        return
    if not out or (os.path.exists(out) and not os.path.isdir(out)):
        raise UserError(f"run: field 'out': expected a results folder (a directory, new or of the same "
                        f"experiment), got {out!r}")


def _predicting(cells: int) -> None:
    """Say what the next seconds (minutes, for 64-host training iterations) go to: every cell's proof and model."""
    print(f"proving and predicting {cells} cells ...", flush=True)


def _envelopes(calibrations: dict[int, Calibration | None]) -> Callable[[int], Envelope]:
    """Per MTU, what this machine's calibration there gives an emulation (no calibration: the defaults)."""
    cores = os.cpu_count()
    return lambda mtu: calibration_file.envelope(calibrations.get(mtu), cores)


def _prepare(exp: xp.Experiment, calibrations: dict[int, Calibration | None]
             ) -> tuple[list[xp.PreparedCell], list[xp.RunDilation]]:
    """Every cell proven and predicted with this machine's calibration at its MTU (None: no intrinsic latency),
    the runs under ``dilation: auto`` at the dilation chosen from it; and every run's dilation."""
    cells = xp.expand(exp)
    _predicting(len(cells))

    def latency_of(profile: FabricProfile) -> LatencyModel:
        return fidelity.latency_model(profile, calibrations[profile.emulated_mtu])

    with Meter("proving and predicting", len(cells), "cells") as meter:
        prepared = xp.prepare(exp, cells, latency_of=latency_of, meter=meter)
        return xp.choose_dilations(exp, prepared, _envelopes(calibrations), latency_of, meter)


def _admit(args: argparse.Namespace, prepared: list[xp.PreparedCell], out: str | None,
           calibrations: dict[int, Calibration | None],
           cluster: ClusterRun | None = None) -> tuple[admission.Request, admission.Verdict]:
    """Refuse the cells still to run (every cell without ``out``) when they do not fit this machine (on a
    ``cluster``: each server its share); the load and the agents' work are held against ``calibrations`` (per
    MTU)."""
    folder = results_folder.ResultsFolder(out) if out is not None else None
    todo = [pc for pc in prepared if folder is None or not folder.cell_finished(pc.cell)]
    request = xp.experiment_request(todo, _envelopes(calibrations))
    if cluster is None:
        return request, admit.check(request, args, echo=lambda line: None)
    shares = xp.cluster_memory(todo, lambda topo: cluster.placement(topo).of, cluster.cluster.head)
    line = admit.check_cluster("run", shares, cluster.cluster) if shares else ""
    if shares:
        request = dataclasses.replace(request, memory=shares[cluster.cluster.head])
    verdict = admit.check(request, args, echo=lambda line: None)
    return request, dataclasses.replace(verdict, warnings=(*verdict.warnings, line) if line else verdict.warnings)


def _print_dilations(dilations: list[xp.RunDilation], calibrated: bool) -> None:
    """Each run's dilation: chosen, or the file's own and whether this machine keeps up with it."""
    for d in dilations:
        print(f"# {d.line()}")
    if not calibrated and any(d.auto for d in dilations):
        print("# (no calibration of this machine yet: chosen from the default agent costs and no datapath "
              "capacity; `emu run` calibrates first and chooses again)")


def cmd_run(args: argparse.Namespace) -> int:
    _check_out(args.out)
    exp = xp.load(args.file)
    if args.max_time is None:  # the file knows how long it runs; the command line still overrides it
        args.max_time = exp.max_time_s
    existing = {p.emulated_mtu: calibration_file.load_calibration(p.emulated_mtu) for p in xp.profiles(exp)}
    cluster = cluster_run(args)
    if cluster is not None:  # every network's MTU, before anything starts
        for p in xp.profiles(exp):
            cluster.cluster.check_mtu(p.emulated_mtu, f"cluster file {cluster.cluster.name}")
    if args.check:
        return _check_only(args, exp, existing, cluster)
    out = _results_folder(args, exp)
    prepared, dilations = _prepare(exp, existing)
    _, verdict = _admit(args, prepared, out, existing, cluster)  # memory and time before anything starts; the load where calibrated
    system.require_root()
    if any(pc.cell.mpi is not None for pc in prepared):  # before anything starts: MPI cells need Open MPI's launcher
        system.require_tools([mpi.MPIRUN, "mnexec"])
    # one line, and about a minute per MTU, when this machine has no calibration at an MTU the cells use
    calibrations: dict[int, Calibration | None] = {p.emulated_mtu: ensure_calibration(p) for p in xp.profiles(exp)}
    if any(existing[mtu] is None for mtu in calibrations):  # predict with the new calibration; check the load
        prepared, dilations = _prepare(exp, calibrations)
        _, verdict = _admit(args, prepared, out, calibrations, cluster)
    _make_folder(args, out)
    with open(args.file, encoding="utf-8") as fh:
        text = fh.read()
    interrupt_on_sigterm()
    _print_start(exp, prepared, dilations, verdict, out, cluster)
    results_folder.ResultsFolder(out).write_dilations([d.to_json() for d in dilations])
    factory = replay.on_cluster(cluster) if cluster is not None else replay.ReplaySession
    summary = runner.Runner(exp, out, session_factory=factory, source_text=text, prepared=prepared).run()
    return _finish(summary, out)


def _check_only(args: argparse.Namespace, exp: xp.Experiment, existing: dict[int, Calibration | None],
                cluster: ClusterRun | None) -> int:
    """``emu run --check``: every cell proved and predicted, each network's load, admission; nothing starts."""
    prepared, dilations = _prepare(exp, existing)
    _print_dilations(dilations, all(c is not None for c in existing.values()))  # before a refusal: it explains it
    request, verdict = _admit(args, prepared, args.out, existing, cluster)
    for pc in prepared:
        if pc.report is None:
            _print_mpi_cell(pc)
            continue
        eff = pc.report.scaling_efficiency
        what = (f"scaling efficiency {eff:.3f}" if eff is not None
                else f"busbw {pc.report.to_json()['busbw_mbps']:.2f} Mbit/s")
        print(f"{pc.cell.id}: predicted {pc.predicted_s:.3f} s per repetition, {what}, "
              f"max flows per link {max(pc.report.costs.max_flows_per_link, default=0)}")
    _print_loads(prepared)
    est = request.time_s or 0.0
    n_mpi = sum(pc.report is None for pc in prepared)
    guess = f" (MPI cells: {xp.MPI_ESTIMATE_S:g} s each, a guess: no model predicts them)" if n_mpi else ""
    print(f"{args.file}: ok, experiment {exp.name!r}: {len(prepared)} cells on {_networks(prepared)} networks; "
          f"about {format_duration(est)} if the network met the model{guess}")
    _print_fabrics(prepared)
    for line in verdict.lines:
        print(f"# {line}")
    return 0


def _results_folder(args: argparse.Namespace, exp: xp.Experiment) -> str:
    """Where the run's results go: ``--out`` (new, or a run of the same experiment), else the newest unfinished
    run of this experiment (unless ``--new``), else a new folder under ``results/``."""
    if args.out:
        old = results_folder.ResultsFolder(args.out).read_run()
        if old is not None and old.fingerprint != exp.fingerprint():
            raise UserError(f"run: field 'out': expected a new folder or one of the same experiment, got "
                            f"{args.out!r} (it holds a run of a different experiment file)")
        return str(args.out)
    found = None if args.new else results_folder.find_unfinished(RESULTS_ROOT, exp)
    return found or results_folder.new_out_dir(RESULTS_ROOT, exp.name)


def _make_folder(args: argparse.Namespace, out: str) -> None:
    """Create the results folder (and point ``results/latest`` at it when ``--out`` did not name it)."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise UserError(f"run: field 'out': expected a folder that can be created, got {out!r} ({exc.strerror})") \
            from None
    if not args.out:
        results_folder.point_latest(RESULTS_ROOT, out)


def _print_start(exp: xp.Experiment, prepared: list[xp.PreparedCell], dilations: list[xp.RunDilation],
                 verdict: admission.Verdict, out: str, cluster: ClusterRun | None) -> None:
    """What is about to run: its cells and networks, fabrics, dilations, admission, and the cluster's placement."""
    print(f"experiment {exp.name!r}: {len(prepared)} cells on {_networks(prepared)} networks, results in {out}")
    _print_fabrics(prepared)
    _print_dilations(dilations, True)
    for line in verdict.lines:
        print(f"# {line}")
    if cluster is not None:
        for spec, topo in {pc.topo.spec: pc.topo for pc in prepared}.items():
            print(f"# {spec} on cluster {cluster.cluster.name}: "
                  f"{cluster.placement(topo).describe(topo, cluster.cluster.head)}")


def _finish(summary: runner.Summary, out: str) -> int:
    """The report, the closing lines, and the exit status: 130 interrupted, 1 when a cell failed, else 0."""
    try:
        path = _write_report(out)
        print(f"report: {path}")
    except KeyboardInterrupt:
        print("report not written (interrupted); `emu report DIR` writes it")
    print(f"{summary.status}: {len(summary.ran)} cells run, {len(summary.skipped)} skipped, "
          f"{len(summary.failed)} failed, in {format_duration(summary.wall_s)}")
    for cid, err in summary.failed.items():
        print(f"  failed {cid}: {err}")
    if summary.interrupted:
        return 130
    return 1 if summary.failed else 0


def _print_mpi_cell(pc: xp.PreparedCell) -> None:
    """An MPI cell in ``--check``'s list: what it runs, and that the model has nothing to say about it."""
    cell = pc.cell
    assert cell.mpi is not None
    print(f"{cell.id}: runs the MPI program `{cell.mpi.command()}` on {cell.ranks} ranks ({cell.placement} "
          "placement); no model prediction (the timing model predicts schedules only)")


def _print_loads(prepared: list[xp.PreparedCell]) -> None:
    """Per network, the model's busiest step against this machine's calibrated datapath capacity."""
    by_group: dict[tuple[str, str, int, str], list[xp.PreparedCell]] = {}
    for pc in prepared:
        by_group.setdefault(pc.cell.group, []).append(pc)
    for (spec, policy, seed, _), all_pcs in by_group.items():
        pcs = [pc for pc in all_pcs if pc.report is not None]
        if not pcs:
            print(f"network {spec} ({policy}{routing.seed_words(policy, seed)}): "
                  f"{len(all_pcs[0].topo.hosts)} hosts, MPI programs only (no model of their load)")
            continue
        busiest = max(pcs, key=lambda pc: pc.peak_load_mbps())
        calibration = calibration_file.load_calibration(busiest.cell.fabric.emulated_mtu)
        capacity = calibration.datapath_capacity_mbps if calibration is not None else None
        share = f", {busiest.peak_load_mbps() / capacity:.0%} of the calibrated {capacity:.0f}" if capacity else \
            " (no calibration at this MTU: `emu calibrate`)"
        print(f"network {spec} ({policy}{routing.seed_words(policy, seed)}): {len(pcs[0].topo.hosts)} "
              f"hosts, busiest step {busiest.peak_load_mbps():.0f} switch-hop Mbit/s{share} "
              f"({busiest.cell.id})")


def _networks(prepared: list[xp.PreparedCell]) -> int:
    """How many networks the cells come up on (after ``dilation: auto`` chose their rates)."""
    return len(xp.groups([pc.cell for pc in prepared]))


def _print_fabrics(prepared: list[xp.PreparedCell]) -> None:
    """Every fabric profile the cells emulate (the chosen dilations included), in file order."""
    for profile in dict.fromkeys(pc.cell.fabric for pc in prepared):
        print(f"fabric: {profile.describe()}")


def cmd_report(args: argparse.Namespace) -> int:
    expected = "a results folder of `emu run` (with its experiment.json)"
    if not results_folder.ResultsFolder(args.dir).has_plan():
        raise UserError(f"report: field 'dir': expected {expected}, got {args.dir!r}")
    try:
        path = _write_report(args.dir)
    except (LookupError, TypeError, ValueError, AttributeError, FileNotFoundError) as exc:
        # a results folder damaged by hand: say which, in one line, rather than a traceback
        raise UserError(f"report: field 'dir': expected {expected} and intact cell results, got {args.dir!r} "
                        f"({type(exc).__name__}: {exc})") from None
    print(f"report: {path}")
    return 0


def _write_report(out: str) -> str:
    """Write the report of the results folder ``out``; returns report.md's path."""
    from emulator.study import (
        report,  # here, not at the top: `emu --help` and `emu run --check` need no report or plots
    )

    with Meter("writing the report, with the model's projections to 1024 accelerators"):
        return report.write_report(out)
