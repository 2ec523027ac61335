"""The answers to the EFLOPS paper's questions, in numbers, from an experiment's results.

This module owns which comparisons answer which question and how the
answers read: the report's "Answers" section (first thing after the title)
and the ``answers`` of ``summary.json``. It does not compute tables: it
picks entries of :func:`~emulator.study.report.speedups.speedup_tables` and
:func:`~emulator.study.report.speedups.server_speedup_tables` (which carry the
95% intervals) and reads the rows of
:func:`~emulator.study.report.rows.load_rows`, so everything follows from
which cells exist, never from series names.

* **Q1** "Does one NIC per accelerator remove intra-server congestion?": the
  server-design comparison at the most accelerators and the largest size, for
  the reference algorithm and the best and worst other algorithm.
* **Q2** "Do BiGraph and HDRM remove network congestion?": the reference
  against every baseline family at the largest host count that has the
  reference (largest size), and against the best and worst non-star baseline
  of the table with the most baselines.
* **scaling**: the reference's efficiency (busbw / link goodput, each cell's
  own link rate) from the smallest to the largest host count.
* **training** (the paper's third claim, near-linear ResNet-50 scaling): per
  workload and host count, the reference family's training scaling
  efficiency (compute-only / iteration time) against every other family's at
  the same host count (:func:`training_answers`).
* **projection** (model only): at the largest scale that
  :mod:`emulator.model.prediction.paper_scale` projects, the reference against the leaf-spine
  baselines, beside the model's measured error (:func:`model_error_text`).
* **designs** (model only): for an experiment on servers, every design it
  ran grown to :data:`~emulator.model.prediction.paper_scale.FAMILY_HOSTS` accelerators
  (:func:`~emulator.model.prediction.paper_scale.project_families`); at the most, per
  size, the reference against the fastest and the slowest other design
  (:func:`design_answers`).

Q1, Q2 and scaling are busbw answers: they see only the rows of one
collective at a size (:func:`~emulator.study.report.rows.busbw_rows`), never a
training iteration. A family of another collective than allreduce is named
with it (``leaf-spine + ECMP + ring allgather``).

Every answer names its cells' trouble in place: a cell that failed, did not
run, is flagged (a fidelity flag, ``model_disagrees``) or is unchecked (a
check without data) is called out in the sentence; an answer is trusted only
when every cell it uses is.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from emulator.base import stats
from emulator.model import routing as routings
from emulator.model import topology
from emulator.model.collectives import registry
from emulator.model.prediction import paper_scale
from emulator.model.schedule.format import format_size
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.runs import trust
from emulator.runs.trust import Tally, Verdict
from emulator.study.report.families import TrainingKey, TrainingPoint, efficiency_interval, training_families
from emulator.study.report.rows import CellRow, Reference, busbw_rows
from emulator.study.report.speedups import ServerComparison, SpeedupTable, median, ratio, speedup_interval

QUESTIONS = {
    "Q1": "Q1. Does one NIC per accelerator remove intra-server congestion?",
    "Q2": "Q2. Do BiGraph and HDRM remove network congestion?",
    "scaling": "Scaling: does the reference keep its links busy as hosts are added?",
    "training": "Training: does a data-parallel iteration scale near-linearly?",
    "projection": "At the paper's scale (model only)",
    "designs": "The same designs grown to more accelerators (model only)",
}
PAPER = {
    "Q1": "The paper claims up to ×11.3 from removing NIC congestion.",
    "Q2": "The paper claims up to ×6.08 from BiGraph and HDRM together.",
    "scaling": ("The paper reports near-linear scaling of ResNet-50 training; `emu run experiments/resnet50.yaml` "
                "measures that claim with training iterations."),
    "training": "The paper reports near-linear scaling of ResNet-50 training on BiGraph with HDRM.",
    "projection": "",
    "designs": "",
}
#: The band of each kind of cell's measured/model time (:mod:`emulator.runs.trust`), by the report's name for it.
BANDS = {"replay": trust.REPLAY_BAND, "mpi": trust.MPI_BAND}
EACH_FAMILY_MAX = 4  # at the largest host count, every baseline family gets a sentence up to this many
KINDS = {name: kind.title for name, kind in topology.KINDS.items()}
EFLOPS_DESIGNS = (None, "NIC per accelerator")  # a network question is asked of hosts with their own NIC
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """One sentence answering a question, with the numbers behind it (``summary.json``'s ``answers``)."""

    question: str                          # "Q1", "Q2", "scaling", "training" or "projection" (model only)
    text: str
    comparison: str                        # short label: numerator / denominator
    hosts: int
    size: int
    measured: float | None                 # None: not measured (a cell failed or did not run)
    interval: tuple[float, float] | None   # 95% bootstrap interval of ``measured``
    significant: bool | None               # the interval excludes 1
    model: float | None
    trusted: bool                          # every cell used finished and is trusted (none flagged or unchecked)
    cells: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "text": self.text, "comparison": self.comparison,
                "hosts": self.hosts, "size": self.size, "measured": self.measured,
                "interval": list(self.interval) if self.interval else None, "significant": self.significant,
                "model": self.model, "trusted": self.trusted, "cells": list(self.cells)}


