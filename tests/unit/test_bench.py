"""emu bench's pure parts: link rate choice, replay rows, bring-up medians, the printed report."""

from __future__ import annotations

import pytest

from emulator.base.errors import UserError
from emulator.cli.main import main
from emulator.model import fabric
from emulator.model.latency import LatencyModel
from emulator.model.schedule import generators
from emulator.model.topology import build
from emulator.selfcheck import bench


def test_the_bench_profile_and_bw():
    assert bench.bench_profile(None, None) == fabric.default()
    p = bench.bench_profile("alpha_us=4", 50)
    assert p.emulated_link_mbps == pytest.approx(50) and p.alpha_us == 4 and p.link_gbps == 100
    with pytest.raises(UserError, match="field 'bw'"):
        bench.bench_profile(None, 2000)
    with pytest.raises(UserError, match="field 'preset'"):
        bench.bench_profile("nope", None)


def test_default_cases_generate_and_fit_their_topologies():
    for case in bench.DEFAULT_CASES:
        topo = build(bench.with_bw(case.topology, 6))
        assert topo.host_bw == 6
        for algo in (*case.algorithms, *case.extra_algorithms):
            for size in (*bench.DEFAULT_SIZES, *case.extra):
                assert generators.generate(algo, topo, size.bytes).p == len(topo.hosts)
    assert any("hdrm" in c.algorithms and c.topology.startswith("bigraph") for c in bench.DEFAULT_CASES)
    algorithms = {a for c in bench.DEFAULT_CASES for a in c.algorithms}
    assert algorithms == set(generators.ALGORITHMS)  # every algorithm is benchmarked
    for c in bench.CROSSOVERS:
        assert {c.algorithm, "ring"} <= set(c.case.algorithms)


def test_crossover_interpolates_in_log_log_and_says_who_wins_without_one():
    sizes = [1 << 10, 1 << 20]
    c = bench.crossover(sizes, [0.5, 2.0], [1.0, 1.0])  # ratio 0.5 -> 2: crosses 1 half-way (log scale)
    assert c["size"] == pytest.approx(2 ** 15)
    none = bench.crossover(sizes, [0.5, 0.9], [1.0, 1.0])
    assert none["size"] is None and none["x_faster"] is True
    slower = bench.crossover(sizes, [1.5, 2.0], [1.0, 1.0])
    assert slower["size"] is None and slower["x_faster"] is False
    assert bench.crossovers_agree(c, {"size": 1.9 * 2 ** 15, "x_faster": None})
    assert not bench.crossovers_agree(c, {"size": 2.1 * 2 ** 15, "x_faster": None})
    assert bench.crossovers_agree(none, {"size": None, "x_faster": True})
    assert not bench.crossovers_agree(none, slower) and not bench.crossovers_agree(c, none)


def test_the_model_finds_hds_crossover_with_ring_under_ecmp_and_none_for_hdrm_on_bigraph():
    model = LatencyModel(fabric.default())
    rate = fabric.default().emulated_link_mbps
    hdrm, hd = (bench.model_crossover(c, rate, model, 9000) for c in bench.CROSSOVERS)
    assert hdrm["size"] is None and hdrm["x_faster"]  # contention-free with 8 latencies against 30
    assert 1 << 20 < hd["size"] < 16 << 20  # fewer latencies, but ECMP collisions at large sizes


def test_prediction_summary_targets():
    rows = [{"measured_over_predicted": x} for x in (1.0, 1.05, 0.95, 1.02, 0.99, 1.01, 1.03, 0.97, 1.0, 1.15)]
    s = bench.prediction_summary(rows)
    assert (s["within"], s["beyond_worst"], s["worst"], s["pass"]) == (9, 0, 1.15, True)
    assert not bench.prediction_summary(rows + [{"measured_over_predicted": 1.3}])["pass"]  # one beyond 25%
    assert not bench.prediction_summary(rows + [{"measured_over_predicted": None}])["pass"]  # one not measured


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


def mpi_results(busbw: float, wrong: int = 0) -> dict:
    return {"kind": "mpirun", "status": "ok", "bench": [{"size": 4 << 20, "busbw_mbps": busbw, "wrong": wrong}],
            "fidelity": {"cpu_idle": 0.2, "flags": ["cpu_saturated"]}}


def agents_results(busbw: float) -> dict:
    return {"status": "ok", "busbw_mbps_median": busbw,
            "repetitions": [{"fidelity": {"flags": ["uncalibrated"]}}, {"fidelity": {"flags": ["latency_floor"]}}]}


