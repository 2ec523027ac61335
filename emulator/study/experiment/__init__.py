"""Experiment files: a typed, frozen grid of replay runs and its cells.

This package is pure: it imports nothing that starts a process or touches a
network or a results folder, so ``emu run --check`` and the unit tests use it
without root. Its modules, each one job (each imports only those before it):

* :mod:`~emulator.study.experiment.cells` -- the types: :class:`Experiment`,
  :class:`Series`, :class:`Run`, a run's :class:`Workload` or
  :class:`MpiProgram`, and the grid's :class:`Cell`;
* :mod:`~emulator.study.experiment.fields` -- the file's field readers;
* :mod:`~emulator.study.experiment.fabric_keys` -- the ``fabric:``,
  ``link_mbps:`` and ``dilation:`` keys, where the file's fabric profile is
  parsed;
* :mod:`~emulator.study.experiment.mpi_keys` -- a run's ``mpi:`` key (an
  Open MPI program as the cell's workload, checked with
  :mod:`emulator.runs.mpi_plan`'s functions);
* :mod:`~emulator.study.experiment.run_keys` -- one entry of a series'
  ``runs``;
* :mod:`~emulator.study.experiment.grid` -- expansion into cells with stable
  ids (:func:`expand`), and :func:`groups` of cells that share a network;
* :mod:`~emulator.study.experiment.parse` -- the file (``experiments/*.yaml``,
  documented in ``experiments/README.md``): :func:`load` / :func:`from_dict`;
* :mod:`~emulator.study.experiment.prediction` -- :func:`prepare`: each
  cell's schedule and the model's prediction, which ``emu run --check``
  validates without starting anything;
* :mod:`~emulator.study.experiment.estimates` -- each cell's expected wall
  time and ``emu run``'s admission request;
* :mod:`~emulator.study.experiment.auto_dilation` -- ``dilation: auto``: each
  run's dilation chosen from the machine's calibration
  (:func:`choose_dilations`).

Callers use the names re-exported here (``from emulator.study import
experiment as xp; xp.load(...)``). The results folder and its resume
bookkeeping are in :mod:`emulator.study.folder.results_folder`, the live loop in
:mod:`emulator.study.live.runner`, the report in :mod:`emulator.study.report`.
"""

from emulator.base.errors import UserError as UserError
from emulator.study.experiment.auto_dilation import RunDilation
from emulator.study.experiment.auto_dilation import choose as choose_dilations
from emulator.study.experiment.cells import (
    DEFAULT_REFERENCE,
    DEFAULT_REPEAT,
    DEFAULT_SEEDS,
    DEFAULT_SIZES,
    DEFAULT_WARMUP,
    Cell,
    Experiment,
    MpiProgram,
    Run,
    Series,
    Workload,
)
from emulator.study.experiment.estimates import (
    CELL_OVERHEAD_S,
    MPI_ESTIMATE_S,
    cell_load,
    cluster_memory,
    estimate_s,
    experiment_request,
)
from emulator.study.experiment.grid import GroupKey, expand, groups, profiles, topology_slug
from emulator.study.experiment.mpi_keys import MAX_MPI_TIMEOUT_S, MPI_EXCLUDES, MPI_KEYS
from emulator.study.experiment.parse import REFERENCE_KEYS, SERIES_KEYS, TOP_KEYS, from_dict, load
from emulator.study.experiment.prediction import LatencyOf, PreparedCell, cell_profile, prepare
from emulator.study.experiment.run_keys import RUN_KEYS

__all__ = [
    "RunDilation",
    "choose_dilations",
    "CELL_OVERHEAD_S",
    "DEFAULT_REFERENCE",
    "DEFAULT_REPEAT",
    "DEFAULT_SEEDS",
    "DEFAULT_SIZES",
    "DEFAULT_WARMUP",
    "MAX_MPI_TIMEOUT_S",
    "MPI_ESTIMATE_S",
    "MPI_EXCLUDES",
    "MPI_KEYS",
    "REFERENCE_KEYS",
    "RUN_KEYS",
    "SERIES_KEYS",
    "TOP_KEYS",
    "Cell",
    "Experiment",
    "GroupKey",
    "LatencyOf",
    "MpiProgram",
    "PreparedCell",
    "Run",
    "Series",
    "UserError",
    "Workload",
    "cell_load",
    "cell_profile",
    "estimate_s",
    "expand",
    "experiment_request",
    "cluster_memory",
    "from_dict",
    "groups",
    "load",
    "prepare",
    "profiles",
    "topology_slug",
]
