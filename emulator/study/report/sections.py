"""The report's sections, in the order they appear: one function each, appending its blocks to a :class:`Doc`.

This module owns the report's prose and tables: what each section says and
how its numbers read (``×1.24 (1.10–1.38)``, ``–`` for a missing value).
Each function takes rows and numbers already computed (:mod:`emulator.study.report.rows`,
:mod:`~emulator.study.report.speedups`, :mod:`~emulator.study.report.families`,
:mod:`~emulator.study.report.timelines`, :mod:`~emulator.study.report.answers`,
:mod:`emulator.model.prediction.paper_scale`); those with a
figure draw it through :mod:`emulator.study.report.plots` into the ``plots``
folder they are given and link it as ``plots/<name>``.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence

from emulator.model import fabric
from emulator.model.prediction import paper_scale
from emulator.model.schedule.format import format_size
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.runs import trust
from emulator.runs.metrics import LAG_SHARE
from emulator.runs.trust import Verdict
from emulator.study.report import answers, plots
from emulator.study.report.doc import Doc
from emulator.study.report.families import ScalingKey, ScalingPoint, TrainingKey, TrainingPoint
from emulator.study.report.rows import CellRow, MpiRow, Plan, Reference, Row, busbw_rows
from emulator.study.report.speedups import RESAMPLES, BaselineEntry, ServerComparison, SpeedupTable
from emulator.study.report.timelines import LinkStepMatrix, Timeline, first_measured_transfers, link_step_matrix

INTERVAL_SENTENCE = (f"In brackets after a speedup: its 95% bootstrap interval ({RESAMPLES} resamples: the ECMP "
                     "seeds with replacement, then the repetitions within each drawn seed, the median of the "
                     "pooled draw on each side); **n.s.** = not significant, the interval contains 1.")


def fmt_number(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def speedup_text(speedup: float | None, interval: tuple[float, float] | None, significant: bool | None) -> str:
    """``×1.24 (1.10–1.38)``, ``×1.02 (0.97–1.08) n.s.`` or ``–``."""
    if speedup is None:
        return "–"
    text = f"×{speedup:.2f}"
    if interval:
        text += f" ({interval[0]:.2f}–{interval[1]:.2f})"
    return text + (" n.s." if significant is False else "")


# ------------------------------------------------------------ the opening
def title(doc: Doc, plan: Plan) -> None:
    """The experiment's name, and its description if it has one."""
    doc.h(1, f"Experiment `{plan.name}`")
    if plan.description:
        doc.p(plan.description)


def _counts(counts: dict[str, int], words: dict[str, str] | None = None) -> str:
    """`` (`over_capacity` 2, `model_disagrees` 1)`` or "" without counts."""
    if not counts:
        return ""
    named = [f"{(words or {}).get(k) or f'`{k}`'} {n}" for k, n in counts.items()]
    return f" ({', '.join(named)})"


def bands_sentence() -> str:
    """The model's bands, each with where it is documented."""
    return "; ".join(f"{name} cells {band.text()} ({band.source})" for name, band in answers.BANDS.items())


def trust_summary(doc: Doc, every: Sequence[Row]) -> None:
    """How many measured cells are trusted, flagged (each flag's count) and unchecked (each reason's), and the
    model's bands: the line under the title."""
    t = trust.tally(r.trust for r in every)
    if not t.measured:
        return
    doc.p(f"**Trust: {t.trusted} of {t.measured} measured cells trusted, {t.flagged} flagged"
          f"{_counts(t.flags)}, {t.unchecked} unchecked{_counts(t.why_unchecked, trust.UNCHECKED_WHY)}.** "
          "Trusted: every check had its data and passed; flagged: a check failed; unchecked: a check had no "
          "data, so nothing says the cell is right. A cell whose measured/model time is outside its band is "
          f"flagged `{trust.MODEL_FLAG}`; the bands: {bands_sentence()}. What each flag means and what to do: "
          "\"How to read the trust and flags\" below.")


def answers_section(doc: Doc, found: list[answers.Answer], repeat: int) -> None:
    """The "Answers" section: per question its sentences (nothing when no answer has data)."""
    if not found:
        return
    doc.h(2, "Answers")
    for question, heading in answers.QUESTIONS.items():
        texts = [a.text for a in found if a.question == question]
        if texts:
            doc.p(f"**{heading}**")
            doc.ul(texts)
    notes = []
    if any(a.question != "training" for a in found):
        notes.append(f"Measured: median busbw of the measured repetitions (ECMP seeds: median over seeds); 95%: the "
                     f"bootstrap interval of that ratio over repetitions and ECMP seeds ({RESAMPLES} resamples); "
                     "model: `schedule check`'s max-min fair prediction on the same routes. Cells at different link "
                     "rates are compared by efficiency (busbw / link goodput), never by busbw. Details in the "
                     "tables below.")
    if any(a.question == "training" for a in found):
        notes.append("Training: scaling efficiency (compute-only / iteration time, median of the measured "
                     "repetitions) of the reference family against another family at the same host count; the "
                     f"ratio, with its bootstrap interval over repetitions ({RESAMPLES} resamples), is how much "
                     "faster the reference's iteration runs (both have the same compute); model: `schedule "
                     "check`'s timing model on the same routes.")
    if repeat < 5:
        notes.append(f"With {repeat} measured repetitions per cell the bootstrap sees little of the run-to-run "
                     "spread: read a narrow interval as a lower bound on the uncertainty.")
    doc.p(" ".join(notes))


