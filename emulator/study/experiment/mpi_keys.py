"""The ``mpi:`` key of an experiment file's run: an Open MPI program as the run's workload.

A run with ``mpi:`` has no ``algorithms`` (nor the other keys of
:data:`MPI_EXCLUDES`); its program, ``np``, ``mca``, ``nice`` and
``timeout_s`` are checked here with :mod:`emulator.runs.mpi_plan`'s functions,
as ``emu mpirun`` checks its command line (the program is found, the bundled
benchmark's arguments parse), and the run's placements must fit its ranks.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from emulator.base.errors import MAX_LINE, MISSING, FieldError, UserError, int_field, printable, shorten
from emulator.model import topology
from emulator.model.collectives.placements import PLACEMENTS
from emulator.model.fabric import FabricProfile
from emulator.runs import allreduce_bench as mpi_bench
from emulator.runs import mpi_plan as mpi
from emulator.study.experiment.cells import MpiProgram, Run
from emulator.study.experiment.fields import choices_field, mapping_field, reject_unknown, seeds_field

MPI_KEYS = ("program", "np", "mca", "nice", "timeout_s")
#: Keys of a run that an MPI run cannot have: its program is its workload (and has its own sizes).
MPI_EXCLUDES = ("algorithms", "collective", "model", "batch", "scale", "faults", "sizes")
MAX_MPI_TIMEOUT_S = 7 * 86400.0


def reject_beside_mpi(where: str, rp: str, run: Mapping[str, Any]) -> None:
    """An MPI run at field ``rp`` has none of :data:`MPI_EXCLUDES`."""
    for key in MPI_EXCLUDES:
        if key in run:
            raise FieldError(where, f"{rp}.{key}", "nothing beside mpi: an MPI run's program is its workload "
                             "(with its own sizes)", run[key])




def mpi_run(where: str, rp: str, run: Mapping[str, Any], topo: topology.Topology, policies: tuple[str, ...],
             rprofile: FabricProfile | None) -> Run:
    """An MPI run (``mpi:`` instead of ``algorithms``): its placements fit the program's ranks."""
    if topo.has_domain:
        raise FieldError(where, f"{rp}.topology", "a spec without domain_bw (an MPI program's ranks of one server "
                         "talk through the server's switch; the interconnect is for replays)", topo.spec)
    placements = (choices_field(where, f"{rp}.placements", run["placements"], PLACEMENTS)
                  if "placements" in run else ("identity",))
    program = mpi_program(where, f"{rp}.mpi", run["mpi"], topo)
    for i, placement in enumerate(placements):
        try:
            hosts = mpi.rank_hosts(topo, placement, program.np)
        except FieldError as exc:
            name = f"{rp}.placements[{i}]" if exc.field == "placement" else f"{rp}.mpi.{exc.field}"
            raise FieldError(where, name, exc.expected, exc.given) from None
        if len(hosts) < 2:
            raise FieldError(where, f"{rp}.mpi.np", "at least 2 ranks", len(hosts))
    return Run(topology=topo.spec, routing=policies, algorithms=(), placements=placements,
               seeds=seeds_field(where, f"{rp}.seeds", run["seeds"]) if "seeds" in run else None,
               fabric=rprofile, mpi=program)


def _own_bin() -> str:
    """This emulator's scripts (the venv's bin), where the bundled MPI programs are; as
    :func:`emulator.emulation.mpi.mpi_run.own_bin` (a live module this one does not import) finds them."""
    return os.path.dirname(sys.executable)


