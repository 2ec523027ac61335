"""The admission options of every command that starts a run, and this machine as :mod:`emulator.runs.admission` sees it.

``--max-time`` and ``--allow-untrusted`` (:func:`add_arguments`), the
policy they make (:func:`policy`), the machine's available memory and
calibrated datapath capacity (:func:`machine`), and :func:`check`, which
refuses a run that does not fit before anything starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from emulator.base.errors import UserError
from emulator.cli.arguments import duration
from emulator.emulation.cluster import cluster_probe, remote_shell
from emulator.emulation.machine import calibration_file, system
from emulator.runs import admission
from emulator.runs.cluster_file import Cluster
from emulator.runs.dilation import Envelope


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--max-time`` and ``--allow-untrusted``."""
    p.add_argument("--max-time", type=duration, default=None, metavar="DURATION",
                   help="refuse a run predicted to take longer, e.g. 2h, 90m, 600s (default 30m; for `emu run`, "
                        "the experiment file's max_time where it has one)")
    p.add_argument("--allow-untrusted", action="store_true",
                   help="run even when the model's load exceeds this machine's calibrated datapath capacity, or "
                        "the agents' work exceeds what its cores keep up with (the results are flagged and not "
                        "trusted)")


def policy(args: argparse.Namespace) -> admission.Policy:
    max_time = args.max_time if args.max_time is not None else admission.DEFAULT_MAX_TIME_S
    return admission.Policy(max_time_s=max_time, allow_untrusted=args.allow_untrusted)


def machine() -> admission.Machine:
    """This machine's memory, available now and in all."""
    available, total = system.memory_available()
    return admission.Machine(available_bytes=available, total_bytes=total, cores=os.cpu_count())


def cluster_machines(cluster: Cluster) -> dict[str, admission.Machine]:
    """Every server's memory and cores, measured on it (the head's here); :class:`UserError` for a server that
    does not answer."""
    machines = {}
    for server in cluster.servers:
        found = cluster_probe.machine(remote_shell.remote_runner(cluster, server))
        if found is None:
            raise UserError(f"cluster {cluster.name}: server {server.name} does not answer (its memory is needed "
                            "before the run): `emu cluster check` says why")
        available, total, cores = found
        machines[server.name] = admission.Machine(available, total, cores)
    return machines


def check_cluster(command: str, estimates: Mapping[str, admission.MemoryEstimate], cluster: Cluster) -> str:
    """Refuse a cluster run (:class:`UserError`, exit 2) when a server's share does not fit its memory; else the
    line of what each takes."""
    machines = cluster_machines(cluster)
    refusals = admission.cluster_memory_refusals(command, estimates, machines)
    if refusals:
        raise UserError("; ".join(refusals))
    return admission.cluster_memory_line(estimates, machines)


def envelope(mtu: int) -> Envelope:
    """What this machine's calibration at ``mtu`` gives an emulation (capacity, agents' costs, cores)."""
    return calibration_file.envelope(calibration_file.load_calibration(mtu), os.cpu_count())


def check(req: admission.Request, args: argparse.Namespace, echo=print) -> admission.Verdict:
    """Refuse ``req`` (:class:`emulator.base.errors.UserError`, exit 2) when it does not fit; else echo what it takes
    and its warnings (each line after ``# ``)."""
    return admission.admit(req, machine(), policy(args), echo)