def fabric_sentence(profile: fabric.FabricProfile | None, link_mbps: float) -> str:
    """What the emulated figures stand for: the experiment's fabric profile (older runs had none)."""
    if profile is None:
        dilation = fabric.default().dilation_for(link_mbps)
        return (f"Time dilation: a {link_mbps:g} Mbit/s emulated link stands for a {fabric.default().link_gbps:g} "
                f"Gbit/s one, every time divided by {dilation:g}. This run predates fabric profiles: only "
                "bandwidth was dilated, so small messages here are more latency-bound than on the real fabric.")
    return (f"Fabric: {profile.describe()}. Divide an emulated time by {profile.dilation:g} (multiply a rate by "
            f"it) for the real fabric's: busbw {link_mbps * 0.9:.1f} Mbit/s here is "
            f"{profile.real_mbps(link_mbps * 0.9) / 1000:.0f} Gbit/s there.")


def links_sentence(plan: Plan, rows: Sequence[CellRow]) -> str:
    """The link rates the cells ran at: the experiment's, or each run's (``dilation: auto``, a run's own rate)."""
    rates = Counter(r.link_mbps for r in rows)
    if set(rates) <= {plan.link_mbps}:
        return f"Links: {plan.link_mbps:g} Mbit/s (host and switch links unless a topology sets its own)"
    per = ", ".join(f"{rate:g} Mbit/s ({n} cell{'s' if n > 1 else ''})" for rate, n in sorted(rates.items()))
    return f"Links, per run (`dilation: auto` or a run's own rate): {per}"


def fabric_sentences(plan: Plan, rows: Sequence[CellRow]) -> str:
    """What the emulated figures stand for: one sentence, or one per dilation the cells ran at."""
    profiles: dict[float, tuple[fabric.FabricProfile, int]] = {}
    for r in rows:
        if r.fabric is not None:
            known, n = profiles.get(r.fabric.dilation, (r.fabric, 0))
            profiles[r.fabric.dilation] = (known, n + 1)
    if len(profiles) <= 1:
        return fabric_sentence(plan.fabric, plan.link_mbps)
    per = "; ".join(f"{n} cell{'s' if n > 1 else ''}: {p.describe()}"
                    for p, n in sorted(profiles.values(), key=lambda pn: pn[0].dilation))
    return (f"Fabric, per run: {per}. Divide a cell's emulated time by its own dilation (multiply a rate by it) "
            "for the real fabric's.")


def overview(doc: Doc, plan: Plan, every: Sequence[Row]) -> None:
    """How many cells finished (every kind's), the links and datapath, what busbw and the model are, the
    fabric; a caution when the model's contention-free cells ran much slower than predicted."""
    rows = [r for r in every if isinstance(r, CellRow)]
    mpi_rows = [r for r in every if isinstance(r, MpiRow)]
    statuses = [r.status for r in every]
    n_ok = sum(st == "ok" for st in statuses)
    failed = sum(st not in ("ok", "not run") for st in statuses)
    not_run = sum(st == "not run" for st in statuses)
    datapaths = sorted({r.datapath for r in every if r.datapath})
    others = sorted({r.collective for r in rows if r.collective != ALLREDUCE})
    trained = sorted({r.workload for r in rows if r.is_training})
    doc.ul([
        f"**{n_ok} of {len(statuses)} cells finished**, {failed} failed or interrupted, {not_run} not run"
        + ("" if n_ok == len(statuses) else " (run `emu run` again to finish them)") + ".",
        f"{links_sentence(plan, rows)}; Open vSwitch "
        f"datapath: {', '.join(datapaths) or 'unknown'}; repetitions per cell: {plan.warmup} warm-up + "
        f"{plan.repeat} measured; ECMP seeds: {', '.join(map(str, plan.ecmp_seeds))}.",
        "busbw is the nccl-tests bus bandwidth (algbw x 2(p-1)/p), the median of the measured repetitions; a "
        "perfect allreduce reaches the link's TCP goodput. "
        + (f"Other collectives here ({', '.join(others)}) use nccl-tests' own factor: (p-1)/p for "
           "reduce_scatter, allgather and alltoall, 1 for broadcast and reduce. " if others else "")
        + "The model is `schedule check`'s timing model on the "
        "same routes: max-min fair sharing of every link, and the fabric's per-message latency, with the agents' "
        "own dependency rules (it knows contention and latency, not the emulator's CPU limits).",
        *([f"Training iterations ({', '.join(f'`{w}`' for w in trained)}): "
           f"{sum(r.is_training for r in rows)} cells, compared by scaling efficiency (compute-only / iteration "
           "time) in \"Training iteration: scaling efficiency\", never by busbw."] if trained else []),
        *([f"MPI programs: {len(mpi_rows)} cells ran an Open MPI program instead of a schedule; they are in "
           "\"MPI programs\" only (beside the model's prediction of Open MPI's algorithm), never in a busbw "
           "comparison, a table of the model or an answer."] if mpi_rows else []),
        fabric_sentences(plan, rows),
    ])
    clean_ratios = [r.measured_over_predicted for r in rows
                    if r.measured_over_predicted and r.max_flows_per_link <= 1]
    if clean_ratios and statistics.median(clean_ratios) > 1.3:
        doc.p(f"**Caution:** cells the model calls contention-free (at most one flow per link) took "
              f"{statistics.median(clean_ratios):.1f}x their predicted time (median of {len(clean_ratios)}). "
              "Something other than the fabric's links limits them: on this machine, the CPU (Python agents and "
              "the userspace Open vSwitch datapath share its cores) or TCP losses (see the retransmits column). "
              "That ceiling applies to every fabric alike and compresses the measured differences between them; "
              "the model's numbers show the fabric-only effect. Fewer hosts, lower link rates or a calibrated "
              "kernel datapath bring the measurement closer to the model.")


