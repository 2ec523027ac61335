"""A server's accelerator interconnect: the spec and profile keys, the model's ports, the fluid arbiter, and
agents on loopback whose interconnect transfers take what the timing model says."""

from __future__ import annotations

import socket
import tempfile
import time

import pytest
from test_agent import run_agents

from emulator.base.errors import FieldError
from emulator.emulation.agents.interconnect import START, DomainArbiter, arbiter_socket, check_directory
from emulator.emulation.session import fidelity
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.fabric import DOMAIN
from emulator.model.latency import LatencyModel
from emulator.model.prediction import check, cost, timing
from emulator.model.prediction.fluid import Drained, FluidLinks
from emulator.runs import metrics

SERVER = "star:hosts=4,servers=1,accels_per_server=4,nics_per_server=1,domain_bw=8"
TWO_SERVERS = "leafspine:leaves=2,spines=1,hosts_per_leaf=2,servers=2,accels_per_server=4,nics_per_server=2"


# ------------------------------------------------------------------ spec and profile
def test_domain_bw_is_a_server_key_kept_in_the_canonical_spec():
    topo = topology.build(SERVER)
    assert topo.has_domain and topo.params["domain_bw"] == 8.0
    assert "domain_bw=8" in topo.spec and topology.build(topo.spec).spec == topo.spec
    assert topo.summary()["domain_bw_mbps"] == 8.0
    assert topo.over_domain("h1", "h2") and not topology.build(TWO_SERVERS).has_domain
    # one server: its bisection is half its accelerators' interconnect ports
    assert topo.bisection_bw_mbps() == 2 * 8.0
    rebuilt = topology.from_json(topo.to_json())
    assert rebuilt.params["domain_bw"] == 8.0


@pytest.mark.parametrize("spec,field", [
    ("star:hosts=4,domain_bw=8", "domain_bw"),  # a server key without servers
    (SERVER.replace("domain_bw=8", "domain_bw=0"), "domain_bw"),
    (SERVER.replace("domain_bw=8", "domain_bw=30000"), "domain_bw"),
])
def test_bad_domain_rates_are_named(spec, field):
    with pytest.raises(FieldError) as err:
        topology.build(spec)
    assert err.value.field == field


def test_a_profile_with_an_interconnect_gives_servers_one_at_its_ratio_to_the_links():
    profile = fabric.parse("h100-ndr400")
    assert profile.domain_ratio == 9.0
    topo = topology.build(TWO_SERVERS, profile.emulated_link_mbps, profile.domain_ratio)
    assert topo.params["domain_bw"] == 9 * profile.emulated_link_mbps
    # a spec's own rate keeps the ratio; a profile without one leaves servers without
    assert topology.build(TWO_SERVERS + ",bw=2", None, profile.domain_ratio).params["domain_bw"] == 18.0
    assert not topology.build(TWO_SERVERS, 20.0, fabric.parse("roce100").domain_ratio).has_domain
    # the same fabric at another dilation: the interconnect follows the links
    assert "domain_bw=90" in topology.at_link_rate(topo.spec, 10.0)


def test_the_profile_keys_round_trip_and_scale_with_a_workload():
    profile = fabric.parse("h100-ndr400")
    assert fabric.parse(profile.spec()) == profile
    assert profile.domain_latency_s == pytest.approx(3.4e-6 * profile.dilation)
    assert fabric.message_latency_s(profile, DOMAIN) == pytest.approx(profile.alpha_s + profile.domain_latency_s)
    assert fabric.rendezvous_latency_s(profile, DOMAIN) == pytest.approx(profile.domain_latency_s)
    scaled = fabric.for_workload_scale(profile, 4)
    assert scaled.domain_latency_us == pytest.approx(3.4 / 4)
    without = fabric.parse("preset=h100-ndr400,domain_gbps=0")
    assert without.domain_ratio is None and fabric.parse(without.spec()) == without
    with pytest.raises(FieldError) as err:
        fabric.parse("preset=roce100,domain_gbps=-1")
    assert err.value.field == "domain_gbps"


# ------------------------------------------------------------------ the model
def test_transfers_inside_a_server_take_its_interconnect_ports_not_the_datapath():
    topo = topology.build(SERVER)
    schedule = generators.generate("ring", topo, 64 * 1024)
    planned = cost.transfers(schedule, topo, "shortest")
    assert planned and all(t.domain and t.switches == DOMAIN and t.datapath_switches == 0 for t in planned)
    assert fidelity.datapath_bytes(planned) == 0
    links = cost.physical_links(topo, planned[0].path)
    assert [cap for _, cap in links] == [8e6 / 8] * 2
    assert links[0][0] == ("h1", "s2~domain") and links[1][0] == ("s2~domain", "h2")
    # the agents' plan holds the interconnect's latency terms, no frames
    model = LatencyModel(fabric.parse("h100-ndr400"))
    paths = metrics.send_paths(topo, planned, model, 4096)
    assert all(p.over_domain and not p.sends_wait_for_ack and p.unshaped_s(1 << 20) == 0 for p in paths.values())


def test_the_timing_model_charges_an_interconnect_transfer_its_latency_and_bytes_only():
    """Two ranks of one server swap 1 MB each way: latency + bytes / port rate, no frame tail, no ACK."""
    topo = topology.build("star:hosts=2,servers=1,accels_per_server=2,nics_per_server=1,domain_bw=8")
    schedule = generators.generate("hd", topo, 2 * 500_000)
    model = LatencyModel(fabric.parse("preset=h100-ndr400,dilation=20000"))
    report = check.check(schedule, topo, "shortest", latency=model, mtu=4096)
    lat = model.path(DOMAIN)
    one = lat.rendezvous_target_s + lat.message_target_s + 500_000 / (8e6 / 8)
    assert report.predicted_time_s == pytest.approx(2 * one, rel=1e-9)  # two rounds of halving-doubling


