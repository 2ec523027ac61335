"""Admission (emulator.runs.admission): the estimates of memory, time and load, and the refusals they make.

The memory estimate of an agent is held against what :class:`emulator.model.schedule.buffers.RankBuffers` really
allocates; the
rate a capacity refusal suggests is predicted again to check that it fits; the command line refuses before
anything is written, with the machine's memory replaced by a small one.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from fake_session import factory
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.base.errors import UserError
from emulator.cli.arguments import duration
from emulator.cli.commands import admit
from emulator.cli.commands import experiment as cmd
from emulator.cli.main import main
from emulator.emulation.machine.system import cgroup_memory_headroom
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import predict
from emulator.model.schedule.buffers import BUFFER_NAMES, RankBuffers, rank_bytes
from emulator.model.schedule.format import RECV_REDUCE, save
from emulator.runs import admission
from emulator.runs.admission import GiB, MiB
from emulator.runs.dilation import AgentCosts, Envelope
from emulator.study import experiment as xp
from emulator.study.live import runner

STAR = "star:hosts=8"
ALGOS = ("ring", "hd", "dbtree")


def allocated_bytes(schedule, rank: int) -> int:
    """What RankBuffers holds for ``rank``, plus its receive workers' staging at their largest recv_reduce."""
    bufs = RankBuffers(schedule, rank)
    total = sum(bufs.arrays[b].nbytes for b in BUFFER_NAMES) + bufs.inputs.nbytes
    total += sum(values.nbytes + mask.nbytes for values, mask in bufs.expected.values())
    staging: dict[tuple[int, int], int] = {}
    for op in schedule.ranks[rank].ops:
        if op.kind == RECV_REDUCE:
            key = (op.partner, op.lane)
            staging[key] = max(staging.get(key, 0), bufs.target(op).nbytes)
    return total + sum(staging.values())


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(ALGOS), st.sampled_from((2, 4, 8)), st.integers(12, 20), st.data())
def test_rank_bytes_bounds_what_the_buffers_allocate_and_is_tight(algo, hosts, log_size, data):
    topo = topology.build(f"star:hosts={hosts}")
    schedule = generators.generate(algo, topo, 1 << log_size)
    rank = data.draw(st.integers(0, schedule.p - 1))
    actual = allocated_bytes(schedule, rank)
    estimate = rank_bytes(schedule, rank)
    assert actual <= estimate <= 1.6 * actual + schedule.chunk_bytes


def test_an_agent_of_an_8_rank_64_mib_ring_is_estimated_above_its_measured_282_mb():
    # measured here (docs/fidelity.md): VmRSS 282 MB for this agent
    schedule = generators.generate("ring", topology.build(STAR), 64 * MiB)
    assert 282e6 <= admission.agent_bytes(schedule, 0) <= 1.3 * 282e6


def test_the_agents_limit_covers_its_estimate_and_its_threads_stacks():
    schedule = generators.generate("hd", topology.build(STAR), 1 * MiB)
    limit = admission.agent_limit_bytes(schedule, 0)
    threads = admission.agent_threads(schedule, 0)
    assert threads == 2 + 3 + 3  # main and a spare; hd on 8 ranks: 3 peers, a sender and a receiver each
    assert limit >= admission.agent_bytes(schedule, 0) + threads * admission.THREAD_STACK_BYTES


def test_replay_memory_adds_every_agent_the_hosts_switches_and_the_session():
    topo = topology.build(STAR)
    schedule = generators.generate("ring", topo, 1 * MiB)
    est = admission.replay_memory(schedule, topo)
    agents = sum(admission.agent_bytes(schedule, r) for r in range(8))
    assert est.total_bytes == agents + 8 * admission.HOST_BYTES + admission.SWITCH_BYTES + admission.SESSION_BYTES
    assert est.ranks == 8 and est.rank_bytes == max(admission.agent_bytes(schedule, r) for r in range(8))


