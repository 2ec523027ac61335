"""emu bench's pure parts: link rate choice, replay rows, bring-up medians, the printed report."""

from __future__ import annotations

import pytest

from emulator import bench
from emulator.cli import main
from emulator.errors import UserError
from emulator.schedule import generators
from emulator.topology import build


def test_link_rate_sources():
    assert bench.link_rate(25, {"recommended_link_mbps": 6}) == (25.0, "--bw")
    rate, source = bench.link_rate(None, {"recommended_link_mbps": 6, "machine": {"date": "d"}})
    assert rate == 6 and "calibration" in source
    assert bench.link_rate(None, None)[0] == 10
    with pytest.raises(UserError, match="field 'bw'"):
        bench.link_rate(2000, None)


def test_default_size_fits_the_time_budget():
    assert bench.default_size(10) == 1 << 20
    assert bench.default_size(3) == 512 << 10
    assert bench.default_size(0.1) == 64 << 10


def test_default_cases_generate_and_fit_their_topologies():
    for case in bench.DEFAULT_CASES:
        topo = build(bench.with_bw(case.topology, 6))
        assert topo.host_bw == 6
        for algo in case.algorithms:
            assert generators.generate(algo, topo, bench.DEFAULT_SIZE).p == len(topo.hosts)
    assert any("hdrm" in c.algorithms and c.topology.startswith("bigraph") for c in bench.DEFAULT_CASES)


def results(mp, busbw, flags=()):
    rep = {"measured_over_predicted": mp, "fidelity": {"flags": list(flags), "datapath_load_mbps": 300.0,
                                                       "cpu_idle": 0.3}}
    return {"status": "ok", "error": None, "time_s_median": 1.0, "prediction": {"predicted_time_s": 1.0 / mp},
            "measured_over_predicted_median": mp, "busbw_mbps_median": busbw, "repetitions": [rep]}


def test_replay_row_verdicts_and_flags():
    case = bench.DEFAULT_CASES[0]
    row = bench.replay_row(case, "hdrm", results(1.05, 5.7, ["uncalibrated", "over_capacity"]), 6.0)
    assert row["within_target"] is True and row["busbw_over_link"] == pytest.approx(0.95)
    assert row["flags"] == ["over_capacity"]
    assert bench.replay_row(case, "hd", results(1.2, 4.0), 6.0)["within_target"] is False
    failed = bench.replay_row(case, "hd", {"status": "failed", "error": "rank 3 hung"}, 6.0)
    assert failed["within_target"] is None and failed["busbw_over_link"] is None


def test_bringup_summary_medians_and_ratio():
    s = bench.bringup_summary([{"up_s": 4.0, "down_s": 2.0, "total_s": 6.0}, {"up_s": 6.0, "down_s": 2.0,
                                                                              "total_s": 8.0}],
                              [{"up_s": 2.0, "down_s": 1.0, "total_s": 3.0}])
    assert s["ours_up_s"] == 5.0 and s["plain_up_s"] == 2.0 and s["up_ratio"] == 2.5
    assert s["total_ratio"] == pytest.approx(7.0 / 3.0)


def test_report_prints_every_ratio_with_verdicts():
    case = bench.DEFAULT_CASES[0]
    rows = [bench.replay_row(case, "hdrm", results(1.05, 5.7), 6.0),
            bench.replay_row(case, "hd", results(1.3, 4.0), 6.0),
            bench.replay_row(case, "ring", {"status": "failed", "error": "rank 1 hung"}, 6.0)]
    data = {"date": "now", "machine": {"nproc": 2, "datapath": "user", "loadavg_before": [1.0]}, "mtu": 9000,
            "link_mbps": 6.0, "link_source": "--bw", "dilation": bench.REAL_FABRIC_MBPS / 6.0,
            "agents": {"ratio": 0.96, "agent_mbps": 5.7, "iperf3_mbps": 5.94}, "replays": rows, "hdrm": rows[0],
            "bringup": bench.bringup_summary([{"up_s": 4.0, "down_s": 2.0, "total_s": 6.0}],
                                             [{"up_s": 2.0, "down_s": 1.0, "total_s": 3.0}]) | {"hosts": 32},
            "calibration_capacity_mbps": 400.0, "duration_s": 300, "path": "results/x.json"}
    text = bench.format_report(data)
    assert "agent / iperf3" in text and "0.960" in text and "MISS" in text
    assert "hdrm busbw / link rate" in text and "0.950" in text and "PASS" in text
    assert "1 of 3" in text and "failed: rank 1 hung" in text
    assert "bring-up 32 hosts" in text and "2.00" in text
    assert "factor 16667" in text or "16666.7" in text


@pytest.mark.parametrize("argv,field", [(["bench", "--bw", "0"], "bw"), (["bench", "--repeat", "0"], "repeat"),
                                        (["bench", "--size", "1 potato"], "size")])
def test_cli_rejects_bad_input(argv, field, capsys):
    assert main(argv) == 2
    assert field in capsys.readouterr().err


def test_bandwidth_bound_size_keeps_hdrm_within_its_budget():
    assert bench.bandwidth_bound_size(10.0) == 16 << 20  # 25 s ideal at 10 Mbit/s
    assert bench.bandwidth_bound_size(5.0) == 8 << 20
    assert bench.bandwidth_bound_size(0.1) == 1 << 20  # never below the grid's size
    for bw in (1.0, 3.0, 10.0, 50.0):
        size = bench.bandwidth_bound_size(bw)
        assert size == 1 << 20 or 2 * 15 / 16 * size * 8 / (bw * 1e6) <= 30.0
