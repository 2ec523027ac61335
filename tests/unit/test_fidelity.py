"""Fidelity bookkeeping: tc/snmp parsing, per-repetition deltas and flags, the latency model of a calibration."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from emulator.base.errors import UserError
from emulator.emulation.machine.calibration_file import CALIBRATION_VERSION, Calibration, LatencyCalibration, Machine
from emulator.emulation.network.tc_commands import parse_htb_rates
from emulator.emulation.session import captures, fidelity
from emulator.model import topology
from emulator.model.latency import Curve, Intrinsic
from emulator.model.topology import tcp_goodput_factor
from emulator.runs.metrics import LAG_SHARE, AgentLag
from emulator.runs.results import Fidelity


def test_parse_tc_json_keeps_root_qdiscs():
    text = json.dumps([
        {"kind": "htb", "handle": "5:", "root": True, "dev": "efs1-eth1", "bytes": 10, "packets": 2, "drops": 1,
         "overlimits": 3},
        {"kind": "pfifo", "handle": "10:", "parent": "5:1", "dev": "efs1-eth1", "bytes": 99},
    ])
    assert fidelity.parse_tc_json(text) == {"efs1-eth1": fidelity.QdiscCounters(bytes=10, packets=2, drops=1,
                                                                                overlimits=3)}
    assert fidelity.parse_tc_json("garbage") == {}


def test_parse_tcp_retrans():
    snmp = ("Ip: Forwarding DefaultTTL\nIp: 1 64\n"
            "Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 42 0\n")
    assert fidelity.parse_tcp_retrans(snmp) == 42
    assert fidelity.parse_tcp_retrans("") == 0


def snap(t, idle, total, drops=0, retrans=0):
    return fidelity.Snapshot(time=t, cpu_idle=idle, cpu_total=total, retrans={"h1": retrans},
                             qdisc={"efs1-eth1": fidelity.QdiscCounters(bytes=1000 * t, packets=t, drops=drops)})


def calibration(capacity_mbps):
    machine = Machine(kernel="6.1", ovs_version="3.1.0", nproc=2, date="2026-01-01T00:00:00+00:00")
    return Calibration(version=CALIBRATION_VERSION, machine=machine, datapath_capacity_mbps=capacity_mbps,
                       recommended_link_mbps=20.0, latency=None)


def test_assess_flags():
    calib = calibration(100.0)
    ok = fidelity.assess(snap(0, 0, 0), snap(1, 50, 100), 1.0, 1_000_000, calib)
    assert isinstance(ok, Fidelity)
    assert ok.flags == [] and ok.trusted and ok.cpu_idle == pytest.approx(0.5)
    assert ok.datapath_load_mbps == pytest.approx(8.0) and ok.datapath_capacity_mbps == 100.0
    busy = fidelity.assess(snap(0, 0, 0, 0, 0), snap(1, 1, 100, 5, 7), 1.0, 20_000_000, calib)
    assert set(busy.flags) == {"cpu_saturated", "over_capacity"} and not busy.trusted
    assert busy.qdisc_drops == 5 and busy.tcp_retransmits == 7
    unknown = fidelity.assess(snap(0, 0, 0), snap(1, 50, 100), 1.0, 1000, None)
    assert unknown.flags == ["uncalibrated"] and unknown.trusted
    assert unknown.datapath_capacity_mbps == fidelity.UNCALIBRATED_CAPACITY_MBPS
    assert fidelity.flag_text(unknown) == "" and "over_capacity" in fidelity.flag_text(busy)
    assert fidelity.flag_text(None) == ""


def test_a_calibration_without_a_capacity_uses_the_default_but_is_not_uncalibrated():
    fid = fidelity.assess(snap(0, 0, 0), snap(1, 50, 100), 1.0, 1000, calibration(None))
    assert fid.flags == [] and fid.datapath_capacity_mbps == fidelity.UNCALIBRATED_CAPACITY_MBPS


def test_assess_writes_the_fidelity_document_of_results_json():
    fid = fidelity.assess(snap(0, 0, 0), snap(1, 1, 100, 2, 3), 1.0, 20_000_000, calibration(100.0), floors=[5],
                          late_fraction=0.5)
    doc = fid.to_json()
    assert doc["flags"] == ["cpu_saturated", "over_capacity", "latency_floor"] and doc["trusted"] is False
    assert doc["latency_floor_switches"] == [5] and doc["late_fraction"] == 0.5
    assert Fidelity.from_json(doc) == fid


def test_an_agent_lagging_more_than_its_share_is_flagged_even_with_idle_cpu():
    calib = calibration(100.0)
    behind = fidelity.assess(snap(0, 0, 0), snap(1, 50, 100), 1.0, 1000, calib, lag=AgentLag(rank=3, share=0.25))
    assert behind.flags == ["emulator_lag"] and not behind.trusted
    assert (behind.lag_share, behind.lag_rank) == (0.25, 3)
    assert Fidelity.from_json(behind.to_json()) == behind
    within = fidelity.assess(snap(0, 0, 0), snap(1, 50, 100), 1.0, 1000, calib,
                             lag=AgentLag(rank=0, share=LAG_SHARE * 0.9))
    assert within.flags == [] and within.trusted
    assert "emulator_lag" in fidelity.flag_text(behind)


def test_link_records_are_deltas():
    recs = fidelity.link_records(snap(1, 0, 0, 1, 2), snap(3, 0, 0, 4, 10), rep=2)
    tc = next(r for r in recs if r["source"] == "tc")
    assert tc["bytes"] == 2000 and tc["drops"] == 3 and tc["rep"] == 2 and tc["interface"] == "efs1-eth1"
    assert set(tc) == {"source", "rep", "interface", "bytes", "packets", "drops", "overlimits", "mbps", "seconds"}
    assert tc["mbps"] == pytest.approx(2000 * 8 / 2 / 1e6)
    tcp = next(r for r in recs if r["source"] == "tcp")
    assert tcp["retransmits"] == 8


def test_a_link_new_since_the_first_snapshot_counts_from_zero():
    before = fidelity.Snapshot(time=0.0)
    recs = fidelity.link_records(before, snap(1, 0, 0, drops=4, retrans=2), rep=0)
    assert [r["drops"] for r in recs if r["source"] == "tc"] == [4]
    assert [r["retransmits"] for r in recs if r["source"] == "tcp"] == [2]


def test_the_latency_model_takes_the_calibrations_intrinsic_latency():
    from emulator.model import fabric

    profile = fabric.parse(None)
    assert not fidelity.latency_model(profile, None, netem=False).intrinsic.calibrated
    intrinsic = Intrinsic(data=Curve(((1, 0.001),)), rendezvous=Curve(((1, 0.002),)), ack=Curve(((1, 0.0),)))
    latency = LatencyCalibration(link_mbps=20.0, mtu=9000, bytes=64, per_switches={}, intrinsic=intrinsic)
    cal = replace(calibration(100.0), latency=latency)
    model = fidelity.latency_model(profile, cal, netem=False)
    assert model.intrinsic.data.at(1) == pytest.approx(0.001)
    assert model.intrinsic.source == "emu calibrate of 2026-01-01T00:00:00+00:00"


def test_link_names_for_capture():
    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=1")
    assert captures.parse_link_name(topo, "s1-s3") == ("s1", "s3")
    assert captures.capture_interface(topo, "s1", "s3") == "efs1-eth2"
    assert captures.capture_interface(topo, "h1", "s1") == "efs1-eth1"
    for bad in ("s1-s2", "s1", "x-y", "s1-s3-s4"):
        with pytest.raises(UserError, match="field 'link'"):
            captures.parse_link_name(topo, bad)


def test_htb_rates_parse():
    text = ("class htb 5:1 root leaf 10: prio 0 rate 10Mbit ceil 10Mbit burst 15Kb cburst 1600b\n"
            "class htb 5:2 root prio 0 rate 500Kbit ceil 500Kbit burst 1600b cburst 1600b\n"
            "class htb 10:1 root leaf 11: prio 0 rate 10Gbit ceil 10Gbit burst 1Mb cburst 1600b\n")
    assert parse_htb_rates(text) == [10.0, 0.5]  # a host's priority classes (10:) never limit


def test_goodput_factor():
    assert tcp_goodput_factor(1500) == pytest.approx(1448 / 1514)
    assert tcp_goodput_factor(9000) > 0.99