# ------------------------------------------------------------- speedups
def _headline(table: SpeedupTable) -> str:
    """One sentence on the largest size: the reference against its best and worst baseline, with the model.

    Baselines rank by speedup (by efficiency where link rates differ), never by busbw across link rates.
    """
    size = max(table.sizes)
    rr = table.reference.get(size)
    entries = {fam: by[size] for fam, by in table.baselines.items() if size in by and by[size].speedup}
    if not rr or not rr.busbw_mbps or not entries:
        return ""
    ahead = [f for f, e in entries.items() if (e.speedup or 0) > 1]
    best = min(entries, key=lambda f: entries[f].speedup or 0)
    worst = max(entries, key=lambda f: entries[f].speedup or 0)
    return (f"At {format_size(size)}: the reference `{rr.family()}` reaches **{rr.busbw_mbps:.2f} Mbit/s** "
            f"busbw (model {fmt_number(rr.predicted_busbw_mbps)}), ahead of {len(ahead)} of {len(entries)} "
            f"baselines. Best baseline: `{best}` {entries[best].busbw:.2f} (model "
            f"{fmt_number(entries[best].model_busbw)}); worst: `{worst}` {entries[worst].busbw:.2f} (model "
            f"{fmt_number(entries[worst].model_busbw)}).")


def _baseline_cell(e: BaselineEntry) -> str:
    """One baseline at one size: ``×1.24 (1.10–1.38); model ×1.25; seeds ×1.20..×1.28; busbw 4.1 (4.2)``."""
    text = speedup_text(e.speedup, e.interval, e.significant) + f"; model ×{fmt_number(e.model_speedup)}"
    if e.by_efficiency:
        text += "; by efficiency"
    if e.range:
        text += f"; seeds ×{e.range[0]:.2f}..×{e.range[1]:.2f}"
    return text + f"; busbw {fmt_number(e.busbw)} ({fmt_number(e.model_busbw)})"


def _speedup_table(doc: Doc, t: SpeedupTable) -> None:
    doc.h(3, f"series `{t.series}`, {t.hosts} hosts" + ("" if t.collective == ALLREDUCE else f", {t.collective}"))
    headline = _headline(t)
    if headline:
        doc.p(headline)
    head = ["baseline"] + [f"{format_size(s)}: speedup (95%), model" for s in t.sizes]
    ref_row = ["**reference busbw**, Mbit/s (model)"]
    for s in t.sizes:
        rr = t.reference.get(s)
        ref_row.append(f"**{fmt_number(rr.busbw_mbps if rr else None)}** ({fmt_number(rr.predicted_busbw_mbps if rr else None)})"
                       + (f" {rr.id.split('.')[1]}" if rr else ""))
    body = [ref_row]
    for fam in sorted(t.baselines):
        by_size = t.baselines[fam]
        body.append([fam] + [_baseline_cell(by_size[s]) if s in by_size else "" for s in t.sizes])
    doc.table(head, body)


def speedups(doc: Doc, tables: list[SpeedupTable], ref: Reference) -> None:
    """The reference against every baseline: a table per series and host count, a column per size."""
    doc.h(2, f"Speedup of {ref.routing} + {ref.algorithm} over every baseline")
    if not tables:
        doc.p("No reference cells (the experiment's `reference`) finished or were planned.")
    for t in tables:
        _speedup_table(doc, t)
    doc.p("Speedup = reference busbw / baseline busbw (medians; for ECMP the median over seeds, with the range "
          "over seeds). Above 1: the reference is faster. " + INTERVAL_SENTENCE + " Model: the same ratio "
          "from the model. By efficiency: the two ran at different link rates, so the ratio is of busbw / "
          "link goodput.")


def servers(doc: Doc, server_tables: list[ServerComparison]) -> None:
    """One NIC per accelerator against a shared NIC (nothing when the experiment has no server designs)."""
    if not server_tables:
        return
    doc.h(2, "Server designs: one NIC per accelerator against a shared NIC")
    doc.table(["servers x accelerators, routing, algorithm", "size", "speedup (95%), model",
               "NIC per accelerator busbw (model)", "shared NIC busbw (model)"],
              [[t.family, format_size(t.size),
                speedup_text(t.speedup, t.interval, t.significant)
                + f", model ×{fmt_number(t.model_speedup)}" + (", by efficiency" if t.by_efficiency else ""),
                f"{fmt_number(t.own.busbw_mbps)} ({fmt_number(t.own.predicted_busbw_mbps)})",
                f"{fmt_number(t.shared.busbw_mbps)} ({fmt_number(t.shared.predicted_busbw_mbps)})"]
               for t in server_tables])
    doc.p("Each server's accelerators sit behind one PCIe switch; with a shared NIC they all leave the "
          "server through one link, with a NIC each every accelerator uses its own (EFLOPS). Speedup = busbw "
          "with a NIC per accelerator / busbw with the shared NIC, same fabric, routing, algorithm and size; "
          "in brackets the model's ratio. Only the phases that cross servers gain: intra-server steps run "
          "over PCIe either way (which is also why busbw may exceed the NIC rate). A ring with identity "
          "placement sends one flow out of each server per step, so a shared NIC costs it nothing. "
          + INTERVAL_SENTENCE)


