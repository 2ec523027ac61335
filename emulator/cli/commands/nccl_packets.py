"""``emu nccl-tests ... --packets``: its flags, read into
:class:`emulator.emulation.session.nccl_packets.Options`, and the plan and run
of the sizes NCCL runs as rings or trees, replayed as real packets beside the
model (:mod:`emulator.emulation.session.nccl_packets`).
"""

from __future__ import annotations

import argparse
import os

from emulator.base.errors import UserError
from emulator.cli.commands import admit
from emulator.emulation.session import nccl_packets as packets
from emulator.emulation.session.nccl_packets import Planned
from emulator.model import fabric
from emulator.model.nccl import cost
from emulator.model.nccl.system import System
from emulator.runs import admission
from emulator.runs.nccl_packets import LINK_MBPS, NotRun


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


def options_of(args: argparse.Namespace, system: System) -> packets.Options:
    """The ``--packets`` flags, checked: :class:`UserError` naming the field otherwise."""
    rate = link_rate(args.link_mbps)
    if not 1 <= args.repeat <= admission.MAX_REPEAT:
        raise UserError(f"nccl-tests: field 'repeat': expected 1..{admission.MAX_REPEAT}, got {args.repeat!r}")
    out = args.out or os.path.join("results", f"nccl-tests-{args.op}-{system.nodes}x{system.gpus_per_node}")
    return packets.Options(out, rate, args.repeat)


def plan(system: System, collective: str, predictions: list[cost.Prediction], args: argparse.Namespace
         ) -> tuple[list[Planned], list[NotRun]]:
    """Every cell built, predicted and admitted under ``--max-time`` and ``--allow-untrusted`` (:class:`UserError`
    before anything starts if one does not fit)."""
    return packets.plan(system, collective, predictions, options_of(args, system), gate(args))


def gate(args: argparse.Namespace) -> packets.Gate:
    """This machine's calibration, and admission under ``--max-time`` and ``--allow-untrusted``, silent."""
    return packets.Gate(admit.envelope, lambda request: admit.check(request, args, echo=lambda line: None))


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
