"""The report of training iterations and of collectives other than allreduce, on a fake results folder.

The collective cells run through the fake session (:mod:`fake_session`); the training cells are written by
hand (``experiment.json`` entries, ``results.json`` with iterations, ``timeline.jsonl`` with compute
records), because predicting a ResNet-50 iteration takes longer than a unit test should.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import statistics
from typing import Any

import pytest
import yaml
from fake_session import factory

from emulator.base.files import append_jsonl, read_json_object, write_json_atomic
from emulator.runs import results
from emulator.runs.results import CellResults, Fidelity, Iteration, Repetition
from emulator.study import experiment as xp
from emulator.study import report
from emulator.study.live import runner
from emulator.study.report import answers, plots, timelines

TRAIN = "{{topology: \"{spec}\", routing: {routing}, algorithms: [{algo}], model: resnet50, scale: {scale}}}"
SCALE = {8: 100, 16: 100, 32: 200}  # the largest host count shrunk more: still one family per line
FAMILIES = {  # (routing, algorithm) -> hosts -> topology
    ("bigraph", "hdrm"): {8: "bigraph:upper=2,lower=2,hosts_per_switch=2",
                          16: "bigraph:upper=4,lower=4,hosts_per_switch=2",
                          32: "bigraph:upper=4,lower=4,hosts_per_switch=4"},
    ("ecmp", "ring"): {8: "leafspine:leaves=4,spines=2,hosts_per_leaf=2",
                       16: "leafspine:leaves=4,spines=4,hosts_per_leaf=4",
                       32: "leafspine:leaves=8,spines=4,hosts_per_leaf=4"},
}
COLLECTIVES = """
  - name: coll
    sizes: [64KiB]
    runs:
      - {topology: "bigraph:upper=2,lower=2,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm]}
      - {topology: "leafspine:leaves=4,spines=2,hosts_per_leaf=2", routing: ecmp, algorithms: [hd, ring]}
      - {topology: "bigraph:upper=2,lower=2,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm],
         collective: allgather}
      - {topology: "leafspine:leaves=4,spines=2,hosts_per_leaf=2", routing: ecmp, algorithms: [ring],
         collective: allgather}
"""
HEAD = """
name: train
description: ResNet-50 iterations at 8, 16 and 32 hosts, and a few collectives
repeat: 3
warmup: 1
ecmp_seeds: [0]
series:
"""
COMPUTE_ONLY_S = 10.0
#: the model's efficiency per family and host count; measured repetitions spread around it by REP_SPREAD
MODEL_EFF = {("bigraph", "hdrm"): {8: 0.96, 16: 0.95, 32: 0.94}, ("ecmp", "ring"): {8: 0.93, 16: 0.87, 32: 0.53}}
REP_SPREAD = (0.90, 1.0, 0.99)  # median 0.99, mean 0.963: the table must show the median
GANTT_RANKS = 8


def training_yaml() -> str:
    runs = [TRAIN.format(spec=spec, routing=routing, algo=algo, scale=SCALE[hosts])
            for (routing, algo), by_hosts in FAMILIES.items() for hosts, spec in by_hosts.items()]
    return "  - name: train\n    runs:\n" + "".join(f"      - {r}\n" for r in runs)


def rep_efficiencies(cell: xp.Cell) -> list[float]:
    return [MODEL_EFF[(cell.routing, cell.algorithm)][cell.hosts] * f for f in REP_SPREAD]


def cell_json(cell: xp.Cell, latency_scaled: bool) -> dict[str, Any]:
    """The cell as the plan holds it, its fabric's latencies divided by its scale or not (both exist)."""
    profile = cell.fabric
    scale = cell.workload.scale if cell.workload is not None else 1.0
    if latency_scaled:
        profile = dataclasses.replace(profile, alpha_us=8 / scale, switch_latency_us=1 / scale)
    else:
        profile = dataclasses.replace(profile, alpha_us=8, switch_latency_us=1)
    return {**cell.to_json(), "fabric": profile.spec()}


def write_training_cell(out: str, cell: xp.Cell, warmup: int, latency_scaled: bool = False) -> None:
    """The cell's plan entry's results: repetitions with iterations, and (8 hosts) a timeline with compute."""
    cdir = os.path.join(out, "cells", cell.id)
    os.makedirs(cdir, exist_ok=True)
    model = MODEL_EFF[(cell.routing, cell.algorithm)][cell.hosts]
    pred: dict[str, Any] = {"predicted_time_s": COMPUTE_ONLY_S / model, "busbw_mbps": 1.3, "alpha_beta_time_s": 0.5,
            "max_flows_per_link": [1], "goodput": 0.99, "compute_only_s": COMPUTE_ONLY_S,
            "iteration_time_s": COMPUTE_ONLY_S / model, "scaling_efficiency": model}

    def rep(i: int, eff: float) -> Repetition:
        it = COMPUTE_ONLY_S / eff
        return Repetition(rep=i, time_s=it, algbw_mbps=1.0, busbw_mbps=1.2, predicted_time_s=pred["predicted_time_s"],
                          measured_over_predicted=it / pred["predicted_time_s"],
                          fidelity=Fidelity(cpu_idle=1.0, datapath_load_mbps=0.0, datapath_capacity_mbps=0.0,
                                            flags=["uncalibrated"]),
                          iteration=Iteration(iteration_s=it, compute_only_s=COMPUTE_ONLY_S))

    effs = rep_efficiencies(cell)
    res = CellResults(config={"cell": cell_json(cell, latency_scaled), "warmup": warmup, "repeat": len(effs),
                              "routing": cell.routing, "seed": cell.seed},
                      prediction=pred, link_mbps=20.0, datapath="user", status="ok", outcome="ok",
                      warmup=[rep(0, model)], repetitions=[rep(warmup + i, e) for i, e in enumerate(effs)])
    res.save(os.path.join(cdir, "results.json"))
    if cell.hosts == 8:
        for r in range(warmup + 1):  # the warm-up and the first measured repetition
            for rec in gantt_records(r):
                append_jsonl(os.path.join(cdir, "timeline.jsonl"), rec)


def gantt_records(rep: int) -> list[dict]:
    """Per rank a forward and two backward ops, and a transfer to the next rank after the first backward."""
    t0, out = 100.0 * rep, []
    for rank in range(GANTT_RANKS):
        host = f"h{rank + 1}"
        for op, (start, end) in enumerate([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]):
            out.append({"rep": rep, "kind": "compute", "step": 0, "rank": rank, "host": host, "op": op,
                        "seconds": (end - start) / 5000, "start": t0 + start, "end": t0 + end})
        out.append({"rep": rep, "step": 1, "src": rank, "dst": (rank + 1) % GANTT_RANKS, "src_host": host,
                    "dst_host": f"h{(rank + 1) % GANTT_RANKS + 1}", "bytes": 4096, "start": t0 + 2.0,
                    "end": t0 + 2.5})
    return out


def make_results(tmp_path, latency_scaled: bool = False) -> tuple[str, list[xp.Cell]]:
    """Run the collective cells through the fake session, then add the training cells to the same folder
    (their fabric with the latencies divided by the workload's scale when ``latency_scaled``)."""
    full = xp.from_dict(yaml.safe_load(HEAD + training_yaml() + COLLECTIVES), where="train.yaml")
    out = str(tmp_path / "run")
    runner.Runner(xp.from_dict(yaml.safe_load(HEAD + COLLECTIVES), where="train.yaml"), out,
                  session_factory=factory(), stream=io.StringIO()).run()
    trained = [c for c in xp.expand(full) if c.workload is not None]
    plan = read_json_object(os.path.join(out, "experiment.json"))
    assert plan is not None
    entries = [{**cell_json(c, latency_scaled),
                "predicted_time_s": COMPUTE_ONLY_S / MODEL_EFF[(c.routing, c.algorithm)][c.hosts],
                "predicted_busbw_mbps": 1.3, "alpha_beta_time_s": 0.5, "max_flows_per_link": 1,
                "predicted_scaling_efficiency": MODEL_EFF[(c.routing, c.algorithm)][c.hosts]} for c in trained]
    plan["cells"] = entries + plan["cells"]
    write_json_atomic(os.path.join(out, "experiment.json"), plan)
    for c in trained:
        write_training_cell(out, c, full.warmup, latency_scaled)
    return out, trained


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out, trained = make_results(tmp_path_factory.mktemp("training"))
    md = open(report.write_report(out)).read()
    return out, trained, md


def section(md: str, heading: str) -> str:
    start = md.index(heading)
    end = md.find("\n## ", start + 1)
    return md[start:end if end >= 0 else len(md)]


def test_training_cells_get_their_section_table_and_plot(built):
    out, trained, md = built
    assert [c.id for c in trained][:3] == ["train.bigraph-2x2x2.bigraph.hdrm.resnet50-s100",
                                           "train.bigraph-4x4x2.bigraph.hdrm.resnet50-s100",
                                           "train.bigraph-4x4x4.bigraph.hdrm.resnet50-s200"]
    text = section(md, "## Training iteration: scaling efficiency")
    assert "compute-only time / iteration time" in text and "near-linear scaling" in text
    # these cells replayed at the full latencies: the section says latency weighs more
    assert "latency weighs `scale` times more" in text
    assert "`resnet50-s100` at scale 100, `resnet50-s200` at scale 200" in text
    assert "divided by the scale as well" not in text
    for name in ("training-efficiency.png", "training-gantt.png"):
        path = os.path.join(out, "plots", name)
        assert os.path.getsize(path) > 5000, name
        assert f"plots/{name}" in text
    # the table's numbers are the medians over repetitions, with the range, and the model's
    for (routing, algo), by_hosts in MODEL_EFF.items():
        kind = "bigraph" if routing == "bigraph" else "leafspine"
        for hosts, model in by_hosts.items():
            effs = [model * f for f in REP_SPREAD]
            med = statistics.median(effs)
            assert f"{med:.2f}" != f"{statistics.mean(effs):.2f}"
            iteration = statistics.median(COMPUTE_ONLY_S / e for e in effs)
            row = (f"| {kind} {routing} {algo} resnet50 | {hosts} | {SCALE[hosts]} | {med:.2f} ({min(effs):.2f}.."
                   f"{max(effs):.2f}) | {model:.2f} | {iteration:.3f} ({COMPUTE_ONLY_S / model:.3f}) | "
                   f"{COMPUTE_ONLY_S:.3f} | {iteration / (COMPUTE_ONLY_S / model):.2f} |")
            assert row in text, row
    fams = report.training_families(report.load_rows(out)[1])
    assert set(fams) == {report.TrainingKey("bigraph", "bigraph", "hdrm", "resnet50"),
                         report.TrainingKey("leafspine", "ecmp", "ring", "resnet50")}
    point = fams[report.TrainingKey("leafspine", "ecmp", "ring", "resnet50")][32]
    assert point.efficiency == pytest.approx(0.53 * 0.99)
    assert point.efficiency_range == pytest.approx((0.53 * 0.90, 0.53 * 1.0))


def test_the_training_answer_compares_the_reference_with_the_other_family_at_each_host_count(built):
    out, _, md = built
    with open(os.path.join(out, "summary.json")) as fh:
        found = [a for a in json.load(fh)["answers"] if a["question"] == "training"]
    assert [a["hosts"] for a in found] == [8, 16, 32]
    for a in found:
        ref, other = MODEL_EFF[("bigraph", "hdrm")][a["hosts"]], MODEL_EFF[("ecmp", "ring")][a["hosts"]]
        assert a["text"].startswith(f"At {a['hosts']} hosts a `resnet50` iteration (scale {SCALE[a['hosts']]}) "
                                    "on BiGraph + hdrm keeps "
                                    f"{ref * 0.99:.2f} of the compute-only speed (model {ref:.2f}) against "
                                    f"{other * 0.99:.2f} (model {other:.2f}) for leaf-spine + ECMP + ring")
        assert a["measured"] == pytest.approx(ref / other) and a["model"] == pytest.approx(ref / other)
        lo, hi = a["interval"]
        assert lo <= a["measured"] <= hi and a["trusted"] is True and "Caution" not in a["text"]
        assert a["comparison"] == (f"bigraph bigraph hdrm resnet50 / leafspine ecmp ring resnet50: "
                                   f"scaling efficiency at {a['hosts']} hosts")
        assert len(a["cells"]) == 2 and all(c.startswith("train.") for c in a["cells"])
        assert a["text"] in md
    assert "near-linear scaling of ResNet-50" in found[0]["text"]
    assert not any("near-linear" in a["text"] for a in found[1:])
    assert "**Training: does a data-parallel iteration scale near-linearly?**" in section(md, "## Answers")


def test_training_rows_stay_out_of_every_busbw_comparison(built):
    out, _, md = built
    _, rows = report.load_rows(out)
    ref = report.Reference("hdrm", "bigraph")
    tables = report.speedup_tables(rows, ref)
    cells = [c for t in tables for c in t.reference.values()] + \
            [c for t in tables for by in t.baselines.values() for e in by.values() for c in e.cells]
    assert cells and not any(c.is_training for c in cells)
    assert not any(c.is_training for c in report.busbw_rows(rows))
    assert all(k.size > 0 for k in report.scaling_families(rows))
    assert not any(r is not None and r.is_training for r in report.pick_heatmap_cells(rows, ref))
    assert "resnet50" not in section(md, "## Speedup of bigraph + hdrm over every baseline")
    assert "resnet50" not in section(md, "## busbw against message size")
    with open(os.path.join(out, "summary.json")) as fh:
        busbw = [a for a in json.load(fh)["answers"] if a["question"] != "training"]
    assert busbw and not any("resnet50" in c for a in busbw for c in a["cells"])
    # the every-cell table keeps them, with their efficiency instead of busbw
    every = section(md, "## Every cell: measured against the model")
    assert "| `train.leafspine-8x4x4.ecmp-s0.ring.resnet50-s200` | ok | eff. 0.52 | eff. 0.53 |" in every


def test_cells_csv_names_the_collective_and_the_workload(built):
    out, trained, _ = built
    with open(os.path.join(out, "cells.csv")) as fh:
        got = {r["id"]: r for r in csv.DictReader(fh)}
    for c in trained:
        row = got[c.id]
        slug = f"resnet50-s{SCALE[c.hosts]}"
        assert (row["collective"], row["workload"], row["size"]) == ("allreduce", slug, "0") and c.id.endswith(slug)
        assert float(row["scaling_efficiency"]) == pytest.approx(statistics.median(rep_efficiencies(c)))
        assert float(row["predicted_scaling_efficiency"]) == MODEL_EFF[(c.routing, c.algorithm)][c.hosts]
        assert float(row["compute_only_s"]) == COMPUTE_ONLY_S
    gather = got["coll.leafspine-4x2x2.ecmp-s0.allgather-ring.64KiB"]
    assert (gather["collective"], gather["workload"]) == ("allgather", "")
    assert got["coll.leafspine-4x2x2.ecmp-s0.ring.64KiB"]["collective"] == "allreduce"


def test_a_collective_other_than_allreduce_is_named_in_its_labels(built):
    out, _, md = built
    _, rows = report.load_rows(out)
    by_id = {r.id: r for r in rows}
    gather = by_id["coll.leafspine-4x2x2.ecmp-s0.allgather-ring.64KiB"]
    assert gather.family() == "leafspine-4x2x2 ecmp allgather-ring"
    assert answers.describe(gather) == "leaf-spine + ECMP + ring allgather"
    plain = by_id["coll.leafspine-4x2x2.ecmp-s0.ring.64KiB"]
    assert plain.family() == "leafspine-4x2x2 ecmp ring" and answers.describe(plain) == "leaf-spine + ECMP + ring"
    # its own speedup table, against the allgather reference only
    tables = {t.collective: t for t in report.speedup_tables(rows, report.Reference("hdrm", "bigraph"))}
    assert set(tables) == {"allreduce", "allgather"}
    assert set(tables["allgather"].baselines) == {"leafspine-4x2x2 ecmp allgather-ring"}
    assert tables["allgather"].reference[64 * 1024].collective == "allgather"
    assert "leafspine-4x2x2 ecmp allgather-ring" not in tables["allreduce"].baselines
    assert "### series `coll`, 8 hosts, allgather" in md and "### series `coll`, 8 hosts\n" in md
    assert "| leafspine-4x2x2 ecmp allgather-ring |" in md
    assert "busbw against size, series coll (allreduce, allgather)" in md
    # Q2 is the paper's allreduce question: the allgather table answers it only without an allreduce one
    with open(os.path.join(out, "summary.json")) as fh:
        q2 = [a for a in json.load(fh)["answers"] if a["question"] == "Q2"]
    assert q2 and not any("allgather" in a["comparison"] for a in q2)


def test_read_computes_parses_the_compute_records_of_one_repetition(built):
    out, trained, _ = built
    cdir = os.path.join(out, "cells", trained[0].id)
    computes = report.read_computes(cdir, 1)
    assert len(computes) == 3 * GANTT_RANKS
    first = computes[0]
    assert first == timelines.Compute(rep=1, step=0, rank=0, host="h1", op=0, seconds=1 / 5000, start=100.0,
                                      end=101.0)
    assert {c.rank for c in computes} == set(range(GANTT_RANKS)) and all(c.rep == 1 for c in computes)
    transfers = report.read_transfers(cdir, 1)
    assert len(transfers) == GANTT_RANKS and all(t.bytes == 4096 for t in transfers)
    tl = timelines.first_measured_transfers([r for r in report.load_rows(out)[1] if r.id == trained[0].id])
    assert tl and tl[0].rep == 1 and len(tl[0].computes) == 3 * GANTT_RANKS and tl[0].start == 100.0


def test_the_gantt_draws_compute_alone_or_with_transfers(built, tmp_path):
    out, trained, _ = built
    row = next(r for r in report.load_rows(out)[1] if r.id == trained[0].id)
    computes = report.read_computes(row.dir, 1)
    assert plots.plot_gantt(str(tmp_path / "c.png"), [report.Timeline(row=row, rep=1, transfers=[],
                                                                      computes=computes)])
    assert os.path.getsize(tmp_path / "c.png") > 5000
    assert not plots.plot_gantt(str(tmp_path / "none.png"), [])


def test_the_congestion_timeline_shows_compute_of_its_cells(tmp_path):
    out, _ = make_results(tmp_path)
    _, rows = report.load_rows(out)
    congested, clean = report.pick_heatmap_cells(rows, report.Reference("hdrm", "bigraph"))
    assert clean is not None
    start = min(t.start for t in report.read_transfers(clean.dir, 1))
    append_jsonl(os.path.join(clean.dir, "timeline.jsonl"),
                 {"rep": 1, "kind": "compute", "step": 0, "rank": 0, "host": "h1", "op": 0, "seconds": 1e-4,
                  "start": start, "end": start + 0.1})
    md = open(report.write_report(out)).read()
    timeline = section(md, "## Timeline")
    assert "Grey bars: the rank's compute operations." in timeline
    assert os.path.getsize(os.path.join(out, "plots", "gantt.png")) > 5000


def test_cells_whose_latencies_shrink_with_the_scale_say_what_stays_unscaled(tmp_path):
    out, _ = make_results(tmp_path, latency_scaled=True)
    text = section(open(report.write_report(out)).read(), "## Training iteration: scaling efficiency")
    assert "latencies divided by the scale as well (alpha 8 µs becomes 0.08 µs at scale 100, 0.04 µs at scale 200)" in text
    assert "flagged `latency_floor`" in text and "frame's store-and-forward weighs `scale` times more" in text
    assert "latency weighs `scale` times more" not in text


def test_an_experiment_of_training_only_has_no_busbw_sections(tmp_path):
    full = xp.from_dict(yaml.safe_load(HEAD + training_yaml()), where="train.yaml")
    out = str(tmp_path / "run")
    cells = xp.expand(full)
    os.makedirs(os.path.join(out, "cells"))
    write_json_atomic(os.path.join(out, "experiment.json"), {
        "experiment": full.to_json(), "fingerprint": full.fingerprint(),
        "cells": [{**cell_json(c, False), "predicted_time_s": 11.0, "predicted_busbw_mbps": 1.3, "alpha_beta_time_s": 0.5,
                   "max_flows_per_link": 1, "predicted_scaling_efficiency": 0.9} for c in cells]})
    untrusted = cells[-1]
    for c in cells:
        write_training_cell(out, c, full.warmup)
    res = results.load(os.path.join(out, "cells", untrusted.id, "results.json"))
    assert res is not None
    res.flag_all("over_capacity")
    res.save(os.path.join(out, "cells", untrusted.id, "results.json"))
    md = open(report.write_report(out)).read()
    assert "## Training iteration: scaling efficiency" in md
    for heading in ("## Speedup of", "## busbw against message size", "## Congestion", "## Scaling\n",
                    "## Paper scale"):
        assert heading not in md, heading
    with open(os.path.join(out, "summary.json")) as fh:
        found = json.load(fh)["answers"]
    assert {a["question"] for a in found} == {"training"}
    at32 = next(a for a in found if a["hosts"] == 32)
    assert at32["trusted"] is False and f"Caution: flagged: over_capacity in `{untrusted.id}`." in at32["text"]
    assert f"flagged: `{untrusted.id}`" in section(md, "## Training iteration: scaling efficiency")
