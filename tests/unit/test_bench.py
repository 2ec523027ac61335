"""emu bench's pure parts: link rate choice, typed replay rows, bring-up medians, the printed report."""

from __future__ import annotations

import pytest

from emulator.base.errors import UserError
from emulator.cli.main import main
from emulator.model import fabric
from emulator.model.collectives import generators, registry
from emulator.model.latency import LatencyModel
from emulator.model.schedule.semantics import ALLREDUCE
from emulator.model.topology import build
from emulator.runs.mpi_plan import message_profile
from emulator.selfcheck import bench
from emulator.selfcheck.bench.cases import CROSSOVERS, DEFAULT_CASES, DEFAULT_SIZES
from emulator.selfcheck.bench.crossovers import (
    CrossoverCurve,
    CrossoverRow,
    crossover,
    crossovers_agree,
    model_crossover,
)
from emulator.selfcheck.bench.results import BenchResults
from emulator.selfcheck.bench.rows import (
    AgentsVsIperf,
    BringupSummary,
    BringupTimes,
    MpiPairRow,
    PredictionSummary,
    ReplayRow,
)


def test_the_bench_profile_and_bw():
    assert bench.bench_profile(fabric.default(), None) == fabric.default()
    p = bench.bench_profile(fabric.parse("alpha_us=4"), 50)
    assert p.emulated_link_mbps == pytest.approx(50) and p.alpha_us == 4 and p.link_gbps == 100
    with pytest.raises(UserError, match="field 'bw'"):
        bench.bench_profile(fabric.default(), 2000)


def test_default_cases_generate_and_fit_their_topologies():
    for case in DEFAULT_CASES:
        topo = build(case.topology, 6)
        assert topo.host_bw == 6
        for algo in (*case.algorithms, *case.extra_algorithms):
            for size in (*DEFAULT_SIZES, *case.extra):
                assert generators.generate(algo, topo, size.bytes).p == len(topo.hosts)
    assert any("hdrm" in c.algorithms and c.topology.startswith("bigraph") for c in DEFAULT_CASES)
    algorithms = {a for c in DEFAULT_CASES for a in c.algorithms}
    # every algorithm is benchmarked; NCCL's (nccl: ring over channels, nccl-nvls, nccl-tree) are measured by
    # emu nccl-tests --packets (docs/validation.md)
    assert algorithms | {"nccl", "nccl-nvls", "nccl-tree"} == set(registry.algorithms(ALLREDUCE))
    for c in CROSSOVERS:
        assert {c.algorithm, "ring"} <= set(c.case.algorithms)


def test_crossover_interpolates_in_log_log_and_says_who_wins_without_one():
    sizes = [1 << 10, 1 << 20]
    c = crossover(sizes, [0.5, 2.0], [1.0, 1.0])  # ratio 0.5 -> 2: crosses 1 half-way (log scale)
    assert c.size == pytest.approx(2 ** 15)
    none = crossover(sizes, [0.5, 0.9], [1.0, 1.0])
    assert none.size is None and none.x_faster is True
    slower = crossover(sizes, [1.5, 2.0], [1.0, 1.0])
    assert slower.size is None and slower.x_faster is False
    assert crossovers_agree(c, CrossoverCurve(1.9 * 2 ** 15, (), (), None))
    assert not crossovers_agree(c, CrossoverCurve(2.1 * 2 ** 15, (), (), None))
    assert crossovers_agree(none, CrossoverCurve(None, (), (), True))
    assert not crossovers_agree(none, slower) and not crossovers_agree(c, none)


def test_the_model_finds_hds_crossover_with_ring_under_ecmp_and_none_for_hdrm_on_bigraph():
    model = LatencyModel(fabric.default())
    rate = fabric.default().emulated_link_mbps
    hdrm, hd = (model_crossover(c, rate, model, 9000) for c in CROSSOVERS)
    assert hdrm.size is None and hdrm.x_faster  # contention-free with 8 latencies against 30
    assert hd.size is not None and 1 << 20 < hd.size < 16 << 20  # fewer latencies, but ECMP collisions at large sizes


def ratio_rows(*ratios):
    case = DEFAULT_CASES[0]
    return [ReplayRow.of(case, "ring", {"status": "ok", "measured_over_predicted_median": x}, 6.0) for x in ratios]


def test_prediction_summary_targets():
    rows = ratio_rows(1.0, 1.05, 0.95, 1.02, 0.99, 1.01, 1.03, 0.97, 1.0, 1.15)
    s = PredictionSummary.of(rows)
    assert (s.within, s.beyond_worst, s.worst, s.passed) == (9, 0, 1.15, True)
    assert not PredictionSummary.of(rows + ratio_rows(1.3)).passed  # one beyond 25%
    assert not PredictionSummary.of(rows + ratio_rows(None)).passed  # one not measured