# --------------------------------------------------------------- figures
def busbw_vs_size(doc: Doc, rows: list[CellRow], plot_dir: str) -> None:
    """A busbw-against-size plot per series (training rows left out); a series of other collectives than
    allreduce names them in its title."""
    doc.h(2, "busbw against message size")
    rows = busbw_rows(rows)
    for series in dict.fromkeys(r.series for r in rows):
        name = f"busbw-{series}.png"
        mine = [r for r in rows if r.series == series]
        collectives = list(dict.fromkeys(r.collective for r in mine))
        label = f"series {series}" + ("" if collectives == [ALLREDUCE] else f" ({', '.join(collectives)})")
        if plots.plot_busbw_vs_size(os.path.join(plot_dir, name), mine, f"{label}: busbw against size"):
            doc.img(f"plots/{name}", f"busbw against size, {label}")


def _heatmap(doc: Doc, congested: CellRow | None, clean: CellRow | None, plot_dir: str) -> None:
    mats: list[tuple[CellRow, LinkStepMatrix]] = []
    for r in (c for c in (congested, clean) if c is not None):
        try:
            mats.append((r, link_step_matrix(r.dir)))
        except Exception as exc:  # a damaged cell folder must not cost the whole report
            doc.p(f"No heat map for {r.id}: {type(exc).__name__}: {exc}")
    if not mats:
        return
    plots.plot_heatmaps(os.path.join(plot_dir, "heatmap.png"), mats)
    doc.p("Rows: directed switch-to-switch links; columns: steps. Left: flows the model routes over the "
          "link in that step (2 or more = shared). Right: the mean goodput the transfers crossing the "
          "link got in the first measured repetition. "
          + (f"Congested: `{congested.id}` (up to {congested.max_flows_per_link} flows on a link). "
             if congested else "No congested cell finished. ")
          + (f"Clean: `{clean.id}` (never more than one flow per link)." if clean else ""))
    doc.img("plots/heatmap.png", "flows and goodput per link and step")


def congestion(doc: Doc, congested: CellRow | None, clean: CellRow | None, plot_dir: str) -> None:
    """The heat map of flows and goodput per link and step, then the timeline, of a congested and a clean cell."""
    doc.h(2, "Congestion per link and step")
    chosen = [r for r in (congested, clean) if r is not None]
    if not chosen:
        doc.p("No finished cell with switch-to-switch links.")
        return
    _heatmap(doc, congested, clean, plot_dir)
    doc.h(2, "Timeline")
    timelines = first_measured_transfers(chosen)
    if plots.plot_gantt(os.path.join(plot_dir, "gantt.png"), timelines):
        doc.p("Every transfer of the first measured repetition, from the send's start to the receive's end, "
              "one row per sending rank, coloured by step; both runs on the same time axis."
              + (" Grey bars: the rank's compute operations." if any(tl.computes for tl in timelines) else ""))
        doc.img("plots/gantt.png", "timeline of transfers")


def scaling(doc: Doc, fams: dict[ScalingKey, dict[int, ScalingPoint]], plot_dir: str) -> None:
    """Efficiency per family and host count: a table and a plot (or a sentence saying there is no family)."""
    doc.h(2, "Scaling")
    if not plots.plot_scaling(os.path.join(plot_dir, "scaling.png"), fams):
        doc.p("No family of cells was measured at more than one host count.")
        return
    hosts = sorted({h for v in fams.values() for h in v})
    body = []
    for (kind, routing, algo, size), by_hosts in sorted(fams.items()):
        body.append([f"{kind} {routing} {algo} {format_size(size)}"]
                    + [f"{fmt_number(by_hosts[h].efficiency)} ({fmt_number(by_hosts[h].model_efficiency)})"
                       if h in by_hosts else "" for h in hosts])
    doc.table(["family"] + [f"{h} hosts" for h in hosts], body)
    doc.p("Efficiency = busbw / link goodput (1 = near-linear scaling: the allreduce keeps every host link "
          "busy however many hosts take part); model in brackets.")
    doc.img("plots/scaling.png", "scaling efficiency")


def _range(point: TrainingPoint) -> str:
    """``0.94 (0.93..0.95)``: the median and the range over repetitions."""
    spread = point.efficiency_range
    return fmt_number(point.efficiency) + (f" ({spread[0]:.2f}..{spread[1]:.2f})" if spread else "")


def _notes(cells: list[CellRow]) -> str:
    """``2 seeds``, ``flagged: id``, ``unchecked: id``, ``id failed`` (what a training point's cells say), or ""."""
    notes = [f"{len(cells)} seeds"] if len(cells) > 1 else []
    for c in cells:
        if c.status != "ok":
            notes.append(f"`{c.id}` {c.status}")
        elif c.verdict is not None and c.verdict is not Verdict.TRUSTED:
            notes.append(f"{c.verdict.value}: `{c.id}`")
    return "; ".join(notes)


def _latency_scaled(row: CellRow, profile: fabric.FabricProfile) -> bool:
    """Whether the cell's fabric has the experiment's per-message latency divided by the workload's scale."""
    own = row.fabric
    return own is not None and math.isclose(own.alpha_us * row.workload_scale, profile.alpha_us, rel_tol=1e-6)


