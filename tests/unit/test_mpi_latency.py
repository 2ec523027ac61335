"""The fabric's latency on Open MPI's messages: the holds per pair of hosts, what ``emu mpirun`` gives its
ranks, Open MPI's protocol in the timing model, and the preloaded library itself over loopback (no root).

The library's test runs two Python processes on 127.0.0.1, the receiver with the library that ``make setup``
built (``.venv/lib/ef-mpi-latency.so``) preloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from emulator.base.errors import FieldError
from emulator.emulation.mpi import mpi_run
from emulator.model import fabric, topology
from emulator.model.latency import SHAPER_BURST_BYTES, Curve, Intrinsic, LatencyModel
from emulator.model.prediction import timing
from emulator.model.schedule.format import RECV, SEND, Op, RankProgram, Schedule
from emulator.runs.mpi_plan import (
    BTL_PORT_MIN,
    BTL_PORT_RANGE,
    DEFAULT_MCA,
    LATENCY_LIBRARY,
    MIN_QUEUE_BYTES,
    YIELD_SLEEP_US,
    MpiRunConfig,
    check_latency_mca,
    eager_bytes,
    latency_environment,
    latency_file_text,
    latency_holds,
    message_profile,
    mpirun_command,
    queue_bytes,
    yield_environment,
)

LIBRARY = os.path.join(sys.prefix, "lib", LATENCY_LIBRARY)
PROFILE = fabric.default()


def test_each_pair_is_held_the_profiles_latency_over_its_switches_less_this_machines_own():
    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2", 20.0)
    names = [h.name for h in topo.hosts]
    own = Intrinsic(data=Curve(((1, 0.001), (3, 0.002))))
    holds = latency_holds(topo, names, LatencyModel(PROFILE, own), "bigraph")
    assert len(holds) == len(names) * (len(names) - 1)
    by_pair = {(h.receiver, h.sender): h for h in holds}
    link_byte_s = 8 / (20e6 * topology.tcp_goodput_factor())  # every link of the path is 20 Mbit/s
    for a in names:
        for b in names:
            if a != b:
                s = topo.switch_hops(b, a)
                hold = by_pair[(topo.host(a).ip, topo.host(b).ip)]
                # the frame's serialisation on each of the path's s + 1 links, and the shapers' burst with it
                assert hold.byte_s == pytest.approx((s + 1) * link_byte_s)
                want = fabric.message_latency_s(PROFILE, s) - own.data.at(s) + SHAPER_BURST_BYTES * hold.byte_s
                assert hold.seconds == pytest.approx(want)
    assert {topo.switch_hops(a, b) for a in names for b in names if a != b} == {1, 2, 3}


def test_a_hold_is_never_negative_and_the_file_has_one_line_per_pair():
    topo = topology.build("star:hosts=3", 20.0)
    slow = Intrinsic(data=Curve(((1, 10.0),)))
    holds = latency_holds(topo, ["h1", "h2", "h3"], LatencyModel(PROFILE, slow))
    assert [h.seconds for h in holds] == pytest.approx([SHAPER_BURST_BYTES * h.byte_s for h in holds])  # burst only
    lines = latency_file_text(holds).splitlines()
    assert len(lines) == 6 and lines[0].split()[:2] == ["10.0.0.1", "10.0.0.2"]
    assert [float(x) for x in lines[0].split()[2:]] == pytest.approx([holds[0].seconds, holds[0].byte_s],
                                                                      rel=1e-6)


def test_the_queue_holds_twice_what_a_link_delivers_during_the_longest_hold():
    topo = topology.build("star:hosts=2", 20.0)
    holds = latency_holds(topo, ["h1", "h2"], LatencyModel(PROFILE))
    longest = max(h.seconds + h.byte_s * topology.tcp_payload_bytes() for h in holds)  # held with a full frame
    assert queue_bytes(holds, 20.0) == pytest.approx(2 * longest * 20e6 / 8, abs=1)
    assert queue_bytes([], 20.0) == MIN_QUEUE_BYTES


def test_the_ranks_get_the_library_its_file_and_the_transports_ports_and_nothing_else_does():
    env = latency_environment("/v/lib/x.so", "/out/latency-holds", 300000)
    assert dict(env) == {"LD_PRELOAD": "/v/lib/x.so", "EF_LATENCY_FILE": "/out/latency-holds",
                         "EF_LATENCY_PORTS": f"{BTL_PORT_MIN} {BTL_PORT_MIN + BTL_PORT_RANGE - 1}",
                         "EF_LATENCY_QUEUE_BYTES": "300000",
                         "EF_YIELD_SLEEP_US": str(YIELD_SLEEP_US)}
    cmd = mpirun_command(2, "/out/hostfile", [], ["/bin/prog"], "/out/ranks", environment=env)
    assert cmd[cmd.index("-x", cmd.index("PYTHONUNBUFFERED")) + 1] == "LD_PRELOAD=/v/lib/x.so"
    assert cmd[-1] == "/bin/prog"


def test_the_latency_is_on_only_where_the_run_asks_and_the_profile_has_some():
    cfg = MpiRunConfig(network=fabric.rebuild("star:hosts=2", interconnect=False), routing="shortest", out="/o",
                       program=("p",))
    assert cfg.latency and cfg.to_json()["latency"] is True and mpi_run.latency_on(cfg)
    off = MpiRunConfig(network=fabric.rebuild("star:hosts=2", interconnect=False), routing="shortest", out="/o",
                       program=("p",), latency=False)
    bare = MpiRunConfig(network=fabric.rebuild("star:hosts=2", message_profile(PROFILE, latency=False),
                                               interconnect=False), routing="shortest", out="/o", program=("p",))
    assert not mpi_run.latency_on(off) and not mpi_run.latency_on(bare)


def test_every_run_preloads_the_library_which_must_be_built(tmp_path):
    (tmp_path / "lib").mkdir()
    with pytest.raises(FieldError, match="field 'latency'.*make setup builds it"):
        mpi_run.rank_library(prefix=str(tmp_path))
    (tmp_path / "lib" / LATENCY_LIBRARY).write_bytes(b"")
    assert mpi_run.rank_library(prefix=str(tmp_path)) == str(tmp_path / "lib" / LATENCY_LIBRARY)


def test_without_latency_the_ranks_get_the_library_for_its_sleeping_yield_and_nothing_to_hold():
    assert dict(yield_environment("/v/lib/x.so")) == {"LD_PRELOAD": "/v/lib/x.so",
                                                      "EF_YIELD_SLEEP_US": str(YIELD_SLEEP_US)}


def test_the_defaults_yield_while_waiting_and_the_eager_limit_follows_the_users_choice():
    assert ("mpi_yield_when_idle", "1") in DEFAULT_MCA
    assert eager_bytes(()) == (1 << 20) - 64
    assert eager_bytes((("btl_tcp_eager_limit", "65536"),)) == 65536 - 64


@pytest.mark.parametrize("key", ["opal_event_include", "event_external_event_include"])
def test_an_event_loop_other_than_poll_is_refused_while_the_library_holds_bytes(key):
    check_latency_mca(((key, "poll"), ("btl_tcp_links", "2")))
    with pytest.raises(FieldError, match=f"field 'mca'.*{key} poll.*--latency off.*epoll"):
        check_latency_mca(((key, "epoll"),))


# --- Open MPI's protocol in the timing model ---

def _exchange(nbytes: int, sends: int = 1) -> Schedule:
    """Rank 0 sends ``sends`` messages of ``nbytes`` to rank 1, one after another."""
    ops0 = tuple(Op(i, SEND, 0, 1, nbytes, i, peer=1, deps=(i - 1,) if i else ()) for i in range(sends))
    ops1 = tuple(Op(i, RECV, 0, 1, nbytes, i, peer=0) for i in range(sends))
    return Schedule(algorithm="test", size=nbytes, chunks=1,
                    ranks=(RankProgram(0, "h1", ops0), RankProgram(1, "h2", ops1)))


def _simulate(schedule: Schedule, eager: int | None) -> timing.Timing:
    """Over one switch, 20 Mbit/s links."""
    model = LatencyModel(PROFILE, eager_bytes=eager)
    links = {(0, 1): [("h1", "s1"), ("s1", "h2")], (1, 0): [("h2", "s1"), ("s1", "h1")]}
    return timing.simulate(schedule, lambda a, b, lane=0: (links[(a, b)], [20e6 / 8] * 2, 1), model.path)


def test_an_eager_message_waits_for_no_clear_to_send_and_a_rendezvous_for_a_round_trip_after_its_request():
    msg = fabric.message_latency_s(PROFILE, 1)
    eager = _simulate(_exchange(1000), eager=1 << 20).transfers[0]
    assert eager.cts_at == 0.0 and eager.first_byte == pytest.approx(msg)
    rendezvous = _simulate(_exchange(2 << 20), eager=1 << 20).transfers[0]
    assert rendezvous.cts_at == pytest.approx(2 * msg) and rendezvous.first_byte == pytest.approx(3 * msg)
    agents = _simulate(_exchange(2 << 20), eager=None).transfers[0]
    assert agents.cts_at == pytest.approx(PROFILE.switch_latency_s)


def test_a_rendezvous_request_leaves_behind_the_bytes_written_before_it_on_its_connection():
    msg = fabric.message_latency_s(PROFILE, 1)
    first, second = _simulate(_exchange(2 << 20, sends=2), eager=1 << 20).transfers
    # Open MPI's sends complete once written: the second is queued when the first drained, not acknowledged
    assert second.queued == pytest.approx(first.drained)
    assert second.requested == pytest.approx(first.drained) and second.cts_at == pytest.approx(first.drained + 2 * msg)


# --- the library, over loopback ---

#: Every receiver's start: listen on a free port between argv[1] and argv[2], print it, accept one connection
#: (``conn``, non-blocking).
LISTENER = textwrap.dedent('''
    import json, random, select, socket, sys, time
    srv = socket.socket()
    low, high = map(int, sys.argv[1:3])
    for port in random.sample(range(low, high + 1), high + 1 - low):  # tests in parallel take their own
        try:
            srv.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    srv.listen(1)
    print(port, flush=True)
    conn, _ = srv.accept(); conn.setblocking(False)
''')

RECEIVER = LISTENER + textwrap.dedent('''
    poller = select.poll(); poller.register(conn, select.POLLIN)
    stamps, early, got = [], 0, 0
    while True:
        if not poller.poll(5000):
            break
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            early += 1  # poll said readable, but nothing was due
            continue
        if not data:
            break
        got += len(data)
        if got <= 64 * 5:
            stamps.append(time.time() - float(data[:32].decode()))
    print(json.dumps({"latency": stamps, "early": early, "bytes": got, "end": time.time()}), flush=True)
''')

SENDER = textwrap.dedent('''
    import socket, sys, time
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    for _ in range(5):
        c.sendall(f"{time.time():.6f}".ljust(64).encode()); time.sleep(0.1)
    c.sendall(b"x" * int(sys.argv[2]))
    c.close()
''')


#: Where the receiver listens: ports of the transport's range that emu mpirun's runs do not reach first.
PORTS = (BTL_PORT_MIN + 500, BTL_PORT_MIN + 999)
HELD = f"{PORTS[0]} {PORTS[1]}"


def _held_receive(tmp_path, receiver_program: str, sender_program: str, args: tuple[str, ...], hold_s: float,
                  byte_s: float, held_ports: str = HELD) -> dict:
    """``receiver_program`` with the library (holding ``hold_s`` and ``byte_s`` per byte of each segment on sockets
    of ``held_ports``), run with :data:`PORTS` and ``args``; then ``sender_program`` with its port and ``args``. The
    receiver's JSON findings, and ``sent_at`` when the sender started."""
    assert os.path.isfile(LIBRARY), f"{LIBRARY} is missing: make setup builds it"
    holds = tmp_path / "holds"
    holds.write_text(f"127.0.0.1 127.0.0.1 {hold_s} {byte_s}\n", encoding="ascii")
    env = dict(os.environ, LD_PRELOAD=LIBRARY, EF_LATENCY_FILE=str(holds), EF_LATENCY_PORTS=held_ports,
               EF_LATENCY_QUEUE_BYTES=str(1 << 20))
    receiver = subprocess.Popen([sys.executable, "-c", receiver_program, *map(str, PORTS), *args],
                                stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        start = time.time()
        subprocess.run([sys.executable, "-c", sender_program, str(port), *args], check=True, timeout=30)
        out, _ = receiver.communicate(timeout=30)
    finally:
        receiver.kill()
    result = json.loads(out)
    result["sent_at"] = start
    return result


def _run_pair(tmp_path, hold_s: float, held_ports: str, bulk: int, byte_s: float = 0.0) -> dict:
    """A receiver with the library, and a sender of five 64-byte timestamps 0.1 s apart followed by ``bulk``
    bytes (:func:`_held_receive`); the receiver's findings."""
    return _held_receive(tmp_path, RECEIVER, SENDER, (str(bulk),), hold_s, byte_s, held_ports)


def test_the_library_hands_bytes_over_a_hold_after_they_arrived_and_never_reports_them_early(tmp_path):
    result = _run_pair(tmp_path, 0.05, HELD, 0)
    assert len(result["latency"]) == 5 and all(0.05 <= x < 0.05 + 0.02 for x in result["latency"]), result
    assert result["early"] == 0


def test_a_segment_is_held_its_serialisation_on_the_path_besides_the_hold(tmp_path):
    # 64-byte segments at 0.2 ms per byte: 12.8 ms each on top of the 50 ms
    result = _run_pair(tmp_path, 0.05, HELD, 0, byte_s=2e-4)
    assert len(result["latency"]) == 5 and all(0.0628 <= x < 0.0628 + 0.02 for x in result["latency"]), result


#: A receiver that lets a message's segments queue in the kernel before it first polls, so that one read of the
#: library returns several segments under one timestamp; prints when the whole message was handed over.
LATE_RECEIVER = LISTENER + textwrap.dedent('''
    size = int(sys.argv[3])
    time.sleep(0.02)  # every segment is in the kernel's queue before the library first looks
    poller = select.poll(); poller.register(conn, select.POLLIN)
    data = b""
    while len(data) < size and poller.poll(5000):
        try:
            data += conn.recv(1 << 16)
        except BlockingIOError:
            continue
    print(json.dumps({"latency": time.time() - float(data[:32].decode()), "bytes": len(data)}), flush=True)
''')

#: A sender whose segments carry at most 244 bytes (an MSS of 256 less the timestamp option): one message of
#: argv[2] bytes, its send time first.
SMALL_SEGMENT_SENDER = textwrap.dedent('''
    import socket, sys, time
    c = socket.socket()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 256)
    c.connect(("127.0.0.1", int(sys.argv[1])))
    c.sendall(f"{time.time():.6f}".ljust(int(sys.argv[2])).encode())
    time.sleep(0.5)
    c.close()
''')


def test_segments_read_together_are_held_one_frames_serialisation_not_all_of_theirs(tmp_path):
    # 2048 bytes in nine segments of at most 244, read by the library in one go under the last one's timestamp,
    # at 0.1 ms per byte: each segment is due 50 ms + 24.4 ms after its arrival, not 50 + 204.8 ms
    result = _held_receive(tmp_path, LATE_RECEIVER, SMALL_SEGMENT_SENDER, ("2048",), 0.05, 1e-4)
    assert result["bytes"] == 2048
    assert 0.05 + 0.0244 <= result["latency"] < 0.05 + 0.0244 + 0.03, result


def test_a_held_stream_keeps_its_rate_the_hold_is_paid_once(tmp_path):
    # 64 MiB over loopback with 50 ms held: the stream is pipelined, it does not pay 50 ms per chunk
    result = _run_pair(tmp_path, 0.05, HELD, 64 << 20)
    assert result["bytes"] == 5 * 64 + (64 << 20)
    assert result["end"] - result["sent_at"] < 0.5 + 5 * 0.1 + 3.0, result


def test_a_socket_outside_the_transports_ports_passes_through(tmp_path):
    result = _run_pair(tmp_path, 0.05, "1 2", 0)
    assert all(x < 0.02 for x in result["latency"]), result


YIELDS = "import os, time\nt = time.monotonic()\nfor _ in range(200): os.sched_yield()\nprint(time.monotonic() - t)"


def _yield_time(sleep_us: str | None) -> float:
    """Seconds that 200 sched_yield() calls take in a process with the library preloaded."""
    env = dict(os.environ, LD_PRELOAD=LIBRARY)
    env.pop("EF_YIELD_SLEEP_US", None)
    if sleep_us is not None:
        env["EF_YIELD_SLEEP_US"] = sleep_us
    done = subprocess.run([sys.executable, "-c", YIELDS], env=env, capture_output=True, text=True, check=True,
                          timeout=30)
    return float(done.stdout)


def test_a_yield_sleeps_the_time_the_ranks_are_given_and_yields_without_it():
    assert os.path.isfile(LIBRARY), f"{LIBRARY} is missing: make setup builds it"
    assert _yield_time("2000") >= 200 * 0.002
    assert _yield_time(None) < 0.2 and _yield_time("0") < 0.2