def results(mp, busbw, flags=()):
    rep = {"measured_over_predicted": mp, "fidelity": {"flags": list(flags), "datapath_load_mbps": 300.0,
                                                       "cpu_idle": 0.3}}
    return {"status": "ok", "error": None, "time_s_median": 1.0, "prediction": {"predicted_time_s": 1.0 / mp},
            "measured_over_predicted_median": mp, "busbw_mbps_median": busbw, "repetitions": [rep]}


def test_replay_row_verdicts_and_flags():
    case = DEFAULT_CASES[0]
    row = ReplayRow.of(case, "hdrm", results(1.05, 5.7, ["uncalibrated", "over_capacity"]), 6.0)
    assert row.within_target is True and row.busbw_over_link == pytest.approx(0.95)
    assert row.flags == ("over_capacity",)
    assert ReplayRow.of(case, "hd", results(1.2, 4.0), 6.0).within_target is False
    failed = ReplayRow.failed(case, "hd", "rank 3 hung", 6.0)
    assert failed.within_target is None and failed.busbw_over_link is None and failed.error == "rank 3 hung"


def test_a_replay_rows_json_keeps_the_keys_of_the_results_document():
    row = ReplayRow.of(DEFAULT_CASES[0], "hdrm", results(1.05, 5.7, ["latency_floor"]), 6.0, 1 << 20)
    doc = row.to_json()
    assert list(doc) == ["topology", "routing", "seed", "algorithm", "size", "status", "error", "time_s",
                         "predicted_s", "measured_over_predicted", "measured_over_predicted_reps", "busbw_mbps",
                         "busbw_over_link", "datapath_load_mbps", "cpu_idle_min", "tcp_retransmits", "flags",
                         "within_target"]
    assert doc["flags"] == ("latency_floor",) and doc["tcp_retransmits"] == (None,) and doc["size"] == 1 << 20


def bringups(ours, plain):
    return BringupSummary("star:hosts=2", 2, 1, 2, tuple(BringupTimes(u, d, "user") for u, d in ours),
                          tuple(BringupTimes(u, d) for u, d in plain))


def test_bringup_summary_medians_and_ratio():
    s = bringups([(4.0, 2.0), (6.0, 2.0)], [(2.0, 1.0)])
    assert s.median("ours", "up_s") == 5.0 and s.median("plain", "up_s") == 2.0 and s.up_ratio == 2.5
    assert s.total_ratio == pytest.approx(7.0 / 3.0)
    doc = s.to_json()
    assert doc["ours"][0] == {"up_s": 4.0, "down_s": 2.0, "total_s": 6.0, "datapath": "user"}
    assert doc["plain"][0] == {"up_s": 2.0, "down_s": 1.0, "total_s": 3.0} and doc["up_ratio"] == 2.5
    assert "up_ratio" not in bringups([(4.0, 2.0)], []).to_json()
    assert s.per_host("ours", "up_s") == 2.5 and s.per_host("plain", "total_s") == 1.5  # 2 hosts
    assert bringups([(4.0, 2.0)], []).per_host("plain", "up_s") is None


def mpi_results(busbw: float, wrong: int = 0) -> dict:
    return {"kind": "mpirun", "status": "ok", "bench": [{"size": 4 << 20, "busbw_mbps": busbw, "wrong": wrong}],
            "fidelity": {"cpu_idle": 0.2, "flags": ["cpu_saturated"]},
            "predictions": [{"size": 4 << 20, "measured_over_predicted": 1.12}]}


def agents_results(busbw: float) -> dict:
    return {"status": "ok", "busbw_mbps_median": busbw, "measured_over_predicted_median": 1.03,
            "repetitions": [{"fidelity": {"flags": ["uncalibrated"]}}, {"fidelity": {"flags": ["latency_floor"]}}]}


def test_an_mpi_pair_row_compares_busbw_and_keeps_both_runs_flags():
    row = MpiPairRow.of("BiGraph 4/4/2 hdrm", "rabenseifner", "hd", mpi_results(5.0), agents_results(5.8))
    assert row.ratio == pytest.approx(5.0 / 5.8) and row.passed is False and row.mpi_correct
    assert row.agents_flags == ("latency_floor", "uncalibrated") and row.mpi_flags == ("cpu_saturated",)
    assert row.to_json()["pass"] is False and row.to_json()["agents_flags"] == ["latency_floor", "uncalibrated"]
    assert row.mpi_over_model == 1.12 and row.agents_over_model == 1.03
    assert MpiPairRow.of("BiGraph 4/4/2 hdrm", "ring", "ring", mpi_results(5.6), agents_results(5.8)).passed is True
    assert not MpiPairRow.of("BiGraph 4/4/2 hdrm", "ring", "ring", mpi_results(5.6, wrong=3),
                             agents_results(5.8)).mpi_correct
    failed = MpiPairRow.of("BiGraph 4/4/2 hdrm", "ring", "ring", mpi_results(5.6),
                           {"status": "failed", "error": "rank 2 hung"})
    assert failed.ratio is None and failed.agents_error == "rank 2 hung"
    assert MpiPairRow.not_run("BiGraph 4/4/2 hdrm", "ring", "ring", "boom").to_json() == {
        "fabric": "BiGraph 4/4/2 hdrm", "mpi_algorithm": "ring", "agents_algorithm": "ring", "size": 4 << 20,
        "ratio": None, "pass": None,
        "mpi_error": "boom"}


