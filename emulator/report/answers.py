"""The answers to the EFLOPS paper's questions, in numbers, from an experiment's results.

This module owns which comparisons answer which question and how the
answers read: the report's "Answers" section (first thing after the title)
and the ``answers`` of ``summary.json``. It does not compute tables: it
picks entries of :func:`emulator.report.speedup_tables` and
:func:`emulator.report.server_speedup_tables` (which carry the 95%
intervals) and reads the rows of :func:`emulator.report.load_rows`, so
everything follows from which cells exist, never from series names.

* **Q1** "Does one NIC per accelerator remove intra-server congestion?": the
  server-design comparison at the most accelerators and the largest size, for
  the reference algorithm and the best and worst other algorithm.
* **Q2** "Do BiGraph and HDRM remove network congestion?": the reference
  against every baseline family at the largest host count that has the
  reference (largest size), and against the best and worst non-star baseline
  of the table with the most baselines.
* **scaling**: the reference's efficiency (busbw / link goodput, each cell's
  own link rate) from the smallest to the largest host count.

Every answer names its cells' trouble in place: a cell that failed, did not
run or is not trusted (a fidelity flag) is called out in the sentence.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from emulator import stats
from emulator.schedule.format import format_size

QUESTIONS = {
    "Q1": "Q1. Does one NIC per accelerator remove intra-server congestion?",
    "Q2": "Q2. Do BiGraph and HDRM remove network congestion?",
    "scaling": "Scaling: does the reference keep its links busy as hosts are added?",
    "projection": "At the paper's scale (model only)",
}
PAPER = {
    "Q1": "The paper claims up to ×11.3 from removing NIC congestion.",
    "Q2": "The paper claims up to ×6.08 from BiGraph and HDRM together.",
    "scaling": "The paper reports near-linear scaling of ResNet-50 training.",
    "projection": "",
}
EACH_FAMILY_MAX = 4  # at the largest host count, every baseline family gets a sentence up to this many
KINDS = {"bigraph": "BiGraph", "leafspine": "leaf-spine", "fattree": "fat-tree", "star": "star"}
ROUTINGS = {"ecmp": "ECMP", "dmodk": "d-mod-k", "shortest": "shortest-path", "bigraph": "BiGraph routing"}
EFLOPS_DESIGNS = (None, "NIC per accelerator")  # a network question is asked of hosts with their own NIC
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """One sentence answering a question, with the numbers behind it (``summary.json``'s ``answers``)."""

    question: str                          # "Q1", "Q2", "scaling" or "projection" (model only)
    text: str
    comparison: str                        # short label: numerator / denominator
    hosts: int
    size: int
    measured: float | None                 # None: not measured (a cell failed or did not run)
    interval: tuple[float, float] | None   # 95% bootstrap interval of ``measured``
    significant: bool | None               # the interval excludes 1
    model: float | None
    trusted: bool                          # every cell used finished and is trusted
    cells: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "text": self.text, "comparison": self.comparison,
                "hosts": self.hosts, "size": self.size, "measured": self.measured,
                "interval": list(self.interval) if self.interval else None, "significant": self.significant,
                "model": self.model, "trusted": self.trusted, "cells": list(self.cells)}


# ------------------------------------------------------------------ words
def describe(row: dict[str, Any], seeds: int = 1) -> str:
    """``leaf-spine + ECMP (2 seeds) + hd``: a family in words."""
    kind, routing = row["kind"], row["routing"]
    parts = [KINDS.get(kind, kind)]
    if kind != "star" and not (kind == "bigraph" and routing == "bigraph"):
        parts.append(ROUTINGS.get(routing, routing) + (f" ({seeds} seeds)" if seeds > 1 else ""))
    parts.append(_algorithm(row))
    return " + ".join(parts)


def _algorithm(row: dict[str, Any]) -> str:
    placement = row["placement"]
    return row["algorithm"] if placement in ("identity", "hdrm") else f"{row['algorithm']} ({placement} placement)"


def _label(row: dict[str, Any]) -> str:
    """``leafspine-4x4x4 ecmp hd`` (the report's family label)."""
    algo = row["algorithm"] if row["placement"] in ("identity", "hdrm") else f"{row['algorithm']}-{row['placement']}"
    return f"{row['topology_slug']} {row['routing']} {algo}"


