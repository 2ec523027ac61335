"""The report of an experiment's results folder: ``report.md``, ``report.html``, ``cells.csv``, ``summary.json``, plots.

Pure: it only reads what :class:`emulator.study.live.runner.Runner` and the replay wrote
(``experiment.json``, ``state.json``, ``cells/<id>/results.json``,
``timeline.jsonl``, ``schedule.json``, ``topology.json``) and writes into the
same folder, so ``emu report DIR`` can rewrite it at any time, also for an
unfinished run.

What it shows, all from median busbw (nccl-tests definition) of the measured
repetitions, with the model's prediction (``schedule check``, max-min fair
flow level) beside every number; training iterations (cells with a workload
instead of a size) never enter a busbw comparison
(:func:`~emulator.study.report.rows.busbw_rows`), they have their own section:

* first, how many cells are trusted, flagged (each flag's count) and
  unchecked, with the model's bands (:mod:`emulator.runs.trust`;
  ``summary.json``'s ``cells`` and ``model_band``);
* then the answers to the paper's questions in a few sentences
  (``summary.json`` holds them as numbers);
* the speedup of the reference (by default BiGraph + hdrm) over every other
  topology x routing x algorithm of the same series and host count, per size;
  ECMP seeds are folded into one row (median over seeds, range given); every
  speedup has its 95% hierarchical bootstrap interval over repetitions and
  seeds (:mod:`emulator.base.stats`) and says when that contains 1; cells at
  different link rates compare efficiencies (busbw / link goodput), not busbw;
* one NIC per accelerator against a shared NIC, where server designs exist;
* busbw against size, one line per topology x routing x algorithm;
* a per-step heat map of every directed switch-to-switch link for one
  congested and one clean cell: flows the model puts on the link, and the
  mean goodput the transfers crossing it got (timeline + routing.route);
* a timeline (Gantt) of the same two cells' first measured repetition;
* scaling efficiency (busbw / link goodput) against the number of hosts, for
  every family of cells measured at more than one host count;
* "Training iteration: scaling efficiency" (training cells only): per family
  (kind, routing, algorithm, workload without its scale) and host count,
  compute-only time over iteration time measured and by the model, a plot of
  it against hosts and a Gantt chart of one iteration with its compute in grey;
* the same comparisons at the paper's scale, by the model alone
  (:mod:`emulator.model.prediction.paper_scale`), when the reference ran at several host counts;
* "MPI programs" (MPI cells only, :class:`~emulator.study.cell_kinds.mpi.MpiRow`):
  per cell the program, ranks, placement, exit status, wall time and the
  bundled benchmark's busbw at its largest size and its time over the model's (they enter no
  other section's table, plot or answer, but count in the overview and in
  the fidelity and failure lists);
* every cell: measured against predicted, its trust, faults, fidelity flags,
  failures, and the reading guide (a table: each verdict, column and flag,
  what it means, what to do).

A collective other than allreduce is named wherever a family is (``leafspine-4x4x4
ecmp allgather-ring``), and its speedup tables are its own; allreduce labels
read as they always did.

Every cell, whatever its kind, is read in one code path
(:func:`~emulator.study.report.rows.load`: its kind, :mod:`emulator.study.cell_kinds`,
makes its row) and counts in the overview, the fidelity and failure lists
and ``cells.csv``; a kind's own section (as "MPI programs" is the MPI
cells') is a function of :mod:`~emulator.study.report.sections` that
:func:`build` calls on that kind's rows.

Modules, each importing only those before it:

* :mod:`~emulator.study.report.rows` -- typed rows from the folder
  (:func:`~emulator.study.report.rows.load`, :func:`load_rows`, ``cells.csv``),
  which of them busbw describes and which are training iterations;
* :mod:`~emulator.study.report.speedups` -- speedup and server tables with
  their bootstrap intervals;
* :mod:`~emulator.study.report.families` -- scaling efficiency per family
  and host count, of collectives and of training iterations;
* :mod:`~emulator.study.report.timelines` -- the heat map's cells and
  matrices, the timelines' transfers and compute operations;
* :mod:`~emulator.study.report.answers` -- which comparisons answer which question,
  and their sentences;
* :mod:`~emulator.study.report.doc` -- the document's blocks and their Markdown and
  HTML renderings;
* :mod:`~emulator.study.report.plots` -- every figure (matplotlib, Agg backend);
* :mod:`~emulator.study.report.sections` -- one function per section of the report;
* this package -- :func:`build` (the sections in order) and
  :func:`write_report` (the files). It re-exports the public names of the
  modules above that callers use (``report.load_rows``, ``report.speedup_tables``, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from emulator.base.files import write_atomic, write_json_atomic
from emulator.model import fabric
from emulator.model.prediction import paper_scale
from emulator.runs import trust
from emulator.study.cell_kinds import DEFAULT_KINDS, Kinds
from emulator.study.folder.results_folder import ResultsFolder
from emulator.study.report import answers, llm_section, sections
from emulator.study.report.doc import Doc
from emulator.study.report.families import (
    ScalingKey,
    ScalingPoint,
    TrainingKey,
    TrainingPoint,
    scaling_families,
    training_families,
)
from emulator.study.report.rows import (
    CSV_FIELDS,
    CellRow,
    MpiRow,
    Plan,
    Reference,
    Row,
    busbw_rows,
    load,
    load_mpi_rows,
    load_rows,
    training_rows,
    write_csv,
)
from emulator.study.report.speedups import (
    RESAMPLES,
    BaselineEntry,
    ServerComparison,
    SpeedupTable,
    server_speedup_tables,
    speedup_interval,
    speedup_tables,
)
from emulator.study.report.timelines import (
    Compute,
    LinkStepMatrix,
    Timeline,
    link_step_matrix,
    pick_heatmap_cells,
    read_computes,
    read_transfers,
)

#: The host counts the report projects its comparisons to (model only; tests make it smaller, it is their cost).
PROJECTED_HOSTS: tuple[int, ...] = paper_scale.HOSTS
#: The accelerator counts an experiment on servers grows its designs to (model only; tests make it smaller too).
DESIGN_HOSTS: tuple[int, ...] = paper_scale.FAMILY_HOSTS

__all__ = ["CSV_FIELDS", "RESAMPLES", "BaselineEntry", "CellRow", "Compute", "Doc", "LinkStepMatrix", "MpiRow",
           "Plan", "Reference", "Report", "Row", "ScalingKey", "ScalingPoint", "ServerComparison", "SpeedupTable",
           "Timeline", "TrainingKey", "TrainingPoint", "build", "busbw_rows", "link_step_matrix", "load",
           "load_mpi_rows", "load_rows", "pick_heatmap_cells", "read_computes", "read_transfers", "scaling_families",
           "server_speedup_tables", "speedup_interval", "speedup_tables", "training_families", "training_rows",
           "write_csv", "write_report"]


@dataclass(frozen=True)
class Report:
    """A built report: the experiment, its rows (``rows`` the replay cells', ``mpi_rows`` the MPI cells', ``cells``
    every cell's, of every kind, in ``cells.csv``'s order), the answers (measured and projected) and the
    document."""

    plan: Plan
    rows: list[CellRow]
    answers: list[answers.Answer]
    doc: Doc
    mpi_rows: list[MpiRow] = field(default_factory=list)
    cells: list[Row] = field(default_factory=list)


def build(out: str, kinds: Kinds = DEFAULT_KINDS) -> Report:
    """Compute everything, draw the plots into ``out/plots/``; return the report (nothing else is written).
    ``kinds``: the kinds of the folder's cells (:mod:`emulator.study.cell_kinds`)."""
    plan, every = load(out, kinds)
    rows = [r for r in every if isinstance(r, CellRow)]  # replay cells: every table, plot and answer of the model
    mpi_rows = [r for r in every if isinstance(r, MpiRow)]  # MPI cells: their own section
    ref = plan.reference
    plot_dir = os.path.join(out, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    collective = busbw_rows(rows)  # every busbw comparison: one collective at a size, no training iteration
    tables, server_tables = speedup_tables(collective, ref), server_speedup_tables(collective)
    found = answers.find(rows, ref, tables, server_tables)
    error = answers.model_error_text(paper_scale.model_error(collective))
    profile = plan.fabric or fabric.default()
    # the projection answers the scaling question at the paper's scale: only for experiments that ask it
    scaled = len({r.hosts for r in collective if ref.matches(r)}) > 1
    projected = paper_scale.project_comparisons(profile, hosts=PROJECTED_HOSTS) if scaled else ()
    found += answers.projection_answers(projected, error)
    # an experiment on servers (today's designs): each of its designs grown to more accelerators
    designs = () if scaled else answers.design_families(collective, ref)
    sizes = tuple(sorted({r.size for r in collective} | {paper_scale.FAMILY_LARGE_SIZE}))
    grown = paper_scale.project_families(designs, profile, sizes, DESIGN_HOSTS) if designs else ()
    found += answers.design_answers(grown, error)

    doc = Doc()
    sections.title(doc, plan)
    sections.trust_summary(doc, every)
    sections.answers_section(doc, found, plan.repeat)
    sections.overview(doc, plan, every)
    # an experiment of training iterations or MPI programs only has no busbw to show
    empty = not rows and not mpi_rows
    if collective or empty:
        sections.speedups(doc, tables, ref)
        sections.servers(doc, server_tables)
        sections.busbw_vs_size(doc, collective, plot_dir)
        sections.congestion(doc, *pick_heatmap_cells(collective, ref), plot_dir)
        sections.scaling(doc, scaling_families(collective), plot_dir)
    sections.training(doc, training_families(rows), rows, profile, plot_dir)
    llm_section.section(doc, rows, profile)
    if collective or empty:
        sections.projection(doc, projected, error, profile)
        sections.designs(doc, grown, max((r.hosts for r in collective), default=0), error, profile)
    sections.mpi_programs(doc, mpi_rows)
    if rows or empty:
        sections.every_cell(doc, rows, plot_dir)
    sections.faults(doc, rows)
    sections.fidelity(doc, every)
    return Report(plan=plan, rows=rows, answers=found, doc=doc, mpi_rows=mpi_rows, cells=every)


def write_report(out: str, kinds: Kinds = DEFAULT_KINDS) -> str:
    """Write ``report.md``, ``report.html``, ``cells.csv``, ``summary.json`` and ``plots/*.png`` into ``out``.

    Returns report.md's path. ``summary.json``'s ``wall_s`` is ``run.json``'s (null when it has none).
    """
    report = build(out, kinds)
    write_csv(os.path.join(out, "cells.csv"), report.cells)
    run = ResultsFolder(out).read_run()
    write_json_atomic(os.path.join(out, "summary.json"),
                      answers.summary(report.plan.name, run.wall_s if run is not None else None, report.answers,
                                      trust.tally(r.trust for r in report.cells)))
    write_atomic(os.path.join(out, "report.html"), report.doc.html(f"Experiment {report.plan.name}"))
    path = os.path.join(out, "report.md")
    write_atomic(path, report.doc.markdown())
    return path
