"""Trust is earned: a repetition or cell without the data a check needs is unchecked, never trusted; a cell
outside its model band is flagged ``model_disagrees``; the report counts and shows all three."""

from __future__ import annotations

import io
import json
import os

import pytest
import yaml
from fake_session import factory

from emulator.base.files import write_json_atomic
from emulator.emulation.session import fidelity
from emulator.runs import trust
from emulator.runs.mpi_results import MpiResults
from emulator.runs.results import CellResults, Fidelity, Repetition
from emulator.runs.trust import MODEL_FLAG, REPLAY_BAND, Trust, Verdict
from emulator.study import experiment as xp
from emulator.study import report
from emulator.study.live import runner

PREDICTED_S = 2.0


def measured(fid: Fidelity | None, time_s: float = PREDICTED_S) -> Repetition:
    return Repetition(rep=0, time_s=time_s, algbw_mbps=1.0, busbw_mbps=1.0, fidelity=fid)


def fine() -> Fidelity:
    return Fidelity(cpu_idle=0.5, datapath_load_mbps=1.0, datapath_capacity_mbps=10.0, flags=["uncalibrated"])


def cell(*reps: Repetition) -> CellResults:
    return CellResults(status="ok", prediction={"predicted_time_s": PREDICTED_S}, repetitions=list(reps))


def test_a_repetition_without_fidelity_data_is_unchecked_and_so_is_its_cell():
    rep = measured(None)
    assert rep.trust.verdict is Verdict.UNCHECKED and not rep.trusted
    res = cell(measured(fine()), rep)
    assert res.trust() == Trust(unchecked=(trust.NO_FIDELITY,)) and res.trusted is False
    doc = res.to_json()
    assert doc["trusted"] is False and doc["verdict"] == "unchecked" and doc["unchecked"] == ["fidelity"]
    assert cell(measured(fine())).trust() == Trust()  # every check had data and passed: trusted


def test_a_flag_outweighs_a_check_without_data():
    flagged = Fidelity(cpu_idle=0.01, datapath_load_mbps=1.0, datapath_capacity_mbps=10.0,
                       flags=["cpu_saturated"], trusted=False)
    res = cell(measured(None), measured(flagged))
    assert res.trust() == Trust(flags=("cpu_saturated",), unchecked=("fidelity",))
    assert res.trust().verdict is Verdict.FLAGGED


def test_cpu_counters_that_do_not_advance_leave_cpu_idle_unknown_and_the_repetition_unchecked():
    still = fidelity.Snapshot(time=0.0, cpu_idle=50.0, cpu_total=100.0)
    fid = fidelity.assess(still, fidelity.Snapshot(time=1.0, cpu_idle=50.0, cpu_total=100.0), 1.0, 0, None)
    assert fid.cpu_idle is None and "cpu_saturated" not in fid.flags
    assert fid.trust == Trust(unchecked=(trust.CPU_IDLE,))
    back = Fidelity.from_json(json.loads(json.dumps(fid.to_json())))
    assert back.cpu_idle is None and back.trust.verdict is Verdict.UNCHECKED
    assert cell(measured(fid)).trust().verdict is Verdict.UNCHECKED


def test_flagging_a_repetition_without_fidelity_invents_no_cpu_idle():
    res = cell(measured(None))
    res.flag_all("probe_failed")
    fid = res.repetitions[0].fidelity
    assert fid is not None and fid.cpu_idle is None and fid.flags == ["probe_failed"]
    assert res.trust().verdict is Verdict.FLAGGED


@pytest.mark.parametrize("ratio, verdict", [(1.0, Verdict.TRUSTED), (REPLAY_BAND.high - 1e-9, Verdict.TRUSTED),
                                            (REPLAY_BAND.low + 1e-9, Verdict.TRUSTED), (1.49, Verdict.FLAGGED),
                                            (REPLAY_BAND.low - 0.01, Verdict.FLAGGED)])
def test_a_cell_outside_its_model_band_is_flagged_model_disagrees(ratio, verdict):
    res = cell(measured(fine(), time_s=PREDICTED_S * ratio))
    t = res.trust()
    assert t is not None and t.verdict is verdict
    assert (MODEL_FLAG in res.flags()) is (verdict is Verdict.FLAGGED)


def test_a_cell_without_a_model_time_is_unchecked():
    res = CellResults(status="ok", repetitions=[measured(fine())])
    assert res.trust() == Trust(unchecked=(trust.MODEL,))


def test_an_older_results_document_that_said_trusted_is_judged_again():
    """A results.json of schema 3 said ``trusted: true`` for a cell at 1.49 times its model, with a repetition
    without fidelity data: it still loads, and is flagged."""
    doc = {"schema": 3, "status": "ok", "prediction": {"predicted_time_s": 2.0}, "trusted": True,
           "repetitions": [{"rep": 0, "time_s": 2.98, "busbw_mbps": 1.0},
                           {"rep": 1, "time_s": 2.98, "busbw_mbps": 1.0,
                            "fidelity": {"cpu_idle": 0.5, "flags": [], "trusted": True}}]}
    res = CellResults.from_json(doc)
    assert res.trust() == Trust(flags=(MODEL_FLAG,), unchecked=(trust.NO_FIDELITY,))