# ------------------------------------------------------------------ words
def describe(row: CellRow, seeds: int = 1) -> str:
    """``leaf-spine + ECMP (2 seeds) + hd``: a family in words; ``... + ring allgather`` for another collective
    than allreduce."""
    kind, policy = row.kind, row.routing
    parts = [KINDS.get(kind, kind)]
    if not topology.is_ideal(kind) and not routings.own_routing(kind, policy):
        parts.append(routings.title(policy) + (f" ({seeds} seeds)" if seeds > 1 else ""))
    parts.append(_algorithm(row))
    return " + ".join(parts)


def _algorithm(row: CellRow) -> str:
    placement = row.placement
    algo = row.algorithm if row.collective == ALLREDUCE else f"{row.algorithm} {row.collective}"
    own = registry.own_placement(row.collective, row.algorithm)
    return algo if placement == own else f"{algo} ({placement} placement)"


def caution(cells: Iterable[CellRow]) -> str:
    """`` Caution: flagged: over_capacity in `id`; unchecked: no fidelity data in `id3`; `id2` failed.`` or ""
    when every cell is fine."""
    notes = []
    for c in cells:
        if c.status != "ok":
            notes.append(f"`{c.id}` {c.status}")
        elif c.trust is not None and c.verdict is not Verdict.TRUSTED:
            notes.append(f"{c.trust.text()} in `{c.id}`")
    return f" Caution: {'; '.join(notes)}." if notes else ""


def _trusted(cells: Iterable[CellRow]) -> bool:
    """Every cell finished and is trusted: every check had its data and passed."""
    return all(c.status == "ok" and c.verdict is Verdict.TRUSTED for c in cells)


def _x(value: float | None) -> str:
    return "–" if value is None else f"×{value:.2f}"


def _spread(interval: tuple[float, float] | None, significant: bool | None) -> str:
    """``95%: 1.10–1.38`` or ``95%: 0.97–1.05, not significant``."""
    text = f"95%: {interval[0]:.2f}–{interval[1]:.2f}" if interval else "no interval"
    return text + (", not significant" if significant is False else "")


def _said(model: float | None) -> str:
    return f"the model says {_x(model)}" if model is not None else "the model has no prediction"


def _compared(subject: str, other: str, measured: float | None, interval: tuple[float, float] | None,
              significant: bool | None, model: float | None) -> str:
    """``subject is ×1.24 (95%: 1.10–1.38) faster than other; the model says ×1.25`` (no full stop).

    Below 1: ``is ×0.80 (...) as fast as``; an interval that contains 1: ``is no different from other
    within the noise: ×1.02 (95%: 0.97–1.08, not significant)``.
    """
    if measured is None:
        return f"{subject} against {other}: not measured; {_said(model)}"
    if significant is False:
        return (f"{subject} is no different from {other} within the noise: {_x(measured)} "
                f"({_spread(interval, significant)}); {_said(model)}")
    verb = "faster than" if measured >= 1 else "as fast as"
    return f"{subject} is {_x(measured)} ({_spread(interval, significant)}) {verb} {other}; {_said(model)}"


def _sentence(question: str, body: str, cells: list[CellRow], paper: bool) -> str:
    """``body.`` then the paper's claim (first answer of a question only), then what is wrong with a cell."""
    return body + "." + (" " + PAPER[question] if paper else "") + caution(cells)