def _scale_sentence(rows: list[CellRow], profile: fabric.FabricProfile) -> str:
    """What a workload's scale > 1 keeps of the real iteration and what it does not ("" when every scale is 1).

    Two cases (:mod:`emulator.model.workloads.training`): cells whose fabric has the latencies divided by the scale
    too (the experiment's ``profile`` against each cell's own), and cells that replayed at the full latencies.
    """
    rows = [r for r in rows if r.workload_scale > 1]
    scaled = sorted({(r.workload, r.workload_scale) for r in rows})
    if not scaled:
        return ""
    names = ", ".join(f"`{w}` at scale {s:g}" for w, s in scaled)
    if all(_latency_scaled(r, profile) for r in rows):
        return (f"Scale: {names}. Every gradient size and every compute time is divided by the scale, to keep "
                "emulated runs short, and the cells replay on a fabric with the per-message and per-switch "
                f"latencies divided by the scale as well (alpha {profile.alpha_us:g} µs becomes "
                + ", ".join(f"{profile.alpha_us / s:g} µs at scale {s:g}" for s in sorted({s for _, s in scaled}))
                + "). Then every term of the iteration's time is 1/scale of the real iteration's except two: "
                "the emulator's own latencies (flagged `latency_floor` where they exceed the target) and frame "
                "serialisation: frames do not shrink, so a frame's store-and-forward weighs `scale` times more "
                "than in the real iteration.")
    return (f"Scale: {names}. Every gradient size and every compute time is divided by the scale, which keeps "
            "the ratio of bandwidth time to compute time: where the network is bandwidth-bound the overlap, the "
            "exposed communication tail and the scaling efficiency are those of the real iteration. It does not "
            "shrink the per-message latency (alpha), the switch latency or the store-and-forward of a frame, so "
            "latency weighs `scale` times more against compute and bandwidth than in the real iteration: a "
            "pessimistic efficiency, more so for ring's 2(p-1) messages than for halving-doubling's 2·log2 p; "
            "and the smallest buckets may pad relatively more. Multiplied by the scale, the times read as the "
            "real iteration's only where latency is negligible.")


def training(doc: Doc, fams: dict[TrainingKey, dict[int, TrainingPoint]], rows: list[CellRow],
             profile: fabric.FabricProfile, plot_dir: str) -> None:
    """The "Training iteration: scaling efficiency" section (nothing without training cells): per family and
    host count the measured and the model's efficiency, iteration and compute-only time, what the workload's
    scale means (against the experiment's fabric ``profile``), a plot, and a Gantt of the first training
    cell's first measured repetition."""
    if not fams:
        return
    doc.h(2, "Training iteration: scaling efficiency")
    doc.p("Scaling efficiency = compute-only time / iteration time. The iteration is one data-parallel "
          "training step on every rank: the forward pass, the backward pass layer by layer, and every gradient "
          "bucket's allreduce, started as soon as the bucket's gradients are ready (PyTorch DDP), so it overlaps "
          "the rest of the backward compute. Compute-only time is the iteration with communication free (the "
          "compute operations' dilated time along the longest chain). An efficiency of 1 means communication "
          "hides entirely behind the backward compute: each host computes as fast as it would alone, so "
          "adding hosts scales the throughput linearly (near-linear scaling); below 1 the exposed "
          "communication tail costs that fraction of the speed. Measured: median over the measured "
          "repetitions (ECMP seeds: median over seeds), in brackets the lowest and highest repetition; model: "
          "`schedule check`'s timing model on the same routes. Times are emulated seconds.")
    scale = _scale_sentence([c for by in fams.values() for pt in by.values() for c in pt.cells], profile)
    if scale:
        doc.p(scale)
    body = []
    for key, by_hosts in fams.items():
        for hosts, pt in by_hosts.items():
            body.append([key.label, str(hosts), ", ".join(f"{s:g}" for s in pt.scales), _range(pt),
                         fmt_number(pt.model_efficiency),
                         f"{fmt_number(pt.iteration_s, 3)} ({fmt_number(pt.model_iteration_s, 3)})", fmt_number(pt.compute_only_s, 3),
                         fmt_number(pt.measured_over_model), _notes(pt.cells)])
    doc.table(["family (kind, routing, algorithm, workload)", "hosts", "scale", "efficiency (min..max)",
               "model efficiency",
               "iteration s (model)", "compute-only s", "measured/model iteration time", "notes"], body)
    if plots.plot_training_efficiency(os.path.join(plot_dir, "training-efficiency.png"), fams):
        doc.img("plots/training-efficiency.png", "training scaling efficiency against hosts")
    _training_gantt(doc, [c for by in fams.values() for pt in by.values() for c in pt.cells], rows, plot_dir)


def _training_gantt(doc: Doc, cells: list[CellRow], rows: list[CellRow], plot_dir: str) -> None:
    """A Gantt of the first training cell (in the experiment's order) that has a timeline."""
    ids = {c.id for c in cells}
    timeline: Timeline | None = None
    for r in rows:
        if r.id in ids and r.status == "ok":
            found = first_measured_transfers([r])
            if found:
                timeline = found[0]
                break
    if timeline is None or not plots.plot_gantt(os.path.join(plot_dir, "training-gantt.png"), [timeline]):
        return
    doc.p(f"The first measured repetition (repetition {timeline.rep}) of `{timeline.row.id}`: one row per rank; "
          "grey bars are its compute operations (the forward pass, then the backward pass layer by layer), "
          "coloured bars the transfers it sends (coloured by step, from the send's start to the receive's end), "
          "so the gradient allreduces show how much of them overlaps the backward compute.")
    doc.img("plots/training-gantt.png", "timeline of a training iteration")


