"""The timing model beside ``emu mpirun``'s benchmark (emulator.runs.mpi_prediction): Open MPI's algorithms as
schedules in its rank order, its own fallbacks, the connections' ports under ECMP, and the controller's log of
what it learned (emulator.emulation.network.controller_process)."""

from __future__ import annotations

import json

import pytest

from emulator.emulation.network.controller_process import ControllerProcess
from emulator.model import routing, topology
from emulator.model.collectives import generators
from emulator.model.collectives.placements import placement_hosts
from emulator.model.latency import LatencyModel
from emulator.model.prediction import cost
from emulator.model.prediction.check import check
from emulator.model.schedule import executor
from emulator.runs.mpi_plan import BTL_PORT_MIN, mca_settings
from emulator.runs.mpi_prediction import (
    GENERATOR_OF,
    MpiPrediction,
    PredictionInput,
    btl_flow_function,
    describe,
    open_mpi_generator,
    open_mpi_schedule,
    predict_bench,
    predict_row,
)
from emulator.runs.mpi_results import MpiResults

LEAFSPINE = "leafspine:leaves=4,spines=2,hosts_per_leaf=2,bw=20"
BENCH = ("/venv/bin/emu-allreduce-bench", "--algo", "rabenseifner", "--sizes", "1MiB")


def test_open_mpi_algorithms_map_onto_generators_with_its_own_fallbacks():
    assert GENERATOR_OF == {"ring": "ring", "segmented_ring": "ring", "rabenseifner": "hd",
                            "recursive_doubling": "rd"}
    assert open_mpi_generator("ring", 1 << 18, 16) == ("ring", "")
    assert open_mpi_generator("ring", 8, 16)[0] == "rd"  # fewer elements than ranks
    assert open_mpi_generator("rabenseifner", 1 << 18, 12) == ("hd", "")
    none, why = open_mpi_generator("rabenseifner", 7, 12)  # fewer than the largest power of two <= 12
    assert none is None and "basic_linear" in why
    assert open_mpi_generator("segmented_ring", 1 << 18, 8) == ("ring", "")
    assert open_mpi_generator("segmented_ring", 1 << 18, 8, segment_bytes=65536)[0] is None
    for algorithm in ("default", "basic_linear", "nonoverlapping"):
        assert open_mpi_generator(algorithm, 1 << 18, 8)[0] is None


@pytest.mark.parametrize("generator", sorted(set(GENERATOR_OF.values())))
@pytest.mark.parametrize("p", [2, 3, 6, 8, 12])
def test_the_schedule_puts_rank_r_on_the_r_th_host_of_the_run_and_proves(generator, p):
    topo = topology.build(LEAFSPINE)
    hosts = [h.name for h in topo.hosts][::-1][:p]  # rank order is the placement's, not the topology's
    sched = open_mpi_schedule(generator, 48 * 1024, hosts)
    assert [r.host for r in sched.ranks] == hosts and executor.execute(sched).valid
    assert check(sched, topo, "shortest").valid


def test_a_prediction_is_the_timing_model_of_the_same_transfers():
    topo = topology.build(LEAFSPINE)
    hosts = tuple(placement_hosts(topo, "identity"))
    latency = LatencyModel()
    given = PredictionInput(topo, "dmodk", 0, hosts, latency)
    row = predict_row("rabenseifner", 1 << 20, 1 << 18, 2.0, given)
    expected = check(generators.generate("hd", topo, 1 << 20), topo, "dmodk", latency=latency).predicted_time_s
    assert row.generator == "hd" and row.predicted_s == pytest.approx(expected)
    assert row.measured_over_predicted == pytest.approx(2.0 / expected)
    assert MpiPrediction.from_json(json.loads(json.dumps(row.to_json()))) == row
    assert "measured/predicted" in describe(row)


def _connections(topo: topology.Topology, hosts: list[str]) -> list[tuple[str, str, int, int]]:
    """What the controller learns from a run: each pair's transport connection (the higher rank listens), and an
    out-of-band connection of every host to rank 0's (ephemeral ports both)."""
    conns = []
    for i, a in enumerate(hosts):
        for j, b in enumerate(hosts[i + 1:], i + 1):
            conns.append((a, b, 40000 + 7 * i + j, BTL_PORT_MIN + j))
        if i:
            conns.append((a, hosts[0], 50000 + i, 45000))
    return conns


