"""Cell kinds: one interface through which the runner, the run folder and the report treat every cell.

An experiment's cells are of a kind: a replay of a schedule
(:mod:`~emulator.study.cell_kinds.replay`) or a run of an Open MPI program
(:mod:`~emulator.study.cell_kinds.mpi`). Each kind implements
:class:`~emulator.study.cell_kinds.base.CellKind`: how its cell runs on a started
network, how its ``results.json`` is read and saved, how a probe or a broken
network flags it, its progress line, and its row in the report and in
``cells.csv``. :class:`~emulator.study.cell_kinds.base.Kinds` picks a cell's kind
(the first of its tuple that claims it); :data:`DEFAULT_KINDS` are ``emu
run``'s and ``emu report``'s.

Adding a kind touches one place per layer:

* the study: a module here with a class implementing ``CellKind`` (and its
  row type), added to :data:`DEFAULT_KINDS` (and to :func:`run_kinds` when it
  runs through something live, as the MPI kind does). The runner
  (:mod:`emulator.study.live.runner`), the run folder
  (:mod:`emulator.study.folder.results_folder`) and the report's rows and ``cells.csv``
  (:mod:`emulator.study.report.rows`) go through the interface only: the new
  kind's cells run, resume, appear in the overview, the fidelity list and
  ``cells.csv`` with no change there;
* the experiment file: the keys that make cells of the kind
  (:mod:`emulator.study.experiment`);
* the report, if the kind has a section of its own: a function in
  :mod:`emulator.study.report.sections` called from
  :func:`emulator.study.report.build` on the kind's rows.

Pure: a kind that runs through something live (an MPI program) is given its
runner by the runner.
"""

from __future__ import annotations

from emulator.study.cell_kinds.base import (
    CSV_FIELDS,
    CellKind,
    Kinds,
    PlanDefaults,
    Results,
    Row,
    Session,
    read_fabric,
)
from emulator.study.cell_kinds.mpi import MpiCellRunner, MpiKind, MpiRow
from emulator.study.cell_kinds.replay import CellRow, ReplayKind

__all__ = ["CSV_FIELDS", "DEFAULT_KINDS", "CellKind", "CellRow", "Kinds", "MpiCellRunner", "MpiKind", "MpiRow",
           "PlanDefaults", "ReplayKind", "Results", "Row", "Session", "read_fabric",
           "run_kinds"]

#: The kinds of ``emu run``'s cells, in the order ``cells.csv`` lists their rows; the MPI kind here has no
#: runner (reading and reporting need none: :func:`run_kinds` gives it one).
DEFAULT_KINDS = Kinds([ReplayKind(), MpiKind()])


def run_kinds(mpi_runner: MpiCellRunner) -> Kinds:
    """:data:`DEFAULT_KINDS` with the MPI kind running its programs through ``mpi_runner``."""
    return DEFAULT_KINDS.replace(MpiKind(mpi_runner))