def caution(cells: Iterable[dict[str, Any]]) -> str:
    """`` Caution: not trusted: over_capacity in `id`; `id2` failed.`` or "" when every cell is fine."""
    notes = []
    for c in cells:
        if c["status"] != "ok":
            notes.append(f"`{c['id']}` {c['status']}")
        elif c["trusted"] is False:
            flags = [f for f in c["flags"] if f != "uncalibrated"] or ["a fidelity flag"]
            notes.append(f"not trusted: {', '.join(flags)} in `{c['id']}`")
    return f" Caution: {'; '.join(notes)}." if notes else ""


def _trusted(cells: Iterable[dict[str, Any]]) -> bool:
    return all(c["status"] == "ok" and c["trusted"] is not False for c in cells)


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


def _sentence(question: str, body: str, cells: list[dict[str, Any]], paper: bool) -> str:
    """``body.`` then the paper's claim (first answer of a question only), then what is wrong with a cell."""
    return body + "." + (" " + PAPER[question] if paper else "") + caution(cells)


# ----------------------------------------------------------------------- Q1
def server_answers(server_tables: list[dict[str, Any]], ref: dict[str, str]) -> list[Answer]:
    """Q1 at the most accelerators and the largest size: the reference algorithm, then the best and worst other."""
    if not server_tables:
        return []
    hosts = max(t["own"]["hosts"] for t in server_tables)
    size = max(t["size"] for t in server_tables if t["own"]["hosts"] == hosts)
    here = [t for t in server_tables if t["own"]["hosts"] == hosts and t["size"] == size]
    refs = [t for t in here if _is_reference(t["own"], ref)]
    others = [t for t in here if t not in refs]
    picked = refs + _lowest_and_highest(others, lambda t: t["speedup"], lambda t: t["model_speedup"])
    return [_server_answer(t, paper=i == 0) for i, t in enumerate(picked)]


def _server_answer(t: dict[str, Any], paper: bool) -> Answer:
    own, shared = t["own"], t["shared"]
    where = (f" for {_algorithm(own)} at {format_size(t['size'])} per rank on {own['hosts']} accelerators "
             f"({own['servers']} servers × {own['accels_per_server']})")
    if t["by_efficiency"]:
        where += " (by efficiency: their links run at different rates)"
    text = _sentence("Q1", _compared("One NIC per accelerator", "a shared NIC" + where, t["speedup"],
                                     t["interval"], t["significant"], t["model_speedup"]), [own, shared], paper)
    return Answer("Q1", text, f"{t['family']}: NIC per accelerator / shared NIC", own["hosts"], t["size"],
                  t["speedup"], t["interval"], t["significant"], t["model_speedup"], _trusted([own, shared]),
                  (own["id"], shared["id"]))


# ----------------------------------------------------------------------- Q2
def network_answers(tables: list[dict[str, Any]]) -> list[Answer]:
    """Q2: every family at the largest host count, and the best and worst non-star of the fullest table."""
    tables = [t for t in tables if t["reference"] and t["baselines"]
              and all(r["server_design"] in EFLOPS_DESIGNS for r in t["reference"].values())]
    if not tables:
        return []
    largest = max(tables, key=lambda t: (t["hosts"], len(t["baselines"])))
    fullest = max(tables, key=lambda t: (len(t["baselines"]), t["hosts"]))
    picked: list[tuple[dict[str, Any], int, str, str]] = []  # (table, size, family, role)
    if len(largest["baselines"]) <= EACH_FAMILY_MAX:
        size = max(largest["reference"])
        picked += [(largest, size, fam, "") for fam in sorted(largest["baselines"])
                   if size in largest["baselines"][fam]]
    if fullest is not largest or len(largest["baselines"]) > EACH_FAMILY_MAX:
        picked += _extremes(fullest)
    return [_network_answer(*p, paper=i == 0) for i, p in enumerate(picked)]


def _extremes(t: dict[str, Any]) -> list[tuple[dict[str, Any], int, str, str]]:
    """The reference against the best and the worst non-star baseline of ``t`` at its largest size."""
    size = max(t["reference"])
    entries = {fam: by[size] for fam, by in t["baselines"].items()
               if size in by and by[size]["cells"][0]["kind"] != "star"}
    fams = _lowest_and_highest(sorted(entries), lambda f: entries[f]["speedup"],
                               lambda f: entries[f]["model_speedup"])
    n = len(entries)
    roles = [f", the best of its {n} non-star baselines in series `{t['series']}`",
             f", the worst of its {n} non-star baselines in series `{t['series']}`"]
    return [(t, size, fam, roles[i] if n > 1 else "") for i, fam in enumerate(fams)]


