"""The report's plots: every use of matplotlib, each figure drawn from data the report's numbers computed.

This module owns how the figures look (sizes, colours, axes, resolution) and
nothing of what goes into them: the rows (:mod:`emulator.study.report.rows`),
the link x step matrices and timelines (:mod:`emulator.study.report.timelines`)
and the scaling families (:mod:`emulator.study.report.families`) come from elsewhere.
Every function writes one PNG to ``path``; those that may have nothing to
draw return whether they wrote it. Matplotlib runs with the Agg backend (no
display) and is imported on the first plot only.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import numpy as np

from emulator.model.schedule.format import format_size
from emulator.runs.trust import Verdict
from emulator.study.report.families import ScalingKey, ScalingPoint, TrainingKey, TrainingPoint
from emulator.study.report.rows import CellRow
from emulator.study.report.timelines import LinkStepMatrix, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _plt() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported here: it takes a noticeable time to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(ax: Axes, xlabel: str, ylabel: str, title: str, **legend: Any) -> None:
    """Label the axes, title them, add a light grid and the legend (``legend``: its options)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(**legend)


def _save(fig: Figure, path: str, dpi: int) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)


def plot_busbw_vs_size(path: str, rows: list[CellRow], title: str) -> bool:
    """busbw against size, one line per family (ECMP seeds: median); False when no row has a busbw."""
    fams: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if r.busbw_mbps:
            fams.setdefault(r.family(), {}).setdefault(r.size, []).append(r.busbw_mbps)
    if not fams:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for fam, by_size in sorted(fams.items()):
        xs = sorted(by_size)
        ax.plot(xs, [statistics.median(by_size[x]) for x in xs], marker="o",
                linewidth=2.5 if "hdrm" in fam else 1.2, label=fam)
    ax.set_xscale("log", base=2)
    sizes = sorted({r.size for r in rows})
    ax.set_xticks(sizes, [format_size(s) for s in sizes])
    _finish(ax, "bytes per rank", "busbw (Mbit/s, median; ECMP seeds: median)", title,
            fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, path, 110)
    return True


def plot_heatmaps(path: str, cells: list[tuple[CellRow, LinkStepMatrix]]) -> None:
    """For each (row, matrix): predicted flows per link per step, and measured mean goodput."""
    plt = _plt()
    fig, axes = plt.subplots(len(cells), 2, figsize=(14, 4.2 * len(cells)), squeeze=False)
    for i, (row, m) in enumerate(cells):
        flows = np.array(m.flows, dtype=float).T if m.links else np.zeros((1, len(m.steps)))
        meas = np.array([[np.nan if v is None else v for v in col] for col in m.measured_mbps],
                        dtype=float).T if m.links else np.zeros((1, len(m.steps)))
        ax = axes[i][0]
        im = ax.imshow(flows, aspect="auto", cmap="Reds", vmin=0, vmax=max(2, float(flows.max(initial=0))),
                       interpolation="nearest")
        fig.colorbar(im, ax=ax, label="flows on the link (model)")
        ax.set_title(f"{row.id}: flows per link (predicted)", fontsize=9)
        ax2 = axes[i][1]
        im2 = ax2.imshow(meas, aspect="auto", cmap="viridis_r", vmin=0, vmax=row.link_mbps,
                         interpolation="nearest")
        fig.colorbar(im2, ax=ax2, label="mean goodput of its transfers (Mbit/s)")
        ax2.set_title(f"measured, repetition {m.rep} (yellow = slow, dark = fast, blank = unused)", fontsize=9)
        for a in (ax, ax2):
            a.set_xlabel("step")
            a.set_yticks(range(len(m.links)), m.links, fontsize=6)
            a.set_xticks(range(len(m.steps)), [str(s) for s in m.steps], fontsize=7)
    _save(fig, path, 100)


COMPUTE_GREY = "#b0b0b0"


def plot_gantt(path: str, timelines: list[Timeline]) -> bool:
    """One Gantt chart per timeline on a common time axis; False when there is none.

    A row per rank: its transfers by sending rank (send start to receive end, coloured by step) and, in
    grey behind them, its compute operations (a training iteration's forward and backward passes).
    """
    if not timelines:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 3.6 * len(timelines)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    xmax = max(tl.end - tl.start for tl in timelines)
    computing = any(tl.computes for tl in timelines)
    for i, tl in enumerate(timelines):
        ax = axes[i][0]
        t0 = tl.start
        ranks: dict[int, list[tuple[float, float]]] = {}
        for c in tl.computes:
            ranks.setdefault(c.rank, []).append((c.start - t0, c.end - c.start))
        for rank, spans in ranks.items():  # one call per rank: an iteration has hundreds of compute ops
            ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=COMPUTE_GREY, edgecolor="white", linewidth=0.3)
        if tl.transfers:  # narrower over compute, so that both show where they overlap
            ax.barh([t.src for t in tl.transfers], [t.end - t.start for t in tl.transfers],
                    left=[t.start - t0 for t in tl.transfers], height=0.5 if tl.computes else 0.8,
                    color=[cmap(t.step % 10) for t in tl.transfers], edgecolor="black", linewidth=0.2)
        ax.set_xlim(0, xmax * 1.02)
        ax.set_ylabel("rank" if tl.computes else "sending rank")
        what = ("transfers by sending rank (send start to receive end), colour = step; grey = compute"
                if tl.computes else "transfers (send start to receive end), colour = step")
        ax.set_title(f"{tl.row.id}, repetition {tl.rep}: {what}", fontsize=9)
        if tl.computes and not tl.transfers:
            ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
        else:
            ax.invert_yaxis()
    axes[-1][0].set_xlabel("seconds since the first send or compute op" if computing
                           else "seconds since the first send")
    _save(fig, path, 100)
    return True


