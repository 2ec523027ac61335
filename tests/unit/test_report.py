"""The report on synthetic results written by a fake session: tables, CSV, plots, flags and failures."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import random
import statistics

import pytest
import yaml
from fake_session import factory

from emulator.base import stats
from emulator.base.files import write_json_atomic
from emulator.cli import main as cli
from emulator.model import fabric
from emulator.study import experiment as xp
from emulator.study import report
from emulator.study.live import runner
from emulator.study.report.answers import describe

EXP = """
name: synth
description: synthetic results for the report tests
repeat: 2
warmup: 1
ecmp_seeds: [0, 1]
sizes: [16KiB, 64KiB]
series:
  - name: cmp
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=2"
        routing: bigraph
        algorithms: [hdrm, hd]
      - topology: "leafspine:leaves=4,spines=2,hosts_per_leaf=2"
        routing: [ecmp, dmodk]
        algorithms: [hd, ring]
      - topology: "star:hosts=8"
        routing: shortest
        algorithms: [hd]
  - name: scale
    sizes: [64KiB]
    runs:
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm]
      - topology: "leafspine:leaves=2,spines=2,hosts_per_leaf=2"
        routing: ecmp
        seeds: [0]
        algorithms: [hd]
"""

REF = report.Reference(algorithm="hdrm", routing="bigraph")


def make_results(tmp_path, fail=(), flags=("uncalibrated",)):
    exp = xp.from_dict(yaml.safe_load(EXP), where="synth.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(fail=set(fail), flags=flags), stream=io.StringIO()).run()
    return exp, out


def test_report_files_and_speedup_numbers(tmp_path):
    exp, out = make_results(tmp_path, fail={"cmp.leafspine-4x2x2.dmodk.ring.16KiB"})
    path = report.write_report(out)
    md = open(path).read()
    for name in ("busbw-cmp.png", "busbw-scale.png", "heatmap.png", "gantt.png", "scaling.png",
                 "measured-vs-model.png"):
        p = os.path.join(out, "plots", name)
        assert os.path.getsize(p) > 5000, name
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}" in md
    html = open(os.path.join(out, "report.html")).read()
    assert "<table>" in html and "<img src='plots/heatmap.png'" in html

    _, rows = report.load_rows(out)
    by_id = {r.id: r for r in rows}
    ref = by_id["cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"]
    s0, s1 = by_id["cmp.leafspine-4x2x2.ecmp-s0.hd.64KiB"], by_id["cmp.leafspine-4x2x2.ecmp-s1.hd.64KiB"]
    tables = report.speedup_tables(rows, REF)
    cmp8 = next(t for t in tables if t.series == "cmp" and t.hosts == 8)
    entry = cmp8.baselines["leafspine-4x2x2 ecmp hd"][64 * 1024]
    median = (s0.busbw_mbps + s1.busbw_mbps) / 2
    assert abs(entry.speedup - ref.busbw_mbps / median) < 1e-9
    assert entry.seeds == 2
    assert entry.speedup > 1  # the fake session slows ECMP down
    lo, hi = entry.interval
    assert lo <= entry.speedup <= hi and entry.significant is (lo > 1 or hi < 1)
    assert f"×{entry.speedup:.2f} ({lo:.2f}–{hi:.2f}); model ×{entry.model_speedup:.2f}" in md
    assert "star-8 shortest hd" in cmp8.baselines
    assert fabric.default().describe() in md  # what the emulated figures stand for
    # the reference ran at two host counts: the model projects the comparisons (to 128 in these tests)
    assert "Model only, not measured: at 128 accelerators and 16MiB per rank, BiGraph + hdrm would be" in md
    assert "| 128 | 16MiB | fat-tree + ECMP + ring | `fattree:k=8` |" in md

    # every cell, its prediction, its flags and the failed cell
    assert "cmp.leafspine-4x2x2.dmodk.ring.16KiB`: failed: RuntimeError: rank 3" in md
    assert "`uncalibrated`: " in md
    for r in rows:
        assert f"`{r.id}`" in md
    with open(os.path.join(out, "cells.csv")) as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == len(xp.expand(exp))
    got = {r["id"]: r for r in csv_rows}
    assert got["cmp.leafspine-4x2x2.dmodk.ring.16KiB"]["status"] == "failed"
    assert float(got[ref.id]["busbw_mbps"]) == ref.busbw_mbps
    assert float(got[ref.id]["predicted_busbw_mbps"]) > 0

    # scaling joins series: hdrm at 4 and 8 hosts, leafspine ecmp hd at 4 and 8
    fams = report.scaling_families(rows)
    assert set(fams[("bigraph", "bigraph", "hdrm", 64 * 1024)]) == {4, 8}
    assert set(fams[("leafspine", "ecmp", "hd", 64 * 1024)]) == {4, 8}
    eff = fams[("bigraph", "bigraph", "hdrm", 64 * 1024)][8].efficiency
    assert 0 < eff <= 1


def test_a_placement_other_than_the_algorithms_own_is_named(tmp_path):
    _, out = make_results(tmp_path)
    _, rows = report.load_rows(out)
    row = next(r for r in rows if r.algorithm == "hd" and r.placement == "identity")
    assert row.algorithm_label == "hd"
    on_hdrm = dataclasses.replace(row, placement="hdrm")  # hd on HDRM's placement is not hd's own family
    assert on_hdrm.algorithm_label == "hd-hdrm" and on_hdrm.family() != row.family()
    assert describe(on_hdrm).endswith(" + hd (hdrm placement)")
    hdrm = dataclasses.replace(row, algorithm="hdrm", placement="hdrm")
    assert hdrm.algorithm_label == "hdrm" and describe(hdrm).endswith(" + hdrm")
    assert dataclasses.replace(row, collective="allgather").op_label == "allgather-hd"


def test_heatmap_cells_and_matrix(tmp_path):
    _, out = make_results(tmp_path)
    _, rows = report.load_rows(out)
    congested, clean = report.pick_heatmap_cells(rows, REF)
    assert congested.max_flows_per_link >= 2 and congested.kind != "star"
    assert clean.algorithm == "hdrm" and clean.max_flows_per_link == 1
    m = report.link_step_matrix(clean.dir)
    assert m.links and all(">" in lk for lk in m.links)
    assert max(max(col) for col in m.flows) == 1
    assert m.rep == 1  # first measured repetition, after one warm-up
    # every link the model uses in a step has measured transfers in the same step, and no others
    for s, (fcol, mcol) in enumerate(zip(m.flows, m.measured_mbps, strict=True)):
        for f, v in zip(fcol, mcol, strict=True):
            assert (f > 0) == (v is not None), (s, f, v)


def test_flags_untrusted_and_partial_run(tmp_path):
    exp = xp.from_dict(yaml.safe_load(EXP), where="synth.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(flags=("over_capacity",)), stream=io.StringIO(),
                  after_cell=lambda *_: (_ for _ in ()).throw(KeyboardInterrupt)).run()
    md = open(report.write_report(out)).read()
    assert "**1 of 20 cells finished**" in md
    assert "`over_capacity`: 1 cells" in md
    assert "Flagged: `cmp.bigraph-2x2x2.bigraph.hdrm.16KiB` (flagged: over_capacity" in md
    assert "Not run yet: 19 cells." in md


def test_cli_report(tmp_path, capsys):
    _, out = make_results(tmp_path)
    assert cli.main(["report", out]) == 0
    assert "report.md" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "field 'dir'" in capsys.readouterr().err


def test_faults_in_an_experiment_reach_every_cell_of_the_run_and_the_report(tmp_path):
    data = yaml.safe_load(EXP)
    data["series"][1]["runs"][0]["faults"] = ["link_down:s1-s3@step=1", {"action": "controller_kill", "at": 0.2}]
    exp = xp.from_dict(data, where="synth.yaml")
    faulted = [c for c in xp.expand(exp) if c.faults]
    assert [c.id for c in faulted] == ["scale.bigraph-2x2x1.bigraph.hdrm.64KiB"]
    assert faulted[0].faults == ("link_down:s1-s3@step=1", "controller_kill@0.2s")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    md = open(report.write_report(out)).read()
    assert "## Faults" in md and "`link_down:s1-s3@step=1`" in md and "40 ms" in md and "degraded" in md
    _, rows = report.load_rows(out)
    assert {r.outcome for r in rows if r.faults} == {"degraded"}


def test_a_bad_fault_in_an_experiment_names_its_field(tmp_path):
    data = yaml.safe_load(EXP)
    data["series"][1]["runs"][0]["faults"] = ["link_down:s1-s2@1s"]
    try:
        xp.from_dict(data, where="synth.yaml")
    except xp.UserError as exc:
        assert "series[1].runs[0].faults" in str(exc) and "'target'" in str(exc)
    else:
        raise AssertionError("accepted a fault on a link that does not exist")
    data["series"][1]["runs"][0]["faults"] = ["link_down:s1-s3@step=99"]
    exp = xp.from_dict(data, where="synth.yaml")  # steps are known per cell only
    try:
        xp.prepare(exp)
    except xp.UserError as exc:
        assert "step must be a step in 0..3" in str(exc)
    else:
        raise AssertionError("accepted a step the schedule does not have")


def test_server_designs_get_their_speedup_table(tmp_path):
    spec = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=2,accels_per_server=4,pcie_bw=20"
    exp = xp.from_dict(yaml.safe_load(f"""