# ----------------------------------------------------------------------- Q1
def server_answers(server_tables: list[ServerComparison], ref: Reference) -> list[Answer]:
    """Q1 at the most accelerators and the largest size: the reference algorithm, then the best and worst other."""
    if not server_tables:
        return []
    hosts = max(t.own.hosts for t in server_tables)
    size = max(t.size for t in server_tables if t.own.hosts == hosts)
    here = [t for t in server_tables if t.own.hosts == hosts and t.size == size]
    refs = [t for t in here if ref.matches(t.own)]
    others = [t for t in here if t not in refs]
    picked = refs + _lowest_and_highest(others, lambda t: t.speedup, lambda t: t.model_speedup)
    return [_server_answer(t, paper=i == 0) for i, t in enumerate(picked)]


def _server_answer(t: ServerComparison, paper: bool) -> Answer:
    own, shared = t.own, t.shared
    where = (f" for {_algorithm(own)} at {format_size(t.size)} per rank on {own.hosts} accelerators "
             f"({own.servers} servers × {own.accels_per_server})")
    if t.by_efficiency:
        where += " (by efficiency: their links run at different rates)"
    text = _sentence("Q1", _compared("One NIC per accelerator", "a shared NIC" + where, t.speedup,
                                     t.interval, t.significant, t.model_speedup), [own, shared], paper)
    return Answer("Q1", text, f"{t.family}: NIC per accelerator / shared NIC", own.hosts, t.size,
                  t.speedup, t.interval, t.significant, t.model_speedup, _trusted([own, shared]),
                  (own.id, shared.id))


# ----------------------------------------------------------------------- Q2
#: (table, size, family, role): one Q2 answer to give
Pick = tuple[SpeedupTable, int, str, str]


def network_answers(tables: list[SpeedupTable]) -> list[Answer]:
    """Q2: every family at the largest host count, and the best and worst non-star of the fullest table
    (allreduce tables first)."""
    tables = [t for t in tables if t.reference and t.baselines
              and all(r.server_design in EFLOPS_DESIGNS for r in t.reference.values())]
    if not tables:
        return []
    # the paper's question is the allreduce's: another collective's table only when there is no allreduce one
    largest = max(tables, key=lambda t: (t.collective == ALLREDUCE, t.hosts, len(t.baselines)))
    fullest = max(tables, key=lambda t: (t.collective == ALLREDUCE, len(t.baselines), t.hosts))
    picked: list[Pick] = []
    if len(largest.baselines) <= EACH_FAMILY_MAX:
        size = max(largest.reference)
        picked += [(largest, size, fam, "") for fam in sorted(largest.baselines) if size in largest.baselines[fam]]
    if fullest is not largest or len(largest.baselines) > EACH_FAMILY_MAX:
        picked += _extremes(fullest)
    return [_network_answer(*p, paper=i == 0) for i, p in enumerate(picked)]


def _extremes(t: SpeedupTable) -> list[Pick]:
    """The reference against the best and the worst non-star baseline of ``t`` at its largest size."""
    size = max(t.reference)
    entries = {fam: by[size] for fam, by in t.baselines.items()
               if size in by and not topology.is_ideal(by[size].cells[0].kind)}
    fams = _lowest_and_highest(sorted(entries), lambda f: entries[f].speedup, lambda f: entries[f].model_speedup)
    n = len(entries)
    roles = [f", the best of its {n} non-star baselines in series `{t.series}`",
             f", the worst of its {n} non-star baselines in series `{t.series}`"]
    return [(t, size, fam, roles[i] if n > 1 else "") for i, fam in enumerate(fams)]


def _network_answer(t: SpeedupTable, size: int, fam: str, role: str, paper: bool) -> Answer:
    rr, e = t.reference[size], t.baselines[fam][size]
    cells = [rr, *e.cells]
    lead = f"At {t.hosts} hosts and {format_size(size)} per rank, "
    other = describe(e.cells[0], e.seeds) + role
    if e.by_efficiency:
        other += " (by efficiency: their links run at different rates)"
    text = _sentence("Q2", lead + _compared(describe(rr), other, e.speedup, e.interval, e.significant,
                                            e.model_speedup), cells, paper)
    return Answer("Q2", text, f"{rr.family()} / {fam}", t.hosts, size, e.speedup, e.interval,
                  e.significant, e.model_speedup, _trusted(cells), tuple(c.id for c in cells))