def test_under_ecmp_each_connection_is_routed_by_the_ports_it_had():
    topo = topology.build(LEAFSPINE)
    hosts = [h.name for h in topo.hosts]
    flow_of = btl_flow_function(_connections(topo, hosts), topo, "ecmp", seed=3)
    assert flow_of("h1", "h3", 0) == routing.Flow("h1", "h3", routing.IPPROTO_TCP, 40002, BTL_PORT_MIN + 2)
    assert flow_of("h3", "h1", 0) == routing.Flow("h3", "h1", routing.IPPROTO_TCP, BTL_PORT_MIN + 2, 40002)
    oob_only = btl_flow_function([("h1", "h3", 50001, 45000)], topo, "ecmp", seed=3)
    with pytest.raises(KeyError):
        oob_only("h1", "h3", 0)  # across the spines: a choice the controller would have learned
    assert oob_only("h1", "h2", 0).dport == BTL_PORT_MIN  # one leaf: no choice, placeholder ports
    sched = open_mpi_schedule("ring", 64 * 1024, hosts)
    for t in cost.transfers(sched, topo, "ecmp", seed=3, flow_of=flow_of):
        assert t.path == routing.route(topo, "ecmp", flow_of(t.src_host, t.dst_host, 0), seed=3)
    given = PredictionInput(topo, "ecmp", 3, tuple(hosts), LatencyModel(), flow_of=flow_of)
    assert predict_row("ring", 64 * 1024, 16384, 1.0, given).predicted_s is not None
    blind = PredictionInput(topo, "ecmp", 3, tuple(hosts), LatencyModel())
    unknown = predict_row("ring", 64 * 1024, 16384, 1.0, blind)
    assert unknown.predicted_s is None and "ports" in unknown.note


def test_rows_of_any_count_are_predicted_and_other_programs_get_none():
    topo = topology.build(LEAFSPINE)
    given = PredictionInput(topo, "dmodk", 0, tuple(h.name for h in topo.hosts)[:6], LatencyModel())
    # 1 MiB over 6 ranks splits into chunks one element apart, as Open MPI's ring splits it; 2 elements over 6
    # ranks is Open MPI's recursive doubling
    rows = [{"size": 1 << 20, "count": 1 << 18, "time_s": 1.0}, {"size": 8, "count": 2, "time_s": 0.1}]
    ring = ("emu-allreduce-bench", "--algo", "ring", "--sizes", "1MiB")
    first, second = predict_bench(ring, {}, rows, given)
    assert first.predicted_s is not None and first.generator == "ring"
    assert second.predicted_s is not None and second.generator == "rd"
    assert predict_bench(("./my_program",), {}, rows, given) == []
    segmented = ("emu-allreduce-bench", "--algo", "segmented_ring", "--sizes", "1MiB")
    assert predict_bench(segmented, {"coll_tuned_allreduce_algorithm_segmentsize": "8192"}, rows[:1],
                         given)[0].predicted_s is None


def test_results_keep_their_predictions_and_the_transport_listens_in_its_port_range():
    row = MpiPrediction(1 << 20, "ring", "ring", 1.1, 1.0)
    results = MpiResults(config={}, ranks=[], command=[], link_mbps=20.0, predictions=[row.to_json()])
    again = MpiResults.from_json(json.loads(json.dumps(results.to_json())))
    assert [MpiPrediction.from_json(p) for p in again.predictions] == [row]
    own = dict(mca_settings((), "/run/agent"))
    assert int(own["btl_tcp_port_min_v4"]) == BTL_PORT_MIN and int(own["btl_tcp_port_range_v4"]) > 0


def test_the_controller_log_of_learned_connections_reads_from_an_offset(tmp_path):
    ctl = ControllerProcess.for_network("star:hosts=4", "ecmp")
    ctl.state_file = str(tmp_path / "state.json")
    assert ctl.connections_offset() == 0 and ctl.learned_connections() == []
    log = tmp_path / "state.json.connections.jsonl"
    log.write_text('["h1", "h2", 40000, 20001]\n')
    at = ctl.connections_offset()
    with log.open("a") as fh:
        fh.write('["h2", "h3", 40001, 20002]\n["h3", "h4"')  # the last line cut short by a crash
    assert ctl.learned_connections() == [("h1", "h2", 40000, 20001), ("h2", "h3", 40001, 20002)]
    assert ctl.learned_connections(at) == [("h2", "h3", 40001, 20002)]
