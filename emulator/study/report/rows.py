"""The report's rows: what the report reads of a results folder, one typed row per planned cell, and ``cells.csv``.

Pure apart from reading the folder. It owns :class:`Plan` (what the report
needs of ``experiment.json``, its fabric profile parsed once here) and
:class:`Reference`, and loads one row per planned cell through the cell's
kind (:mod:`emulator.study.cell_kinds`:
:class:`~emulator.study.cell_kinds.replay.CellRow` for a replay,
:class:`~emulator.study.cell_kinds.mpi.MpiRow` for an MPI program) in one code
path (:func:`load`), so a new kind's rows come out of it unchanged here.
:func:`load_rows` and :func:`load_mpi_rows` pick the replay and MPI rows;
:func:`write_csv` writes every row, kind after kind, in the columns of
:data:`CSV_FIELDS`. It also says which replay rows busbw describes
(:func:`busbw_rows`: one collective at a size) and which are training
iterations (:func:`training_rows`); every busbw comparison takes the former
only, and no MPI row ever enters one.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emulator.base.files import read_json, write_atomic
from emulator.model import fabric
from emulator.model.fabric import FabricProfile
from emulator.study.cell_kinds import CSV_FIELDS, DEFAULT_KINDS, CellRow, Kinds, MpiRow, Row
from emulator.study.folder.results_folder import ResultsFolder

__all__ = ["CSV_FIELDS", "DEFAULT_REFERENCE", "CellRow", "MpiRow", "Plan", "Reference", "Row", "busbw_rows", "load",
           "load_mpi_rows", "load_rows", "training_rows", "write_csv"]

DEFAULT_REFERENCE = {"algorithm": "hdrm", "routing": "bigraph"}


@dataclass(frozen=True)
class Reference:
    """The experiment's reference: the algorithm and routing every other cell is compared against."""

    algorithm: str
    routing: str

    def matches(self, row: CellRow) -> bool:
        return row.algorithm == self.algorithm and row.routing == self.routing


@dataclass(frozen=True)
class Plan:
    """What the report reads of ``experiment.json``'s ``experiment``."""

    name: str
    description: str
    reference: Reference
    link_mbps: float
    fabric: FabricProfile | None  # the experiment's fabric profile; None for runs older than fabric profiles
    warmup: int
    repeat: int
    ecmp_seeds: tuple[int, ...]

    @classmethod
    def from_json(cls, exp: Mapping[str, Any]) -> Plan:
        """The plan of ``experiment.json``'s ``experiment``, its fabric profile parsed (a FieldError when it does
        not parse)."""
        ref = exp.get("reference") or DEFAULT_REFERENCE
        profile = fabric.FabricProfile.from_spec(exp["fabric"]) if exp.get("fabric") else None
        return cls(name=str(exp["name"]), description=str(exp.get("description") or ""),
                   reference=Reference(algorithm=ref["algorithm"], routing=ref["routing"]),
                   link_mbps=float(exp["link_mbps"]), fabric=profile, warmup=int(exp["warmup"]),
                   repeat=int(exp["repeat"]), ecmp_seeds=tuple(int(s) for s in exp["ecmp_seeds"]))


def _plan_cells(out: str) -> tuple[Plan, list[Mapping[str, Any]]]:
    plan = read_json(os.path.join(out, "experiment.json"))
    if not isinstance(plan, dict):
        raise FileNotFoundError(f"{out}: no experiment.json (not a results folder of `emu run`)")
    return Plan.from_json(plan["experiment"]), plan["cells"]


def load(out: str, kinds: Kinds = DEFAULT_KINDS) -> tuple[Plan, list[Row]]:
    """The experiment and one row per planned cell, made by the cell's kind from its plan entry, its results
    (as its kind reads them) and its ``state.json`` entry; kind after kind (in ``kinds``' order), each in the
    plan's order. Planned cells that never ran have status ``not run``.

    Raises FileNotFoundError when ``out`` has no ``experiment.json``.
    """
    plan, entries = _plan_cells(out)
    folder = ResultsFolder(out, kinds)
    states = folder.read_states()
    by_kind: dict[str, list[Row]] = {kind.name: [] for kind in kinds}
    for entry in entries:
        kind = kinds.of_entry(entry)
        res = folder.results_of(entry["id"], kind)
        by_kind[kind.name].append(kind.row(entry, res, states.get(entry["id"]), plan, folder.cell_dir(entry["id"])))
    return plan, [row for rows in by_kind.values() for row in rows]


def load_rows(out: str) -> tuple[Plan, list[CellRow]]:
    """The experiment and one row per replay cell (:func:`load`'s replay rows; MPI cells are
    :func:`load_mpi_rows`')."""
    plan, rows = load(out)
    return plan, [r for r in rows if isinstance(r, CellRow)]


def load_mpi_rows(out: str) -> list[MpiRow]:
    """One row per MPI cell of the plan, in its order (none for an experiment without them)."""
    return [r for r in load(out)[1] if isinstance(r, MpiRow)]


def write_csv(path: str, rows: Sequence[Row]) -> None:
    """``cells.csv``: one line per row (:func:`load`'s order: the replay cells' rows first, then the MPI
    cells'), the columns of :data:`CSV_FIELDS` (each kind's row fills those that apply), flags separated by
    spaces."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow(row.csv())
    write_atomic(path, buf.getvalue())


def busbw_rows(rows: Iterable[CellRow]) -> list[CellRow]:
    """The rows that busbw describes: one collective at a size (training iterations are left out).

    Every busbw comparison (speedups, server designs, busbw against size, the heat map, scaling, the model's
    error at paper scale, the answers to Q1, Q2 and scaling) takes these rows only.
    """
    return [r for r in rows if not r.is_training]


def training_rows(rows: Iterable[CellRow]) -> list[CellRow]:
    """The rows of data-parallel training iterations (a workload instead of a size; a language model's
    hybrid-parallel iterations have a section of their own, :mod:`emulator.study.report.llm_section`)."""
    return [r for r in rows if r.is_training and r.llm is None]


def llm_rows(rows: Iterable[CellRow]) -> list[CellRow]:
    """The rows of language models' hybrid-parallel iterations."""
    return [r for r in rows if r.llm is not None]
