"""emu calibrate's pure parts: iperf3 reports, the capacity search, the flow set, reshaping commands."""

from __future__ import annotations

import json

import pytest

from emulator.cli.main import main
from emulator.model import routing, topology
from emulator.selfcheck.live import calibration as cal


def iperf_report(received_bps: float, sent_bps: float | None = None, bidir_bps: float | None = None,
                 retransmits: int = 3) -> str:
    end = {"sum_sent": {"seconds": 4.0, "bits_per_second": sent_bps or received_bps, "retransmits": retransmits},
           "sum_received": {"seconds": 4.0, "bits_per_second": received_bps}}
    if bidir_bps is not None:
        end["sum_sent_bidir_reverse"] = {"seconds": 4.0, "bits_per_second": bidir_bps}
        end["sum_received_bidir_reverse"] = {"seconds": 4.0, "bits_per_second": bidir_bps * 0.99}
    return json.dumps({"start": {}, "intervals": [], "end": end})


def test_parse_iperf3_one_way_and_bidir():
    r = cal.parse_iperf3(iperf_report(9.5e6, 9.6e6))
    assert r["received_mbps"] == pytest.approx(9.5) and r["sent_mbps"] == pytest.approx(9.6)
    assert r["retransmits"] == 3 and r["seconds"] == 4.0
    assert "reverse_received_mbps" not in r
    b = cal.parse_iperf3(iperf_report(9.5e6, bidir_bps=9.0e6))
    assert b["reverse_received_mbps"] == pytest.approx(8.91)


@pytest.mark.parametrize("text,match", [
    ("iperf3: error - unable to connect", "not an iperf3 JSON"),
    (json.dumps({"error": "unable to connect to server: Connection refused"}), "Connection refused"),
    (json.dumps({"end": {}}), "no end.sum_received"),
])
def test_parse_iperf3_errors_name_the_flow(text, match):
    with pytest.raises(RuntimeError, match=match) as info:
        cal.parse_iperf3(text, where="iperf3 h1 -> h2")
    assert "h1 -> h2" in str(info.value)


def point(rate, fraction, idle=0.5, flows=4, hops=3):
    return cal.CapacityPoint(rate, [rate * fraction] * flows, [hops] * flows, idle)


def test_capacity_point_units():
    p = cal.CapacityPoint(10.0, [9.9, 9.0, 9.5], [3, 2, 1], 0.4)
    assert p.min_ratio == pytest.approx(0.9)
    assert p.aggregate_mbps == pytest.approx(28.4)
    assert p.switch_hop_mbps == pytest.approx(9.9 * 3 + 9.0 * 2 + 9.5)
    assert p.ok() and not cal.CapacityPoint(10.0, [8.9], [1], 0.4).ok()
    assert not cal.CapacityPoint(10.0, [9.9], [1], 0.01).ok()  # CPU saturated
    assert p.to_json()["ok"] is True


def test_bisection_halves_the_gap_between_the_last_pass_and_the_first_fail_until_it_is_small():
    # the minimal ladder: 16 passed, 32 failed -> their geometric middle
    assert cal.next_bisection_rate([point(16, 0.99), point(32, 0.85)]) == pytest.approx(22.6)
    # then between 22.6 and 32, or 16 and 22.6, as the middle went
    assert cal.next_bisection_rate([point(16, 0.99), point(32, 0.85), point(22.6, 0.95)]) == pytest.approx(26.9)
    assert cal.next_bisection_rate([point(16, 0.99), point(32, 0.85), point(22.6, 0.8)]) == pytest.approx(19.0)
    # a CPU-saturated rung fails like a slow flow
    assert cal.next_bisection_rate([point(16, 0.99), point(32, 0.99, idle=0.01)]) == pytest.approx(22.6)
    # close enough, nothing passed, or nothing failed above the best: no more rungs
    assert cal.next_bisection_rate([point(30, 0.99), point(32, 0.85)]) is None
    assert cal.next_bisection_rate([point(16, 0.5), point(32, 0.85)]) is None
    assert cal.next_bisection_rate([point(16, 0.99), point(32, 0.99)]) is None
    assert cal.next_bisection_rate([point(8, 0.5), point(16, 0.99)]) is None  # a failure below the best


def test_capacity_is_the_best_passing_point_and_says_why_it_stopped():
    points = [point(10, 0.99), point(20, 0.98), point(40, 0.95), point(80, 0.7)]
    c = cal.capacity_from_points(points)
    assert c["capacity_mbps"] == pytest.approx(40 * 0.95 * 4 * 3)
    assert c["at_link_mbps"] == 40
    assert c["limited_by"] == "flows"
    assert c["peak_switch_hop_mbps"] == pytest.approx(80 * 0.7 * 12)


