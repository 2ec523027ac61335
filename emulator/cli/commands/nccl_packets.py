"""``emu nccl-tests ... --packets``: the sizes NCCL runs as rings or trees, replayed as real packets beside the model.

Per size, :func:`emulator.runs.nccl_packets.packet_cell` says what runs (or
why nothing does); every cell is built, predicted and admitted before the
first network comes up; then each is replayed (:func:`emulator.emulation.session.replay.replay`)
into its own folder under ``--out``, and its median time, back on the real
fabric's clock (divided by the dilation, plus NCCL's base latency), is printed
beside the model's with the cell's trust verdict.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass

from emulator.base.errors import UserError
from emulator.cli.commands import admit
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.emulation.session.replay import Prepared, ReplayConfig, ReplayFailed, prepare, replay
from emulator.model import fabric, topology
from emulator.model.collectives.generators import generate
from emulator.model.nccl import cost
from emulator.model.nccl.system import System
from emulator.model.schedule import format as schedule_format
from emulator.runs import admission
from emulator.runs.dilation import NoDilationFits, choose_dilation
from emulator.runs.nccl_packets import LINK_MBPS, NotRun, PacketCell, packet_cell

ROUTING = "shortest"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--packets", action="store_true",
                   help="also run the sizes NCCL runs as rings or trees as real packets on the emulated fabric (root)")
    p.add_argument("--out", default=None, metavar="DIR", help="--packets: results folder (default "
                   "results/nccl-tests-OP-NxG)")
    p.add_argument("--link-mbps", default="auto", metavar="R",
                   help="--packets: the emulated NIC rate in Mbit/s (the dilation follows), or auto: per size the "
                   f"fastest this machine's calibration keeps faithful, at most {LINK_MBPS:g} (default)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="--packets: measured repetitions (default 3)")
    admit.add_arguments(p)


@dataclass(frozen=True)
class Planned:
    """One size, admitted: its cell, its replay prepared (schedule written, prediction made)."""

    cell: PacketCell
    prep: Prepared
    config: ReplayConfig


@dataclass(frozen=True)
class Measured:
    """One size as packets: its time on the real fabric's clock, and whether it is trusted."""

    prediction: cost.Prediction
    time_us: float | None  # None: the replay failed
    verdict: str
    folder: str

    def to_json(self) -> dict[str, object]:
        return {"size": self.prediction.nbytes, "time_us": self.time_us, "verdict": self.verdict,
                "over_model": None if self.time_us is None else self.time_us / self.prediction.time_us,
                "folder": self.folder}


def out_folder(args: argparse.Namespace, system: System) -> str:
    return args.out or os.path.join("results", f"nccl-tests-{args.op}-{system.nodes}x{system.gpus_per_node}")


def plan(system: System, op: str, predictions: list[cost.Prediction], args: argparse.Namespace
         ) -> tuple[list[Planned], list[NotRun]]:
    """Every cell built, predicted and admitted (:class:`UserError` before anything starts if one does not fit)."""
    rate = link_rate(args.link_mbps)
    if not 1 <= args.repeat <= admission.MAX_REPEAT:
        raise UserError(f"nccl-tests: field 'repeat': expected 1..{admission.MAX_REPEAT}, got {args.repeat!r}")
    out = out_folder(args, system)
    if os.path.exists(out) and os.listdir(out):
        raise UserError(f"nccl-tests: field 'out': expected a new or empty directory, got {out!r}")
    created = not os.path.exists(out)
    try:
        return _plan_cells(system, op, predictions, args, out, rate)
    except UserError:  # nothing ran: leave nothing behind but what was there
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for name in os.listdir(out):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        raise


def _plan_cells(system: System, op: str, predictions: list[cost.Prediction], args: argparse.Namespace, out: str,
                rate: float | None) -> tuple[list[Planned], list[NotRun]]:
    planned, skipped = [], []
    for prediction in predictions:
        cell = packet_cell(system, op, prediction)
        if isinstance(cell, NotRun):
            skipped.append(cell)
            continue
        folder = os.path.join(out, f"{prediction.nbytes}B")
        prep, config = _prepared(cell, rate or LINK_MBPS, folder, args.repeat)
        if rate is None:  # auto: the least dilation at which this cell fits the machine, and no faster than
            # LINK_MBPS: without a calibration at the profile's MTU the envelope is the documented default, which
            # chose 230 Mbit/s for 2 x 1 at 1 MiB on the 2-core machine and lagged (2026-12-07)
            env = admit.envelope(prep.profile.emulated_mtu)
            try:
                choice = choose_dilation([prep.report], prep.profile, env, topology.switch_ports(prep.topo))
            except NoDilationFits as exc:
                raise UserError(f"nccl-tests: size {prediction.nbytes}: {exc}") from None
            prep, config = _prepared(cell, min(choice.link_mbps, LINK_MBPS), folder, args.repeat)
        request = admission.replay_request("nccl-tests", prep.schedule, prep.topo, prep.report, 1 + args.repeat,
                                           prep.profile, admit.envelope(prep.profile.emulated_mtu))
        admit.check(request, args, echo=lambda line: None)
        planned.append(Planned(cell, prep, config))
    return planned, skipped


def link_rate(raw: str) -> float | None:
    """``--link-mbps``: a rate in Mbit/s, or None for auto."""
    if raw == "auto":
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = -1.0
    if not fabric.MIN_LINK_MBPS <= rate <= fabric.MAX_LINK_MBPS:
        raise UserError(f"nccl-tests: field 'link-mbps': expected auto or a rate from {fabric.MIN_LINK_MBPS:g} to "
                        f"{fabric.MAX_LINK_MBPS:g} Mbit/s, got {raw!r}")
    return rate


def _prepared(cell: PacketCell, link_mbps: float, folder: str, repeat: int) -> tuple[Prepared, ReplayConfig]:
    """The cell's schedule written into ``folder``, and the replay of it at ``link_mbps``, prepared."""
    network = fabric.rebuild(cell.topology, cell.at_link_rate(link_mbps))
    topo = network.topology
    schedule = generate(cell.generator, topo, cell.prediction.nbytes, chunks=cell.chunks(len(topo.hosts)),
                        collective=cell.collective)
    config = ReplayConfig(schedule=os.path.join(folder, "schedule.json"), network=network, routing=ROUTING,
                          out=folder, repeat=repeat, warmup=1)
    os.makedirs(folder, exist_ok=True)
    schedule_format.save(schedule, config.schedule)
    return prepare(config), config


def run(planned: list[Planned], echo=print) -> list[Measured]:
    """Replay every planned cell in turn (root); a failed replay is reported and the others still run."""
    require_root()
    interrupt_on_sigterm()
    measured = []
    for item in planned:
        cell, cfg = item.cell, item.config
        profile = item.prep.profile
        echo(f"# packets: {cell.prediction.nbytes} B, {cell.collective} over {cell.channels} channels on "
             f"{item.prep.topo.spec}; {profile.describe()}")
        try:
            results = replay(cfg, prep=item.prep, echo=lambda line: None)
        except ReplayFailed as exc:
            echo(f"# packets: {cell.prediction.nbytes} B failed: {exc} (partial results in {cfg.out})")
            measured.append(Measured(cell.prediction, None, "failed", cfg.out))
            continue
        summary = results.summary()
        if summary is None:
            measured.append(Measured(cell.prediction, None, "failed", cfg.out))
            continue
        real_us = profile.real_seconds(summary.time_s) * 1e6 + cell.base_latency_us
        measured.append(Measured(cell.prediction, real_us, summary.verdict.value, cfg.out))
    return measured