# ------------------------------------------------------------------ scaling
def scaling_answers(rows: list[CellRow], ref: Reference) -> list[Answer]:
    """The reference's efficiency at its smallest and largest host count (the family measured at most counts)."""
    fams: dict[tuple[str, str | None, int, bool, str], dict[int, list[CellRow]]] = {}
    for r in busbw_rows(rows):
        if ref.matches(r) and r.server_design in EFLOPS_DESIGNS:
            key = (r.kind, r.server_design, r.size, r.collective == ALLREDUCE, r.collective)
            fams.setdefault(key, {}).setdefault(r.hosts, []).append(r)
    fams = {k: v for k, v in fams.items() if len(v) > 1}
    if not fams:
        return []
    # the family at the most host counts, then the largest size; allreduce before another collective
    key = max(fams, key=lambda k: (len(fams[k]), k[2], k[3]))
    by_hosts = fams[key]
    h_s, h_l, size = min(by_hosts), max(by_hosts), key[2]
    small, large = by_hosts[h_s], by_hosts[h_l]
    e_s, e_l = _efficiency(small, measured=True), _efficiency(large, measured=True)
    m_s, m_l = _efficiency(small, measured=False), _efficiency(large, measured=False)
    measured, model = ratio(e_l, e_s), ratio(m_l, m_s)
    iv = speedup_interval(large, small, efficiency=True)
    interval = (iv.low, iv.high) if iv else None
    significant = stats.significant(iv) if iv else None
    kept = (f"at {h_l} hosts it keeps {_x(measured)} ({_spread(interval, significant)}) of its efficiency at {h_s}"
            if measured is not None else "not measured at both host counts")
    text = _sentence("scaling", f"From {h_s} to {h_l} hosts at {format_size(size)} per rank, {describe(small[0])} "
                     f"goes from {_f(e_s)} to {_f(e_l)} of the link goodput (model {_f(m_s)} to {_f(m_l)}): "
                     f"{kept}; {_said(model)}", [*small, *large], paper=True)
    return [Answer("scaling", text, f"{small[0].family()} {format_size(size)}: {h_l} / {h_s} hosts",
                   h_l, size, measured, interval, significant, model, _trusted([*small, *large]),
                   tuple(c.id for c in (*small, *large)))]


def _efficiency(cells: list[CellRow], measured: bool) -> float | None:
    """Median busbw (or the model's when not ``measured``) / link goodput over the cells that have one."""
    values = [c.busbw_mbps if measured else c.predicted_busbw_mbps for c in cells]
    return median(v / c.capacity_mbps if v else None for v, c in zip(values, cells, strict=True))


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


# ----------------------------------------------------------------- training
def training_answers(rows: list[CellRow], ref: Reference) -> list[Answer]:
    """Per workload and host count of the reference family: its training scaling efficiency against every other
    family's at that host count, one answer each (the reference alone where no other family ran there).

    ``measured`` is the reference's efficiency over the other family's (with the same compute, the other's
    iteration time over the reference's), ``model`` the same ratio from the model; alone, ``measured`` is the
    reference's efficiency and ``model`` the model's.
    """
    fams = training_families(rows)
    out: list[Answer] = []
    for workload in sorted({k.workload for k in fams}):
        refs = [k for k in fams if k.workload == workload and k.routing == ref.routing
                and k.algorithm == ref.algorithm]
        others = [k for k in fams if k.workload == workload and k not in refs]
        for rk in refs:
            for hosts, rp in fams[rk].items():
                against = [(k, fams[k][hosts]) for k in others if hosts in fams[k]]
                if not against:
                    out.append(_training_alone(rk, hosts, rp, paper=not out))
                for k, op in against:
                    out.append(_training_answer(rk, hosts, rp, k, op, paper=not out))
    return out


def _kept(point: TrainingPoint) -> str:
    """``0.94 of the compute-only speed (model 0.95)``."""
    return f"{_f(point.efficiency)} of the compute-only speed (model {_f(point.model_efficiency)})"