def mpi_program(where: str, mp: str, value: object, topo: topology.Topology) -> MpiProgram:
    """The ``mpi`` mapping at field ``mp``, checked with :mod:`emulator.runs.mpi_plan`'s functions as ``emu mpirun``
    checks its command line (the program is found, the bundled benchmark's arguments parse)."""
    raw = mapping_field(where, mp, value)
    reject_unknown(where, f"{mp}.", raw, MPI_KEYS)
    if "program" not in raw:
        raise FieldError(where, f"{mp}.program", "a program and its arguments, e.g. [emu-allreduce-bench, --algo, "
                         "ring, --sizes, 1MiB]", MISSING)
    program = _program(where, f"{mp}.program", raw["program"])
    np = int_field(where, f"{mp}.np", raw["np"], 2) if raw.get("np") is not None else None
    if np is not None:
        try:
            mpi.rank_hosts(topo, "identity", np)
        except FieldError as exc:
            raise FieldError(where, f"{mp}.{exc.field}", exc.expected, exc.given) from None
    mca = _mca(where, f"{mp}.mca", raw["mca"]) if "mca" in raw else ()
    nice = int_field(where, f"{mp}.nice", raw["nice"], 0, 19) if "nice" in raw else mpi.DEFAULT_NICE
    timeout = raw.get("timeout_s", mpi.DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_MPI_TIMEOUT_S:
        raise FieldError(where, f"{mp}.timeout_s", f"seconds > 0 (at most {MAX_MPI_TIMEOUT_S:g}) for the whole "
                         f"program, or leave it out ({mpi.DEFAULT_TIMEOUT_S:g})", timeout)
    return MpiProgram(program=program, np=np, mca=mca, nice=nice, timeout_s=float(timeout))


def _program(where: str, name: str, value: object) -> tuple[str, ...]:
    """``program``: a list of words or one string split as a shell would (no shell runs it); the first word a
    program :func:`emulator.runs.mpi_plan.resolve_program` finds; the bundled benchmark's arguments as it parses them."""
    expected = "a program and its arguments: a list of strings or one string, e.g. emu-allreduce-bench --algo ring"
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise FieldError(where, name, f"{expected} ({exc})", value) from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise FieldError(where, name, expected, value)
    if not words:
        raise FieldError(where, name, expected, value)
    for i, word in enumerate(words):
        if not word.isprintable() or (i == 0 and not word.strip()):
            raise FieldError(where, name, "printable words (one line each), a program first", word)
    try:
        mpi.resolve_program(words[0], own_bin=_own_bin())
    except FieldError as exc:
        raise FieldError(where, name, exc.expected, exc.given) from None
    if os.path.basename(words[0]) == mpi.BENCH_PROGRAM:
        _bench_arguments(where, name, words[1:])
    return tuple(words)


def _bench_arguments(where: str, name: str, args: list[str]) -> None:
    """The bundled benchmark's arguments parse (the cell's folder gets its ``--json``, so none is given)."""
    if any(a == "-h" or (a.startswith("--h") and "--help".startswith(a.split("=", 1)[0])) for a in args):
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments that run it (not --help)", "--help")
    try:
        # argparse prints and exits for a help option it still finds (in a cluster of short options)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            options = mpi_bench.parse_args(args)
    except SystemExit:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments that run it (not --help)", " ".join(args)) \
            from None
    except FieldError as exc:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments: --{exc.field} must be {exc.expected}",
                         exc.given) from None
    except UserError as exc:
        raise UserError(f"{printable(where)}: field '{printable(name)}': {shorten(printable(exc), MAX_LINE)}") from None
    if options.json_path is not None:
        raise FieldError(where, name, f"{mpi.BENCH_PROGRAM} arguments without --json (emu run collects its rows "
                         f"into the cell's {mpi.BENCH_JSON})", options.json_path)


def _mca(where: str, name: str, value: object) -> tuple[tuple[str, str], ...]:
    """``mca``: Open MPI parameters and their values, as :func:`emulator.runs.mpi_plan.parse_mca` checks ``--mca``."""
    raw = mapping_field(where, name, value)
    pairs: list[tuple[str, str]] = []
    for key, val in raw.items():
        if not isinstance(key, str) or isinstance(val, bool) or not isinstance(val, str | int | float):
            raise FieldError(where, f"{name}.{key}", "a parameter name and a value (a string or a number)", val)
        try:
            pairs.extend(mpi.parse_mca([(key, str(val))]))
        except FieldError as exc:
            raise FieldError(where, f"{name}.{key}", exc.expected, exc.given) from None
    return tuple(pairs)
