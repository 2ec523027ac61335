"""The latency calibration's pure parts: the probe schedule, ping parsing, summaries; calibration files."""

from __future__ import annotations

import json

import pytest

from emulator.emulation.machine import calibration_file
from emulator.emulation.machine.calibration_file import Calibration, LatencyCalibration
from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.latency import Intrinsic
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import check_hosts
from emulator.selfcheck.live import intrinsic_latency as latency_probe


def test_the_probe_is_a_two_rank_exchange_between_the_chosen_hosts():
    sched = generators.pair_exchange("h1", "h16", latency_probe.PROBE_BYTES)
    assert execute(sched).valid and sched.hosts == ["h1", "h16"] and sched.p == 2
    check_hosts(sched, topology.build("fattree:k=4"))
    for spec, _policy, pairs in latency_probe.PROBES:
        topo = topology.build(spec)
        for a, b in pairs.values():
            topo.host(a), topo.host(b)
    assert sorted(s for _, _, pairs in latency_probe.PROBES for s in pairs) == [1, 2, 3, 5]


def test_parse_ping_and_its_one_way_estimate():
    text = ("PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.40 ms\n"
            "64 bytes from 10.0.0.2: icmp_seq=2 ttl=64 time=0.60 ms\n64 bytes: time=junk\n--- statistics ---\n")
    rtts = latency_probe.parse_ping(text)
    assert rtts == [0.40, 0.60]
    wire = (98 + 14) * 8 / 20e6
    assert latency_probe.ping_oneway_s(rtts, 2, 20.0, 9000) == pytest.approx(0.5e-3 / 2 - 2 * wire)


def _record(sent, end, posted, cts_at, send_end):
    return {"sent": sent, "end": end, "posted": posted, "cts_at": cts_at, "send_end": send_end}


def test_summarise_takes_medians_less_serialisation_and_makes_curves():
    ser1 = latency_probe.serialisation_s(64, 2, 20.0, 9000)
    recs = {1: [_record(0.0, 0.001 + ser1, 0.0, 0.002, 0.0015 + ser1) for _ in range(5)],
            3: [_record(1.0, 1.003 + latency_probe.serialisation_s(64, 4, 20.0, 9000), 0.0, 0.004, 0.0)]}
    out = latency_probe.summarise(recs, {1: 0.0004, 3: 0.001}, 20.0, 9000)
    one = out.per_switches[1]
    assert one.data_s == pytest.approx(0.001) and one.rendezvous_s == pytest.approx(0.002)
    assert one.ack_s == pytest.approx(0.0005) and one.agent_overhead_s == pytest.approx(0.0006)
    assert one.messages == 5
    assert out.per_switches[3].ack_s == 0.0  # no awaited send measured: none
    assert out.intrinsic.data.at(2) == pytest.approx(0.002) and out.intrinsic.rendezvous.at(3) == pytest.approx(0.004)
    doc = json.loads(json.dumps(out.to_json()))  # the calibration file's latency document
    assert sorted(doc["per_switches"]) == ["1", "3"] and doc["link_mbps"] == 20.0 and doc["bytes"] == 64
    assert LatencyCalibration.from_json(doc) == out
    assert Intrinsic.from_json(doc["intrinsic"]) == out.intrinsic


def test_a_calibration_counts_only_on_the_machine_that_made_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EF_STATE_DIR", str(tmp_path))
    me = {"kernel": "6.1", "ovs_version": "3.1.0", "nproc": 2}
    assert calibration_file.load_calibration(9000, identity=me) is None
    latency = latency_probe.summarise({1: [_record(0.0, 0.001, 0.0, 0.002, 0.0015)]}, {1: 0.0004}, 20.0, 9000)
    data = {"version": calibration_file.CALIBRATION_VERSION, "machine": {**me, "date": "today"},
            "latency": latency.to_json(), "datapath_capacity_mbps": 1000.0}
    (tmp_path / "calibration-mtu9000.json").write_text(json.dumps(data))
    found = calibration_file.load_calibration(9000, identity=me)
    assert isinstance(found, Calibration) and found.datapath_capacity_mbps == 1000.0
    assert found.machine.identity() == me and found.latency == latency
    assert calibration_file.load_calibration(1500, identity=me) is None  # one file per MTU
    assert calibration_file.load_calibration(9000, identity={**me, "ovs_version": "3.2.0"}) is None
    assert "ovs_version" in calibration_file.calibration_problem(data, {**me, "ovs_version": "3.2.0"})
    assert calibration_file.calibration_problem({"version": 1}, me) == "not a version 2 calibration"
    assert found.intrinsic().source == "emu calibrate of today"
    assert found.intrinsic().data == latency.intrinsic.data