def plot_scaling(path: str, fams: dict[ScalingKey, dict[int, ScalingPoint]]) -> bool:
    """Efficiency against hosts, measured (solid) and model (dotted) per family; False without a family."""
    if not fams:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, ((kind, routing, algo, size), by_hosts) in enumerate(sorted(fams.items())):
        xs = sorted(h for h, v in by_hosts.items() if v.efficiency is not None)
        color = plt.get_cmap("tab10")(i % 10)
        label = f"{kind} {routing} {algo} {format_size(size)}"
        if xs:
            ax.plot(xs, [by_hosts[h].efficiency for h in xs], marker="o", color=color, label=label)
        mx = sorted(h for h, v in by_hosts.items() if v.model_efficiency is not None)
        ax.plot(mx, [by_hosts[h].model_efficiency for h in mx], linestyle=":", color=color,
                label=f"{label} (model)")
    ax.set_xscale("log", base=2)
    hosts = sorted({h for v in fams.values() for h in v})
    ax.set_xticks(hosts, [str(h) for h in hosts])
    ax.set_ylim(0, 1.1)
    _finish(ax, "hosts", "busbw / link goodput", "scaling efficiency (1 = every host's link busy all the time)",
            fontsize=7)
    _save(fig, path, 110)
    return True


def plot_training_efficiency(path: str, fams: dict[TrainingKey, dict[int, TrainingPoint]]) -> bool:
    """Training scaling efficiency against hosts, measured (solid) and model (dotted) per family.

    The measured points carry their range over repetitions as error bars. False without a family.
    """
    if not fams:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (key, by_hosts) in enumerate(sorted(fams.items())):
        color = plt.get_cmap("tab10")(i % 10)
        xs = sorted(h for h, v in by_hosts.items() if v.efficiency is not None)
        if xs:
            ys = [by_hosts[h].efficiency or 0.0 for h in xs]
            ranges = [by_hosts[h].efficiency_range or (y, y) for h, y in zip(xs, ys, strict=True)]
            err = [[max(y - lo, 0.0) for y, (lo, _) in zip(ys, ranges, strict=True)],
                   [max(hi - y, 0.0) for y, (_, hi) in zip(ys, ranges, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", color=color, capsize=3, label=key.label)
        mx = sorted(h for h, v in by_hosts.items() if v.model_efficiency is not None)
        ax.plot(mx, [by_hosts[h].model_efficiency for h in mx], linestyle=":", marker=".", color=color,
                label=f"{key.label} (model)")
    ax.set_xscale("log", base=2)
    hosts = sorted({h for v in fams.values() for h in v})
    ax.set_xticks(hosts, [str(h) for h in hosts])
    ax.set_ylim(0, 1.1)
    _finish(ax, "hosts", "compute-only time / iteration time",
            "training scaling efficiency (1 = communication hidden behind compute)", fontsize=7)
    _save(fig, path, 110)
    return True


def plot_measured_vs_predicted(path: str, rows: list[CellRow]) -> bool:
    """Measured against model busbw per cell, flagged cells circled red and unchecked ones grey; False when no
    cell has both."""
    pts = [r for r in rows if r.busbw_mbps and r.predicted_busbw_mbps]
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    kinds = sorted({r.kind for r in pts})
    for i, kind in enumerate(kinds):
        sel = [r for r in pts if r.kind == kind]
        ax.scatter([r.predicted_busbw_mbps for r in sel], [r.busbw_mbps for r in sel], label=kind,
                   marker="os^Dv"[i % 5], alpha=0.8)
    for verdict, colour in ((Verdict.FLAGGED, "red"), (Verdict.UNCHECKED, "grey")):
        marked = [r for r in pts if r.verdict is verdict]
        if marked:
            ax.scatter([r.predicted_busbw_mbps for r in marked], [r.busbw_mbps for r in marked],
                       facecolors="none", edgecolors=colour, s=120, label=verdict.value)
    top = max(max(r.predicted_busbw_mbps or 0.0 for r in pts), max(r.busbw_mbps or 0.0 for r in pts)) * 1.05
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="measured = model")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    _finish(ax, "model busbw (Mbit/s, max-min fair)", "measured busbw (Mbit/s, median)",
            "every cell: measured against the model", fontsize=8)
    _save(fig, path, 110)
    return True