def projection(doc: Doc, comps: Sequence[paper_scale.Comparison], error: str, profile: fabric.FabricProfile) -> None:
    """The "Paper scale (model)" section: the reference against each baseline at 128..1024 accelerators."""
    doc.h(2, "Paper scale, by the model alone (not measured)")
    if not comps:
        doc.p("No projection: the experiment measured its reference at fewer than two host counts.")
        return
    body = []
    for c in comps:
        body.append([str(c.hosts), format_size(c.size), answers.point_label(c.baseline), f"`{c.baseline.topology}`",
                     f"{c.reference.real_time_s * 1e3:.3f} ms, eff. {c.reference.efficiency:.2f}",
                     f"{c.baseline.real_time_s * 1e3:.3f} ms, eff. {c.baseline.efficiency:.2f}",
                     f"model ×{c.speedup:.2f}"])
    doc.table(["accelerators", "size per rank", "baseline (model)", "baseline fabric",
               "reference: real time, efficiency (model)", "baseline: real time, efficiency (model)",
               "speedup (model)"], body)
    ref_specs = sorted({(c.hosts, c.reference.topology) for c in comps})
    doc.p("Every number in this section is the timing model's, on the real fabric the profile names ("
          f"{profile.link_gbps:g} Gbit/s links, {profile.alpha_us:g} µs per message, {profile.switch_latency_us:g} "
          "µs per switch, MTU " f"{profile.mtu}), computed by `emulator.model.prediction.projection` (which equals "
          "`schedule check`'s prediction of the same schedule on the sizes the emulator runs). Reference: "
          + ", ".join(f"`{spec}` ({h})" for h, spec in ref_specs)
          + "; fabrics of equal switch radix k (k/2 hosts per leaf; BiGraph with k/2 switches per group), ECMP "
          f"folded by the median over seeds {', '.join(map(str, paper_scale.SEEDS))}. The model's error where "
          f"the emulator measured it: {error}. Efficiency = busbw / link goodput.")


def designs(doc: Doc, grown: Sequence[paper_scale.Grown], measured_hosts: int, error: str,
            profile: fabric.FabricProfile) -> None:
    """The "designs grown" section: every design of an experiment on servers at more accelerators (model)."""
    if not grown:
        return
    doc.h(2, "The same designs at more accelerators, by the model alone (not measured)")
    columns = sorted({(g.hosts, g.size) for g in grown})
    body = []
    for fam in dict.fromkeys(g.family for g in grown):
        cells = {(g.hosts, g.size): g for g in grown if g.family == fam}
        label = next((answers.point_label(g.point) for g in cells.values() if g.point is not None),
                     f"{fam.topology.split(':')[0]} + {fam.algorithm}")
        row = [label]
        for key in columns:
            g = cells.get(key)
            if g is None or g.point is None:
                row.append("–")
            else:
                row.append(f"{g.point.real_time_s * 1e6:.0f} µs, busbw {g.point.busbw_gbps:.3g} Gbit/s")
        body.append(row)
    doc.table(["design (model)", *(f"{h} accelerators, {format_size(s)}" for h, s in columns)], body)
    missing = sorted({g.why for g in grown if g.point is None and g.why})
    grown_specs = sorted({(g.hosts, g.point.topology) for g in grown if g.point is not None})
    interconnect = (f", servers' interconnect {profile.domain_gbps:g} Gbit/s per accelerator and direction and "
                    f"{profile.domain_latency_us:g} µs" if profile.domain_gbps else "")
    doc.p(f"Each design the experiment measured at {measured_hosts} accelerators, grown with the same servers: "
          "rails longer with their spines in proportion (the leaves' oversubscription kept), BiGraph by the "
          "equal-radix rule (k/2 switches per group). Real times on the fabric the profile names ("
          f"{profile.link_gbps:g} Gbit/s links, {profile.alpha_us:g} µs per message, {profile.switch_latency_us:g} "
          f"µs per switch{interconnect}), by `emulator.model.prediction.projection` (the timing model's rules; hier "
          "as its three phases, each rank entering a phase when done with the one before); ECMP folded by the "
          f"median over seeds {', '.join(map(str, paper_scale.SEEDS))}. Grown fabrics: "
          + ", ".join(f"`{spec}` ({h})" for h, spec in grown_specs)
          + (". Not projected: " + "; ".join(missing) if missing else "")
          + f". The model's error where the emulator measured it: {error}.")


# ---------------------------------------------------------- MPI programs
def _mpi_verdict(r: MpiRow) -> str:
    """``trusted``, ``flagged: over_capacity``, ``unchecked: no fidelity data``, ``–`` (not measured); a trusted
    cell's other flags (``uncalibrated``) in brackets."""
    notes = [f for f in r.flags if r.trust is not None and f not in r.trust.flags]
    return r.trust_text() + (f" ({', '.join(notes)})" if notes and r.verdict is Verdict.TRUSTED else "")


def _exit_text(r: MpiRow) -> str:
    """``0``, ``3``, ``signal 9``, ``signal 15 (timeout)``; the status when the program has none (``not run``)."""
    if r.exit_status is None:
        return (r.run_status if r.run_status not in (None, "ok", "running") else r.status) if r.status != "ok" \
            else "–"
    text = f"signal {-r.exit_status}" if r.exit_status < 0 else str(r.exit_status)
    return text + (f" ({r.run_status})" if r.run_status in ("timeout", "interrupted") else "")


