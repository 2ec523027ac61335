"""results.json: typed, versioned, and a schema-1 document (written before the version existed) reads the same.

``tests/data/results-schema1-star16-hd.json`` is a results.json of this
project's own default experiment (2026-12-01), cut to two repetitions.
"""

from __future__ import annotations

import json
import os
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.runs import results
from emulator.runs.results import CellResults, Fidelity, ProbeVerdict, Repetition, SchemaError, StepTime

OLD = os.path.join(os.path.dirname(__file__), "..", "data", "results-schema1-star16-hd.json")
SUMMARY = ("busbw_mbps_median", "time_s_median", "measured_over_predicted_median", "trusted", "verdict", "flags",
           "unchecked")


def old_document() -> dict:
    with open(OLD, encoding="utf-8") as fh:
        return json.load(fh)


def test_a_schema_1_document_comes_back_as_it_was_with_its_version_and_fresh_medians():
    doc = old_document()
    assert "schema" not in doc
    res = CellResults.from_json(doc)
    again = res.to_json()
    assert again["schema"] == results.SCHEMA_VERSION
    assert {k: v for k, v in again.items() if k not in (*SUMMARY, "schema")} == \
        {k: v for k, v in doc.items() if k not in SUMMARY}
    assert again["busbw_mbps_median"] == statistics.median(r["busbw_mbps"] for r in doc["repetitions"])
    assert again["time_s_median"] == statistics.median(r["time_s"] for r in doc["repetitions"])
    assert again["measured_over_predicted_median"] == pytest.approx(
        again["time_s_median"] / doc["prediction"]["predicted_time_s"])
    assert res.cell_id() == "topology.star-16.shortest.hd.64KiB"
    assert res.finished and res.trusted is True and res.probe is not None and res.probe.passed


def test_unknown_keys_survive_a_rewrite(tmp_path):
    doc = {**old_document(), "written_by_a_newer_version": {"x": 1}}
    path = str(tmp_path / "results.json")
    CellResults.from_json(doc).save(path)
    loaded = results.load(path)
    assert loaded is not None and loaded.to_json()["written_by_a_newer_version"] == {"x": 1}


@pytest.mark.parametrize("doc", [{"schema": results.SCHEMA_VERSION + 1}, {"schema": "2"}, {"schema": True},
                                 {"repetitions": [{"time_s": 1.0}]}, {"repetitions": "many"}])
def test_what_this_version_cannot_read_is_refused(doc):
    with pytest.raises(SchemaError):
        CellResults.from_json(doc)


def test_load_gives_none_for_missing_unreadable_and_foreign_files(tmp_path):
    assert results.load(str(tmp_path / "absent.json")) is None
    (tmp_path / "bad.json").write_text("{cut sho")
    assert results.load(str(tmp_path / "bad.json")) is None
    (tmp_path / "new.json").write_text(json.dumps({"schema": 99}))
    assert results.load(str(tmp_path / "new.json")) is None


def test_no_summary_before_the_first_measured_repetition():
    res = CellResults(prediction={"predicted_time_s": 2.0})
    res.warmup.append(Repetition(rep=0, time_s=1.0, algbw_mbps=1.0, busbw_mbps=1.5))
    assert res.summary() is None and res.trusted is None
    assert not set(SUMMARY) & set(res.to_json())


def test_one_untrusted_repetition_makes_the_result_untrusted_and_flag_all_marks_every_one():
    fid = Fidelity(cpu_idle=0.1, datapath_load_mbps=1.0, datapath_capacity_mbps=2.0, flags=["cpu_saturated"],
                   trusted=False)
    res = CellResults(prediction={"predicted_time_s": 1.0}, repetitions=[
        Repetition(rep=0, time_s=1.0, algbw_mbps=1.0, busbw_mbps=1.5),
        Repetition(rep=1, time_s=1.2, algbw_mbps=1.0, busbw_mbps=1.4, fidelity=fid)])
    assert res.trusted is False and res.flags() == ["cpu_saturated"]
    res.warmup.append(Repetition(rep=2, time_s=1.0, algbw_mbps=1.0, busbw_mbps=1.5))
    res.flag_all("probe_failed")
    assert all(r.fidelity is not None and "probe_failed" in r.fidelity.flags and not r.trusted
               for r in [*res.warmup, *res.repetitions])
    assert res.flags() == ["cpu_saturated", "probe_failed"]


finite = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)


@given(times=st.lists(finite, min_size=1, max_size=6), predicted=finite)
def test_a_document_survives_the_round_trip(times, predicted):
    reps = [Repetition(rep=i, time_s=t, algbw_mbps=1 / t, busbw_mbps=2 / t,
                       steps=[StepTime(step=0, start_s=0.0, time_s=t, predicted_s=predicted, measured_over_predicted=t / predicted)],
                       fidelity=Fidelity(cpu_idle=0.5, datapath_load_mbps=t, datapath_capacity_mbps=10.0))
            for i, t in enumerate(times)]
    res = CellResults(config={"algorithm": "hd"}, prediction={"predicted_time_s": predicted}, repetitions=reps,
                      status="ok", outcome="ok",
                      probe=ProbeVerdict(passed=True, pair=("h1", "h8"), measured_s=1.0, predicted_s=1.0, ratio=1.0,
                                         reason="ok"))
    doc = json.loads(json.dumps(res.to_json()))
    assert CellResults.from_json(doc).to_json() == doc
