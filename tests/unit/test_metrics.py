"""One repetition's metrics from made-up operation times: time, bandwidths, steps, transfers, lateness, the table."""

from __future__ import annotations

import pytest

from emulator.emulation.session import fidelity
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction import check as scheck
from emulator.model.prediction import cost
from emulator.runs.metrics import (
    AgentLag,
    agent_lag,
    nccl_table,
    repetition_metrics,
    send_lateness,
    send_paths,
    timeline_records,
)
from emulator.runs.results import Repetition

TOPO = topology.build("star:hosts=2")
RING = generators.generate("ring", TOPO, 1024)  # 2 ranks, 2 steps of 512 B each way


def op_times(t0=100.0):
    """Step 0 from t0 to t0+1 (the receives posted early), step 1 from t0+1 to t0+3."""
    times = {}
    for prog in RING.ranks:
        per = {}
        for op in prog.ops:
            begin = t0 + (0.0 if op.step == 0 else 1.0)
            end = t0 + (1.0 if op.step == 0 else 3.0)
            per[op.id] = (begin - 0.5 if op.kind != "send" else begin, end)
        times[prog.rank] = per
    return times


def test_a_repetition_has_its_time_bandwidths_and_steps():
    rep = repetition_metrics(RING, op_times(), rep=4)
    assert isinstance(rep, Repetition) and rep.rep == 4
    assert rep.time_s == pytest.approx(3.5)  # from the first posted receive to the last end
    assert rep.start_monotonic == pytest.approx(99.5)
    assert rep.algbw_mbps == pytest.approx(1024 * 8 / 3.5 / 1e6)
    assert rep.busbw_mbps == pytest.approx(rep.algbw_mbps * 2 * (2 - 1) / 2)
    assert [(s.step, s.start_s, s.time_s) for s in rep.steps] == [(0, pytest.approx(0.5), pytest.approx(1.0)),
                                                                   (1, pytest.approx(1.5), pytest.approx(2.0))]
    assert rep.predicted_time_s is None and "predicted_time_s" not in rep.to_json()
    assert all("predicted_s" not in s for s in rep.to_json()["steps"])


def test_against_a_prediction_every_step_has_its_ratio():
    report = scheck.predict(RING, TOPO, "shortest")
    rep = repetition_metrics(RING, op_times(), report)
    assert rep.predicted_time_s == report.predicted_time_s
    assert rep.measured_over_predicted == pytest.approx(3.5 / report.predicted_time_s)
    per_step = report.step_times()
    for step in rep.steps:
        assert step.predicted_s == per_step[step.step]
        assert step.measured_over_predicted == pytest.approx(step.time_s / per_step[step.step])


def test_a_rank_that_reported_nothing_is_left_out_of_the_steps():
    times = op_times()
    del times[1]
    rep = repetition_metrics(RING, times)
    # only rank 0's sends and receives: step spans still from its own operations
    assert [s.step for s in rep.steps] == [0, 1]


def test_timeline_records_pair_each_send_with_its_receive():
    sends = {0: {0: [99.5, 99.9, 100.0, 0.002]}}
    records = timeline_records(RING, 3, op_times(), sends)
    assert len(records) == 4  # two transfers per step
    first = next(r for r in records if r["src"] == 0 and r["step"] == 0)
    assert first == {"rep": 3, "step": 0, "src": 0, "dst": 1, "src_host": "h1", "dst_host": "h2", "bytes": 512,
                     "start": 100.0, "end": 101.0, "send_end": 101.0, "posted": 99.5, "cts_at": 99.9,
                     "sent": 100.0, "late_s": 0.002}
    assert all("late_s" not in r for r in records if r is not first)


def test_lateness_is_measured_against_each_paths_target():
    model = fidelity.latency_model(fabric.parse(None), None, netem=False)
    planned = cost.transfers(RING, TOPO, "shortest")
    paths = send_paths(TOPO, planned, model, 9000)
    assert set(paths) == {(0, 1), (1, 0)} and paths[(0, 1)].byte_s > 0 and paths[(0, 1)].mss > 0
    sends = {0: {0: [0, 0, 0, 0.004], 2: [0, 0, 0, 0.001]}, 1: {1: [0, 0, 0, 0.0]}}
    late, target = send_lateness(RING, sends, paths)
    assert late == [0.004, 0.001, 0.0] and target == [paths[(0, 1)].message_target_s] * 2 + [
        paths[(1, 0)].message_target_s]
    without = send_paths(TOPO, planned, LatencyModel(), 9000)
    assert without[(0, 1)].message_target_s == 0.0


def test_the_nccl_table_has_one_row_per_repetition_and_the_mean():
    reps = [repetition_metrics(RING, op_times(), rep=i) for i in range(2)]
    reps[1].correct = False
    lines = nccl_table(RING, reps).splitlines()
    assert lines[0].startswith("# ring allreduce, 2 ranks")
    rows = [line for line in lines if not line.startswith("#")]
    assert len(rows) == 2 and rows[0].split()[-1] == "0" and rows[1].split()[-1] == "1"
    assert lines[-1] == f"# Avg bus bandwidth    : {reps[0].busbw_mbps:.2f} Mb/s"
    assert "Avg" not in nccl_table(RING, [])


def test_agent_lag_is_the_worst_ranks_share_of_time_behind_the_fabric():
    # rank 0: a receive whose last byte came at 1.0 and was done at 1.3, a send 0.2 late at 2.0;
    # rank 1: two receives whose lags overlap (1.0-1.4 and 1.2-1.5): 0.5 s, counted once
    op_times = {0: {1: (0.5, 1.3), 2: (1.5, 2.5)}, 1: {1: (0.5, 1.4), 2: (0.6, 1.5)}}
    sends = {0: {2: [1.5, 1.6, 2.0, 0.2]}, 1: {}}
    arrivals = {0: {1: 1.0}, 1: {1: 1.0, 2: 1.2}}
    lag = agent_lag(op_times, sends, arrivals, elapsed_s=2.0)
    assert lag is not None and lag.rank == 0 and lag.share == pytest.approx((0.3 + 0.2) / 2.0)
    assert agent_lag(op_times, {}, {1: arrivals[1]}, 2.0) == AgentLag(1, pytest.approx(0.25))
    # sends on time and no stamps: no lag; nothing reported or no time: unknown
    assert agent_lag(op_times, {0: {2: [1.5, 1.6, 2.0, 0.0]}}, {}, 2.0) == AgentLag(0, 0.0)
    assert agent_lag(op_times, {}, {}, 2.0) is None
    assert agent_lag(op_times, sends, arrivals, 0.0) is None