def _training_lead(hosts: int, key: TrainingKey, point: TrainingPoint) -> str:
    """``At 32 hosts a `resnet50-b32` iteration (scale 20) on BiGraph + hdrm keeps ...``."""
    scales = "" if point.scales == [1.0] else f" (scale {', '.join(f'{s:g}' for s in point.scales)})"
    return (f"At {hosts} hosts a `{key.workload}` iteration{scales} on {describe(point.cells[0])} keeps "
            f"{_kept(point)}")


def _training_answer(rk: TrainingKey, hosts: int, rp: TrainingPoint, ok: TrainingKey, op: TrainingPoint,
                     paper: bool) -> Answer:
    cells = [*rp.cells, *op.cells]
    other = describe(op.cells[0], len(op.cells))
    measured, model = ratio(rp.efficiency, op.efficiency), ratio(rp.model_efficiency, op.model_efficiency)
    iv = efficiency_interval(rp.cells, op.cells)
    interval = (iv.low, iv.high) if iv else None
    significant = stats.significant(iv) if iv else None
    if measured is None:
        verdict = f"not measured on both; {_said(model)}"
    elif significant is False:
        verdict = (f"no different within the noise: {_x(measured)} ({_spread(interval, significant)}); "
                   f"{_said(model)}")
    else:
        verdict = (f"its iteration is {_x(measured)} ({_spread(interval, significant)}) "
                   f"{'faster' if measured >= 1 else 'as fast'}; {_said(model)}")
    text = _sentence("training", f"{_training_lead(hosts, rk, rp)} against {_f(op.efficiency)} (model "
                     f"{_f(op.model_efficiency)}) for {other}: {verdict}", cells, paper)
    return Answer("training", text, f"{rk.label} / {ok.label}: scaling efficiency at {hosts} hosts", hosts, 0,
                  measured, interval, significant, model, _trusted(cells), tuple(c.id for c in cells))


def _training_alone(rk: TrainingKey, hosts: int, rp: TrainingPoint, paper: bool) -> Answer:
    spread = rp.efficiency_range
    text = _sentence("training", _training_lead(hosts, rk, rp)
                     + (f" ({spread[0]:.2f}..{spread[1]:.2f} over repetitions)" if spread else "")
                     + "; no other family ran at this host count", rp.cells, paper)
    return Answer("training", text, f"{rk.label}: scaling efficiency at {hosts} hosts", hosts, 0,
                  rp.efficiency, None, None, rp.model_efficiency, _trusted(rp.cells),
                  tuple(c.id for c in rp.cells))


# --------------------------------------------------------------- projection
def model_error_text(errors: list[paper_scale.ModelError]) -> str:
    """``measured/model time 0.97-1.12 (median 1.03) over 40 trusted cells at 8-64 hosts`` (trusted: every check
    but the model's own, so a cell outside the model's band counts in its error)."""
    if not errors:
        return "no trusted cell measured its error"
    lo, hi = min(e.low for e in errors), max(e.high for e in errors)
    cells = sum(e.cells for e in errors)
    med = statistics.median(r for e in errors for r in [e.median] * e.cells)
    hosts = f"{errors[0].hosts}" if len(errors) == 1 else f"{errors[0].hosts}-{errors[-1].hosts}"
    return f"measured/model time {lo:.2f}-{hi:.2f} (median {med:.2f}) over {cells} trusted cells at {hosts} hosts"


def point_label(pt: paper_scale.Point) -> str:
    """``BiGraph + hdrm``, ``leaf-spine + ECMP + hd``."""
    policy = "" if routings.own_routing(pt.fabric, pt.routing) else f" + {routings.title(pt.routing)}"
    return f"{KINDS.get(pt.fabric, pt.fabric)}{policy} + {pt.algorithm}"


def projection_answers(comparisons: Iterable[paper_scale.Comparison], error: str) -> list[Answer]:
    """At the largest projected scale, per size, the reference against the leaf-spine baselines: model only."""
    comps = list(comparisons)
    if not comps:
        return []
    top = max(c.hosts for c in comps)
    out = []
    for c in comps:
        if c.hosts != top or c.baseline.fabric != "leafspine":
            continue
        text = (f"Model only, not measured: at {c.hosts} accelerators and {format_size(c.size)} per rank, "
                f"{point_label(c.reference)} would be ×{c.speedup:.2f} faster than {point_label(c.baseline)} "
                f"(efficiency {c.reference.efficiency:.2f} against {c.baseline.efficiency:.2f}); the model's "
                f"error where the emulator measured it: {error}.")
        out.append(Answer(question="projection", text=text, comparison=f"{point_label(c.reference)} / "
                          f"{point_label(c.baseline)}", hosts=c.hosts, size=c.size, measured=None,
                          interval=None, significant=None, model=c.speedup, trusted=True, cells=()))
    return out