def test_the_mpi_benchmark_holds_three_buffers_of_its_largest_size_and_other_programs_are_unknown():
    assert admission.mpi_program_bytes(["emu-allreduce-bench", "--algo", "ring", "--sizes", "1MiB,64MiB"]) \
        == 3 * 64 * MiB
    assert admission.mpi_program_bytes(["/usr/bin/my_app", "--size", "1GiB"]) == 0
    assert admission.mpi_program_bytes(["emu-allreduce-bench", "--algo", "bogus"]) == 0  # it refuses itself
    # an unknown program's ranks share what the machine can give
    assert admission.mpi_rank_limit_bytes(0, 8, 16 * GiB) == 2 * GiB


def test_bringup_grows_with_ports_as_measured():
    small = admission.bringup_estimate_s(topology.build("bigraph:upper=4,lower=4,hosts_per_switch=4"))
    big = admission.bringup_estimate_s(topology.build("fattree:k=8"))
    assert 2 <= small <= 8  # measured 2.7 s
    assert 15 <= big <= 35  # measured 22.7 s


# ------------------------------------------------------------------ verdicts
MACHINE = admission.Machine(available_bytes=20 * GiB, total_bytes=24 * GiB)


def request(memory_bytes: int = 1 * GiB, time_s: float = 60.0, loads=()) -> admission.Request:
    mem = admission.MemoryEstimate(ranks=4, rank_bytes=memory_bytes // 4, programs_bytes=memory_bytes,
                                   network_bytes=0, session_bytes=0)
    return admission.Request("replay", mem, time_s, "the model's 15 s x 4 repetitions", tuple(loads))


def test_a_run_that_fits_is_admitted_with_what_it_takes():
    v = admission.admit(request(), MACHINE, admission.Policy(), echo=lambda line: None)
    assert v.admitted and v.fits.startswith("admitted: memory 1.0 GiB of 17.6 GiB usable; predicted 60 s")


def test_memory_beyond_what_the_machine_can_give_is_refused_naming_both_numbers():
    with pytest.raises(UserError) as err:
        admission.admit(request(memory_bytes=19 * GiB), MACHINE, admission.Policy())
    text = str(err.value)
    assert "field 'memory'" in text and "19.0 GiB" in text and "17.6 GiB" in text and "20.0 GiB available" in text
    assert "\n" not in text


def test_a_reserve_is_always_left_to_the_machine():
    tiny = admission.Machine(available_bytes=2 * GiB, total_bytes=4 * GiB)
    assert tiny.usable_bytes == 1 * GiB  # the reserve is at least 1 GiB
    assert admission.Machine(available_bytes=0, total_bytes=4 * GiB).usable_bytes == 0


def test_a_run_predicted_beyond_max_time_is_refused_naming_the_prediction_and_the_flag():
    with pytest.raises(UserError) as err:
        admission.admit(request(time_s=3 * 3600), MACHINE, admission.Policy(max_time_s=1800))
    text = str(err.value)
    assert "--max-time 30 min" in text and "3.0 h" in text and "the model's 15 s x 4" in text
    admission.admit(request(time_s=3 * 3600), MACHINE, admission.Policy(max_time_s=4 * 3600), echo=lambda x: None)


def test_every_refusal_is_in_the_one_line():
    with pytest.raises(UserError) as err:
        admission.admit(request(memory_bytes=30 * GiB, time_s=7200), MACHINE, admission.Policy())
    assert "field 'memory'" in str(err.value) and "field 'max-time'" in str(err.value)


def envelope(capacity: float | None) -> Envelope:
    """A calibration's envelope with agents too cheap to matter: the datapath rule alone."""
    return Envelope(capacity, AgentCosts(0.0, 0.0), 2)


def load(peak: float, capacity: float | None) -> admission.Load:
    return admission.Load(peak, capacity, "hd 16MiB", 20.0, None)