def test_an_mpi_run_is_unchecked_without_fidelity_without_a_model_or_with_unchecked_data():
    def run(fid, wrong=0, predicted=True):
        return MpiResults(config={}, ranks=[], command=[], link_mbps=20.0, status="ok", fidelity=fid,
                          bench=[{"size": 1024, "wrong": wrong}],
                          predictions=[{"size": 1024, "measured_over_predicted": 1.05}] if predicted else [])
    assert run(fine()).trust().verdict is Verdict.TRUSTED and run(fine()).trusted
    assert run(None).trust() == Trust(unchecked=(trust.NO_FIDELITY,)) and not run(None).trusted
    assert run(fine(), predicted=False).trust() == Trust(unchecked=(trust.MODEL,))
    assert run(fine(), wrong=None).trust() == Trust(unchecked=(trust.DATA,))
    far = MpiResults(config={}, ranks=[], command=[], link_mbps=20.0, status="ok", fidelity=fine(),
                     bench=[{"size": 1024, "wrong": 0}], predictions=[{"size": 1024, "measured_over_predicted": 1.4}])
    assert far.trust() == Trust(flags=(MODEL_FLAG,)) and far.to_json()["verdict"] == "flagged"


def test_tally_counts_each_verdict_and_flag():
    t = trust.tally([Trust(), Trust(flags=("over_capacity", MODEL_FLAG)), Trust(flags=(MODEL_FLAG,),
                                                                               unchecked=("cpu_idle",)),
                     Trust(unchecked=("fidelity",)), None])
    assert (t.trusted, t.flagged, t.unchecked, t.measured) == (1, 2, 1, 4)
    assert t.flags == {MODEL_FLAG: 2, "over_capacity": 1} and t.why_unchecked == {"fidelity": 1}


EXP = """
name: trust
repeat: 2
warmup: 0
sizes: [16KiB]
series:
  - name: s
    runs:
      - topology: "star:hosts=4"
        routing: shortest
        algorithms: [hd]
      - topology: "bigraph:upper=2,lower=2,hosts_per_switch=1"
        routing: bigraph
        algorithms: [hdrm]
"""


def _set_times(out: str, cell_id: str, ratio: float, drop_fidelity: bool = False) -> None:
    path = os.path.join(out, "cells", cell_id, "results.json")
    with open(path) as fh:
        res = json.load(fh)
    for rep in res["repetitions"]:
        rep["time_s"] = res["prediction"]["predicted_time_s"] * ratio
        if drop_fidelity:
            rep.pop("fidelity", None)
    write_json_atomic(path, res)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    exp = xp.from_dict(yaml.safe_load(EXP), where="trust.yaml")
    out = str(tmp_path_factory.mktemp("trust") / "run")
    runner.Runner(exp, out, session_factory=factory(), stream=io.StringIO()).run()
    ids = [c.id for c in xp.expand(exp)]
    _set_times(out, ids[0], 1.49)  # the cell once marked trusted
    _set_times(out, ids[1], 1.02, drop_fidelity=True)
    md = open(report.write_report(out)).read()
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(out, "cells.csv")) as fh:
        csv_text = fh.read()
    return ids, md, summary, csv_text


def test_the_report_counts_trusted_flagged_and_unchecked_cells_near_the_top(written):
    ids, md, summary, _ = written
    top = md[:md.index("\n## ")]
    assert ("**Trust: 0 of 2 measured cells trusted, 1 flagged (`model_disagrees` 1), 1 unchecked "
            "(no fidelity data 1).**") in top
    assert f"replay cells {REPLAY_BAND.text()}" in top and "docs/testing-accuracy.md" in top
    assert summary["cells"] == {"measured": 2, "trusted": 0, "flagged": 1, "unchecked": 1,
                                "flags": {MODEL_FLAG: 1}, "why_unchecked": {"fidelity": 1}}
    assert summary["model_band"]["replay"]["low"] == REPLAY_BAND.low


def test_the_report_shows_unchecked_and_model_disagrees_in_its_trust_column(written):
    ids, md, _, csv_text = written
    row = {ln.split("|")[1].strip(): ln for ln in md.splitlines() if ln.startswith("| `")}
    assert "| unchecked: no fidelity data |" in row[f"`{ids[1]}`"]
    assert f"| flagged: {MODEL_FLAG} |" in row[f"`{ids[0]}`"]
    assert f"Unchecked: `{ids[1]}` (unchecked: no fidelity data)." in md
    assert f"| `{MODEL_FLAG}` | measured/model time outside its band (replay cells {REPLAY_BAND.text()}" in md
    assert ",unchecked," in csv_text and ",flagged," in csv_text and ",True," not in csv_text