def test_the_mpi_comparison_runs_without_latency():
    bare = message_profile(bench.bench_profile(fabric.default(), 6.0), latency=False)
    assert bare.alpha_s == 0 and bare.switch_latency_s == 0 and bare.emulated_link_mbps == pytest.approx(6.0)


def report_results(**sections) -> BenchResults:
    profile = bench.bench_profile(fabric.default(), 6.0)
    return BenchResults("now", {"nproc": 2, "datapath": "user", "loadavg_before": [1.0]}, profile,
                        LatencyModel(profile), DEFAULT_SIZES, 400.0, "results/x.json", "results/x", 300.0, **sections)


def test_report_prints_every_ratio_with_verdicts():
    case = DEFAULT_CASES[0]
    rows = [ReplayRow.of(case, "hdrm", results(1.05, 5.7), 6.0, 16 << 20),
            ReplayRow.of(case, "hd", results(1.3, 4.0), 6.0, 16 << 20),
            ReplayRow.failed(case, "ring", "rank 1 hung", 6.0, 1 << 20)]
    crossing = crossover([1 << 20, 16 << 20], [0.5, 1.2], [1.0, 1.0])
    data = report_results(
        agents=AgentsVsIperf.of({"ratio": 0.96, "agent_mbps": 5.7, "iperf3_mbps": 5.94}), replays=rows,
        hdrm=rows[0], crossovers=[CrossoverRow("hd / ring", crossing, crossing, True)],
        bringup=bringups([(4.0, 2.0)], [(2.0, 1.0)]),
        mpi=[MpiPairRow.of("BiGraph 4/4/2 hdrm", "ring", "ring", mpi_results(5.4), agents_results(5.8)),
             MpiPairRow.of("BiGraph 4/4/2 hdrm", "rabenseifner", "hd",
                           {"status": "failed", "error": "mpirun could not start"}, agents_results(5.8))])
    text = bench.format_report(data)
    assert "MPI ring / agents ring busbw, BiGraph 4/4/2 hdrm, 4MiB" in text and "0.931" in text
    assert "5.40 vs 5.80 of 6 Mbit/s, MPI CPU idle 20%, over the model: MPI 1.12, agents 1.03; cpu_saturated" in text
    assert "MPI rabenseifner / agents hd" in text and "(mpirun could not start)" in text
    assert "agent / iperf3" in text and "0.960" in text and "MISS" in text
    assert "hdrm busbw / link rate" in text and "16MiB" in text and "0.950" in text and "PASS" in text
    assert "1 of 3" in text and "failed: rank 1 hung" in text
    assert "bring-up 2 hosts" in text and "2.00" in text
    assert "crossover hd / ring" in text
    # 100 Gbit/s over 6 Mbit/s: the dilation as fabric.describe prints it, with %g.
    assert ("# fabric: 6 Mbit/s emulated links stand for 100 Gbit/s ones (time dilation 16666.7: every emulated "
            "time is 16666.7 times the real one)") in text


def test_a_crossover_the_rows_do_not_show_is_reported_not_a_crash():
    predicted = crossover([1 << 20, 16 << 20], [0.5, 1.2], [1.0, 1.0])
    text = bench.format_report(report_results(crossovers=[CrossoverRow("hd / ring", None, predicted, None)]))
    assert "# crossover hd / ring: measured -, model 9197KiB" in text
    assert "crossover hd / ring" in text and "n/a" in text


@pytest.mark.parametrize("argv,field", [(["bench", "--bw", "0"], "bw"), (["bench", "--repeat", "0"], "repeat"),
                                        (["bench", "--sizes", "1 potato"], "sizes"), (["bench", "--sizes", ","], "sizes"),
                                        (["bench", "--fabric", "alpha_us=-2"], "alpha_us"),
                                        (["bench", "--fabric", "nope"], "preset")])
def test_cli_rejects_bad_input(argv, field, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field '{field}': expected " in err