def test_capacity_limited_by_cpu_ladder_or_nothing():
    assert cal.capacity_from_points([point(10, 0.99), point(20, 0.99, idle=0.01)])["limited_by"] == "cpu"
    assert cal.capacity_from_points([point(10, 0.99), point(20, 0.99)])["limited_by"] == "ladder"
    none = cal.capacity_from_points([point(10, 0.5)])
    assert none["capacity_mbps"] is None and none["limited_by"] == "flows"
    assert cal.capacity_from_points([])["capacity_mbps"] is None


def test_search_stops_at_the_first_failure():
    assert cal.should_continue([])
    assert cal.should_continue([point(10, 0.99)])
    assert not cal.should_continue([point(10, 0.99), point(20, 0.5)])


def test_rate_ladder_and_recommended_rate():
    assert cal.rate_ladder(2, quick=True) == [2, 4, 8, 16, 32, 64]
    assert cal.rate_ladder(150)[0] == 150 and cal.rate_ladder(150)[-1] == 1000
    assert cal.recommended_link_mbps(None) == 2
    # 1500 switch-hop Mbit/s, 80% of it over 16 flows x 3 switches = 25 -> 25 on the ladder
    assert cal.recommended_link_mbps(1500) == 25
    # 400 -> 6.67 -> 6
    assert cal.recommended_link_mbps(400) == 6
    assert cal.recommended_link_mbps(50) == 2


def test_capacity_flows_share_no_directed_link():
    topo = topology.build(cal.CAPACITY_TOPOLOGY)
    pairs = cal.capacity_pairs(topo)
    assert len(pairs) == 16 and len({s for s, _ in pairs}) == 16 and len({d for _, d in pairs}) == 16
    paths = cal.flow_paths(topo, cal.CAPACITY_ROUTING, pairs)
    assert all(len(p) - 2 == 3 for p in paths)
    used = [link for p in paths for link in routing.path_links(p)]
    assert len(used) == len(set(used)), "two capacity flows share a directed link"


def test_reshape_commands_cover_both_ends_of_every_link():
    topo = topology.build("star:hosts=2")
    cmds = cal.reshape_commands(topo, 25, {"h1": 101, "h2": 102})
    assert len(cmds) == 2 * len(topo.links)
    assert cmds[0] == ["mnexec", "-a", "101", "tc", "class", "change", "dev", "efh1-eth0", "parent", "5:0",
                       "classid", "5:1", "htb", "rate", "25Mbit", "burst", "100b", "cburst", "100b"]
    assert cmds[1][4] == "efs1-eth1"


def test_agent_size_keeps_the_ring_busy():
    assert cal.agent_size_bytes(10, 3) == 2 << 20  # 3.75 MB target -> 2 MiB
    assert cal.agent_size_bytes(1, 0.1) == 1 << 20


def test_the_aggregate_rows_links_share_out_the_capacity():
    assert cal.aggregate_link_mbps(2041.0) == 63.0  # half the capacity, 63.8 per flow, two digits, down
    assert cal.aggregate_link_mbps(100.0) == pytest.approx(3.1)
    assert cal.aggregate_link_mbps(1e6) == 1000.0
    assert cal.aggregate_link_mbps(None) == cal.AGGREGATE_DEFAULT_MBPS


def test_summary_table_mentions_every_measurement():
    cap = {"capacity_mbps": 1200.0, "flows": 16, "switch_hops": [3] * 16, "topology": "leafspine", "at_link_mbps": 30.0,
           "limited_by": "flows"}
    data = {"machine": {"nproc": 2, "datapath": "user", "mtu": 9000, "ovs_version": "3.1.0", "loadavg_before": [0.1]},
            "recommended_link_mbps": 20.0,
            "measurements": {"capacity": cap,
                             "one_link": {"ratio": 0.98, "goodput_mbps": 19.6, "link_mbps": 20.0,
                                          "model_goodput_factor": 0.9927, "ratio_to_model": 0.987,
                                          "sweep": [{"link_mbps": 10.0, "ratio": 0.99, "goodput_mbps": 9.9}]},
                             "agents_vs_iperf3": {"ratio": 0.98, "agent_mbps": 19.2, "iperf3_mbps": 19.6,
                                                  "size": 4 << 20}}}
    text = cal.summary_table(data)
    for needle in ("1200", "0.980", "agents / iperf3", "one link at 10 Mbit/s", "recommended"):
        assert needle in text


def test_cli_rejects_bad_bw_before_anything_starts(capsys):
    assert main(["calibrate", "--bw", "0"]) == 2
    assert "field 'bw'" in capsys.readouterr().err