def design_families(rows: Iterable[CellRow], ref: Reference) -> tuple[paper_scale.Family, ...]:
    """The designs an experiment on servers ran (topology, routing, algorithm), the reference's first; none
    unless every row's topology has servers and one of them is the reference's."""
    rows = list(rows)
    if not rows or any(r.server_design is None for r in rows):
        return ()
    families = sorted({(not ref.matches(r), r.topology, r.routing, r.algorithm) for r in rows})
    if families[0][0]:  # no row is the reference's
        return ()
    return tuple(paper_scale.Family(t, routing, algo) for _, t, routing, algo in families)


def design_answers(grown: Iterable[paper_scale.Grown], error: str) -> list[Answer]:
    """At the most accelerators projected, per size: the reference design (the first family) against the
    fastest and the slowest other one, by the model."""
    every = list(grown)
    grown = [g for g in every if g.point is not None]
    if not grown:
        return []
    reference = every[0].family  # the reference's, even where it has no point
    top = max(g.hosts for g in grown)
    out = []
    for size in sorted({g.size for g in grown if g.hosts == top}):
        here = [g for g in grown if g.hosts == top and g.size == size]
        ref = next((g.point for g in here if g.family == reference), None)
        others = {g.point: g.point.real_time_s for g in here if g.family != reference and g.point is not None}
        if ref is None or not others:
            continue
        for point in _lowest_and_highest(list(others), lambda p: None, others.get):
            speedup = point.real_time_s / ref.real_time_s
            how = f"×{speedup:.2f} faster than" if speedup >= 1 else f"×{speedup:.2f} as fast as"
            text = (f"Model only, not measured: at {top} accelerators and {format_size(size)} per rank, "
                    f"{point_label(ref)} would be {how} {point_label(point)} ({ref.real_time_s * 1e6:.0f} µs "
                    f"against {point.real_time_s * 1e6:.0f} µs on the real fabric); the model's error where the "
                    f"emulator measured it: {error}.")
            out.append(Answer(question="designs", text=text, comparison=f"{point_label(ref)} / "
                              f"{point_label(point)}", hosts=top, size=size, measured=None, interval=None,
                              significant=None, model=speedup, trusted=True, cells=()))
    return out


# ------------------------------------------------------------------ helpers
def _lowest_and_highest(items: list[T], measured: Callable[[T], float | None],
                        model: Callable[[T], float | None]) -> list[T]:
    """The item with the lowest and the one with the highest speedup (measured, else the model's); once each.

    Over baselines that is the best baseline and the worst; over server designs the least and the most gain.
    """
    def score(item: T) -> float:
        value = measured(item)
        return value if value is not None else (model(item) or 0.0)

    if not items:
        return []
    low, high = min(items, key=score), max(items, key=score)
    return [low] if low is high else [low, high]


def find(rows: list[CellRow], ref: Reference, tables: list[SpeedupTable],
         server_tables: list[ServerComparison]) -> list[Answer]:
    """Every measured answer the data supports, in the order Q1, Q2, scaling, training.

    Q1, Q2 and scaling see only :func:`~emulator.study.report.rows.busbw_rows` (``tables`` and
    ``server_tables`` are built from them already).
    """
    return [*server_answers(server_tables, ref), *network_answers(tables), *scaling_answers(rows, ref),
            *training_answers(rows, ref)]


def summary(name: str, wall_s: float | None, found: list[Answer], cells: Tally) -> dict[str, Any]:
    """The content of ``summary.json``: the answers, and how many cells are trusted, flagged and unchecked
    (``cells``), with the model's bands."""
    return {"schema": 1, "experiment": name, "wall_s": wall_s, "answers": [a.to_json() for a in found],
            "cells": cells.to_json(), "model_band": {name: {"low": band.low, "high": band.high, "source": band.source}
                                                     for name, band in BANDS.items()}}