def test_an_mpi_pair_row_compares_busbw_and_keeps_both_runs_flags():
    row = bench.mpi_pair_row("rabenseifner", "hd", mpi_results(5.0), agents_results(5.8))
    assert row["ratio"] == pytest.approx(5.0 / 5.8) and row["pass"] is False and row["mpi_correct"]
    assert row["agents_flags"] == ["latency_floor", "uncalibrated"] and row["mpi_flags"] == ["cpu_saturated"]
    assert bench.mpi_pair_row("ring", "ring", mpi_results(5.6), agents_results(5.8))["pass"] is True
    assert not bench.mpi_pair_row("ring", "ring", mpi_results(5.6, wrong=3), agents_results(5.8))["mpi_correct"]
    failed = bench.mpi_pair_row("ring", "ring", mpi_results(5.6), {"status": "failed", "error": "rank 2 hung"})
    assert failed["ratio"] is None and failed["agents_error"] == "rank 2 hung"


def test_the_mpi_comparison_runs_without_latency():
    bare = bench.without_latency(bench.bench_profile(None, 6.0))
    assert bare.alpha_s == 0 and bare.switch_latency_s == 0 and bare.emulated_link_mbps == pytest.approx(6.0)


def test_report_prints_every_ratio_with_verdicts():
    case = bench.DEFAULT_CASES[0]
    rows = [bench.replay_row(case, "hdrm", results(1.05, 5.7), 6.0, 16 << 20),
            bench.replay_row(case, "hd", results(1.3, 4.0), 6.0, 16 << 20),
            bench.replay_row(case, "ring", {"status": "failed", "error": "rank 1 hung"}, 6.0, 1 << 20)]
    crossing = bench.crossover([1 << 20, 16 << 20], [0.5, 1.2], [1.0, 1.0])
    data = {"date": "now", "machine": {"nproc": 2, "datapath": "user", "loadavg_before": [1.0]}, "mtu": 9000,
            "link_mbps": 6.0, "fabric": bench.bench_profile(None, 6.0).spec(), "calibration_source": "test",
            "agents": {"ratio": 0.96, "agent_mbps": 5.7, "iperf3_mbps": 5.94}, "replays": rows,
            "hdrm": rows[0] | {"size": 16 << 20},
            "crossovers": [{"label": "hd / ring", "measured": crossing, "predicted": crossing, "agree": True}],
            "bringup": bench.bringup_summary([{"up_s": 4.0, "down_s": 2.0, "total_s": 6.0}],
                                             [{"up_s": 2.0, "down_s": 1.0, "total_s": 3.0}]) | {"hosts": 32},
            "calibration_capacity_mbps": 400.0, "duration_s": 300, "path": "results/x.json",
            "mpi": [bench.mpi_pair_row("ring", "ring", mpi_results(5.4), agents_results(5.8)),
                    bench.mpi_pair_row("rabenseifner", "hd", {"status": "failed", "error": "mpirun could not start"},
                                       agents_results(5.8))]}
    text = bench.format_report(data)
    assert "MPI ring / agents ring busbw, BiGraph 2/2/2 hdrm, 4MiB" in text and "0.931" in text
    assert "5.40 vs 5.80 of 6 Mbit/s, MPI CPU idle 20%; cpu_saturated" in text
    assert "MPI rabenseifner / agents hd" in text and "(mpirun could not start)" in text
    assert "agent / iperf3" in text and "0.960" in text and "MISS" in text
    assert "hdrm busbw / link rate" in text and "16MiB" in text and "0.950" in text and "PASS" in text
    assert "1 of 3" in text and "failed: rank 1 hung" in text
    assert "bring-up 32 hosts" in text and "2.00" in text
    assert "crossover hd / ring" in text
    # 100 Gbit/s over 6 Mbit/s: the dilation as fabric.describe prints it, with %g.
    assert ("# fabric: 6 Mbit/s emulated links stand for 100 Gbit/s ones (time dilation 16666.7: every emulated "
            "time is 16666.7 times the real one)") in text


@pytest.mark.parametrize("argv,field", [(["bench", "--bw", "0"], "bw"), (["bench", "--repeat", "0"], "repeat"),
                                        (["bench", "--sizes", "1 potato"], "sizes"), (["bench", "--sizes", ","], "sizes"),
                                        (["bench", "--fabric", "alpha_us=-2"], "alpha_us")])
def test_cli_rejects_bad_input(argv, field, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field '{field}': expected " in err