def test_load_beyond_the_calibrated_capacity_is_refused_unless_untrusted_runs_are_allowed():
    with pytest.raises(UserError) as err:
        admission.admit(request(loads=[load(3000, 1500)]), MACHINE, admission.Policy())
    assert "3000 switch-hop Mbit/s" in str(err.value) and "1500" in str(err.value)
    assert "at most 10 Mbit/s" in str(err.value) and "--allow-untrusted" in str(err.value)
    lines: list[str] = []
    v = admission.admit(request(loads=[load(3000, 1500)]), MACHINE, admission.Policy(allow_untrusted=True),
                        echo=lines.append)
    assert v.admitted and any("over_capacity" in line for line in lines)


def _agents_load(ranks: int, mbps: float, costs: AgentCosts) -> admission.Load:
    topo = topology.build(f"star:hosts={ranks},bw={mbps:g}")
    report = predict(generators.generate("hd", topo, MiB), topo, "shortest",
                     latency=LatencyModel())
    return admission.load_of(report, Envelope(None, costs, 2), "hd 1MiB", topo, None)


def test_agents_whose_work_the_cores_cannot_keep_up_with_are_refused_unless_untrusted_runs_are_allowed():
    two_cores = admission.Machine(20 * GiB, 24 * GiB, cores=2)
    costly = AgentCosts(per_message_s=1e-3, per_byte_s=20e-9)
    fast = _agents_load(64, 100.0, costly)
    assert fast.agents is not None and fast.agents.share > admission.CPU_FRACTION
    req = admission.Request("replay", admission.MemoryEstimate(64, MiB, 64 * MiB, 0, 0), 60.0, "x", loads=(fast,))
    with pytest.raises(UserError, match="field 'agents': expected work this machine's CPU keeps up with") as err:
        admission.admit(req, two_cores, admission.Policy())
    rate = float(str(err.value).split("at most ")[1].split(" ")[0])
    assert rate < 100.0 and not _agents_load(64, rate, costly).agents_over  # the advice fits when predicted again
    v = admission.admit(req, two_cores, admission.Policy(allow_untrusted=True), echo=lambda x: None)
    assert v.admitted and "emulator_lag" in v.warnings[-1]
    slow = _agents_load(64, rate, costly)
    ok = admission.Request("replay", admission.MemoryEstimate(256, MiB, 256 * MiB, 0, 0), 60.0, "x", loads=(slow,))
    assert admission.admit(ok, two_cores, admission.Policy(), echo=lambda x: None).admitted  # ranks alone: no limit


def test_more_mpi_ranks_than_the_cores_ran_trusted_are_refused_unless_untrusted_runs_are_allowed():
    two_cores = admission.Machine(20 * GiB, 24 * GiB, cores=2)
    many = admission.Request("mpirun", admission.MemoryEstimate(128, MiB, 128 * MiB, 0, 0, what="MPI ranks"),
                             60.0, "x")
    with pytest.raises(UserError, match="field 'ranks': .*128 MPI ranks on 2 cores, where at most 64 ran trusted"):
        admission.admit(many, two_cores, admission.Policy())
    v = admission.admit(many, two_cores, admission.Policy(allow_untrusted=True), echo=lambda x: None)
    assert v.admitted and "cpu_saturated" in v.warnings[0]
    fewer = admission.Request("mpirun", admission.MemoryEstimate(64, MiB, 64 * MiB, 0, 0, what="MPI ranks"), 60.0,
                              "x")
    assert admission.admit(fewer, two_cores, admission.Policy(), echo=lambda x: None).admitted


def test_without_a_calibration_the_load_is_not_refused_but_said_to_be_unchecked():
    v = admission.admit(request(loads=[load(1e6, None)]), MACHINE, admission.Policy(), echo=lambda x: None)
    assert v.admitted and "no datapath calibration" in v.warnings[0]