name: servers
fabric: bandwidth-only    # the NIC's bandwidth is what differs
sizes: [1MiB]
series:
  - name: own
    runs: [{{topology: "{spec},nics_per_server=4,nic_placement=spread", routing: bigraph, algorithms: [hier, ring]}}]
  - name: shared
    runs: [{{topology: "{spec},nics_per_server=1,nic_placement=spread", routing: bigraph, algorithms: [hier, ring]}}]
"""), where="servers.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    _, rows = report.load_rows(out)
    assert {r.server_design for r in rows} == {"NIC per accelerator", "shared NIC"}
    tables = {t.family: t for t in report.server_speedup_tables(rows)}
    assert set(tables) == {"bigraph-2x2x2 2x4 bigraph hier", "bigraph-2x2x2 2x4 bigraph ring"}
    hier = tables["bigraph-2x2x2 2x4 bigraph hier"]
    assert hier.own.nics_per_server == 4 and hier.shared.nics_per_server == 1
    # four flows share the NIC in the inter-server phase: per accelerator 3/4 n in each intra-server ring
    # phase and n/4 across, all four over one NIC when it is shared, so at most (1.5 + 1) / (1.5 + 0.25)
    assert 1.2 < hier.model_speedup <= 2.5 / 1.75 + 1e-9
    assert hier.speedup == pytest.approx(hier.model_speedup)  # the fake session runs at the model's pace
    md = open(report.write_report(out)).read()
    assert "## Server designs: one NIC per accelerator against a shared NIC" in md
    lo, hi = hier.interval
    assert f"×{hier.speedup:.2f} ({lo:.2f}–{hi:.2f})" in md


def test_designs_on_servers_are_grown_to_more_accelerators_by_the_model(tmp_path):
    """An experiment of designs on servers (experiments/clusters.yaml in small): each design the experiment ran is
    projected at more accelerators, and the answers say how the reference compares there (model only)."""
    servers = "servers=2,accels_per_server=4,nics_per_server=4"
    exp = xp.from_dict(yaml.safe_load(f"""
