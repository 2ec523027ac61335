"""The calibration file, typed: round trips of full and minimal documents, errors naming the field, loading."""

from __future__ import annotations

import copy
import glob
import json

import pytest

from emulator.base.errors import FieldError
from emulator.base.files import write_json_atomic
from emulator.emulation.machine.calibration_file import (
    CALIBRATION_VERSION,
    Calibration,
    Machine,
    calibration_path,
    calibration_problem,
    load_calibration,
)

ME = {"kernel": "6.1.0-test", "ovs_version": "3.1.0", "nproc": 2}


def per_switches(s: int) -> dict:
    return {"ack_s": 0.0008 * s, "agent_overhead_s": 9e-05, "data_p90_s": 0.001, "data_s": 0.0005 * s,
            "messages": 100, "oneway_s": 0.0004, "rendezvous_s": 0.001 * s}


#: A document laid out like the files emu calibrate writes (a minimal calibration), numbers made up.
MINIMAL = {
    "version": CALIBRATION_VERSION, "quick": True, "minimal": True,
    "datapath_capacity_mbps": 1500.0,
    "datapath_capacity_unit": "switch-hop Mbit/s: sum of bytes x switches traversed x 8 / seconds / 1e6",
    "recommended_link_mbps": 20.0, "duration_s": 61.9,
    "machine": {**ME, "datapath": "user", "date": "2026-01-01T00:00:00+00:00", "mtu": 9000,
                "loadavg_before": [0.2, 0.9, 1.2], "loadavg_after": [0.6, 0.9, 1.1]},
    "measurements": {"capacity": {"at_link_mbps": 32.0, "capacity_mbps": 1500.0, "points": [{"ok": True}],
                                  "limited_by": "flows"}},
    "latency": {"bytes": 64, "link_mbps": 20.0, "mtu": 9000,
                "per_switches": {str(s): per_switches(s) for s in (1, 2, 3, 5)},
                "intrinsic": {"data": [[1, 0.0005], [2, 0.001], [3, 0.0015], [5, 0.0025]],
                              "rendezvous": [[1, 0.001], [2, 0.002], [3, 0.003], [5, 0.005]],
                              "ack": [[1, 0.0008], [2, 0.0016], [3, 0.0024], [5, 0.004]],
                              "source": "emu calibrate"}},
}
FULL = {**MINIMAL, "quick": False, "minimal": False, "one_link_ratio": 0.98, "agent_over_iperf3": 0.97}


@pytest.mark.parametrize("doc", [MINIMAL, FULL], ids=["minimal", "full"])
def test_a_calibration_document_round_trips(doc):
    cal = Calibration.from_json(doc)
    assert cal.to_json() == doc
    assert json.loads(json.dumps(cal.to_json(), sort_keys=True)) == doc
    assert cal.datapath_capacity_mbps == 1500.0 and cal.machine.identity() == ME
    assert cal.latency is not None and sorted(cal.latency.per_switches) == [1, 2, 3, 5]
    assert cal.latency.per_switches[2].data_s == pytest.approx(0.001)


def test_the_ratios_of_a_full_calibration_only_appear_in_one():
    assert "one_link_ratio" not in Calibration.from_json(MINIMAL).to_json()
    assert Calibration.from_json(FULL).one_link_ratio == 0.98


def test_keys_this_version_does_not_know_are_kept():
    doc = {**MINIMAL, "gpu": {"model": "none"}}
    cal = Calibration.from_json(doc)
    assert cal.extra == {"gpu": {"model": "none"}} and cal.to_json() == doc


def test_the_intrinsic_latency_names_the_calibrations_date():
    it = Calibration.from_json(MINIMAL).intrinsic()
    assert it.calibrated and it.source == "emu calibrate of 2026-01-01T00:00:00+00:00"
    assert it.data.at(2) == pytest.approx(0.001)
    no_latency = {k: v for k, v in MINIMAL.items() if k != "latency"}
    assert not Calibration.from_json(no_latency).intrinsic().calibrated


@pytest.mark.parametrize("path, value, field", [
    (("version",), "2", "version"),
    (("datapath_capacity_mbps",), "fast", "datapath_capacity_mbps"),
    (("machine",), [], "machine"),
    (("latency", "mtu"), 9000.5, "mtu"),
    (("latency", "per_switches", "1", "data_s"), None, "data_s"),
    (("latency", "per_switches"), {"one": per_switches(1)}, "per_switches"),
    (("latency", "intrinsic"), {"data": []}, "intrinsic"),
])
def test_a_bad_field_is_named(path, value, field):
    doc = copy.deepcopy(MINIMAL)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(FieldError) as exc:
        Calibration.from_json(doc)
    assert exc.value.field == field


def test_a_missing_field_is_named():
    doc = copy.deepcopy(MINIMAL)
    del doc["latency"]["per_switches"]["1"]["messages"]
    with pytest.raises(FieldError, match="'messages'.*got nothing"):
        Calibration.from_json(doc)


def test_only_this_machines_readable_calibration_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_STATE_DIR", str(tmp_path))
    assert calibration_path(9000) == str(tmp_path / "calibration-mtu9000.json")
    assert load_calibration(9000, identity=ME) is None
    write_json_atomic(calibration_path(9000), MINIMAL)
    assert load_calibration(9000, identity=ME) == Calibration.from_json(MINIMAL)
    assert load_calibration(9000, identity={**ME, "nproc": 4}) is None
    assert calibration_problem(MINIMAL, {**ME, "nproc": 4}) == "made with nproc 2, this machine has 4"
    broken = copy.deepcopy(MINIMAL)
    broken["latency"]["mtu"] = "jumbo"
    write_json_atomic(calibration_path(9000), broken)
    assert load_calibration(9000, identity=ME) is None
    assert "'mtu'" in (calibration_problem(broken, ME) or "")
    (tmp_path / "calibration-mtu9000.json").write_text("{not json")
    assert load_calibration(9000, identity=ME) is None


def test_a_machine_without_conditions_still_reads():
    machine = Machine.from_json(ME)
    assert machine.identity() == ME and machine.date is None and machine.loadavg_before == []


@pytest.mark.parametrize("path", sorted(glob.glob("/var/lib/ef-emu/calibration-mtu*.json")) or ["none"])
def test_this_machines_calibration_files_round_trip_byte_for_byte(path):
    if path == "none":
        pytest.skip("no calibration file on this machine (/var/lib/ef-emu)")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    cal = Calibration.from_json(json.loads(text))
    assert json.dumps(cal.to_json(), indent=1, sort_keys=True) + "\n" == text