def test_the_suggested_rate_and_dilation_do_fit_when_predicted_again():
    capacity = 100.0
    topo = topology.build("star:hosts=16,bw=20")
    schedule = generators.generate("hd", topo, 4 * MiB)
    report = predict(schedule, topo, "shortest", latency=LatencyModel())
    peak = report.peak_load_mbps()
    assert peak > capacity
    profile = fabric.parse(None, where="test")
    ld = admission.Load(peak, capacity, "hd", topo.host_bw, profile)
    text = admission.fitting_rate(ld)
    rate = float(text.split("at most ")[1].split(" ")[0])
    again = topology.build(f"star:hosts=16,bw={rate:g}")
    assert predict(generators.generate("hd", again, 4 * MiB), again, "shortest",
                   latency=LatencyModel()).peak_load_mbps() <= capacity
    dilation = int(text.split("dilation=")[1].split(",")[0])
    assert profile.link_gbps * 1000 / dilation <= rate


ONE_RATE = """
name: one-rate
repeat: 1
warmup: 0
sizes: [4MiB]
fabric: bandwidth-only
series:
  - name: profile
    link_mbps: 20
    runs:
      - {topology: "bigraph:upper=4,lower=4,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm]}
  - name: spec
    runs:
      - {topology: "bigraph:upper=4,lower=4,hosts_per_switch=2,bw=20", routing: bigraph, algorithms: [hdrm]}
  - name: own
    runs:
      - {topology: "bigraph:upper=4,lower=4,hosts_per_switch=2", routing: bigraph, algorithms: [hdrm]}
"""


def test_one_rate_gives_one_load_whether_the_profile_or_the_spec_sets_it_and_the_advice_follows_the_refusal():
    """Issue 26: hdrm at 4 MiB on BiGraph 4/4/2 was refused at 791 switch-hop Mbit/s with --fabric bandwidth-only
    and admitted at 633 with bw=20 in the spec. Not one rate: bandwidth-only's links are 100 Gbit/s / 4000 = 25
    Mbit/s, and the load scales with the rate (791 = 633 x 25/20). At 20 Mbit/s from the profile and from the spec
    the load and the verdict are the same; the advice scales the refused peak's own rate and keeps the preset."""
    exp = xp.from_dict(yaml.safe_load(ONE_RATE), where="one-rate.yaml")
    by_series = {pc.cell.series: pc for pc in xp.prepare(exp)}
    profile, spec, own = by_series["profile"], by_series["spec"], by_series["own"]
    assert profile.topo.host_bw == spec.topo.host_bw == 20 and own.topo.host_bw == 25
    assert profile.cell.fabric.emulated_link_mbps == 20 and own.cell.fabric.emulated_link_mbps == 25
    assert profile.peak_load_mbps() == pytest.approx(spec.peak_load_mbps())
    assert own.peak_load_mbps() == pytest.approx(spec.peak_load_mbps() * 25 / 20)
    capacity = 0.9 * spec.peak_load_mbps()  # below both 20 Mbit/s cells: both refused, alike

    def refusal(pc: xp.PreparedCell) -> str:
        verdict = admission.verdict(xp.experiment_request([pc], lambda mtu: envelope(capacity)), MACHINE, admission.Policy())
        return " ".join(r for r in verdict.refusals if "field 'load'" in r).replace(pc.cell.id, "CELL")

    assert refusal(profile) and refusal(profile) == refusal(spec)
    # the advice is computed from the figure refused, at the rate it was predicted at
    worst = xp.experiment_request([own], lambda mtu: envelope(capacity)).loads[0]
    line = refusal(own)
    assert f"offers the switch datapath {worst.peak_mbps:.0f} switch-hop Mbit/s" in line
    rate = float(line.split("at most ")[1].split(" ")[0])
    assert rate == math.floor(25 * capacity / worst.peak_mbps * 100) / 100
    advised = fabric.parse(line.split("--fabric ")[1].split(", or ")[0])
    assert advised.preset == "bandwidth-only" and advised.emulated_link_mbps <= rate  # not roce100's latencies
    bigraph = "bigraph:upper=4,lower=4,hosts_per_switch=2"
    for spec_text, again in ((bigraph, advised), (f"{bigraph},bw={rate:g}", own.cell.fabric)):  # either form fits
        topo = topology.build(spec_text, again.emulated_link_mbps)
        schedule = generators.generate("hdrm", topo, 4 * MiB, placement="hdrm")
        assert predict(schedule, topo, "bigraph", latency=LatencyModel(again),
                       mtu=again.emulated_mtu).peak_load_mbps() <= capacity


