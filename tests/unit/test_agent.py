"""Host agents on loopback (no root): real TCP, real reductions, timings; and the replay's pure helpers."""

from __future__ import annotations

import json
import queue
import socket
import tempfile
import threading
import time
import types

import numpy as np
import pytest
from test_schedule_compose import _grouped

from emulator.emulation.agents import agent as agent_mod
from emulator.emulation.agents import peer
from emulator.emulation.agents.agent import Agent, AgentError, expected_sum, input_values
from emulator.emulation.agents.interconnect import DomainSendChannel
from emulator.model import fabric, topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel, PathLatency
from emulator.model.prediction import cost
from emulator.model.schedule.dispatch import Ready
from emulator.model.schedule.format import Op, match_transfers, with_ops
from emulator.runs import metrics
from emulator.runs.results import Repetition


def test_expected_sum_matches_a_direct_sum():
    for p in (1, 2, 5, 64):
        direct = sum(input_values(r, 1000) for r in range(p))
        assert np.array_equal(expected_sum(p, 1000), direct)
    assert input_values(0, 10).dtype == np.float32
    assert not np.array_equal(input_values(0, 100), input_values(1, 100))


def run_agents(schedule, topo, reps=1, base=10, start_at=None, latency=None, compute_dilation=1.0,
               domain_dir=None):
    """Every rank in a thread on 127.0.x.y; returns {rank: [results per rep]}.

    ``start_at``: one monotonic time for all ranks, or a dict rank -> time;
    ``latency``: one :class:`PathLatency` for every pair of ranks, or a dict (src, dst) -> PathLatency;
    ``domain_dir``: where the servers' interconnect sockets are (an arbiter must serve there).
    """
    ip_of = {h.name: f"127.{base}.{h.index // 256}.{h.index % 256}" for h in topo.hosts}

    def plan(rank):
        if isinstance(latency, dict):
            return {dst: lat for (src, dst), lat in latency.items() if src == rank}
        return {peer: latency for peer in range(schedule.p)} if latency is not None else None

    agents = [Agent(schedule, topo, r, ip_of=ip_of, latency=plan(r), compute_dilation=compute_dilation,
                    domain_dir=domain_dir) for r in range(schedule.p)]
    errors: list[BaseException] = []
    results: dict[int, list] = {r: [] for r in range(schedule.p)}
    barrier = threading.Barrier(schedule.p)

    def body(a: Agent) -> None:
        try:
            a.connect(timeout_s=20)
            for rep in range(reps):
                a.prepare()
                barrier.wait(timeout=30)
                at = start_at.get(a.rank) if isinstance(start_at, dict) else start_at
                results[a.rank].append(a.run_once(rep, at).to_json())  # the done message's fields
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            a.close()

    threads = [threading.Thread(target=body, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.parametrize("algo,spec", [
    ("ring", "star:hosts=4"),
    ("hd", "star:hosts=8"),
    ("hdrm", "bigraph:upper=2,lower=2,hosts_per_switch=2"),
    ("dbtree", "star:hosts=5"),
    ("hier", "leafspine:leaves=2,spines=1,hosts_per_leaf=2"),
])
def test_agents_compute_an_allreduce_over_tcp(algo, spec):
    topo = topology.build(spec)
    schedule = generators.generate(algo, topo, 64 * 1024)
    results, errors = run_agents(schedule, topo, reps=2, base=10 + len(algo))
    assert not errors, errors
    for rank, reps in results.items():
        assert len(reps) == 2
        for res in reps:
            assert res["correct"], (rank, res["wrong"])
            n_ops = len(schedule.ranks[rank].ops)
            assert len(res["ops"]) == n_ops
            assert all(end >= start for _, start, end in res["ops"])
            # the kernel stamped every receive's last byte, before the agent was done with it
            ends = {i: end for i, _, end in res["ops"]}
            receives = [op.id for op in schedule.ranks[rank].ops if op.kind in ("recv", "recv_reduce")]
            assert sorted(int(i) for i in res["arrivals"]) == sorted(receives)
            assert all(0 <= ends[int(i)] - at < 5 for i, at in res["arrivals"].items())
    op_times = {r: {i: (s, e) for i, s, e in reps[0]["ops"]} for r, reps in results.items()}
    measured = metrics.repetition_metrics(schedule, op_times)
    assert measured.time_s > 0 and measured.busbw_mbps > 0
    assert [s.step for s in measured.steps] == sorted({op.step for r in schedule.ranks for op in r.ops
                                                             if op.is_comm})
    records = metrics.timeline_records(schedule, 0, op_times)
    assert len(records) == sum(1 for r in schedule.ranks for op in r.ops if op.kind == "send")
    assert all(rec["end"] >= rec["start"] for rec in records)


@pytest.mark.parametrize("algo,spec,size", [
    ("ring", "star:hosts=6", 1 << 20),
    ("hd", "star:hosts=10", 4 * 20_011),
    ("dbtree", "star:hosts=12", 4 * 1003),
])
def test_agents_compute_an_allreduce_of_any_element_count(algo, spec, size):
    """Chunks one element apart (NCCL's and Open MPI's split) carry the right bytes to the right place."""
    topo = topology.build(spec)
    schedule = generators.generate(algo, topo, size)
    assert not schedule.layout.equal
    results, errors = run_agents(schedule, topo, base=40 + len(algo))
    assert not errors, errors
    assert all(reps[0]["correct"] for reps in results.values()), results


def test_agents_compute_collectives_within_their_process_groups():
    schedule = _grouped()
    results, errors = run_agents(schedule, topology.build("star:hosts=8"), base=60)
    assert not errors, errors
    assert all(reps[0]["correct"] for reps in results.values()), results


def test_ranks_release_their_first_operations_at_start_at():
    topo = topology.build("star:hosts=4")
    schedule = generators.generate("ring", topo, 16 * 1024)
    start_at = time.monotonic() + 2.0
    results, errors = run_agents(schedule, topo, base=40, start_at=start_at)
    assert not errors, errors
    starts = [start for reps in results.values() for _, start, _ in reps[0]["ops"]]
    assert min(starts) >= start_at


def test_a_wrong_schedule_is_caught_by_the_data_check():
    """Drop one rank's reductions: the agents finish but the data check names wrong elements."""
    topo = topology.build("star:hosts=4")
    schedule = generators.generate("ring", topo, 4096)
    broken = []
    for prog in schedule.ranks:
        ops = list(prog.ops)
        if prog.rank == 2:
            ops = [op if op.kind != "recv_reduce" else type(op)(**{**op.__dict__, "kind": "recv"}) for op in ops]
        broken.append(ops)
    schedule = with_ops(schedule, broken)
    results, errors = run_agents(schedule, topo, base=30)
    assert not errors
    assert not all(res[0]["correct"] for res in results.values())
    wrong = [res[0]["wrong"] for res in results.values() if not res[0]["correct"]]
    assert "elements wrong" in wrong[0]


def test_mismatched_sizes_are_named():
    topo = topology.build("star:hosts=2")
    schedule = generators.generate("ring", topo, 4096)
    ops0 = list(schedule.ranks[0].ops)
    # make rank 0's receives expect a different step than rank 1 sends
    ops0 = [type(op)(**{**op.__dict__, "step": op.step + 5}) if op.kind != "send" else op for op in ops0]
    bad = with_ops(schedule, [ops0, list(schedule.ranks[1].ops)])
    results, errors = run_agents(bad, topo, base=40)
    assert errors and isinstance(errors[0], AgentError)
    # caught by whichever side sees it first: the sender's clear-to-send check or the receiver's header check
    assert "repetition 0 step" in str(errors[0]) and "got repetition 0 step" in str(errors[0])


def test_a_sender_waits_until_its_receiver_has_posted_the_receive():
    """Rendezvous: rank 1 starts 0.6 s late, so rank 0's first message starts no earlier than that."""
    topo = topology.build("star:hosts=2")
    schedule = generators.generate("ring", topo, 64 * 1024)
    now = time.monotonic()
    results, errors = run_agents(schedule, topo, base=41, start_at={0: now + 0.5, 1: now + 1.1})
    assert not errors, errors
    assert all(reps[0]["correct"] for reps in results.values())
    first_send = min(op.id for op in schedule.ranks[0].ops if op.kind == "send")
    start = next(s for i, s, _ in results[0][0]["ops"] if i == first_send)
    assert start >= now + 1.1


def test_agents_add_the_profiles_latency_to_every_message():
    """hd on 2 ranks: each round waits for its rendezvous (0.05 s), then each message takes 0.15 s."""
    topo = topology.build("star:hosts=2")
    schedule = generators.generate("hd", topo, 64)
    lat = PathLatency(1, message_target_s=0.15, rendezvous_target_s=0.05, link_s=0.0, data_s=0.0, rendezvous_s=0.0,
                      ack_intrinsic_s=0.0)
    results, errors = run_agents(schedule, topo, reps=2, base=42, latency=lat)
    assert not errors, errors
    for rep in range(2):
        op_times = {r: {i: (s, e) for i, s, e in reps[rep]["ops"]} for r, reps in results.items()}
        sends = {r: {int(i): v for i, v in reps[rep]["sends"].items()} for r, reps in results.items()}
        records = metrics.timeline_records(schedule, rep, op_times, sends)
        assert len(records) == 4
        for rec in records:
            assert rec["start"] - rec["posted"] == pytest.approx(0.05, abs=0.01)  # the rendezvous, virtually
            assert rec["end"] - rec["start"] == pytest.approx(0.15, rel=0.1)  # the message latency
            assert rec["late_s"] < 0.01
        total = max(e for times in op_times.values() for _, e in times.values()) - \
            min(s for times in op_times.values() for s, _ in times.values())
        assert total == pytest.approx(2 * (0.05 + 0.15), rel=0.1)


def test_match_transfers_pairs_in_order():
    topo = topology.build("star:hosts=4")
    schedule = generators.generate("ring", topo, 4096)
    pairs = match_transfers(schedule)
    sends = sum(1 for r in schedule.ranks for op in r.ops if op.kind == "send")
    assert len(pairs) == sends
    for a, s, b, r in pairs:
        send = next(op for op in schedule.ranks[a].ops if op.id == s)
        recv = next(op for op in schedule.ranks[b].ops if op.id == r)
        assert send.peer == b and recv.peer == a and send.step == recv.step and send.bytes == recv.bytes


def test_nccl_table_layout():
    topo = topology.build("star:hosts=4")
    schedule = generators.generate("ring", topo, 1 << 20)
    reps = [Repetition(rep=0, time_s=1.0, algbw_mbps=8.39, busbw_mbps=12.58, correct=True)]
    table = metrics.nccl_table(schedule, reps)
    lines = table.splitlines()
    assert "size" in lines[2] and "busbw" in lines[2] and "#wrong" in lines[2]
    row = lines[4].split()
    assert row[:5] == ["1048576", "262144", "float", "sum", "-1"]
    assert row[5] == "1000000" and row[7] == "12.58" and row[8] == "0"
    assert "Avg bus bandwidth" in lines[-1]


def test_the_wire_structs_are_fixed():
    assert (peer.HELLO.size, peer.CLEAR_TO_SEND.size, peer.HEADER.size) == (8, 16, 16)


def test_concurrent_reductions_into_one_chunk_take_turns(monkeypatch):
    """Tree children's receives add into the same chunk, unordered: a slow add exposes any lost update."""
    import time as time_mod

    real_add = np.add

    def slow_add(a, b, out=None):
        result = real_add(a, b)  # read both operands ...
        time_mod.sleep(0.005)  # ... let the other receive interleave here ...
        out[...] = result  # ... then write
        return out

    monkeypatch.setattr(np, "add", slow_add)
    topo = topology.build("star:hosts=7")
    schedule = generators.generate("dbtree", topo, 7 * 1024)
    assert any(len({op.peer for op in prog.ops if op.kind == "recv_reduce" and op.chunk == c}) > 1
               for prog in schedule.ranks for c in range(schedule.chunks)), "no chunk reduced from two peers"
    results, errors = run_agents(schedule, topo, reps=2, base=50)
    assert not errors, errors
    assert all(res["correct"] for reps in results.values() for res in reps)


@pytest.fixture
def tcp_pair():
    """A connected loopback pair (client, server) whose server end has a small window: it must read to ACK."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    server, _ = listener.accept()
    yield client, server
    for sock in (client, server, listener):
        sock.close()


def _send_op():
    topo = topology.build("star:hosts=2")
    return next(o for o in generators.generate("ring", topo, 64 * 1024).ranks[0].ops if o.kind == "send")


def test_an_awaited_send_completes_only_once_the_peer_has_acknowledged_it(tcp_pair):
    """Delivery tracking: bytes in the send queue that the peer has not taken keep the send pending."""
    client, server = tcp_pair
    op = _send_op()
    tracker = peer.DeliveryTracker(client, link_bps=10e6)
    client.sendall(b"x" * (1 << 20))
    tracker.wrote(1 << 20)
    tracker.watch(op, start=1.0)
    delivered: list[peer.Delivered] = []
    assert tracker.poll(delivered.append) > 0
    assert tracker.watching and tracker.oldest == op and not delivered
    got = 0
    while got < 1 << 20:
        got += len(server.recv(1 << 20))
    deadline = time.monotonic() + 5
    while tracker.watching and time.monotonic() < deadline:
        time.sleep(tracker.poll(delivered.append))
    assert not tracker.watching and tracker.oldest is None
    assert len(delivered) == 1 and delivered[0].op == op and delivered[0].start == 1.0 and delivered[0].at > 1.0
    assert tracker.poll(delivered.append) == 0.0  # nothing watched: no need to look again


def test_a_delivery_is_dated_by_the_kernels_ack_stamp_not_by_the_poll(tcp_pair):
    """Looking late does not make a send late: it completed when the ACK came (SO_TIMESTAMPING TX_ACK)."""
    client, server = tcp_pair
    op = _send_op()
    tracker = peer.DeliveryTracker(client, link_bps=10e6)
    client.sendall(b"x" * 1000)
    tracker.wrote(1000)
    tracker.watch(op, start=0.0)
    assert server.recv(1000) == b"x" * 1000  # read: the loopback ACK comes at once
    time.sleep(0.2)
    polled = time.monotonic()
    delivered: list[peer.Delivered] = []
    deadline = polled + 5
    while tracker.watching and time.monotonic() < deadline:
        time.sleep(tracker.poll(delivered.append))
    assert [d.op for d in delivered] == [op]
    assert delivered[0].at < polled - 0.15  # the ACK's time, 0.2 s before anyone looked


def test_a_sender_waiting_for_a_clear_to_send_reports_a_delivery_as_its_ack_comes(tcp_pair):
    """The ACK's stamp on the error queue wakes the wait like data would; the wait must not then block in a read
    until the clear to send comes, but report the delivery at once."""
    client, server = tcp_pair
    op = _send_op()
    channel = peer.SendChannel(client, peer.ConnKey(1), link_bps=10e6)
    channel.send(0, op.step, memoryview(b"x" * (1 << 20)))  # beyond the receiver's window: ACKed as it reads
    channel.delivery.watch(op, start=0.0)
    reported: list[float] = []
    cleared_at: list[float] = []

    def read_then_clear_later() -> None:
        time.sleep(0.2)  # the sender is waiting for its clear to send by now: the last ACK comes during the wait
        got = 0
        while got < peer.HEADER.size + (1 << 20):
            got += len(server.recv(1 << 16))
        time.sleep(0.5)
        cleared_at.append(time.monotonic())
        server.sendall(peer.CLEAR_TO_SEND.pack(0, op.step + 1, 0.0))

    thread = threading.Thread(target=read_then_clear_later)
    thread.start()
    clear = channel.clear_to_send(lambda d: reported.append(time.monotonic()))
    thread.join()
    assert clear.step == op.step + 1
    assert reported and reported[0] < cleared_at[0] - 0.3, (reported, cleared_at)


def test_the_delivery_poll_is_quick_near_the_tail_and_slow_far_from_it(tcp_pair):
    """Far from the last frames: half the remainder's time at the link rate (at most 20 ms); close: often."""
    client, _ = tcp_pair
    op = _send_op()
    slow = peer.DeliveryTracker(client, link_bps=1e6)
    client.sendall(b"x" * (1 << 20))
    slow.wrote(1 << 20)
    slow.watch(op, start=0.0)
    assert slow.poll(lambda d: None) == pytest.approx(0.02)
    # a watched send whose end the peer acknowledged long ago completes at once, whatever is written after it
    tail = peer.DeliveryTracker(client, link_bps=1e6)
    tail.watch(op, start=0.0)
    tail.wrote(1 << 20)
    delivered: list[peer.Delivered] = []
    assert tail.poll(delivered.append) == 0.0 and [d.op for d in delivered] == [op]


def test_a_send_channel_and_a_recv_channel_speak_the_rendezvous_protocol(tcp_pair):
    client, server = tcp_pair
    out, into = peer.SendChannel(client, peer.ConnKey(1, 2), link_bps=10e6), peer.RecvChannel(server, peer.ConnKey(0, 2))
    out.hello(0)
    hello = bytearray(peer.HELLO.size)
    peer.recv_exact(server, memoryview(hello))
    assert peer.HELLO.unpack(hello) == (0, 2) and out.delivery.written == peer.HELLO.size
    into.post(3, 7, 12.5)
    assert out.clear_to_send(lambda d: None) == peer.ClearToSend(rep=3, step=7, posted_at=12.5)
    payload = np.arange(4, dtype=np.float32)
    out.send(3, 7, memoryview(payload.data).cast("B"))
    assert out.delivery.written == peer.HELLO.size + peer.HEADER.size + 16
    assert into.header() == peer.Header(rep=3, step=7, nbytes=16)
    landed = np.zeros(4, dtype=np.float32)
    into.payload_into(memoryview(landed.data).cast("B"))
    assert np.array_equal(landed, payload)
    out.close()
    with pytest.raises(peer.PeerError, match="closed by peer"):
        into.header()


def test_an_agent_whose_peer_never_listens_names_it():
    topo = topology.build("star:hosts=2")
    schedule = generators.generate("ring", topo, 4096)
    agent = Agent(schedule, topo, 0, ip_of={"h1": "127.60.0.1", "h2": "127.60.0.2"})
    started = time.monotonic()
    try:
        with pytest.raises(AgentError, match=r"cannot connect to rank 1 \(h2 127\.60\.0\.2\)"):
            agent.connect(timeout_s=0.3)
    finally:
        agent.close()
    assert time.monotonic() - started < 5


def test_the_agents_latency_plan_per_pair_of_ranks_and_their_lateness():
    topo = topology.build("leafspine:leaves=2,spines=1,hosts_per_leaf=2")
    schedule = generators.generate("ring", topo, 4096)
    model = LatencyModel(fabric.default())
    paths = metrics.send_paths(topo, cost.transfers(schedule, topo, "shortest"), model, 9000)
    assert paths[(0, 1)].switches == 1 and paths[(1, 2)].switches == 3  # same leaf, across the spine
    goodput = 10e6 / 8 * topology.tcp_goodput_factor(9000)
    assert paths[(1, 2)].byte_s == pytest.approx(4 / goodput) and paths[(1, 2)].mss == 8948
    assert paths[(1, 2)].message_target_s == pytest.approx(fabric.message_latency_s(fabric.default(), 3))
    plan = agent_mod.latency_plan(paths)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(plan, fh)
        fh.flush()
        assert agent_mod.load_latency_plan(fh.name, 1) == agent_mod.TimingPlan({2: paths[(1, 2)]}, 1.0)
    sends = {0: {op.id: [0.0, 0.0, 0.0, 0.004] for op in schedule.ranks[0].ops if op.kind == "send"}}
    late, target = metrics.send_lateness(schedule, sends, paths)
    assert late == [0.004] * 6 and target == [paths[(0, 1)].message_target_s] * 6  # a ring's 2(p-1) sends


def test_lanes_are_connections_of_their_own_and_compute_is_dilated_work():
    """Two messages between one pair on two lanes, received in the opposite order of their sends, and a compute
    op: lane 1's message does not wait behind lane 0's (which waits for the receiver's compute)."""
    from emulator.model.schedule.compose import Composer

    topo = topology.build("star:hosts=2")
    comp = Composer(["h1", "h2"], 4096)
    work = comp.compute(1, 0.05)
    comp.message(0, 1, 2, lane=0, after_dst=[work])  # its receive is posted only after rank 1's compute
    comp.message(0, 1, 2, lane=1)
    schedule = comp.build("two-lanes")
    assert {op.lane for op in schedule.ranks[0].ops} == {0, 1}
    results, errors = run_agents(schedule, topo, base=70, compute_dilation=4.0)
    assert not errors, errors
    times = {r: {i: (s, e) for i, s, e in reps[0]["ops"]} for r, reps in results.items()}
    compute_start, compute_end = times[1][0]
    assert compute_end - compute_start == pytest.approx(0.2, abs=1e-6)  # 0.05 s x dilation 4, virtual times
    lane0_recv, lane1_recv = times[1][1], times[1][2]
    assert lane1_recv[1] < compute_end <= lane0_recv[1]
    assert all(reps[0]["correct"] for reps in results.values())


def test_an_interconnect_send_queued_behind_the_previous_one_is_not_late():
    """Two messages to one peer over the interconnect, both due at once: the second waits out the first's 0.2 s
    transfer (the arbiter's drain), as bytes queue behind a stream's on the fabric. That wait is the interconnect's,
    not the agent's: neither message is late (the fabric's sends count it so too)."""
    class Timed(DomainSendChannel):
        def __init__(self) -> None:  # no sockets: the arbiter's timing, faked
            pass

        def clear_to_send(self, on_delivered):
            return peer.ClearToSend(0, 0, 0.0)

        def sleep_until(self, deadline, on_delivered):
            time.sleep(max(0.0, deadline - time.monotonic()))

        def transfer(self, rep, step, payload, start):
            time.sleep(0.2)
            return time.monotonic()

    class Buffers:
        def target(self, op):
            return np.zeros(op.bytes // 4, dtype=np.float32)

    lat = PathLatency(1, message_target_s=0.0, rendezvous_target_s=0.0, link_s=0.0, data_s=0.0, rendezvous_s=0.0,
                      ack_intrinsic_s=0.0)
    run = types.SimpleNamespace(rep=0, send_timings={}, events=queue.Queue())
    sender = agent_mod._Sender(Timed(), lat, Buffers(), run)
    now = time.monotonic()
    for i in range(2):
        sender._send(Ready(Op(i, "send", 0, 1, 64, 0, peer=1), now))
    assert [run.send_timings[i].late_s for i in range(2)] == [pytest.approx(0.0, abs=0.02)] * 2
