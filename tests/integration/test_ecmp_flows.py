"""ECMP on real Open vSwitch hashes every TCP connection by its 5-tuple, not only the agents' (root).

On a leaf-spine with four spines, several TCP connections between ONE host
pair on different leaves, from source ports bound inside the source host,
each take the spine :func:`emulator.model.routing.route` predicts for their
5-tuple and the run's seed: the controller learns them on their first packet
(a miss entry at the leaf, the learned entries of both directions). The
leaves' uplink byte counters show each connection's data on its predicted
spine and its ACKs on the spine predicted for the reversed 5-tuple. The
source ports are chosen so that the connections are predicted on different
spines. A second controller started with the same seed measures the same
spines.
"""

from __future__ import annotations

import re
import time

import pytest

from emulator.base.naming import bridge_name
from emulator.emulation.machine.system import run
from emulator.model import routing

from .test_controller import Fabric, send_tcp, wait_counters

pytestmark = pytest.mark.integration

SPEC = "leafspine:leaves=2,spines=4,hosts_per_leaf=2"
SEED = 11
SRC, DST = "h1", "h3"  # h1 on leaf s1, h3 on leaf s2
DPORT = 5201
CONNECTIONS = 4
NBYTES = 1_000_000


def choose_ports(topo, count: int) -> list[int]:
    """``count`` source ports from 40000 up, spreading the connections over as many spines as route() predicts."""
    chosen: list[int] = []
    spines: set[str] = set()
    for sport in range(40000, 40400):
        spine = routing.route(topo, "ecmp", routing.Flow(SRC, DST, routing.IPPROTO_TCP, sport, DPORT), seed=SEED)[2]
        if spine not in spines:
            chosen.append(sport)
            spines.add(spine)
        if len(chosen) == count:
            return chosen
    raise AssertionError(f"only {len(chosen)} spines reachable by source ports 40000..40399")


def measure(fab: Fabric, stats: str, sport: int) -> tuple[dict[str, int], dict[str, int]]:
    """Send one connection's bytes; the byte deltas of leaf s1's and leaf s2's uplinks, by spine."""
    flow = routing.Flow(SRC, DST, routing.IPPROTO_TCP, sport, DPORT)
    before = wait_counters(fab.topo, stats, time.time())
    assert send_tcp(fab, flow, NBYTES) == NBYTES
    after = wait_counters(fab.topo, stats, time.time())
    src_leaf, dst_leaf = fab.topo.host(SRC).switch, fab.topo.host(DST).switch
    up = {b: after[(a, b)] - before.get((a, b), 0) for a, b in after if a == src_leaf}
    back = {b: after[(a, b)] - before.get((a, b), 0) for a, b in after if a == dst_leaf}
    return up, back


def learned_lines(switch: str) -> list[str]:
    res = run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge_name(switch),
               f"cookie={hex(routing.LEARNED_COOKIE)}/-1"])
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if "priority=" in line]


def test_every_tcp_connection_takes_its_predicted_spine(tmp_path):
    fab = Fabric(SPEC)
    topo = fab.topo
    ports = choose_ports(topo, CONNECTIONS)
    predicted = {p: routing.route(topo, "ecmp", routing.Flow(SRC, DST, 6, p, DPORT), seed=SEED)[2] for p in ports}
    predicted_back = {p: routing.route(topo, "ecmp", routing.Flow(DST, SRC, 6, DPORT, p), seed=SEED)[2]
                      for p in ports}
    # The pair's fallback path (ICMP, and every TCP flow before this change) is one spine only.
    assert len(set(predicted.values())) >= 2
    fab.net.start()  # waits for the machine's network lock first
    t_up = time.monotonic()
    try:
        runs = []
        for attempt in range(2):  # the same seed twice: the same measured spines
            stats = str(tmp_path / f"stats-{attempt}.jsonl")
            ctl = fab.controller("ecmp", seed=SEED, stats_file=stats)
            try:
                measured, measured_back = {}, {}
                for sport in ports:
                    up, back = measure(fab, stats, sport)
                    loaded = [spine for spine, d in up.items() if d > 0.9 * NBYTES]
                    assert loaded == [predicted[sport]], f"port {sport}: uplink bytes {up}, predicted {predicted}"
                    assert all(d < 0.1 * NBYTES for spine, d in up.items() if spine != predicted[sport]), up
                    measured[sport] = loaded[0]
                    # The ACKs: the reversed 5-tuple hashed on its own at the other leaf.
                    busiest = max(back, key=lambda spine: back[spine])
                    assert busiest == predicted_back[sport] and back[busiest] > 2000, (sport, back, predicted_back)
                    measured_back[sport] = busiest
                status = ctl.status()
                assert status["learned_connections"] == len(ports), status
                lines = learned_lines(topo.host(SRC).switch)
                assert len(lines) == len(ports) and all("idle_timeout=120" in line for line in lines), lines
                assert {int(m) for line in lines for m in re.findall(r"tp_src=(\d+)", line)} == set(ports)
            finally:
                ctl.stop()
            runs.append((measured, measured_back))
            print(f"{SPEC} ecmp seed {SEED} run {attempt + 1}: {SRC}->{DST} port {DPORT} from source ports "
                  + ", ".join(f"{p} via {measured[p]} (ACKs via {measured_back[p]})" for p in ports))
        assert runs[0] == runs[1] == (predicted, predicted_back)
        print(f"bring-up {fab.net.bringup_s:.1f} s, two controller runs {time.monotonic() - t_up:.1f} s")
    finally:
        fab.net.stop()