def test_an_experiment_request_counts_only_the_cells_given_and_each_networks_bringup():
    exp = xp.load(os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "tiny.yaml"))
    prepared = xp.prepare(exp)
    whole = xp.experiment_request(prepared, lambda mtu: envelope(1500.0))
    rest = xp.experiment_request(prepared[1:], lambda mtu: envelope(1500.0))
    assert whole.time_s is not None and rest.time_s is not None
    assert rest.time_s == pytest.approx(whole.time_s - xp.estimate_s(prepared[0], xp.CELL_OVERHEAD_S))
    assert len(whole.loads) == len(prepared) and all(ld.capacity_mbps == 1500.0 for ld in whole.loads)
    empty = xp.experiment_request([], lambda mtu: None)
    assert empty.memory.total_bytes == 0 and empty.time_s == 0


# ----------------------------------------------------------- inputs and edges
@pytest.mark.parametrize("text, seconds", [("1800", 1800), ("90s", 90), ("30m", 1800), ("30min", 1800),
                                           ("1.5h", 5400), (" 2H ", 7200)])
def test_durations(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5m", "5x", "nan", "inf", "m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a duration"):
        duration(text)


def test_cgroup_headroom_reads_v2_and_v1_limits(tmp_path):
    v2 = tmp_path / "box"
    v2.mkdir()
    (v2 / "memory.max").write_text("4294967296\n")
    (v2 / "memory.current").write_text("1073741824\n")
    assert cgroup_memory_headroom("0::/box\n", str(tmp_path)) == 3 * GiB
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_memory_headroom("0::/box\n", str(tmp_path)) is None
    v1 = tmp_path / "memory" / "jail"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(2 * GiB))
    (v1 / "memory.usage_in_bytes").write_text(str(GiB // 2))
    assert cgroup_memory_headroom("4:memory:/jail\n0::/\n", str(tmp_path)) == GiB + GiB // 2
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert cgroup_memory_headroom("4:memory:/jail\n", str(tmp_path)) is None


@pytest.fixture
def small_machine(monkeypatch):
    """A machine with 4 GiB available and no calibration, whatever this one has."""
    monkeypatch.setattr(admit, "machine", lambda: admission.Machine(4 * GiB, 8 * GiB))
    monkeypatch.setattr(admit, "envelope", lambda mtu: envelope(1500.0))


def test_replay_that_does_not_fit_exits_2_with_one_line_and_writes_nothing(tmp_path, small_machine, capsys):
    topo = topology.build("star:hosts=4")
    path = tmp_path / "s.json"
    save(generators.generate("ring", topo, 1 * GiB), str(path))
    out = tmp_path / "out"
    assert main(["replay", str(path), "--topology", "star:hosts=4", "--routing", "shortest",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'memory'" in err and "4.0 GiB available" in err
    assert not out.exists()


def test_mpirun_past_max_time_exits_2_naming_its_timeout(tmp_path, small_machine, capsys):
    out = tmp_path / "out"
    assert main(["mpirun", "--topology", "star:hosts=2", "--routing", "shortest", "--out", str(out),
                 "--timeout", "3600", "--", "emu-allreduce-bench", "--algo", "ring", "--sizes", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout 3600" in err and "--max-time 30 min" in err
    assert not out.exists()


def test_run_check_refuses_an_experiment_that_does_not_fit(tmp_path, small_machine, capsys):
    exp = tmp_path / "big.yaml"
    exp.write_text("name: big\nrepeat: 1\nwarmup: 0\nsizes: [2GiB]\nseries:\n  - name: s\n    runs:\n"
                   "      - topology: star:hosts=4\n        routing: shortest\n        algorithms: [ring]\n")
    assert main(["run", str(exp), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run: field 'memory'" in err


def test_the_memory_estimate_is_whole_bytes():
    schedule = generators.generate("ring", topology.build(STAR), 3 * MiB)
    assert isinstance(rank_bytes(schedule, 0), int) and isinstance(admission.agent_limit_bytes(schedule, 0), int)
    assert np.int64(rank_bytes(schedule, 0)) > 0


BUILD_UNDER_LIMIT = """
import resource, sys
from emulator.runs import admission
from emulator.model import topology
from emulator.model.schedule.buffers import RankBuffers, rank_bytes
from emulator.model.collectives import generators
algo, collective, size, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
schedule = generators.generate(algo, topology.build("star:hosts=8"), size, collective=collective)
used = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmData"))
limit = admission.agent_limit_bytes(schedule, 0) if mode == "estimate" else used + rank_bytes(schedule, 0) // 2
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
try:
    RankBuffers(schedule, 0)
except MemoryError:
    sys.exit(12)
"""


@pytest.mark.parametrize("algo, collective", [("ring", "allreduce"), ("ring", "allgather"), ("direct", "alltoall")])
def test_an_agents_buffers_fit_under_its_limit_and_a_limit_below_them_bites(algo, collective):
    def build(mode: str) -> int:
        return subprocess.run([sys.executable, "-c", BUILD_UNDER_LIMIT, algo, collective, str(64 * MiB), mode],
                              capture_output=True, timeout=120, check=False).returncode

    assert build("estimate") == 0
    assert build("half") == 12


def test_a_resume_is_admitted_on_the_cells_still_to_run(tmp_path, small_machine):
    """emu run counts only the unfinished cells of its results folder: after a run that finished one cell (a fake
    session), the request's time drops by that cell's estimate, and a finished folder asks for nothing."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "tiny.yaml")
    exp = xp.load(path)
    prepared = xp.prepare(exp)
    args = argparse.Namespace(max_time=admission.DEFAULT_MAX_TIME_S, allow_untrusted=False)
    whole, _ = cmd._admit(args, prepared, None, {})
    out = tmp_path / "run"

    def stop_after_first(cell_id: str, status: str) -> None:
        raise KeyboardInterrupt

    runner.Runner(exp, str(out), session_factory=factory(flags=()), stream=io.StringIO(),
                  after_cell=stop_after_first, prepared=prepared).run()
    rest, _ = cmd._admit(args, prepared, str(out), {})
    assert whole.time_s is not None and rest.time_s is not None
    assert rest.time_s == pytest.approx(whole.time_s - xp.estimate_s(prepared[0], xp.CELL_OVERHEAD_S))
    runner.Runner(exp, str(out), session_factory=factory(flags=()), stream=io.StringIO(), prepared=prepared).run()
    done, verdict = cmd._admit(args, prepared, str(out), {})
    assert done.time_s == 0 and done.memory.total_bytes == 0 and verdict.admitted


def test_a_replay_on_a_topology_with_its_own_rate_maps_the_fabric_onto_it(tmp_path, small_machine, capsys):
    """Half the profile's rate is twice its dilation: a latency-bound schedule's predicted time doubles (the
    refusal for --max-time quotes it), unless the profile names its dilation."""
    path = tmp_path / "s.json"
    save(generators.generate("hd", topology.build("star:hosts=4"), 1024), str(path))

    def predicted(spec: str, *fabric_args: str) -> float:
        assert main(["replay", str(path), "--topology", spec, "--routing", "shortest", "--out",
                     str(tmp_path / "out"), "--max-time", "0.01s", *fabric_args]) == 2
        err = capsys.readouterr().err
        return float(err.split("the model's ")[1].split(" s")[0])

    at_20 = predicted("star:hosts=4")
    assert predicted("star:hosts=4,bw=10") == pytest.approx(2 * at_20, rel=0.1)
    assert predicted("star:hosts=4,bw=10", "--fabric", "preset=roce100,dilation=5000") < 1.3 * at_20
    assert not (tmp_path / "out").exists()
