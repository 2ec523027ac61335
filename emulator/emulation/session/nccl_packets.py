"""NCCL's sizes as real packets (live): every cell planned and admitted before a network comes up, then replayed.

:func:`plan` asks :func:`emulator.runs.nccl_packets.packet_cell` what runs at
each predicted size (or why nothing does), writes each cell's schedule into its
own folder under the options' ``out``, picks its emulated NIC rate (given, or
auto: the least dilation this machine's calibration keeps faithful, at most
:data:`~emulator.runs.nccl_packets.LINK_MBPS`) and admits it; a refusal leaves
nothing behind. :func:`run` replays each planned cell
(:func:`emulator.emulation.session.replay.replay`) and returns its median time
back on the real fabric's clock (divided by the dilation, plus NCCL's base
latency, which is not a message) with the cell's trust verdict. ``emu
nccl-tests --packets`` and ``emu bench`` both run through here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from emulator.base.errors import UserError
from emulator.emulation.machine.system import interrupt_on_sigterm, require_root
from emulator.emulation.session.replay import Prepared, ReplayConfig, ReplayFailed, prepare, replay
from emulator.model import fabric, topology
from emulator.model.collectives.generators import generate
from emulator.model.nccl import cost
from emulator.model.nccl.system import System
from emulator.model.schedule import format as schedule_format
from emulator.runs import admission
from emulator.runs.dilation import Envelope, NoDilationFits, choose_dilation
from emulator.runs.nccl_packets import LINK_MBPS, Measured, NotRun, PacketCell, packet_cell

ROUTING = "shortest"
#: This machine's envelope at an MTU (its calibration there, or the documented default).
EnvelopeAt = Callable[[int], Envelope]
#: Admits a request or raises :class:`UserError` (exit 2) saying why not.
Admit = Callable[[admission.Request], object]


@dataclass(frozen=True)
class Options:
    """Where the cells go, their emulated NIC rate (None: auto per cell) and measured repetitions."""

    out: str
    link_mbps: float | None
    repeat: int


@dataclass(frozen=True)
class Gate:
    """What a cell is admitted against: this machine's envelope at an MTU, and the admission of a request."""

    envelope_at: EnvelopeAt
    admit: Admit


@dataclass(frozen=True)
class Planned:
    """One size, admitted: its cell, its replay prepared (schedule written, prediction made)."""

    cell: PacketCell
    prep: Prepared
    config: ReplayConfig


def plan(system: System, collective: str, predictions: list[cost.Prediction], options: Options, gate: Gate
         ) -> tuple[list[Planned], list[NotRun]]:
    """Every cell built, predicted and admitted (:class:`UserError` before anything starts if one does not fit,
    and ``options.out`` as it was)."""
    out = options.out
    if os.path.exists(out) and os.listdir(out):
        raise UserError(f"nccl-tests: field 'out': expected a new or empty directory, got {out!r}")
    created = not os.path.exists(out)
    try:
        return _plan_cells(system, collective, predictions, options, gate)
    except UserError:  # nothing ran: leave nothing behind but what was there
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for name in os.listdir(out):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        raise


def _plan_cells(system: System, collective: str, predictions: list[cost.Prediction], options: Options, gate: Gate
                ) -> tuple[list[Planned], list[NotRun]]:
    planned, skipped = [], []
    for prediction in predictions:
        cell = packet_cell(system, collective, prediction)
        if isinstance(cell, NotRun):
            skipped.append(cell)
            continue
        folder = os.path.join(options.out, f"{prediction.nbytes}B")
        prep, config = _prepared(cell, options.link_mbps or LINK_MBPS, folder, options.repeat)
        env = gate.envelope_at(prep.profile.emulated_mtu)
        if options.link_mbps is None:  # auto: the least dilation at which this cell fits the machine, and no
            # faster than LINK_MBPS: without a calibration at the profile's MTU the envelope is the documented
            # default, which chose 230 Mbit/s for 2 x 1 at 1 MiB on the 2-core machine and lagged (2026-12-07)
            try:
                choice = choose_dilation([prep.report], prep.profile, env, topology.switch_ports(prep.topo))
            except NoDilationFits as exc:
                raise UserError(f"nccl-tests: size {prediction.nbytes}: {exc}") from None
            prep, config = _prepared(cell, min(choice.link_mbps, LINK_MBPS), folder, options.repeat)
        gate.admit(admission.replay_request("nccl-tests", prep.schedule, prep.topo, prep.report, 1 + options.repeat,
                                            prep.profile, env))
        planned.append(Planned(cell, prep, config))
    return planned, skipped


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


def run(planned: list[Planned], echo: Callable[[str], None] = print) -> list[Measured]:
    """Replay every planned cell in turn (root); a failed replay is reported and the others still run."""
    require_root()
    interrupt_on_sigterm()
    return [_run_one(item, echo) for item in planned]


def _run_one(item: Planned, echo: Callable[[str], None]) -> Measured:
    cell, cfg, profile = item.cell, item.config, item.prep.profile
    nbytes, link_mbps = cell.prediction.nbytes, profile.emulated_link_mbps
    echo(f"# packets: {nbytes} B, {cell.collective} over {cell.channels} channels on {item.prep.topo.spec}; "
         f"{profile.describe()}")
    try:
        results = replay(cfg, prep=item.prep, echo=lambda line: None)
    except ReplayFailed as exc:
        echo(f"# packets: {nbytes} B failed: {exc} (partial results in {cfg.out})")
        return Measured(cell.prediction, None, "failed", cfg.out, link_mbps)
    summary = results.summary()
    if summary is None:
        return Measured(cell.prediction, None, "failed", cfg.out, link_mbps)
    real_us = profile.real_seconds(summary.time_s) * 1e6 + cell.base_latency_us
    return Measured(cell.prediction, real_us, summary.verdict.value, cfg.out, link_mbps)