def _network_answer(t: dict[str, Any], size: int, fam: str, role: str, paper: bool) -> Answer:
    rr, e = t["reference"][size], t["baselines"][fam][size]
    cells = [rr, *e["cells"]]
    lead = f"At {t['hosts']} hosts and {format_size(size)} per rank, "
    other = describe(e["cells"][0], e["seeds"]) + role
    if e["by_efficiency"]:
        other += " (by efficiency: their links run at different rates)"
    text = _sentence("Q2", lead + _compared(describe(rr), other, e["speedup"], e["interval"], e["significant"],
                                            e["model_speedup"]), cells, paper)
    return Answer("Q2", text, f"{_label(rr)} / {fam}", t["hosts"], size, e["speedup"], e["interval"],
                  e["significant"], e["model_speedup"], _trusted(cells), tuple(c["id"] for c in cells))


# ------------------------------------------------------------------ scaling
def scaling_answers(rows: list[dict[str, Any]], ref: dict[str, str]) -> list[Answer]:
    """The reference's efficiency at its smallest and largest host count (the family measured at most counts)."""
    fams: dict[tuple[str, str | None, int], dict[int, list[dict[str, Any]]]] = {}
    for r in rows:
        if _is_reference(r, ref) and r["server_design"] in EFLOPS_DESIGNS:
            fams.setdefault((r["kind"], r["server_design"], r["size"]), {}).setdefault(r["hosts"], []).append(r)
    fams = {k: v for k, v in fams.items() if len(v) > 1}
    if not fams:
        return []
    key = max(fams, key=lambda k: (len(fams[k]), k[2]))
    by_hosts = fams[key]
    small, large = by_hosts[min(by_hosts)], by_hosts[max(by_hosts)]
    e_s, e_l = _efficiency(small, "busbw_mbps"), _efficiency(large, "busbw_mbps")
    m_s, m_l = _efficiency(small, "predicted_busbw_mbps"), _efficiency(large, "predicted_busbw_mbps")
    measured = e_l / e_s if e_l and e_s else None
    model = m_l / m_s if m_l and m_s else None
    iv = _efficiency_interval(large, small)
    interval = (iv.low, iv.high) if iv else None
    significant = stats.significant(iv) if iv else None
    h_s, h_l, size = min(by_hosts), max(by_hosts), key[2]
    kept = (f"at {h_l} hosts it keeps {_x(measured)} ({_spread(interval, significant)}) of its efficiency at {h_s}"
            if measured is not None else "not measured at both host counts")
    text = _sentence("scaling", f"From {h_s} to {h_l} hosts at {format_size(size)} per rank, {describe(small[0])} "
                     f"goes from {_f(e_s)} to {_f(e_l)} of the link goodput (model {_f(m_s)} to {_f(m_l)}): "
                     f"{kept}; {_said(model)}", [*small, *large], paper=True)
    return [Answer("scaling", text, f"{_label(small[0])} {format_size(size)}: {h_l} / {h_s} hosts",
                               h_l, size, measured, interval, significant, model, _trusted([*small, *large]),
                               tuple(c["id"] for c in (*small, *large)))]


def _efficiency(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c[key] / c["capacity_mbps"] for c in cells if c[key]]
    return statistics.median(values) if values else None


def _efficiency_interval(num: list[dict[str, Any]], den: list[dict[str, Any]]) -> stats.Interval | None:
    def groups(cells: list[dict[str, Any]]) -> list[list[float]]:
        return [[v / c["capacity_mbps"] for v in c["rep_busbw"]] for c in cells if c["rep_busbw"]]

    n, d = groups(num), groups(den)
    return stats.ratio_interval(n, d) if n and d else None


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


# ------------------------------------------------------------------ helpers
def _is_reference(row: dict[str, Any], ref: dict[str, str]) -> bool:
    return row["algorithm"] == ref["algorithm"] and row["routing"] == ref["routing"]


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


def find(rows: list[dict[str, Any]], ref: dict[str, str], tables: list[dict[str, Any]],
         server_tables: list[dict[str, Any]]) -> list[Answer]:
    """Every answer the data supports, in the order Q1, Q2, scaling."""
    return [*server_answers(server_tables, ref), *network_answers(tables), *scaling_answers(rows, ref)]


def summary(name: str, wall_s: float | None, found: list[Answer]) -> dict[str, Any]:
    """The content of ``summary.json``."""
    return {"schema": 1, "experiment": name, "wall_s": wall_s, "answers": [a.to_json() for a in found]}