def mpi_programs(doc: Doc, rows: Sequence[MpiRow]) -> None:
    """The "MPI programs" section (nothing without MPI cells): per cell the program, its ranks and placement,
    exit status, wall time, the bundled benchmark's busbw at its largest size and over the link's goodput,
    whether it is trusted; then every benchmark row."""
    if not rows:
        return
    doc.h(2, "MPI programs")
    doc.table(["cell", "program", "ranks", "placement", "exit status", "wall s", "busbw (largest size)",
               "busbw / link goodput", "measured / model", "trust"],
              [[f"`{r.id}`", f"`{r.program}`", str(r.ranks), r.placement, _exit_text(r), fmt_number(r.time_s, 1),
                f"{fmt_number(r.busbw_mbps)} at {format_size(r.busbw_size)}" if r.busbw_size is not None else "–",
                fmt_number(r.efficiency), fmt_number(r.measured_over_predicted), _mpi_verdict(r)] for r in rows])
    doc.p("Each of these cells ran an Open MPI program the way `emu mpirun` does: one rank per host (the "
          "placement's first ranks), `mpirun` in rank 0's host, TCP over the emulated links, every rank at "
          "niceness 19 unless the file says otherwise, on its network after the network's probe and beside that "
          "network's replay cells. measured / model: the benchmark's time at its largest size over the timing "
          "model's for the schedule that makes Open MPI's algorithm's transfers in its rank order (ring, "
          "Rabenseifner as hd, recursive doubling as rd; docs/fidelity.md); these cells enter no speedup, "
          "busbw plot, scaling, training table or answer above. busbw: the "
          "bundled `emu-allreduce-bench`'s (nccl-tests' definition, Mbit/s) at its largest size; busbw / link "
          "goodput as everywhere in this report. Open MPI's algorithms are its own, not the agents' schedules "
          "of the same name. Their messages get the fabric's latency where they are received, from a library "
          "preloaded into every rank (docs/emulation.md, \"Open MPI programs\"). Wall s is mpirun's, Open MPI's "
          "start-up included; a program that exits "
          "non-zero is a failed cell. Trust: fidelity over the program's run (CPU idle, the datapath's load "
          "against its calibrated capacity), the benchmark's data check, and measured / model within "
          f"{trust.MPI_BAND.text()} (else `{trust.MODEL_FLAG}`; no model: unchecked). Each cell's folder has `mpirun.log` and every rank's output in "
          "`ranks/`.")
    bench = [(r, b) for r in rows for b in r.bench]
    if bench:
        doc.table(["cell", "size", "time per iteration s", "algbw Mbit/s", "busbw Mbit/s", "busbw / link goodput",
                   "wrong elements"],
                  [[f"`{r.id}`", format_size(b["size"]), fmt_number(_number(b.get("time_s")), 4),
                    fmt_number(_number(b.get("algbw_mbps"))), fmt_number(_number(b.get("busbw_mbps"))),
                    fmt_number(_ratio(_number(b.get("busbw_mbps")), r.capacity_mbps)),
                    "unchecked" if b.get("wrong") is None else str(b["wrong"])]
                   for r, b in bench])


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


# ------------------------------------------------------------ every cell
def every_cell(doc: Doc, rows: list[CellRow], plot_dir: str) -> None:
    """Every cell measured against the model: a scatter plot and a table, with its fidelity counters."""
    doc.h(2, "Every cell: measured against the model")
    if plots.plot_measured_vs_predicted(os.path.join(plot_dir, "measured-vs-model.png"), busbw_rows(rows)):
        doc.img("plots/measured-vs-model.png", "measured against predicted busbw")

    def rate(r: CellRow, measured: bool) -> str:
        """busbw, or a training iteration's scaling efficiency (``eff. 0.94``)."""
        if r.is_training:
            value = r.scaling_efficiency if measured else r.predicted_scaling_efficiency
            return "–" if value is None else f"eff. {value:.2f}"
        return fmt_number(r.busbw_mbps if measured else r.predicted_busbw_mbps)

    body = [[f"`{r.id}`", r.status, rate(r, True), rate(r, False), fmt_number(r.time_s, 3),
             fmt_number(r.predicted_time_s, 3), fmt_number(r.measured_over_predicted), str(r.max_flows_per_link),
             r.trust_text(), ", ".join(r.flags) or "none", str(r.qdisc_drops), str(r.tcp_retransmits)] for r in rows]
    doc.table(["cell", "status", "busbw", "model busbw", "time s", "model s", "measured/model time",
               "max flows/link", "trust", "fidelity flags", "qdisc drops", "TCP retrans."], body)
    doc.p("Times are the median of the measured repetitions; busbw in Mbit/s. "
          + ("Training cells (their id ends with the workload, e.g. `resnet50-s100`) show their scaling "
             "efficiency (`eff.`: compute-only / iteration time) instead of busbw, and their time is the "
             "iteration's. " if any(r.is_training for r in rows) else ""))
    reading_guide(doc)