def test_interconnect_ports_are_shared_max_min():
    """All-to-all inside a 4-accelerator server: each port carries 3 flows, so it takes 3 times one alone."""
    topo = topology.build(SERVER)
    schedule = generators.generate("direct", topo, 3 * 4 * 40_000, collective="alltoall")
    path_of = cost.path_function(topo, cost.transfers(schedule, topo, "shortest"))
    makespan = timing.simulate(schedule, path_of).makespan_s
    assert makespan == pytest.approx(3 * 120_000 / (8e6 / 8) / 1, rel=0.02)


# ------------------------------------------------------------------ the fluid arbiter
def test_flows_sharing_a_port_drain_together_and_a_late_look_reports_the_true_times():
    port = {("a", "x"): 10.0, ("b", "x"): 10.0, ("x", "c"): 10.0, ("x", "d"): 10.0}
    f = FluidLinks(port)
    assert f.start(1, [("a", "x"), ("x", "c")], 10, 0.0) == []
    assert f.start(2, [("b", "x"), ("x", "c")], 10, 0.0) == []
    assert f.next_drain() == pytest.approx(2.0)  # 5 bytes/s each
    assert f.start(3, [("b", "x"), ("x", "d")], 5, 1.0) == []  # b's port now shared by 2 and 3
    # woken late, at 10 s: every drain at its own time, rates recomputed between them
    drained = f.advance(10.0)
    times = {d.flow: d.at for d in drained}
    # 0-1 s: flows 1, 2 at 5 B/s (5 left each); then 1 at 5, 2 and 3 at 5 (b's port and c's port split):
    # all three have 5 left at 1 s and drain at 2 s
    assert times == pytest.approx({1: 2.0, 2: 2.0, 3: 2.0})
    assert f.active == 0 and f.next_drain() is None


def test_a_flow_alone_gets_its_whole_port_once_the_other_drained():
    f = FluidLinks({("a", "x"): 10.0, ("b", "x"): 10.0, ("x", "c"): 10.0})
    f.start("big", [("a", "x"), ("x", "c")], 30, 0.0)
    f.start("small", [("b", "x"), ("x", "c")], 5, 0.0)
    assert f.advance(100.0) == [Drained("small", 1.0), Drained("big", 3.5)]


def test_the_arbiter_refuses_what_it_cannot_time():
    f = FluidLinks({("a", "x"): 10.0})
    with pytest.raises(ValueError, match="no link"):
        f.start(1, [("a", "y")], 10, 0.0)
    f.start(1, [("a", "x")], 10, 0.0)
    with pytest.raises(ValueError, match="already"):
        f.start(1, [("a", "x")], 10, 0.0)
    assert f.start(2, [("a", "x")], 0, 0.5) == [Drained(2, 0.5)]
    with pytest.raises(ValueError, match="no accelerator interconnect"):
        DomainArbiter(topology.build("star:hosts=2"), "/tmp")
    with pytest.raises(ValueError, match="shorter run directory"):
        check_directory("/tmp/" + "x" * 100, 8)


# ------------------------------------------------------------------ agents on loopback
@pytest.mark.parametrize("algo,collective,size", [
    ("ring", "allreduce", 256 * 1024),
    ("direct", "alltoall", 4 * 64 * 1024),
])
def test_agents_time_interconnect_transfers_as_the_model_does(algo, collective, size):
    """Every transfer inside the server over Unix sockets, timed by the arbiter: the data is right and the
    collective takes the timing model's time (8 Mbit/s ports: hundreds of milliseconds), with the
    interconnect's latency on every message."""
    topo = topology.build(SERVER)
    schedule = generators.generate(algo, topo, size, collective=collective)
    model = LatencyModel(fabric.parse("preset=h100-ndr400,dilation=5000"))
    planned = cost.transfers(schedule, topo, "shortest")
    paths = metrics.send_paths(topo, planned, model, 4096)
    predicted = check.check(schedule, topo, "shortest", latency=model, mtu=4096).predicted_time_s
    with tempfile.TemporaryDirectory(prefix="efdom-") as folder, DomainArbiter(topo, folder) as arbiter:
        results, errors = run_agents(schedule, topo, reps=2, base=70 + len(algo), latency=paths, domain_dir=folder)
        assert not errors, errors
        assert arbiter.flows == 2 * len(planned)
    for rep in range(2):
        assert all(reps[rep]["correct"] for reps in results.values()), results
        ends = [e for reps in results.values() for _, _, e in reps[rep]["ops"]]
        starts = [s for reps in results.values() for _, s, _ in reps[rep]["ops"]]
        assert max(ends) - min(starts) == pytest.approx(predicted, rel=0.1)


def test_an_arbiter_that_fails_says_why_and_lets_its_senders_go():
    """A start the arbiter cannot time (two accelerators of different servers): it records the error and closes
    the sender's connection, so the sender fails at once instead of waiting for a drain."""
    topo = topology.build("star:hosts=4,servers=2,accels_per_server=2,nics_per_server=1,domain_bw=8")
    with tempfile.TemporaryDirectory(prefix="efdom-") as folder, DomainArbiter(topo, folder) as arbiter:
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sender.connect(arbiter_socket(folder))
        sender.sendall(START.pack(1, 1, 3, 1000, time.monotonic()))  # h1 and h3: different servers
        sender.settimeout(5)
        assert sender.recv(16) == b""  # closed, not answered
        assert arbiter.error is not None and "no link" in arbiter.error
        sender.close()