name: designs
fabric: h100-ndr400
sizes: [64KiB]
reference: {{algorithm: hdrm, routing: bigraph}}
series:
  - name: designs
    runs:
      - {{topology: "bigraph:upper=2,lower=2,hosts_per_switch=2,{servers},nic_placement=hdrm", routing: bigraph,
         algorithms: [hdrm]}}
      - {{topology: "railonly:rails=4,hosts_per_rail=2,{servers}", routing: shortest, algorithms: [hdrm, hier]}}
"""), where="designs.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    built = report.build(out)
    designs = [a for a in built.answers if a.question == "designs"]
    assert designs and all(a.hosts == 32 and a.measured is None and a.model for a in designs)
    assert {a.size for a in designs} == {64 << 10, 256 << 20}
    assert all(a.comparison.startswith("BiGraph + hdrm / rail-only") for a in designs)
    md = built.doc.markdown()
    assert "## The same designs at more accelerators, by the model alone (not measured)" in md
    assert "`railonly:rails=4,hosts_per_rail=8," in md and "32 accelerators, 256MiB" in md
    assert "servers' interconnect 3600 Gbit/s" in md


# ------------------------------------------------------------------ answers, intervals and summary.json
ANSWERS_EXP = """
name: answers
description: a comparison at 8 hosts, a larger one at 16, and the reference at both
repeat: 3
warmup: 0
ecmp_seeds: [0, 1]
sizes: [16KiB, 64KiB]
series:
  - name: cmp
    runs:
      - {{topology: "bigraph:upper=2,lower=2,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm, hd]}}
      - {{topology: "leafspine:leaves=4,spines=2,hosts_per_leaf=2", routing: [ecmp, dmodk], algorithms: [hd, ring]}}
      - {{topology: "star:hosts=8", routing: shortest, algorithms: [hd]}}
  - name: big
    sizes: [64KiB]
    runs:
      - {{topology: "bigraph:upper=4,lower=4,hosts_per_switch=2{bw}", routing: bigraph, algorithms: [hdrm]}}
      - {{topology: "leafspine:leaves=4,spines=2,hosts_per_leaf=4", routing: ecmp, seeds: [0], algorithms: [hd]}}
"""
BIG_REF = "big.bigraph-4x4x2.bigraph.hdrm.64KiB"
BIG_BASE = "big.leafspine-4x2x4.ecmp-s0.hd.64KiB"


def make_answers_results(tmp_path, bw="", fail=()):
    exp = xp.from_dict(yaml.safe_load(ANSWERS_EXP.format(bw=bw)), where="answers.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(fail=set(fail)), stream=io.StringIO()).run()
    jitter(out)
    within_the_model(out)
    return out


def within_the_model(out, ratio=1.02):
    """Put every finished cell's repetition times at ``ratio`` of its model's, as today's experiments measure: the
    fake session stretches max-min step times, which for ECMP and ring cells lands far outside the band (their
    busbw, which the answers compare, stays as the fake measured it)."""
    for cell_id in sorted(os.listdir(os.path.join(out, "cells"))):
        res = cell_results(out, cell_id)
        if res.get("status") == "ok":
            for rep in res["repetitions"]:
                rep["time_s"] = res["prediction"]["predicted_time_s"] * ratio
            write_json_atomic(os.path.join(out, "cells", cell_id, "results.json"), res)


def cell_results(out, cell_id):
    with open(os.path.join(out, "cells", cell_id, "results.json")) as fh:
        return json.load(fh)


def set_cell(out, cell_id, busbw=None, flags=None):
    """Rewrite a finished cell's repetitions: their busbw (and median), or their fidelity flags."""
    res = cell_results(out, cell_id)
    if busbw is not None:
        for rep, value in zip(res["repetitions"], busbw, strict=True):
            rep["busbw_mbps"] = value
        res["busbw_mbps_median"] = statistics.median(busbw)
    if flags is not None:
        for rep in res["repetitions"]:
            rep["fidelity"]["flags"] = list(flags)
            rep["fidelity"]["trusted"] = "over_capacity" not in flags
        res["trusted"] = "over_capacity" not in flags
    write_json_atomic(os.path.join(out, "cells", cell_id, "results.json"), res)


def jitter(out, rel=0.03):
    """Give every finished cell's repetitions a deterministic spread of +-rel around the fake session's value."""
    rng = random.Random(7)
    for cell_id in sorted(os.listdir(os.path.join(out, "cells"))):
        res = cell_results(out, cell_id)
        if res.get("status") == "ok":
            set_cell(out, cell_id, [r["busbw_mbps"] * (1 + rel * rng.uniform(-1, 1)) for r in res["repetitions"]])


def summary_of(out):
    with open(os.path.join(out, "summary.json")) as fh:
        return json.load(fh)


def test_answers_open_the_report_and_match_the_tables_and_summary(tmp_path):
    out = make_answers_results(tmp_path)
    with open(os.path.join(out, "run.json")) as fh:
        run = json.load(fh)
    write_json_atomic(os.path.join(out, "run.json"), {**run, "wall_s": 123.5})
    md = open(report.write_report(out)).read()
    blocks = md.split("\n\n")
    assert blocks[0] == "# Experiment `answers`" and blocks[1].startswith("a comparison at 8 hosts")
    assert blocks[2].startswith("**Trust: 20 of 20 measured cells trusted, 0 flagged, 0 unchecked.**")
    assert blocks[3] == "## Answers"  # before anything else but the trust line
    answers_md = md[md.index("## Answers"):md.index("\n## ", md.index("## Answers") + 1)]
    assert "**Q2. Do BiGraph and HDRM remove network congestion?**" in answers_md
    assert f"repetitions and ECMP seeds ({report.RESAMPLES} resamples)" in answers_md

    summary = summary_of(out)
    assert summary["schema"] == 1 and summary["experiment"] == "answers" and summary["wall_s"] == 123.5
    keys = {"question", "text", "comparison", "hosts", "size", "measured", "interval", "significant", "model",
            "trusted", "cells"}
    assert all(set(a) == keys for a in summary["answers"])
    q2 = [a for a in summary["answers"] if a["question"] == "Q2"]
    # the largest host count (16, one baseline) gets every family; the 8-host table (6 baselines) its best
    # and worst non-star baseline, never the star
    assert [(a["hosts"], a["comparison"]) for a in q2][0] == (16, "bigraph-4x4x2 bigraph hdrm / leafspine-4x2x4 ecmp hd")
    assert [a["hosts"] for a in q2] == [16, 8, 8] and not any("star" in a["comparison"] for a in q2)
    assert "the best of its 5 non-star baselines" in q2[1]["text"] and "the worst of" in q2[2]["text"]
    assert "×6.08" in q2[0]["text"] and "×6.08" not in q2[1]["text"]

    _, rows = report.load_rows(out)
    tables = {(t.series, t.hosts): t for t in report.speedup_tables(rows, REF)}
    for a in q2:
        t = tables[("big", 16)] if a["hosts"] == 16 else tables[("cmp", 8)]
        fam = a["comparison"].split(" / ")[1]
        e = t.baselines[fam][a["size"]]
        assert a["measured"] == pytest.approx(e.speedup) and a["model"] == pytest.approx(e.model_speedup)
        assert a["interval"] == pytest.approx(list(e.interval)) and a["significant"] == e.significant
        lo, hi = a["interval"]
        assert lo <= a["measured"] <= hi and lo < hi  # the jitter gives every cell a spread
        assert f"×{a['measured']:.2f} (95%: {lo:.2f}–{hi:.2f})" in a["text"] and a["text"] in answers_md
        assert f"×{e.speedup:.2f} ({lo:.2f}–{hi:.2f})" in md  # the table shows the same interval
        assert a["trusted"] is True and "Caution" not in a["text"]
    # ECMP seeds fold into one baseline: the interval resamples one group per seed
    by_id = {r.id: r for r in rows}
    ring = tables[("cmp", 8)].baselines["leafspine-4x2x2 ecmp ring"][64 * 1024]
    seeds = [by_id[f"cmp.leafspine-4x2x2.ecmp-s{s}.ring.64KiB"].rep_busbw for s in (0, 1)]
    iv = stats.ratio_interval([by_id["cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"].rep_busbw], seeds)
    assert ring.seeds == 2 and ring.interval == (iv.low, iv.high)

    scaling = [a for a in summary["answers"] if a["question"] == "scaling"]
    assert len(scaling) == 1 and (scaling[0]["hosts"], scaling[0]["size"]) == (16, 64 * 1024)
    small, large = by_id["cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"], by_id[BIG_REF]
    assert scaling[0]["measured"] == pytest.approx(large.busbw_mbps / small.busbw_mbps)  # same link rate
    assert "From 8 to 16 hosts at 64KiB per rank" in scaling[0]["text"]
    assert not [a for a in summary["answers"] if a["question"] == "Q1"]  # no server designs: no Q1
    assert "**Q1." not in md


def test_wall_s_comes_from_run_json_and_is_null_without_it(tmp_path):
    _, out = make_results(tmp_path)
    with open(os.path.join(out, "run.json")) as fh:
        run = json.load(fh)
    write_json_atomic(os.path.join(out, "run.json"), {**run, "wall_s": 7})
    report.write_report(out)
    assert summary_of(out)["wall_s"] == 7.0
    write_json_atomic(os.path.join(out, "run.json"), {k: v for k, v in run.items() if k != "wall_s"})
    report.write_report(out)
    assert summary_of(out)["wall_s"] is None


def test_an_untrusted_or_failed_cell_is_called_out_in_its_answer(tmp_path):
    small_ref = "cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"
    out = make_answers_results(tmp_path, fail={small_ref})
    set_cell(out, BIG_REF, flags=["over_capacity", "uncalibrated"])
    report.write_report(out)
    answers = summary_of(out)["answers"]
    big = next(a for a in answers if a["question"] == "Q2" and a["hosts"] == 16)
    assert f"Caution: flagged: over_capacity in `{BIG_REF}`." in big["text"] and big["trusted"] is False
    assert "uncalibrated" not in big["text"] and big["measured"] is not None
    # the failed 8-host reference: its answers are not measured and name it, with the model's number
    eight = [a for a in answers if a["question"] == "Q2" and a["hosts"] == 8]
    assert len(eight) == 2
    for a in eight:
        assert f"`{small_ref}` failed" in a["text"] and "not measured" in a["text"] and a["trusted"] is False
        assert a["measured"] is None and a["interval"] is None and a["significant"] is None and a["model"] > 0
    scaling = next(a for a in answers if a["question"] == "scaling")
    assert f"`{small_ref}` failed" in scaling["text"] and f"over_capacity in `{BIG_REF}`" in scaling["text"]
    assert scaling["trusted"] is False and scaling["measured"] is None


def test_a_trusted_answer_has_no_caution(tmp_path):
    out = make_answers_results(tmp_path)
    set_cell(out, "cmp.leafspine-4x2x2.dmodk.hd.64KiB", flags=["over_capacity"])  # used by no answer
    report.write_report(out)
    answers = summary_of(out)["answers"]
    assert answers and all(a["trusted"] and "Caution" not in a["text"] for a in answers)
    assert "cmp.leafspine-4x2x2.dmodk.hd.64KiB" not in {c for a in answers for c in a["cells"]}


def test_a_baseline_that_failed_everywhere_is_not_measured_but_still_answered(tmp_path):
    out = make_answers_results(tmp_path, fail={BIG_BASE})
    report.write_report(out)
    big = next(a for a in summary_of(out)["answers"] if a["question"] == "Q2" and a["hosts"] == 16)
    assert big["measured"] is None and big["interval"] is None and big["model"] > 0
    assert "not measured" in big["text"] and f"`{BIG_BASE}` failed" in big["text"]


def test_a_difference_inside_the_noise_is_not_significant(tmp_path):
    out = make_answers_results(tmp_path)
    set_cell(out, BIG_REF, busbw=[5.0, 5.3, 4.8])
    set_cell(out, BIG_BASE, busbw=[5.1, 4.9, 5.2])
    md = open(report.write_report(out)).read()
    big = next(a for a in summary_of(out)["answers"] if a["question"] == "Q2" and a["hosts"] == 16)
    assert big["significant"] is False and big["interval"][0] < 1 < big["interval"][1]
    assert "is no different from leaf-spine + ECMP + hd within the noise" in big["text"] and big["text"] in md
    assert "not significant" in big["text"] and "faster than" not in big["text"]
    assert f"×{big['measured']:.2f} ({big['interval'][0]:.2f}–{big['interval'][1]:.2f}) n.s." in md
    # a clear difference stays significant
    set_cell(out, BIG_BASE, busbw=[2.5, 2.4, 2.6])
    report.write_report(out)
    big = next(a for a in summary_of(out)["answers"] if a["question"] == "Q2" and a["hosts"] == 16)
    assert big["significant"] is True and "not significant" not in big["text"]
    assert big["measured"] == pytest.approx(5.0 / 2.5)


def test_cells_at_different_link_rates_are_compared_by_efficiency(tmp_path):
    out = make_answers_results(tmp_path, bw=",bw=10")
    md = open(report.write_report(out)).read()
    _, rows = report.load_rows(out)
    by_id = {r.id: r for r in rows}
    ref, base = by_id[BIG_REF], by_id[BIG_BASE]
    assert (ref.link_mbps, base.link_mbps) == (10, 20)
    # the spec's own rate set its run's dilation: the same real fabric, dilated twice as much
    assert ref.fabric is not None and base.fabric is not None and ref.fabric.dilation == 2 * base.fabric.dilation
    eff = (ref.busbw_mbps / ref.capacity_mbps) / (base.busbw_mbps / base.capacity_mbps)
    assert abs(eff - ref.busbw_mbps / base.busbw_mbps) > 0.3  # the two readings differ a lot here
    answers = summary_of(out)["answers"]
    big = next(a for a in answers if a["question"] == "Q2" and a["hosts"] == 16)
    assert big["measured"] == pytest.approx(eff) and "by efficiency" in big["text"]
    lo, hi = big["interval"]
    assert lo <= eff <= hi
    t = next(t for t in report.speedup_tables(rows, REF) if t.hosts == 16)
    assert t.baselines["leafspine-4x2x4 ecmp hd"][64 * 1024].by_efficiency is True
    assert f"×{eff:.2f} ({lo:.2f}–{hi:.2f})" in md
    # scaling: 8 hosts at 20 Mbit/s against 16 at 10, by each cell's own link goodput
    small = by_id["cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"]
    scaling = next(a for a in answers if a["question"] == "scaling")
    expected = (ref.busbw_mbps / ref.capacity_mbps) / (small.busbw_mbps / small.capacity_mbps)
    assert scaling["measured"] == pytest.approx(expected)
    assert abs(expected - ref.busbw_mbps / small.busbw_mbps) > 0.3


SERVERS_EXP = """
name: servers
fabric: bandwidth-only
repeat: 3
warmup: 0
sizes: [256KiB, 1MiB]
series:
  - name: own
    runs: [{{topology: "{spec},nics_per_server=4,nic_placement=spread", routing: bigraph, algorithms: [hdrm, hier, ring]}}]
  - name: shared
    runs: [{{topology: "{spec},nics_per_server=1,nic_placement=spread", routing: bigraph, algorithms: [hdrm, hier, ring]}}]
"""


def test_q1_answers_from_the_server_designs(tmp_path):
    spec = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=2,accels_per_server=4,pcie_bw=20"
    exp = xp.from_dict(yaml.safe_load(SERVERS_EXP.format(spec=spec)), where="servers.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    jitter(out)
    md = open(report.write_report(out)).read()
    q1 = [a for a in summary_of(out)["answers"] if a["question"] == "Q1"]
    # the reference algorithm first, then the other algorithms with the least and the most gain; largest size
    assert [a["comparison"].split(":")[0].split()[-1] for a in q1][0] == "hdrm"
    assert sorted(a["comparison"].split(":")[0].split()[-1] for a in q1[1:]) == ["hier", "ring"]
    assert all(a["size"] == 1 << 20 and a["hosts"] == 8 for a in q1)
    assert q1[1]["measured"] <= q1[2]["measured"]
    tables = {(t.family, t.size): t for t in report.server_speedup_tables(report.load_rows(out)[1])}
    for a in q1:
        t = tables[(a["comparison"].split(":")[0], a["size"])]
        assert a["measured"] == pytest.approx(t.speedup) and a["interval"] == pytest.approx(list(t.interval))
        assert a["cells"] == [t.own.id, t.shared.id]
        assert a["text"].startswith("One NIC per accelerator is ") and f"×{a['measured']:.2f} (95%: " in a["text"]
        assert "on 8 accelerators (2 servers × 4)" in a["text"]
    assert "×11.3" in q1[0]["text"] and not any("×11.3" in a["text"] for a in q1[1:])
    # Q1 comes first; a shared-NIC table does not answer Q2 (only the own-NIC series' does)
    assert md.index("**Q1.") < md.index("**Q2.")
    q2 = [a for a in summary_of(out)["answers"] if a["question"] == "Q2"]
    assert q2 and all(a["comparison"].startswith("bigraph-2x2x2-srv2x4n4s") for a in q2)


# ------------------------------------------------------------------ the document
def test_the_document_renders_every_block_to_markdown_and_html():
    doc = report.Doc()
    doc.h(2, "Speedup <of> x")
    doc.p("a `code` and **bold** & more")
    doc.ul([])
    doc.ul(["one", "`two`"])
    doc.table(["a", "b|c"], [["1", "x|y"]])
    doc.img("plots/p.png", "a plot")
    assert doc.markdown() == ("## Speedup <of> x\n\na `code` and **bold** & more\n\n- (none)\n\n- one\n- `two`\n\n"
                              "| a | b|c |\n|---|---|\n| 1 | x\\|y |\n\n![a plot](plots/p.png)\n")
    page = doc.html("Experiment <x>")
    assert page.startswith("<!doctype html>") and "<title>Experiment &lt;x&gt;</title>" in page
    assert "<h2>Speedup &lt;of&gt; x</h2>" in page
    assert "<p>a <code>code</code> and <b>bold</b> &amp; more</p>" in page
    assert "<ul></ul>" in page and "<li><code>two</code></li>" in page
    assert "<tr><th>a</th><th>b|c</th></tr><tr><td>1</td><td>x|y</td></tr>" in page
    assert "<p><img src='plots/p.png' alt='a plot'></p>" in page and page.endswith("</body></html>\n")


def test_cells_csv_has_the_columns_in_order_and_a_row_per_planned_cell(tmp_path):
    _, out = make_results(tmp_path)
    report.write_report(out)
    with open(os.path.join(out, "cells.csv")) as fh:
        lines = fh.read().splitlines()
    assert lines[0] == ",".join(report.CSV_FIELDS)
    _, rows = report.load_rows(out)
    assert [line.split(",")[0] for line in lines[1:]] == [r.id for r in rows]
    flagged = next(r for r in rows if r.flags)
    assert f",{' '.join(flagged.flags)}," in lines[1 + rows.index(flagged)]


def test_runs_at_their_own_rates_are_each_said_what_they_stand_for(tmp_path):
    """A run with its own rate (or ``dilation: auto``'s choice): the overview lists each rate and dilation,
    never the experiment's 20 Mbit/s for every cell."""
    data = yaml.safe_load(EXP)
    data["series"][1]["runs"][0]["link_mbps"] = 10
    exp = xp.from_dict(data, where="synth.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    report.write_report(out)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as fh:
        text = fh.read()
    links = next(line for line in text.splitlines() if line.startswith("- Links"))
    assert "per run" in links and "10 Mbit/s (1 cell)" in links and "20 Mbit/s (" in links
    fabrics = next(line for line in text.splitlines() if line.startswith("- Fabric"))
    assert "time dilation 10000" in fabrics and "time dilation 5000" in fabrics