#: The reading guide's rows: a column, verdict or flag; what it means; what to do.
GUIDE: tuple[tuple[str, str, str], ...] = (
    ("trust: `trusted`", "every check had its data and passed", "read the cell's numbers as the fabric's"),
    ("trust: `flagged: ...`", "a check failed; the flags say which (below)",
     "do not read the cell as the fabric's; fix what its flag names and run it again (delete "
     "`cells/<cell>/`, then `emu run` with `--out` on this folder)"),
    ("trust: `unchecked: ...`", "a check had no data, so nothing says the cell is right (no fidelity data: "
     "results older than the check; CPU idle unknown: its counters did not advance; clocks not comparable; "
     "no model time)", "run the cell again with this version; a cell without a model stays unchecked"),
    ("measured/model time", "the median measured time over the timing model's (1 = as predicted)",
     f"outside {trust.REPLAY_BAND.text()} the cell is flagged `{trust.MODEL_FLAG}`"),
    (f"`{trust.MODEL_FLAG}`", f"measured/model time outside its band ({bands_sentence()})",
     "compare its per-step times (`cells/<cell>/results.json`) with the model's; rerun on a quiet machine; "
     "`docs/fidelity.md` has the figures measured so far"),
    ("`over_capacity`", "the switch datapath was offered more than this machine's calibrated capacity",
     "slower links (a larger dilation, or `dilation: auto`) or fewer hosts"),
    ("`cpu_saturated`", "the CPU had under 5% idle time", "fewer hosts or slower links; nothing else running"),
    ("`latency_floor`", "messages could not meet the fabric's latency: this machine's own latency is above it, "
     "or the agents sent late", "a larger dilation (the target grows with it), or read the cell as bandwidth "
     "only"),
    ("`emulator_lag`", f"an agent was behind the fabric (bytes already in its host, or a send past its deadline) "
     f"for over {LAG_SHARE:.0%} of the repetition", "fewer hosts per core or slower links"),
    ("`uncalibrated`", "`emu calibrate` never ran here: the capacity is the documented default (not a failed "
     "check)", "run `emu calibrate` once on this machine"),
    ("`probe_failed`", "its network failed its probe again after a rebuild",
     "look at `sessions/<network>/probe.json`; rerun when the machine is quiet"),
    ("`network_damaged`", "its controller exited or Open vSwitch was restarted while it ran",
     "rerun the cell; `run.log` says what broke"),
    ("`clock_offset`", "on a cluster, a server's clock was not known to within 1% of the shortest step",
     "synchronise the servers' clocks (chrony), or longer steps (a larger dilation)"),
    ("qdisc drops, TCP retrans.", "frames the links dropped and TCP sent again, over the measured repetitions",
     "a few are normal under ECMP contention; many beside a slow cell say the links, not the model, set it"),
)


def reading_guide(doc: Doc) -> None:
    """How to read the trust and flag columns: one row per verdict, column and flag, what it means, what to do."""
    doc.h(3, "How to read the trust and flags")
    doc.table(["column, verdict or flag", "what it means", "what to do"], [list(row) for row in GUIDE])


def faults(doc: Doc, rows: list[CellRow]) -> None:
    """Every fault of every cell: when it fired, how long the controller took, what it hit (nothing without)."""
    faulted = [r for r in rows if r.faults]
    if not faulted:
        return
    doc.h(2, "Faults")
    body = []
    for r in faulted:
        for f in r.faults:
            affected = f.get("affected_transfers") or []
            slow = [t["time_s"] for t in affected if t.get("time_s") is not None]
            body.append([f"`{r.id}`", f"`{f['spec']}`",
                         "not fired" if f.get("fired_s") is None else f"{f['fired_s']:.3f} s",
                         "" if f.get("reroute_s") is None else f"{f['reroute_s'] * 1000:.0f} ms",
                         f"{len(affected)}" + (f" (slowest {max(slow):.3f} s)" if slow else ""),
                         f.get("error") or f.get("note") or "", r.outcome])
    doc.table(["cell", "fault", "fired at", "controller done after", "transfers on the link", "what happened",
               "cell outcome"], body)
    doc.p("`fired at` counts from the repetition's common start; `controller done after` is the time until "
          "the controller had every switch confirmed with entries that route around (or back over) the link, "
          "or had resynchronised every switch after a restart. Transfers on the link are those whose planned "
          "path crossed it, with the slowest one's measured time. A cell whose repetitions all finished with "
          "correct data despite a fault is `degraded`; a fault that stops a rank fails the cell.")


def fidelity(doc: Doc, every: Sequence[Row]) -> None:
    """How many cells carry each fidelity flag, the flagged and the unchecked cells, the failed ones and those not
    run yet (cells of every kind, in :func:`~emulator.study.report.rows.load`'s order)."""
    doc.h(2, "Fidelity flags and failures")
    flag_counts: dict[str, int] = {}
    for r in every:
        for f in r.flags:
            flag_counts[f] = flag_counts.get(f, 0) + 1
    doc.ul([f"`{f}`: {n} cells" for f, n in sorted(flag_counts.items())] or ["no fidelity flag in any cell"])
    for verdict in (Verdict.FLAGGED, Verdict.UNCHECKED):
        cells = [r for r in every if r.trust is not None and r.trust.verdict is verdict]
        if cells:
            doc.p(f"{verdict.value.capitalize()}: " + ", ".join(f"`{r.id}` ({r.trust.text()})" for r in cells
                                                                if r.trust is not None) + ".")
    failed = [r for r in every if r.status not in ("ok", "not run")]
    doc.ul([f"`{r.id}`: {r.status}: {r.error or 'no error recorded'}" for r in failed] or ["no failed cells"])
    not_run = sum(r.status == "not run" for r in every)
    if not_run:
        doc.p(f"Not run yet: {not_run} cells.")
    doc.p("Every cell's numbers are in `cells.csv`; raw results in `cells/<cell>/` (results.json, timeline.jsonl, "
          "links.jsonl); the answers, as numbers, in `summary.json`.")
