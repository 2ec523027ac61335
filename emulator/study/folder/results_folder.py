"""The results folder of ``emu run``: its layout, what it says about each cell, and where runs go.

:class:`ResultsFolder` is the only code that knows the folder's layout:

* ``experiment.yaml`` -- the experiment file as given;
* ``experiment.json`` -- the validated experiment, its fingerprint and every
  cell with the model's prediction (:meth:`ResultsFolder.write_plan`; an MPI
  cell has null predictions and a ``prediction`` saying it has none);
* ``run.json`` -- the run's status (``running``, ``interrupted``,
  ``incomplete`` with failed cells, or ``complete``), when it was created and
  last updated, and its wall time over every invocation (:class:`RunRecord`);
* ``dilation.json`` -- every run's dilation: chosen from this machine's
  calibration (``dilation: auto``) or the file's own, with the rule that set
  it (:class:`emulator.study.experiment.RunDilation`);
* ``state.json`` -- every cell's last outcome, wall time and error
  (:class:`CellState`);
* ``run.log`` -- one time-stamped line per event (cell ran, skipped or failed;
  network probes and rebuilds; what the session echoes);
* ``cells/<cell-id>/`` -- what the replay writes for one cell (``results.json``,
  ``timeline.jsonl``, ``links.jsonl``, ``schedule.json``, ``topology.json``,
  agent logs); for an MPI cell what ``emu mpirun`` writes (``results.json``
  of kind ``mpirun``, :class:`emulator.runs.mpi_results.MpiResults`; ``mpirun.log``,
  ``ranks/``, the launch files, ``links.jsonl``, ``bench.json``);
* ``sessions/<network>/`` -- one network's controller logs and port counters,
  its probes (``probe-<attempt>/``) and their verdicts (``probe.json``).

A cell is finished when its ``results.json``, read as the cell's kind reads
it (:mod:`emulator.study.cell_kinds`), says ``ok`` and holds exactly this cell's
configuration (:meth:`ResultsFolder.cell_finished`): a cell whose definition
changed in the file, one that failed or was interrupted, and one whose
results are missing, unreadable or of another kind are run again. A replay
cell's ``results.json`` is read as :func:`emulator.runs.results.load` reads
it, so folders written before the schema version existed (schema 1) resume
as before; an MPI cell's as :class:`emulator.runs.mpi_results.MpiResults` (its
program exited 0: status ``ok``). Every cell goes through one code path
here; a new kind of cell needs no change in this module.

The module-level functions pick the folder of a run under a results root:
:func:`new_out_dir` names a new one, :func:`find_unfinished` finds the newest
unfinished run of the same experiment (same fingerprint) to resume, and
:func:`point_latest` points ``<root>/latest`` at the folder in use.

Nothing here starts a process; the folder is plain files, so it is
unit-tested without root.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.files import read_json_object, write_atomic, write_json_atomic
from emulator.runs.results import ProbeVerdict
from emulator.study import experiment as xp
from emulator.study.cell_kinds import DEFAULT_KINDS, CellKind, Kinds, Results
from emulator.study.folder.cell_state import CellState, json_number, json_text, timestamp

#: The name of the symlink under a results root that points at the folder in use.
LATEST = "latest"
#: What the plan says of an MPI cell's prediction.
NO_PREDICTION = "none: an MPI program (the timing model predicts schedules only)"


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: which experiment, its status, and the wall seconds of every invocation so far.

    Every field is None when the document lacks it (or holds a value of the
    wrong type): a ``run.json`` without ``wall_s`` has no wall time, which the
    report writes as null and a resume counts as 0.
    """

    experiment: str | None
    source: str | None
    fingerprint: str | None
    created: str | None
    updated: str | None
    status: str | None
    cells: int | None
    wall_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "source": self.source, "fingerprint": self.fingerprint,
                "created": self.created, "updated": self.updated, "status": self.status, "cells": self.cells,
                "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """Any JSON object: keys that are missing or of the wrong type read as None."""
        cells = data.get("cells")
        return cls(experiment=json_text(data.get("experiment")), source=json_text(data.get("source")),
                   fingerprint=json_text(data.get("fingerprint")), created=json_text(data.get("created")),
                   updated=json_text(data.get("updated")), status=json_text(data.get("status")),
                   cells=cells if isinstance(cells, int) and not isinstance(cells, bool) else None,
                   wall_s=json_number(data.get("wall_s")))


class ResultsFolder:
    """One results folder of ``emu run`` at ``path`` (see the module docstring for its layout), its cells of
    ``kinds`` (:mod:`emulator.study.cell_kinds`: how each kind's results are read and written)."""

    def __init__(self, path: str, kinds: Kinds = DEFAULT_KINDS):
        self.path = path
        self.kinds = kinds

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # ---------------------------------------------------------------- cells
    def cell_dir(self, cell: xp.Cell | str) -> str:
        """``cells/<id>/`` of a cell (or of a cell id)."""
        return os.path.join(self.path, "cells", cell if isinstance(cell, str) else cell.id)

    def results_path(self, cell: xp.Cell | str) -> str:
        return os.path.join(self.cell_dir(cell), "results.json")

    def results_of(self, cell: xp.Cell | str, kind: CellKind[Any] | None = None) -> Results | None:
        """The cell's ``results.json`` as ``kind`` reads it (default: the cell's kind; for a cell id alone, the
        first kind that reads the document); None when it is missing, unreadable or of another kind."""
        data = read_json_object(self.results_path(cell))
        if data is None:
            return None
        if kind is None and isinstance(cell, xp.Cell):
            kind = self.kinds.of(cell)
        readers = [kind] if kind is not None else list(self.kinds)
        return next((res for k in readers if (res := k.read(data)) is not None), None)

    def finished_results(self, cell: xp.Cell) -> Results | None:
        """The cell's results if they are finished (status ``ok``) and of exactly this cell, else None."""
        res = self.results_of(cell)
        if res is None or res.status != "ok" or res.config.get("cell") != cell.to_json():
            return None
        return res

    def cell_finished(self, cell: xp.Cell) -> bool:
        """True if the cell's directory holds a finished result of exactly this cell (the resume rule)."""
        return self.finished_results(cell) is not None

    def empty_cell_dir(self, cell: xp.Cell) -> str:
        """The cell's directory, emptied of whatever an earlier attempt left (a cell always runs from scratch)."""
        return _empty_dir(self.cell_dir(cell))

    def save_results(self, cell: xp.Cell, res: Results, probe: ProbeVerdict | None = None) -> None:
        """The cell's results as its kind writes them, with its network's ``probe`` when given."""
        self.kinds.of(cell).save(self.results_path(cell), res, probe)

    # ------------------------------------------------------------- networks
    def session_dir(self, spec: str, policy: str, seed: int, link_mbps: float) -> str:
        """``sessions/<topology slug>.<policy>-s<seed>/``: one network's working directory."""
        return os.path.join(self.path, "sessions", f"{xp.topology_slug(spec, link_mbps)}.{policy}-s{seed}")

    @staticmethod
    def empty_probe_dir(session_dir: str, attempt: int) -> str:
        """``<session>/probe-<attempt>/``, emptied: where one probe of the network replays."""
        return _empty_dir(os.path.join(session_dir, f"probe-{attempt}"))

    @staticmethod
    def write_probes(session_dir: str, verdicts: Sequence[ProbeVerdict]) -> None:
        """``<session>/probe.json``: every probe attempt's verdict, in order."""
        write_json_atomic(os.path.join(session_dir, "probe.json"), {"attempts": [v.to_json() for v in verdicts]})

    # ------------------------------------------------------ the run's files
    def write_dilations(self, dilations: Sequence[Mapping[str, Any]]) -> None:
        """``dilation.json``: every run's dilation, chosen (``dilation: auto``) or the file's own, and why."""
        write_json_atomic(self._file("dilation.json"), {"runs": list(dilations)})

    def write_plan(self, exp: xp.Experiment, prepared: Sequence[xp.PreparedCell],
                   source_text: str | None = None) -> None:
        """``cells/``, ``experiment.yaml`` (when the text is given) and ``experiment.json`` (cells, predictions)."""
        os.makedirs(os.path.join(self.path, "cells"), exist_ok=True)
        if source_text is not None:
            write_atomic(self._file("experiment.yaml"), source_text)
        cells = []
        for pc in prepared:
            if pc.report is None:  # an MPI program: no schedule, so nothing the model predicts
                cells.append({**pc.cell.to_json(), "predicted_time_s": None, "predicted_busbw_mbps": None,
                              "alpha_beta_time_s": None, "max_flows_per_link": 0,
                              "predicted_scaling_efficiency": None, "prediction": NO_PREDICTION})
                continue
            pred = pc.report.to_json()
            cells.append({**pc.cell.to_json(), "predicted_time_s": pred["predicted_time_s"],
                          "predicted_busbw_mbps": pred["busbw_mbps"],
                          "alpha_beta_time_s": pred["alpha_beta_time_s"],
                          "max_flows_per_link": max(pred["max_flows_per_link"], default=0),
                          "predicted_scaling_efficiency": pred.get("scaling_efficiency")})
        write_json_atomic(self._file("experiment.json"),
                          {"experiment": exp.to_json(), "fingerprint": exp.fingerprint(), "cells": cells})

    def has_plan(self) -> bool:
        """True if ``experiment.json`` is the plan of an ``emu run``: the experiment and cells with dotted ids."""
        plan = read_json_object(self._file("experiment.json"))
        cells = plan.get("cells") if plan is not None else None
        return (plan is not None and isinstance(plan.get("experiment"), dict) and isinstance(cells, list)
                and all(isinstance(c, dict) and isinstance(c.get("id"), str) and "." in c["id"] for c in cells))

    def read_run(self) -> RunRecord | None:
        """``run.json``; None when there is none (a new folder), or it is not a JSON object or an empty one."""
        data = read_json_object(self._file("run.json"))
        return RunRecord.from_json(data) if data else None

    def write_run(self, exp: xp.Experiment, status: str, cells: int, wall_s: float) -> RunRecord:
        """Write ``run.json`` with this status and wall time, keeping the time it was first created."""
        old = self.read_run()
        now = timestamp()
        record = RunRecord(experiment=exp.name, source=exp.source, fingerprint=exp.fingerprint(),
                           created=(old.created if old is not None else None) or now, updated=now, status=status,
                           cells=cells, wall_s=round(wall_s, 3))
        write_json_atomic(self._file("run.json"), record.to_json())
        return record

    def read_states(self) -> dict[str, CellState]:
        """``state.json``'s cells; entries that are not readable are left out (their cells run as if new)."""
        cells = (read_json_object(self._file("state.json")) or {}).get("cells")
        if not isinstance(cells, Mapping):
            return {}
        out = {}
        for cell_id, raw in cells.items():
            state = CellState.from_json(raw)
            if state is not None:
                out[str(cell_id)] = state
        return out

    def write_states(self, states: Mapping[str, CellState]) -> None:
        write_json_atomic(self._file("state.json"), {"cells": {k: s.to_json() for k, s in states.items()}})

    def log(self, text: str) -> None:
        """Append one time-stamped line to ``run.log``."""
        with open(self._file("run.log"), "a", encoding="utf-8") as fh:
            fh.write(f"{timestamp()} {text}\n")


def _empty_dir(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# ----------------------------------------------------------- results roots
def new_out_dir(results_root: str, name: str, now: datetime.datetime | None = None) -> str:
    """``<root>/<name>-<YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``... when that already exists (not created here)."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    path = os.path.join(results_root, f"{name}-{stamp}")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(results_root, f"{name}-{stamp}-{n}")
    return path


def find_unfinished(results_root: str, exp: xp.Experiment) -> str | None:
    """The newest folder of ``results_root`` holding an unfinished run of this very experiment, or None.

    A candidate is a real directory (not ``latest``, not a symlink) named
    ``<experiment name>-...`` whose ``run.json`` has this experiment's
    fingerprint and a status other than ``complete``; the newest is the one
    created last (ties: the name that sorts last).
    """
    try:
        names = sorted(os.listdir(results_root))
    except OSError:
        return None
    best: tuple[tuple[str, str], str] | None = None
    for name in names:
        path = os.path.join(results_root, name)
        if name == LATEST or os.path.islink(path) or not name.startswith(exp.name + "-"):
            continue
        run = ResultsFolder(path).read_run()
        if run is None or run.fingerprint != exp.fingerprint() or run.status == "complete":
            continue
        key = (run.created or "", name)
        if best is None or key > best[0]:
            best = (key, path)
    return best[1] if best else None


def point_latest(results_root: str, out: str) -> None:
    """Make ``results_root/latest`` a relative symlink to ``out`` (replaced atomically).

    Does nothing when ``out`` is not directly under ``results_root`` (an
    ``--out`` elsewhere leaves ``latest`` as it was).
    """
    link = os.path.join(results_root, LATEST)
    if os.path.abspath(os.path.dirname(os.path.abspath(out))) != os.path.abspath(results_root):
        return
    tmp = link + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(os.path.basename(os.path.abspath(out)), tmp)
    os.replace(tmp, link)
