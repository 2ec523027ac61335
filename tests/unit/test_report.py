"""The report on synthetic results written by a fake session: tables, CSV, plots, flags and failures."""

from __future__ import annotations

import csv
import io
import os

import pytest
import yaml
from fake_session import factory

from emulator import cli, fabric, report, runner
from emulator import experiment as xp

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
    by_id = {r["id"]: r for r in rows}
    ref = by_id["cmp.bigraph-2x2x2.bigraph.hdrm.64KiB"]
    s0, s1 = by_id["cmp.leafspine-4x2x2.ecmp-s0.hd.64KiB"], by_id["cmp.leafspine-4x2x2.ecmp-s1.hd.64KiB"]
    tables = report.speedup_tables(rows, {"algorithm": "hdrm", "routing": "bigraph"})
    cmp8 = next(t for t in tables if t["series"] == "cmp" and t["hosts"] == 8)
    entry = cmp8["baselines"]["leafspine-4x2x2 ecmp hd"][64 * 1024]
    median = (s0["busbw_mbps"] + s1["busbw_mbps"]) / 2
    assert abs(entry["speedup"] - ref["busbw_mbps"] / median) < 1e-9
    assert entry["seeds"] == 2
    assert entry["speedup"] > 1  # the fake session slows ECMP down
    assert f"x{entry['speedup']:.2f} (x{entry['model_speedup']:.2f})" in md
    assert "star-8 shortest hd" in cmp8["baselines"]
    assert fabric.default().describe() in md  # what the emulated figures stand for

    # every cell, its prediction, its flags and the failed cell
    assert "cmp.leafspine-4x2x2.dmodk.ring.16KiB`: failed: RuntimeError: rank 3" in md
    assert "`uncalibrated`: " in md
    for r in rows:
        assert f"`{r['id']}`" in md
    with open(os.path.join(out, "cells.csv")) as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == len(xp.expand(exp))
    got = {r["id"]: r for r in csv_rows}
    assert got["cmp.leafspine-4x2x2.dmodk.ring.16KiB"]["status"] == "failed"
    assert float(got[ref["id"]]["busbw_mbps"]) == ref["busbw_mbps"]
    assert float(got[ref["id"]]["predicted_busbw_mbps"]) > 0

    # scaling joins series: hdrm at 4 and 8 hosts, leafspine ecmp hd at 4 and 8
    fams = report.scaling_families(rows)
    assert set(fams[("bigraph", "bigraph", "hdrm", 64 * 1024)]) == {4, 8}
    assert set(fams[("leafspine", "ecmp", "hd", 64 * 1024)]) == {4, 8}
    eff = fams[("bigraph", "bigraph", "hdrm", 64 * 1024)][8]["efficiency"]
    assert 0 < eff <= 1


def test_heatmap_cells_and_matrix(tmp_path):
    _, out = make_results(tmp_path)
    _, rows = report.load_rows(out)
    congested, clean = report.pick_heatmap_cells(rows, {"algorithm": "hdrm", "routing": "bigraph"})
    assert congested["max_flows_per_link"] >= 2 and congested["kind"] != "star"
    assert clean["algorithm"] == "hdrm" and clean["max_flows_per_link"] == 1
    m = report.link_step_matrix(clean["dir"])
    assert m["links"] and all(">" in lk for lk in m["links"])
    assert max(max(col) for col in m["flows"]) == 1
    assert m["rep"] == 1  # first measured repetition, after one warm-up
    # every link the model uses in a step has measured transfers in the same step, and no others
    for s, (fcol, mcol) in enumerate(zip(m["flows"], m["measured_mbps"], strict=True)):
        for f, v in zip(fcol, mcol, strict=True):
            assert (f > 0) == (v is not None), (s, f, v)


def test_flags_untrusted_and_partial_run(tmp_path):
    exp = xp.from_dict(yaml.safe_load(EXP), where="synth.yaml")
    out = str(tmp_path / "run")
    runner.Runner(exp, out, session_factory=factory(flags=("over_capacity",)), stream=io.StringIO(),
                  after_cell=lambda *_: (_ for _ in ()).throw(KeyboardInterrupt)).run()
    md = open(report.write_report(out)).read()
    assert "**1 of 20 cells finished**" in md
    assert "`over_capacity`: 1 cells" in md and "Not trusted: `cmp.bigraph-2x2x2.bigraph.hdrm.16KiB`" in md
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
    assert {r["outcome"] for r in rows if r["faults"]} == {"degraded"}


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
    assert {r["server_design"] for r in rows} == {"NIC per accelerator", "shared NIC"}
    tables = {t["family"]: t for t in report.server_speedup_tables(rows)}
    assert set(tables) == {"bigraph-2x2x2 2x4 bigraph hier", "bigraph-2x2x2 2x4 bigraph ring"}
    hier = tables["bigraph-2x2x2 2x4 bigraph hier"]
    assert hier["own"]["nics_per_server"] == 4 and hier["shared"]["nics_per_server"] == 1
    # four flows share the NIC in the inter-server phase: per accelerator 3/4 n in each intra-server ring
    # phase and n/4 across, all four over one NIC when it is shared, so at most (1.5 + 1) / (1.5 + 0.25)
    assert 1.2 < hier["model_speedup"] <= 2.5 / 1.75 + 1e-9
    assert hier["speedup"] == pytest.approx(hier["model_speedup"])  # the fake session runs at the model's pace
    md = open(report.write_report(out)).read()
    assert "## Server designs: one NIC per accelerator against a shared NIC" in md
    assert f"x{hier['speedup']:.2f}" in md
